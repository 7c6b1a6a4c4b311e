# `seeds`: the seed study, whatever `seeds` says: Table 1 (and, on data that marks its decisions,
# the credit lab) over `study_seeds`, into results/tables/<study>/seeds/ and
# results/figures/<study>/seeds/. Each seed's runs and evaluations are the ordinary ones, shared
# with every other target.
STUDY_SEEDS = seed_list("study_seeds")

rule seeds_table1:
    input: study_summaries(RUNS, STUDY_SEEDS)
    output: multiext(f"{TABLES_DIR}/seeds/table1", ".md", ".csv", ".tex")
    log: f"logs/{STUDY}/seeds_table1.log"
    params:
        out=lambda w, output: output[0].removesuffix(".md"),
        runs=RUNS,
        **report_params(STUDY_SEEDS),
    shell: report_command("table1 --methods {params.runs:q}")

rule seeds_credit_lab:
    input: trained_runs(METHODS, STUDY_SEEDS), rules.data.output
    output: multiext(f"{FIGURES_DIR}/seeds/credit_lab", ".png", ".pdf", ".md", ".csv")
    log: f"logs/{STUDY}/seeds_credit_lab.log"
    params: runs=credit_lab_runs(STUDY_SEEDS), **FIGURE_PARAMS
    shell: CREDIT_LAB

rule seeds:
    input: rules.seeds_table1.output, *(rules.seeds_credit_lab.output if DECISIONS and METHODS else [])
