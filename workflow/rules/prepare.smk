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
