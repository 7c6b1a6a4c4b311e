# `seeds`: the seed study, whatever `seeds` says: Table 1 (and, on data that marks its decisions,
# the credit lab and the forced-choice table) over `study_seeds`, into results/tables/<study>/seeds/
# and results/figures/<study>/seeds/. Each seed's runs and evaluations are the ordinary ones,
# shared with every other target.
STUDY_SEEDS = seed_list("study_seeds")
# Benchmarks that are tasks with decisions -> decisions per response: the SFT policy is also
# evaluated with the winning choice forced at its first k of them (eval.forced, issue #25).
FORCED = {b: get_task(b).N_DECISIONS for b in BENCHMARKS if has_decisions(b)}


use rule evaluate as evaluate_forced with:
    output: f"results/raw/{KEY}/{{run}}/{{benchmark}}/forced{{k}}/summary.json"
    log: f"logs/{KEY}/forced{{k}}_{{run}}_{{benchmark}}.log"
    benchmark: f"results/benchmarks/{KEY}/forced{{k}}_{{run}}_{{benchmark}}.tsv"
    wildcard_constraints: k="[1-9]"
    params:
        evaluation=lambda w, output: [f"eval_out={os.path.dirname(output[0])}", f"evaluation.forced={w.k}"],


def forced_summaries(seeds):
    """The SFT policy's own and forced evaluations of every FORCED benchmark, every seed."""
    return [f"{d}/sft/{b}/{k}summary.json" for d in keyed("results/raw/{key}", seeds) for b, n in FORCED.items()
            for k in ["", *(f"forced{k}/" for k in range(1, n + 1))]]


rule seeds_forced:
    input: forced_summaries(STUDY_SEEDS)
    output: multiext(f"{TABLES_DIR}/seeds/forced", ".md", ".csv")
    log: f"logs/{STUDY}/seeds_forced.log"
    params:
        out=lambda w, output: output[0].removesuffix(".md"),
        summaries=keyed("results/raw/{key}", STUDY_SEEDS),
        benchmarks=[f"{b}={n}" for b, n in FORCED.items()],
    shell: "{PYTHON:q} -m eval.forced --summaries {params.summaries:q} --benchmarks {params.benchmarks:q} --out {params.out:q} > {log:q} 2>&1"

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
    input: rules.seeds_table1.output, *(rules.seeds_credit_lab.output if DECISIONS and METHODS else []), *(rules.seeds_forced.output if FORCED else [])
