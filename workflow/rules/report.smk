# Tables 2 and 3 (Sec. 5.4, 5.5) and the boundary-only ablation: the rows of `tables:` in
# workflow/config.yaml, each beside the paper's value for the configured backbone.
for ablation in TABLES:
    rule:
        name: ablation
        input: table_summaries(ablation)
        output: multiext(f"{TABLES_DIR}/{ablation}", ".md", ".csv", ".tex")
        log: f"logs/{STUDY}/{ablation}.log"
        params:
            table=ablation,
            out=lambda w, output: output[0].removesuffix(".md"),
            rows=table_rows(ablation),
            **REPORT_PARAMS,
        shell: report_command("{params.table:q} --rows {params.rows:q}")
