rule evaluate:
    input: "runs/{model}/{data}/{run}/final/DONE.json", CONFIGS
    output: "results/raw/{model}/{data}/{run}/{benchmark}/summary.json"
    log: "logs/eval_{model}_{data}_{run}_{benchmark}.log"
    benchmark: "results/benchmarks/eval_{model}_{data}_{run}_{benchmark}.tsv"
    threads: 1
    shell: ENV + " -m eval.run benchmark={wildcards.benchmark} run_name={wildcards.run} model={wildcards.model} data={wildcards.data} preset={PRESET} > {log} 2>&1"
