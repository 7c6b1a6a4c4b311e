# results/index.{md,json}: which runs, seeds, checkpoints and commits made each table cell.
# It reads every table under results/tables (other studies' too, as they stand), and the
# summaries, identity and provenance files they name. Its inputs: every table and figure of
# the configured study (STUDY_OUTPUTS); `all` builds it last.
rule index:
    input: STUDY_OUTPUTS
    output: report("results/index.md", caption=f"{ROOT}/workflow/report/index.rst", category="Provenance"), "results/index.json"
    log: "logs/index.log"
    shell: "{PYTHON:q} -m eval.index --tables results/tables --out results/index > {log:q} 2>&1"
