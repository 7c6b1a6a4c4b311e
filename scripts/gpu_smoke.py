"""The one-command GPU smoke test, for a machine with a CUDA GPU and the environment.yml
environment (vLLM 0.24.0, verl 0.9.1); the first command to run on a new GPU machine:

    python scripts/gpu_smoke.py                          # everything below, a few minutes
    python scripts/gpu_smoke.py --skip-train             # the engine checks only
    python scripts/gpu_smoke.py --backends local,verl    # also the verl backend
    .venv-engines/bin/python scripts/gpu_smoke.py --device cpu   # the same checks without a GPU

``--device cpu`` runs every check on vLLM's CPU build and the CPU trainer (the engines
environment, ``.venv-engines``), float32 unless ``--dtype`` says otherwise.

1. Engine: loads ``--model`` in ``VLLMEngine``, runs ``run_agent`` with the sandboxed Python
   tool on 4 built-in arithmetic problems, prints tokens/s, stop reasons, finishes, the mean
   top-K entropy and reward, and checks the invariants the trainer relies on (one log-prob and
   one entropy per response token, zeros on observation tokens, log-probs <= 0, entropies >= 0
   and finite). It then re-scores every sequence with a transformers forward pass, as the
   trainer scores them, and checks the mean absolute log-prob difference against
   ``--logprob-tol``. Sampling at temperature 0.8 tells raw log-probs (what the engine must
   return) from temperature-scaled ones, which coincide at temperature 1. Then it perturbs the
   transformers copy's weights, pushes them into vLLM as the trainer does after an update, and
   checks that new rollouts' log-probs are the perturbed model's; and that the rollouts' shared
   prompts were served from vLLM's prefix cache.
2. Training (``--skip-train`` skips it): in a scratch folder, prepares the offline tiny model
   and data, runs SFT, then for each backend x method x rollout engine a few RL steps
   (``python -m cbpo.train ... device=cuda``, or ``cpu``), and checks that it finished, that every step's
   reward is finite and tokens were generated, and that a run whose final checkpoint is removed
   resumes from its last step checkpoint and finishes again.

It ends with one PASS/FAIL line per check. Exit status 0 when every check passes, 1 when one
fails, 2 with ``--device cuda`` (the default) and no CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

# Generous for rounding: vLLM computes log-softmax in float32 and may return e.g. 1e-7.
NUMERIC_SLACK = 1e-5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Smoke-test VLLMEngine in the agent loop on a GPU (needs vllm: see environment.yml).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=None, help="Hugging Face id or local path for the engine checks "
                   "(default: the SFT checkpoint the training checks make, so no hub access is needed)")
    p.add_argument("--samples", type=int, default=4, help="rollouts per problem (4 problems)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="cap per agent turn")
    p.add_argument("--max-total-tokens", type=int, default=1536, help="cap per response")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (not 1: see above)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--top-k-entropy", type=int, default=10, help="K of the truncated entropy (Eq. 6)")
    p.add_argument("--seed", type=int, default=0, help="vLLM seed and arith problem seed")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where every check runs (cpu: vLLM's CPU build)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="model dtype, for vLLM and the transformers check (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--max-model-len", type=int, default=None, help="vLLM context length (default: the model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.7,
                   help="vLLM's share of GPU memory; the rest holds the transformers check")  # fmt: skip
    p.add_argument("--logprob-tol", type=float, default=0.05,
                   help="largest accepted MEAN absolute log-prob difference, vLLM vs the transformers pass")  # fmt: skip
    p.add_argument("--skip-train", action="store_true", help="run the engine checks only")
    p.add_argument("--methods", type=_names, default="grpo,cbpo", help="RL methods to train, comma-separated")
    p.add_argument("--backends", type=_names, default="local", help="training backends: local, verl")
    p.add_argument("--rl-engines", type=_names, default="hf,vllm", help="local backend's rollout engines: hf, vllm")
    p.add_argument("--steps", type=int, default=2, help="RL steps per run (>= 2, so that a step checkpoint exists)")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    args = p.parse_args(argv)
    from cbpo.registry import get_method, known_methods

    wrong = [m for m in args.methods if m not in known_methods() or not get_method(m).trains]
    wrong += [b for b in args.backends if b not in ("local", "verl")]
    wrong += [e for e in args.rl_engines if e not in ("hf", "vllm")]
    if wrong:
        p.error(f"unknown or non-training choices: {', '.join(wrong)}")
    if args.steps < 2:
        p.error("--steps must be >= 2")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    return args


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


class TimedEngine:
    """Passes ``sample`` through, counting calls, tokens, seconds and stop reasons."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = self.tokens = 0
        self.seconds = 0.0
        self.stops: Counter[str] = Counter()

    def sample(self, contexts, max_new_tokens, stop_token_ids=frozenset(), stop_strings=()):
        start = time.perf_counter()
        samples = self.engine.sample(contexts, max_new_tokens, stop_token_ids, stop_strings)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.tokens += sum(len(s.token_ids) for s in samples)
        self.stops.update(s.stop for s in samples)
        return samples


def invariant_errors(trajectories) -> list[str]:
    errors = []
    for k, t in enumerate(trajectories):
        n = len(t.response_ids)
        if not len(t.model_mask) == len(t.logprobs) == len(t.entropies) == n:
            errors.append(f"trajectory {k}: {n} tokens, {len(t.model_mask)} mask, "
                          f"{len(t.logprobs)} logprobs, {len(t.entropies)} entropies")  # fmt: skip
            continue
        for j, (m, lp, ent) in enumerate(zip(t.model_mask, t.logprobs, t.entropies)):
            if not m and (lp != 0.0 or ent != 0.0):
                errors.append(f"trajectory {k}, token {j}: observation token with logprob {lp}, entropy {ent}")
            elif m and not (math.isfinite(lp) and lp <= NUMERIC_SLACK):
                errors.append(f"trajectory {k}, token {j}: log-prob {lp}")
            elif m and not (math.isfinite(ent) and ent >= -NUMERIC_SLACK):
                errors.append(f"trajectory {k}, token {j}: entropy {ent}")
    if not any(t.n_model_tokens for t in trajectories):
        errors.append("no model tokens were generated")
    return errors


def compare_with_transformers(args, model, trajectories) -> tuple[float, float, float, float]:
    """Max and mean |vLLM - transformers ``model``| of the sampled tokens' raw log-probs, then
    of the top-K entropies, over every model token."""
    import torch

    lp_diffs, ent_diffs = [], []
    with torch.inference_mode():
        for t in trajectories:
            ids = torch.tensor([t.prompt_ids + t.response_ids], device=args.device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            start = len(t.prompt_ids)
            pos = torch.tensor([start + j for j, m in enumerate(t.model_mask) if m], device=args.device)
            if len(pos) == 0:
                continue
            rows = logp[pos - 1]  # the distribution each model token was drawn from
            hf_lp = rows.gather(1, ids[0, pos].unsqueeze(1)).squeeze(1)
            top = rows.topk(args.top_k_entropy, dim=-1).values.exp()
            hf_ent = -torch.special.xlogy(top, top).sum(-1)
            ours_lp = torch.tensor([lp for lp, m in zip(t.logprobs, t.model_mask) if m], device=args.device)
            ours_ent = torch.tensor([e for e, m in zip(t.entropies, t.model_mask) if m], device=args.device)
            lp_diffs.append((ours_lp - hf_lp).abs())
            ent_diffs.append((ours_ent - hf_ent).abs())
    lp_d, ent_d = torch.cat(lp_diffs), torch.cat(ent_diffs)
    return lp_d.max().item(), lp_d.mean().item(), ent_d.max().item(), ent_d.mean().item()


def _cbpo(work: Path, *overrides: str) -> tuple[int, str]:
    """``python -m cbpo.<module> overrides...`` in ``work``; its return code and output."""
    module, *rest = overrides
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", module, *rest], cwd=work, env=env, capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


class Checks:
    """Named pass/fail results, printed as they come and again as one list at the end."""

    def __init__(self):
        self.results: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, ok, detail))
        print(f"{'ok' if ok else 'FAILED'}: {name}{' - ' + detail if detail else ''}", flush=True)
        return ok

    def summary(self) -> str:
        lines = [f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail.splitlines()[0] + ')' if detail else ''}"
                 for name, ok, detail in self.results]
        failed = sum(not ok for _, ok, _ in self.results)
        return "\n".join([*lines, "SMOKE OK" if not failed else f"SMOKE FAILED ({failed} of {len(self.results)} checks)"])


def train_checks(args, work: Path, checks: Checks) -> None:
    """SFT once, then RL runs on ``args.device``, each a check."""
    repo = Path(__file__).resolve().parents[1]
    common = ["preset=smoke", "model=tiny", f"device={args.device}", f"paths.data_dir={work}/data",
              f"paths.models_dir={work}/models", f"paths.runs_dir={work}/runs"]
    for step in (["cbpo.prepare", "target=data"], ["cbpo.prepare", "target=model"], ["cbpo.train", "stage=sft"]):
        rc, out = _cbpo(repo, *step, *common)
        if not checks.add(" ".join(step), rc == 0, "" if rc == 0 else f"exit {rc}:\n{out[-3000:]}"):
            return
    runs = [(b, m, e) for b in args.backends for m in args.methods for e in (args.rl_engines if b == "local" else ["-"])]
    for backend, method, engine in runs:
        name = f"{method}-{backend}-{engine}"
        run = [*common, "stage=rl", f"method={method}", f"backend={backend}", f"run_name={name}", f"rl.steps={args.steps}",
               "rl.checkpoint_every=1", *([f"rl.engine={engine}"] if backend == "local" else [])]
        start = time.perf_counter()
        rc, out = _cbpo(repo, "cbpo.train", *run)
        problems = [f"exit {rc}:\n{out[-3000:]}"] if rc else run_problems(work / "runs", name, args.steps)
        if not problems:  # resume: without its final checkpoint the run picks up its last step checkpoint
            shutil.rmtree(next((work / "runs").glob(f"**/{name}/final")))
            rc, out = _cbpo(repo, "cbpo.train", *run)
            if rc or "resuming from" not in out:
                problems.append(f"the rerun did not resume (exit {rc}):\n{out[-3000:]}")
            problems += run_problems(work / "runs", name, args.steps)
        detail = f"{time.perf_counter() - start:.0f} s, trained and resumed" if not problems else "; ".join(problems)
        checks.add(f"train {name}", not problems, detail)


def run_problems(runs: Path, name: str, steps: int) -> list[str]:
    """What is wrong with a finished run: its final checkpoint, and a finite reward and some
    generated tokens at every step of metrics.jsonl."""
    found = list(runs.glob(f"**/{name}"))
    if len(found) != 1 or not (found[0] / "final" / "DONE.json").is_file():
        return [f"no finished run folder for {name} under {runs}"]
    records = [json.loads(line) for line in (found[0] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    problems = [] if [r["step"] for r in records] == list(range(1, steps + 1)) else [f"metrics steps {[r['step'] for r in records]}"]
    problems += [f"step {r['step']}: reward {r['reward']}" for r in records if not math.isfinite(r["reward"])]
    problems += [f"step {r['step']}: no generated tokens" for r in records if not r["generated_tokens"] > 0]
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke needs a CUDA GPU and the environment.yml environment: torch sees no GPU here "
              "(--device cpu runs the checks on vLLM's CPU build)", file=sys.stderr)
        return 2
    checks = Checks()
    # training first: its runs are subprocesses that need the GPU memory this process's vLLM holds later
    if args.skip_train and args.model is None:
        print("--skip-train needs --model (a Hugging Face id or checkpoint folder)", file=sys.stderr)
        return 2
    if not args.skip_train:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="cbpo-gpu-smoke-"))
        train_checks(args, work, checks)
        if args.model is None:  # offline: the engine checks load the SFT checkpoint just trained
            sft = next(work.glob("runs/**/sft/final"), None)
            args.model = None if sft is None else str(sft)
    if args.model is None:
        checks.add("engine checks", False, "no SFT checkpoint to load: stage=sft failed")
    else:
        engine_checks(args, checks)
    print("\n" + checks.summary())
    return 0 if all(ok for _, ok, _ in checks.results) else 1


def engine_checks(args, checks: Checks) -> None:
    """VLLMEngine in the agent loop on ``args.model``: invariants, agreement with transformers,
    a weight push, the prefix cache."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cbpo.chat import build_prompt
    from cbpo.reward import Rewarder
    from cbpo.rollout.agent import AgentConfig, run_agent
    from cbpo.rollout.vllm_engine import VLLMEngine
    from cbpo.tasks import arith
    from cbpo.tools import ToolsConfig, build_tools
    from cbpo.trajectory import Trajectory

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    start = time.perf_counter()
    try:
        vllm = VLLMEngine(
            args.model,
            tokenizer,
            top_k_entropy=args.top_k_entropy,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            llm_kwargs={"dtype": args.dtype},
        )  # fmt: skip
    except Exception as exc:  # every later check needs the engine: report why it is missing
        checks.add("engine: vLLM starts", False, f"{type(exc).__name__}: {exc}")
        return
    checks.add("engine: vLLM starts", True, f"{time.perf_counter() - start:.1f} s, {args.model}, {args.dtype}, {args.device}")
    engine = TimedEngine(vllm)

    rows = arith.generate(args.seed, 0, 4)["test"]
    row_of = [row for row in rows for _ in range(args.samples)]
    tools = build_tools(["python"], ToolsConfig(python_timeout=10, search_k=10))
    cfg = AgentConfig(max_new_tokens=args.max_new_tokens, max_total_tokens=args.max_total_tokens)

    def rollouts():
        fresh = [Trajectory(prompt_ids=build_prompt(tokenizer, row["question"])) for row in row_of]
        return run_agent(engine, tokenizer, fresh, tools, cfg)

    before = vllm.rollout_counts()
    start = time.perf_counter()
    done = rollouts()
    wall = time.perf_counter() - start
    after = vllm.rollout_counts()
    cached = after["prefill_cached_tokens"] - before["prefill_cached_tokens"]
    prompt_tokens = after["prefill_tokens"] - before["prefill_tokens"]

    rewarder = Rewarder()
    try:
        rewards = rewarder([tokenizer.decode(t.response_ids) for t in done], row_of)
    finally:
        rewarder.close()
    entropies = [e for t in done for e, m in zip(t.entropies, t.model_mask) if m]
    print(f"rollouts {len(done)}, sample() calls {engine.calls}, generated tokens {engine.tokens}")
    print(f"sampling {engine.seconds:.2f} s, {engine.tokens / max(engine.seconds, 1e-9):.0f} tokens/s; "
          f"agent loop {wall:.2f} s; tool calls {sum(t.tool_calls for t in done)}, "
          f"tool seconds {sum(t.tool_seconds for t in done):.2f}")  # fmt: skip
    print(f"engine stop reasons {dict(engine.stops)}")
    print(f"trajectory finishes {dict(Counter(t.finish for t in done))}")
    print(f"mean top-{args.top_k_entropy} entropy {sum(entropies) / max(len(entropies), 1):.4f} "
          f"over {len(entropies)} model tokens; mean reward {sum(rewards) / len(rewards):.3f}")  # fmt: skip
    print(f"example response:\n{tokenizer.decode(done[0].response_ids)}\n")

    errors = invariant_errors(done)
    checks.add("engine: rollouts well-formed", not errors,
               f"{len(done)} rollouts, {engine.tokens} tokens" if not errors else "; ".join(errors[:5]))
    checks.add("engine: prompts served from the prefix cache", cached > 0, f"{cached} of {prompt_tokens} prompt tokens")

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    lp_max, lp_mean, ent_max, ent_mean = compare_with_transformers(args, model, done)
    checks.add("engine: log-probs and entropies equal transformers'", lp_mean <= args.logprob_tol,
               f"log-prob |diff| max {lp_max:.2e} mean {lp_mean:.2e}; entropy |diff| max {ent_max:.2e} mean {ent_mean:.2e}; "
               f"--logprob-tol {args.logprob_tol}")

    # A weight push, as the trainer's after each update: vLLM must sample from the new weights.
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.1 * torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype))
    moved = compare_with_transformers(args, model, done)[1]  # the old rollouts under the new weights
    try:
        vllm.push_weights(model.named_parameters())
        followed = compare_with_transformers(args, model, rollouts())[1]
        checks.add("engine: pushed weights reach vLLM", followed <= args.logprob_tol and moved > 10 * followed,
                   f"mean log-prob |diff| to the pushed weights {followed:.2e}, to the old ones {moved:.2e}")
    except Exception as exc:
        checks.add("engine: pushed weights reach vLLM", False, f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":  # vLLM starts worker processes: keep the work under this guard
    sys.exit(main())
