rule table1:
    input: expand("results/raw/{model}/{data}/{run}/{benchmark}/summary.json", model=MODEL, data=DATA, run=RUNS, benchmark=BENCHMARKS)
    output: multiext("results/tables/table1", ".md", ".csv", ".tex")
    log: "logs/table1.log"
    shell: sys.executable + " -m eval.report table1 --summaries results/raw/{MODEL}/{DATA} --out results/tables/table1 --methods {RUNS} --benchmarks {BENCHMARKS} --label '" + config["label"] + "' > {log} 2>&1"
