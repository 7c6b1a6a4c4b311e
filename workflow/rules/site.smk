# The study's face: the description atop `snakemake --report` (every table and figure marked
# report() in its rule, with a caption naming the runs and seeds behind it), and the results
# browser: results/site/{index,trajectories}.html, static pages over Table 1, the figures and the
# rollout dumps of every run they train (python -m eval.site).
report: f"{ROOT}/workflow/report/workflow.rst"

SITE_RUNS = list(dict.fromkeys([*METHODS, *FIG5_METHODS]))  # the runs `table1 figures` trains

rule site:
    input:
        tables=[rules.table1.output[1], *([f"{FIGURES_DIR}/credit_lab.csv"] if "credit_lab" in FIGURES else [])],
        headings=[rules.table1.output[0], *([f"{FIGURES_DIR}/credit_lab.md"] if "credit_lab" in FIGURES else [])],
        figures=[f"{FIGURES_DIR}/{name}.png" for name in FIGURES],
        runs=trained_runs(SITE_RUNS),
    output: directory("results/site")
    log: f"logs/{STUDY}/site.log"
    params:
        runs=[f"{d}/{m}" for d in RUN_DIRS for m in SITE_RUNS],
        label=LABEL,
    shell: "{PYTHON:q} -m eval.site --tables {input.tables:q} --figures {input.figures:q} --runs {params.runs:q} --label={params.label:q} --out {output:q} > {log:q} 2>&1"
