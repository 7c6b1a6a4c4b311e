# Tables 2 and 3 (Sec. 5.4, 5.5) and the boundary-only ablation: the rows of `tables:` in
# workflow/config.yaml, each beside the paper's value for the configured backbone.


def table_outputs(table):
    """A table's Markdown, in `snakemake --report` with its caption, and its CSV and LaTeX."""
    md = report(f"{TABLES_DIR}/{table}.md", caption=f"{ROOT}/workflow/report/table.rst", category="Tables")
    return [md, f"{TABLES_DIR}/{table}.csv", f"{TABLES_DIR}/{table}.tex"]

for ablation in TABLES:
    rule:
        name: ablation
        input: table_summaries(ablation)
        output: table_outputs(ablation)
        log: f"logs/{STUDY}/{ablation}.log"
        params:
            table=ablation,
            out=lambda w, output: output[0].removesuffix(".md"),
            rows=table_rows(ablation),
            **REPORT_PARAMS,
        shell: report_command("{params.table:q} --rows {params.rows:q}")
