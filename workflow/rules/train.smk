import shutil

from cbpo.cost import per_node_gpus, rl_job_gpus, visible_gpus

# The SLURM plugin reads job states with the `sacct` on this process's PATH: slurm/bin's
# hands them over as the plugin compares them (a cancelled or preempted job seen as ended;
# see there). Only beside a real sacct: alone, the plugin would take it for one.
if shutil.which("sacct") and f"{ROOT}/slurm/bin" not in os.environ["PATH"].split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([f"{ROOT}/slurm/bin", os.environ["PATH"]])


def train_nodes():
    """The nodes of a training job (sft, teacher, rl): on verl `verl_nodes` (workflow/config.yaml),
    else the Hydra config's verl.nodes; the trainer gets the same number."""
    if BACKEND != "verl":
        return 1
    return config["verl_nodes"] or composed().verl.nodes


def verl_gpus_per_node(stage):
    """The GPUs per node a verl training job trains on: `verl_gpus_per_node` where set; under a
    cluster profile those its SLURM resources ask for (resources.<stage>.gpu); run here (the
    local executor), this machine's, and one process on a machine without GPUs (verl's CPU
    platform, cbpo/backends/verl/cpu.py)."""
    if config["verl_gpus_per_node"]:
        return config["verl_gpus_per_node"]
    if on_cluster():
        return resources(stage)["gpu"]
    return max(1, visible_gpus())


def backend_args(stage):
    """The backend settings of a training job: nothing for the local default, else the backend
    and (verl) the job's nodes and GPUs per node, and an rl job's `async_training`."""
    if BACKEND == PRESET_BACKEND == "local":
        return []
    if BACKEND != "verl":
        return [f"backend={BACKEND}"]
    overlap = [f"rl.async_training={config['async_training']}"] if stage == "rl" and config["async_training"] else []
    return [f"backend={BACKEND}", f"verl.nodes={train_nodes()}", f"verl.gpus_per_node={verl_gpus_per_node(stage)}",
            *overlap]


def on_cluster():
    """Whether the jobs go to a cluster: a non-local executor (SLURM's, and its job steps'), or a
    dry run of the SLURM profile (its default resources name the slurm_partition), which then
    plans what the run will do. Known once jobs are made, not while the Snakefile is parsed:
    call it from a rule's functions."""
    if workflow.non_local_exec:
        return True
    defaults = workflow.resource_settings.default_resources
    return bool(defaults and any(arg.startswith("slurm_") for arg in defaults.args))


def train_threads(default):
    """A training job's cores (a function for the rule's ``threads``). Run here on verl, a job
    starts its own Ray cluster (workers, vLLM servers, reward workers) or torchrun world and holds
    every core Snakemake has, so none runs beside it: two at once overran a 24 GiB machine (Ray's
    memory monitor killed workers of both)."""
    return lambda wildcards: workflow.cores if BACKEND == "verl" and not on_cluster() else default


def rl_gpus(wildcards):
    """An rl job's GPUs: resources.rl's on each node; OPD on verl also holds its teacher's own
    (verl.teacher_gpus, configs/config.yaml). cbpo.doctor checks the same count."""
    return rl_job_gpus(resources("rl").get("gpu", 0), train_nodes(), method_of(wildcards.trained), BACKEND,
                       composed().verl.teacher_gpus)


def train_resources(stage, gpus=None):
    """resources.<stage> (GPUs: ``gpus(wildcards)`` where given, else resources.<stage>'s per
    node), on several nodes one SLURM allocation (--nodes=N) with one task per node: verl's
    Ray-on-SLURM recipe for rl, one torchrun per node for SFT. There the GPUs are asked per node
    (--gres=gpu:G, as verl's recipe does), so every node holds its share and a one-node step
    inside the job is valid; `mpi` makes the job-step plugin run the shell in the batch script
    instead of a one-node srun, so the shell reaches every node (slurm/ray-on-slurm.sh; SFT's
    srun, cbpo/backends/verl/sft.py)."""
    nodes = train_nodes()
    spec = dict(resources(stage))
    per_node = spec.pop("gpu", 0)
    if nodes == 1:
        return {**spec, "gpu": gpus or per_node}
    gres = (lambda w: f"gpu:{per_node_gpus(gpus(w), nodes)}") if gpus else f"gpu:{per_node}"
    return {**spec, "nodes": nodes, "tasks": nodes, "mpi": "srun", "gres": gres}


rule sft:
    input:
        "models/{model}/cbpo_model.json",
        rules.data.output,
        hydra_configs,
        training_files("sft"),
    output: f"runs/{KEY}/sft/final/DONE.json"
    log: f"logs/{KEY}/sft.log"
    benchmark: f"results/benchmarks/{KEY}/sft.tsv"
    threads: train_threads(2)  # runs alone in the CPU demo
    resources: **train_resources("sft")
    # on verl: torchrun over the job's GPUs, one per node (cbpo/backends/verl/sft.py)
    params: data_root=DATA_ROOT, backend=lambda w: backend_args("sft")
    shell: command("cbpo.train stage=sft {params.backend:q}", JOB)

rule teacher:  # OPD's teacher where the preset names none: the SFT recipe run longer
    input: rules.sft.input
    output: f"runs/{KEY}/teacher/final/DONE.json"
    log: f"logs/{KEY}/teacher.log"
    benchmark: f"results/benchmarks/{KEY}/teacher.tsv"
    threads: train_threads(2)
    resources: **train_resources("sft")
    params:
        data_root=DATA_ROOT,
        init=lambda w: f"init=runs/{KEY.format(**w)}/teacher/final",
        steps=lambda w: f"sft.steps={preset_sft_steps() * config['teacher_sft_factor']}",
        backend=lambda w: backend_args("sft"),
    shell: command("cbpo.train stage=sft {params.init:q} {params.steps:q} {params.backend:q}", JOB)


rule rl:
    input:
        f"runs/{KEY}/sft/final/DONE.json",
        lambda w: [] if method_of(w.trained) != "opd" else f"models/{TEACHER_MODEL}/cbpo_model.json" if TEACHER_MODEL
        else [] if TEACHER else f"runs/{KEY.format(**w)}/teacher/final/DONE.json",
        lambda w: f"{ROOT}/configs/method/{method_of(w.trained)}.yaml",
        hydra_configs,
        training_files("train"),
        SEARCH_INPUT,
    output: f"runs/{KEY}/{{trained}}/final/DONE.json"
    log: f"logs/{KEY}/{{trained}}.log"
    benchmark: f"results/benchmarks/{KEY}/rl_{{trained}}.tsv"
    threads: train_threads(1)
    resources: **train_resources("rl", rl_gpus)
    # H's GPU backends: backend=verl reaches the job; the default (local) adds nothing.
    # A variant names its run folder (variant=) and carries its overrides.
    params:
        data_root=DATA_ROOT,
        backend=lambda w: backend_args("rl"),
        # verl trains on a Ray cluster: started across the job's allocation under SLURM
        launch=[] if BACKEND == "local" else [f"{ROOT}/slurm/ray-on-slurm.sh"],
        method=lambda w: method_of(w.trained),
        search=SEARCH,
        dump=[] if config["dump_every"] is None else [f"rl.dump_every={config['dump_every']}"],
        variant=lambda w: [f"variant={w.trained}", *overrides_of(w.trained)] if w.trained in VARIANTS else [],
        # the teacher path is a method.* override: variant= keeps it from renaming the run
        teacher=lambda w: [f"variant={w.trained}", *(f"method.teacher={t}" for t in teacher_of(w))]
        if teacher_of(w) and w.trained not in VARIANTS else [f"method.teacher={t}" for t in teacher_of(w)],
    # Rollout dumps (every rl.dump_every steps and the last) feed Figs. 2 and 5 and the credit
    # lab; bookkeeping, the weights do not depend on them.
    shell: command("cbpo.train stage=rl method={params.method:q}", JOB, "{params.variant:q} {params.teacher:q} {params.backend:q} {params.search:q} rl.dump_rollouts=true {params.dump:q}").replace("{PYTHON:q}", "{params.launch:q} {PYTHON:q}", 1)
