"""``python -m cbpo.train backend=verl`` on a machine without the GPU stack stops at once,
naming what is missing, and writes nothing; ``verl.dry_run=true`` prints the generated,
verl-validated config on any machine; methods that need the policy in their own steps are
refused. What the launch writes for verl's processes is read back by verl's own dataset and
agent-loop registration. The launch past the GPU check (Ray, the task runner, the worker
groups) needs a GPU cluster and is not exercised here."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.backends.verl import agent_loop, credit
from cbpo.backends.verl.launch import missing_gpu_stack, run_verl, write_inputs

pytest.importorskip("verl")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def train(tmp_path, *overrides):
    return subprocess.run([sys.executable, "-m", "cbpo.train", "stage=rl", "method=cbpo", "preset=paper", "backend=verl",
                           *overrides], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)


@pytest.mark.skipif(not missing_gpu_stack(), reason="this machine can run verl")
def test_verl_backend_fails_fast_without_gpus_and_writes_nothing(tmp_path):
    out = train(tmp_path)
    assert out.returncode != 0
    assert "backend=verl needs the GPU environment (environment.yml): torch sees no CUDA GPU" in out.stderr
    assert [p.name for p in tmp_path.iterdir()] in ([], ["train.log"])  # Hydra's job log only: no run folder


def test_dry_run_prints_the_validated_verl_config(tmp_path):
    out = train(tmp_path, "verl.dry_run=true", "verl.nodes=2")
    assert out.returncode == 0, out.stderr
    assert "adv_estimator: cbpo_suite_credit" in out.stdout and "nnodes: 2" in out.stdout
    assert [p.name for p in tmp_path.iterdir()] in ([], ["train.log"])  # Hydra's job log only: no run folder


def test_sft_is_refused_on_the_verl_backend(tmp_path):
    out = train(tmp_path, "stage=sft")
    assert out.returncode != 0 and "backend=verl runs the RL stage" in out.stderr


CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def composed(*overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["backend=verl", *overrides])
    schema.validate(cfg)
    return cfg


@pytest.mark.parametrize(("method", "why"), [("opd", "needs the policy model"), ("oc_grpo", "needs the policy model"),
                                           ("dapo", "chooses among more problems than it trains on")])
def test_methods_verls_agent_loop_cannot_serve_are_refused_before_anything_is_written(tmp_path, method, why):
    cfg = composed("stage=rl", f"method={method}", "preset=paper")
    with pytest.raises(ValueError, match=f"method={method} {why}.*backend=local"):
        run_verl(cfg, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


class FakeServer:
    """verl's ``LLMServerClient.generate`` under the suite's server contract: every context is
    answered at once, stopped by the answer's closing tag."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.prompts.append(prompt_ids)
        await asyncio.sleep(0)
        ids = self.tokenizer.encode("<answer>3</answer>", add_special_tokens=False)
        # as vLLM: the stop token's id where the closing tag is one token, else the stop string
        stop = ids[-1] if ids[-1] in sampling_params["stop_token_ids"] else "</answer>"
        assert stop in sampling_params["stop_token_ids"] + sampling_params["stop"]
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={
            agent_loop.ENTROPIES: [0.25] * len(ids), agent_loop.FINISH: "stop", agent_loop.STOP: stop})


def test_verls_dataset_and_agent_loop_worker_read_what_the_launch_writes(tmp_path):
    # What verl's processes do with the launch's files, on CPU: its dataset reads the rows, and
    # its agent-loop worker registers the config's default agent loop from the file and builds
    # it as verl does for each row; the M rows of one uid return the group's M rollouts.
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from cbpo.backends.verl.config import build
    from cbpo.chat import build_prompt
    from cbpo.models import train_tokenizer

    cfg = composed("stage=rl", "method=grpo", "preset=smoke", "data=twohop", "verl.gpus_per_node=1",
                   "verl.tensor_parallel=1")
    out = tmp_path / "run"
    generated = build(cfg, schema.method_config(cfg), schema.settings(cfg, "rl"), schema.settings(cfg, "verl"),
                      str(out / "verl" / "train.parquet"), out)
    rows = [{"id": "q1", "question": "Who founded the city?", "answer": "3", "domain": "search"},
            {"id": "q2", "question": "Where was she born?", "answer": "4", "domain": "search"}]
    write_inputs(cfg, generated, rows)
    tokenizer = train_tokenizer(["<answer>3</answer> Who founded the city? Where was she born?"] * 20, 300)

    dataset = create_rl_dataset(generated.data.train_files, generated.data, tokenizer, None)
    assert [json.loads(dataset[i]["extra_info"]["row"]) for i in range(len(rows))] == rows

    rollout = generated.actor_rollout_ref.rollout
    registry = {c.name: c for c in OmegaConf.load(rollout.agent.agent_loop_config_path)}
    server = FakeServer(tokenizer)

    async def verl_worker(row):
        def build_loop():  # as verl's AgentLoopWorker._run_agent_loop, once per batch row
            return hydra.utils.instantiate(
                registry[rollout.agent.default_agent_loop], trainer_config=DictConfigWrap(generated),
                server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                dataset_cls=RLHFDataset, data_config=DictConfigWrap(generated.data), tools=ToolListWrap([]))
        return await asyncio.gather(*(build_loop().run({}, uid="uid-1", **row) for _ in range(rollout.n)))

    outputs = asyncio.run(verl_worker(dataset[0]))
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    assert [o.extra_fields["cbpo_index"] for o in outputs] == list(range(rollout.n)) and rollout.n == 4
    prompt = build_prompt(tokenizer, rows[0]["question"], None)  # the smoke preset has no system prompt
    assert server.prompts == [prompt] * rollout.n and all(o.prompt_ids == prompt for o in outputs)
    for o in outputs:
        assert o.reward_score is not None and o.extra_fields["cbpo_domain"] == "search"
        assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) > 0
        assert set(credit.FIELDS) <= set(o.extra_fields)
    # the built-in corpus has no cache: calls are counted, hits and misses are not
    assert [o.extra_fields["cbpo_search_calls"] for o in outputs] == [0] * rollout.n  # the replies never search
    assert all(o.extra_fields["cbpo_search_cache_hits"] is None for o in outputs)
