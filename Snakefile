# The paper's DAG: data -> model -> SFT -> RL{methods} -> eval{runs x benchmarks} -> tables.
# Each step is a Hydra entry point; outputs are written atomically (a DONE.json last), so a
# crashed step never looks finished. `make demo` runs `table1 figures` on data=forks; `snakemake` alone builds `all`.
import os

configfile: os.path.join(workflow.basedir, "workflow", "config.yaml")

include: "workflow/rules/common.smk"

# Cheap steps stay on the submitting machine under a cluster profile.
localrules: all, ablations, data, retriever_corpus, table1, table2, table3, boundary, figures, fig2, fig4, fig5, curves, credit_lab, index, site, seeds, seeds_table1, seeds_credit_lab, seeds_forced

include: "workflow/rules/prepare.smk"
include: "workflow/rules/retriever.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/seeds.smk"
include: "workflow/rules/cost.smk"
include: "workflow/rules/doctor.smk"

# Table 1 of the configured preset, model, data and seeds.
rule table1:
    input: study_summaries(RUNS)
    output: table_outputs("table1")
    log: f"logs/{STUDY}/table1.log"
    params:
        out=lambda w, output: output[0].removesuffix(".md"),
        runs=RUNS,
        **REPORT_PARAMS,
    shell: report_command("table1 --methods {params.runs:q}")

# `ablations`: Tables 2 and 3; `all` (what `snakemake` alone builds): every table and figure
# and the index of what made them. Each variant run is trained once. The default target is set
# here: an included file's does not survive.
STUDY_OUTPUTS = [*rules.table1.output, *rules.table2.output, *rules.table3.output, *rules.boundary.output, *rules.figures.input]
include: "workflow/rules/index.smk"
include: "workflow/rules/site.smk"

rule all:
    default_target: True
    input: rules.index.output, rules.site.output

rule ablations:
    input: rules.table2.output, rules.table3.output
