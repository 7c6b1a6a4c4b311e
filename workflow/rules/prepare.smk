# Both built-in tasks, whatever the run's data (the scratch tokenizer learns from both), plus
# the run's own built-in tasks where its data config has others (data=forks).
DATA_TASKS = [t for t in data_config(DATA).get("tasks", []) if t in TASKS and t not in ("arith", "twohop")]

rule data:
    input: f"{ROOT}/configs/config.yaml", f"{ROOT}/configs/data/mix.yaml", *([f"{ROOT}/configs/data/{DATA}.yaml"] if DATA_TASKS else [])
    output: expand("data/tasks/{task}/{split}.jsonl", task=["arith", "twohop", *DATA_TASKS], split=["train", "test"])
    log: "logs/data.log"
    benchmark: "results/benchmarks/data.tsv"
    threads: 1
    params: data=DATA
    shell: command("cbpo.prepare target=data data=mix") + (" && " + command("cbpo.prepare target=data data={params.data:q}", append=True) if DATA_TASKS else "")

rule model:
    input: rules.data.output, f"{ROOT}/configs/config.yaml", f"{ROOT}/configs/model/{{model}}.yaml"
    output: "models/{model}/cbpo_model.json"
    log: "logs/model_{model}.log"
    benchmark: "results/benchmarks/model_{model}.tsv"
    threads: 1
    resources: **resources("model")
    shell: command("cbpo.prepare target=model model={wildcards.model:q}")


# The study's hub inputs that are not there yet (cbpo.fetch: Tool-Star's SFT traces, converted;
# MATH; the backbone; OPD's teacher; wiki-18 for the retrieval server), fetched by one job on the
# submitting machine, the only job with the hub allowed (cluster nodes often have no route out).
# Planned only while something is missing, so `-n` shows the whole study; without the hub it
# fails at once, its one message listing every missing input and how to provide it by hand.
from cbpo.fetch import corpus_item, missing, study_items
from cbpo.retriever.index import study_index

FETCH_MODELS = [MODEL, *([TEACHER_MODEL] if TEACHER_MODEL and "opd" in METHODS else [])]
# a hub corpus the study's retrieval server indexes (search_backend=http, workflow/rules/retriever.smk)
FETCH_CORPUS = [corpus_item(config["retriever"]["corpus"], Path(DATA_ROOT))] if study_index(config) else []
FETCH = missing(study_items(DATA, BENCHMARKS, FETCH_MODELS, Path(DATA_ROOT), Path("models"))
                + [item for item in FETCH_CORPUS if item is not None])

if FETCH:
    localrules: fetch
    ruleorder: fetch > model

    rule fetch:
        output: [str(item.target) for item in FETCH]
        log: "logs/fetch.log"
        params: inputs=[item.name for item in FETCH], data_root=DATA_ROOT
        shell: "OMP_NUM_THREADS=1 HF_HUB_OFFLINE=0 {PYTHON:q} -m cbpo.fetch {params.inputs:q} --data-root {params.data_root:q}"
               " --models-dir models > {log:q} 2>&1 || (cat {log:q} >&2; exit 1)"
