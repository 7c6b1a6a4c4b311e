# The preflight (cbpo.doctor) before anything is submitted. While planning: every input of the
# study that no job can make and is not there, all named at once with its fix (a missing file
# would otherwise stop the DAG naming one). Under `--profile slurm`, once the DAG is built and
# before the first submission: `python -m cbpo doctor` on the study (search key or retrieval
# server, judge, the partition's limits against the jobs' requests, account, disk, engines);
# a problem stops the run with the doctor's report (`--config preflight=false` skips it).
import subprocess
import tempfile

import yaml
from snakemake.exceptions import WorkflowError

from cbpo import doctor


def _missing_inputs():
    made = {str(item.target) for item in FETCH}
    models = [MODEL, *([TEACHER_MODEL] if TEACHER_MODEL and "opd" in METHODS else [])]
    # the data config as read from its file (composing it here would reconfigure the logging)
    problems = doctor.check_files(data_config(DATA), Path(DATA_ROOT), config, Path("models"), models)
    return [p for p in problems if not any(m in p.what for m in made)]


if workflow.is_main_process:
    _problems = _missing_inputs()
    if _problems:
        raise ValueError(f"{len(_problems)} input(s) of the study are missing:\n"
                         + "\n".join(f"- {p.what}\n    fix: {p.fix}" for p in _problems))


onstart:
    if str(config["preflight"]).lower() == "true" and workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        job = next(iter(workflow.dag.needrun_jobs()), None)
        res = dict(job.resources) if job is not None else {}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(dict(config), f)  # the DAG's config, --config overrides included
        cmd = [PYTHON, "-m", "cbpo", "doctor", f"model={MODEL}", f"data={DATA}", f"preset={PRESET}", f"data_root={DATA_ROOT}",
               "--configfile", f.name, "--partition", str(res.get("slurm_partition", "")), "--account", str(res.get("slurm_account", ""))]
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(done.stdout + done.stderr, flush=True)
        if done.returncode != 0:
            raise WorkflowError(f"the preflight found problems (above); fix them and run again (`{' '.join(cmd[1:])}` rechecks)")
