rule evaluate:
    input: evaluated_model, benchmark_file, lambda w: f"{ROOT}/configs/method/{method_of(w.run)}.yaml", f"{ROOT}/eval/benchmarks/{{benchmark}}.yaml", hydra_configs, SEARCH_INPUT
    output: f"results/raw/{KEY}/{{run}}/{{benchmark}}/summary.json"
    log: f"logs/{KEY}/eval_{{run}}_{{benchmark}}.log"
    benchmark: f"results/benchmarks/{KEY}/eval_{{run}}_{{benchmark}}.tsv"
    threads: 1
    resources: **resources("evaluate")
    params:
        data_root=DATA_ROOT,
        # A param: another judge rescores the judged benchmarks (only those).
        judge=lambda w: JUDGE if benchmark_config(w.benchmark)["metric"] == "judge" else [],
        # A variant: its method and the overrides it was trained with, under its own run name.
        method=lambda w: method_of(w.run),
        overrides=lambda w: overrides_of(w.run),
        search=SEARCH,
        # what a second evaluation of the same checkpoint changes (evaluate_passk, evaluate_forced)
        evaluation=[],
    shell: command("eval.run benchmark={wildcards.benchmark:q} method={params.method:q} run_name={wildcards.run:q}", "{params.evaluation:q}", JOB, "{params.overrides:q} {params.judge:q} {params.search:q}")
