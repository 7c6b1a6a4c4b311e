# Figures 2, 4 and 5 and the reward curves of Table 1's trained methods (eval.figures), under
# results/figures/<preset>/<model>/<data>/, from the configured seeds' runs and evaluations.
# `figures` builds them all, training GiGPO, ARPO and CBPO when the study's rows do not.
FIGURES_DIR = f"results/figures/{STUDY}"
RUN_DIRS = keyed("runs/{key}")
FIG5_METHODS = ["gigpo", "arpo", "cbpo"]  # Fig. 5 (a, b); CBPO's rollout dump feeds Figs. 2 and 5 (c, d)
FIG4_METHODS = ["arpo", "cbpo"]
MATH_BENCHMARKS = [b for b in BENCHMARKS if benchmark_config(b)["domain"] == "math"]
# Data whose tasks mark their decisions (data=forks) also get the credit lab (eval.credit_lab).
DECISIONS = any(has_decisions(t) for t in data_config(DATA).get("tasks", []))
FIGURES = ["fig2", "fig5"] + ["curves"] * bool(METHODS) + ["fig4"] * bool(MATH_BENCHMARKS) + ["credit_lab"] * (DECISIONS and bool(METHODS))
FIGURE_PARAMS = dict(out=lambda w, output: output[0].removesuffix(".png"), label=LABEL)


def figure_outputs(name, *suffixes):
    """A figure's PNG, in `snakemake --report` with its caption (workflow/report/<name>.rst),
    and its other files."""
    png = report(f"{FIGURES_DIR}/{name}.png", caption=f"{ROOT}/workflow/report/{name}.rst", category="Figures")
    return [png, *(f"{FIGURES_DIR}/{name}{suffix}" for suffix in suffixes)]


def trained_runs(methods, seeds=None):
    """The finished training runs of ``methods``, for every seed (the configured ones unless ``seeds``)."""
    return [f"{d}/{m}/final/DONE.json" for d in keyed("runs/{key}", seeds) for m in methods]


def credit_lab_runs(seeds=None):
    """The run folders the credit lab compares: Table 1's trained methods, every seed."""
    return [f"{d}/{m}" for d in keyed("runs/{key}", seeds) for m in METHODS]


CREDIT_LAB = "{PYTHON:q} -m eval.credit_lab --runs {params.runs:q} --out {params.out:q} --label={params.label:q} > {log:q} 2>&1"


def passk_summary():
    """Fig. 4's summary below <run>/<benchmark>/: the preset's own evaluation where it samples
    at least passk_samples answers per problem (paper), else one made for the figure."""
    evaluation = composed().evaluation
    own = evaluation.n_samples >= config["figures"]["passk_samples"] and evaluation.temperature > 0
    return "summary.json" if own else "pass5/summary.json"


def figure_command(args):
    return "{PYTHON:q} -m eval.figures " + args + " --out {params.out:q} --label={params.label:q} > {log:q} 2>&1"


# Pass@3/5 need several sampled answers; the smoke and tiny presets evaluate greedily once.
use rule evaluate as evaluate_passk with:
    output: f"results/raw/{KEY}/{{run}}/{{benchmark}}/pass5/summary.json"
    log: f"logs/{KEY}/passk_{{run}}_{{benchmark}}.log"
    benchmark: f"results/benchmarks/{KEY}/passk_{{run}}_{{benchmark}}.tsv"
    params:
        evaluation=lambda w, output: [f"eval_out={os.path.dirname(output[0])}",
                                      f"evaluation.n_samples={config['figures']['passk_samples']}",
                                      f"evaluation.temperature={config['figures']['passk_temperature']}"],

rule fig2:
    input: trained_runs(["cbpo"])[0]
    output: figure_outputs("fig2", ".pdf")
    log: f"logs/{STUDY}/fig2.log"
    params: run=f"{RUN_DIRS[0]}/cbpo", **FIGURE_PARAMS
    shell: figure_command("fig2 --run {params.run:q}")

rule fig4:
    input: lambda w: [f"{d}/{m}/{b}/{passk_summary()}" for d in SUMMARIES for m in FIG4_METHODS for b in MATH_BENCHMARKS]
    output: figure_outputs("fig4", ".pdf")
    log: f"logs/{STUDY}/fig4.log"
    params: summaries=SUMMARIES, file=lambda w: passk_summary(), methods=FIG4_METHODS, benchmarks=MATH_BENCHMARKS, **FIGURE_PARAMS
    shell: figure_command("fig4 --summaries {params.summaries:q} --summary-file {params.file:q} --methods {params.methods:q} --benchmarks {params.benchmarks:q}")

rule fig5:
    input: trained_runs(FIG5_METHODS)
    output: figure_outputs("fig5", ".pdf")
    log: f"logs/{STUDY}/fig5.log"
    params: runs=RUN_DIRS, methods=FIG5_METHODS, **FIGURE_PARAMS
    shell: figure_command("fig5 --runs {params.runs:q} --methods {params.methods:q}")

rule curves:
    input: trained_runs(METHODS)
    output: figure_outputs("curves", ".pdf")
    log: f"logs/{STUDY}/curves.log"
    params: runs=RUN_DIRS, methods=METHODS, **FIGURE_PARAMS
    shell: figure_command("curves --runs {params.runs:q} --methods {params.methods:q}")

rule credit_lab:  # where each Table 1 method's credit lands relative to the tasks' decisions
    input: trained_runs(METHODS), rules.data.output
    output: figure_outputs("credit_lab", ".pdf", ".md", ".csv")
    log: f"logs/{STUDY}/credit_lab.log"
    params: runs=credit_lab_runs(), **FIGURE_PARAMS
    shell: CREDIT_LAB

rule figures:
    input: [f"{FIGURES_DIR}/{name}{ext}" for name in FIGURES for ext in (".png", ".pdf")]
