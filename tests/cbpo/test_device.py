"""The local backend's device and precision plumbing (issue 12 part 1), on CPU: the trainer
builds its tensors on ``model.device`` (never a hard-coded device), runs forward passes in the
configured compute dtype, samples on the policy's device, and pushes the policy's weights into
a vLLM engine (faked) after every update."""
import sys
import types

import numpy as np
import pytest
import torch

import cbpo.backends.local.rl as rl
from cbpo.backends.local.sft import sft
from cbpo.logprobs import rollout_tensors
from cbpo.runlog import MetricsLog
from cbpo import stages
from cbpo.device import autocast, resolve_device, resolve_dtype
from cbpo.objective import ObjectiveConfig
from cbpo.registry import get_method
from cbpo.rollout.agent import AgentConfig
from cbpo.trajectory import Trajectory


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32  # bf16 only on a GPU that has it
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(RuntimeError, match="device=cuda but torch sees no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device("tpu")


def _traj():
    return Trajectory([5, 6], [8, 9, 10], [True, False, True], [-1.0] * 3, [0.5] * 3)


def test_rollout_tensors_land_on_the_device_asked_for():
    seen = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        seen.append(args[0] if args else kwargs.get("device"))
        return to(self, *args, **kwargs)

    credits = [(np.array([0.5, 0.7]), np.array([1, 1]))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "to", spy)
        batch = rollout_tensors([_traj()], credits, pad_id=0, device="cpu")
    assert seen == ["cpu"] * 4  # ids, attention, advantages, loss mask: each moved once
    assert all(batch[k].device == torch.device("cpu") for k in ("input_ids", "attention_mask", "advantages", "loss_mask"))


def test_policy_update_builds_its_batch_on_the_models_device_and_computes_in_dtype(model, monkeypatch):
    devices, dtypes = [], []
    build = rl.update_tensors

    def recording(*args, **kwargs):
        batch = build(*args, **kwargs)
        devices.append(batch["input_ids"].device)
        return batch

    monkeypatch.setattr(rl, "update_tensors", recording)
    model.lm_head.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = rl.policy_update(model, None, opt, [_traj()], [(np.ones(2), np.ones(2))], stages.RLConfig(),
                                  ObjectiveConfig(beta=0.0), 0, torch.bfloat16)
    assert devices == [model.device]
    assert dtypes == [torch.bfloat16]  # the forward ran under bf16 autocast ...
    assert next(model.parameters()).dtype == torch.float32  # ... while the weights stay float32
    assert np.isfinite(stats["loss"])


def test_sft_runs_on_the_models_device_in_dtype(model, tokenizer, tmp_path):
    seen = []
    model.lm_head.register_forward_hook(lambda _m, inputs, out: seen.append((inputs[0].device, out.dtype)))
    rows = [{"question": "What is 1 plus 2?", "trace": "<answer>\\boxed{3}</answer>"}]
    sft(model, tokenizer, rows, stages.SFTConfig(steps=1, batch_size=2, warmup_steps=0), tmp_path,
                MetricsLog(tmp_path / "m.jsonl"), None, torch.bfloat16)
    assert seen == [(model.device, torch.bfloat16)]


def test_autocast_is_off_for_float32():
    with autocast(torch.device("cpu"), torch.float32):
        assert not torch.is_autocast_enabled("cpu")


def test_hf_rollouts_sample_on_the_policys_device(model, tokenizer):
    engine = rl.rollout_engine(model, tokenizer, stages.RLConfig(), torch.float32, top_k_entropy=3)
    assert engine.device == model.device and engine.generator.device == model.device
    assert engine.top_k_entropy == 3


class FakeLLM:
    """``vllm.LLM`` as the trainer uses it: enqueue and its engine's steps (the agent loop's
    streaming batch), collective_rpc("reload_weights"), reset_prefix_cache."""

    instances = []

    def __init__(self, **kwargs):
        self.kwargs, self.events, self.weights, self.pending, self.requests = kwargs, [], None, [], 0
        self.llm_engine = self
        FakeLLM.instances.append(self)

    def enqueue(self, prompts, params, use_tqdm=True):
        if self.events[-1:] != ["rollout"]:
            self.events.append("rollout")
        ids = [str(self.requests + i) for i in range(len(params))]
        self.requests += len(ids)
        eos = self.kwargs["eos"]
        for request_id in ids:  # each prompt ends at once with EOS (stop_reason None)
            self.pending.append(types.SimpleNamespace(request_id=request_id, finished=True, num_cached_tokens=0, outputs=[
                types.SimpleNamespace(token_ids=[eos], logprobs=[{eos: types.SimpleNamespace(logprob=-0.5)}],
                                      finish_reason="stop", stop_reason=None)]))
        return ids

    def step(self):
        done, self.pending = self.pending, []
        return done

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        self.events.append("push")
        self.weights = dict(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        self.events.append("reset")
        return True


def test_vllm_rollouts_get_the_policys_weights_after_every_update(model, tokenizer, tmp_path, monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: types.SimpleNamespace(kwargs=kw)
    module.TokensPrompt = dict
    module.LLM = lambda **kw: FakeLLM(eos=tokenizer.eos_token_id, **kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.instances = []
    model.name_or_path = str(tmp_path / "init")
    method = get_method("grpo")(vocab_size=len(tokenizer), budget=2, beta=0.0)
    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = stages.RLConfig(steps=2, problems_per_step=1, lr=0.5, engine="vllm", vllm_gpu_memory=0.25,
                           agent=AgentConfig(max_new_tokens=4, max_total_tokens=8))
    rewards = iter([[0.0, 1.0], [1.0, 0.0]])  # a non-zero advantage: every step changes the weights
    rl.rl_train(model, tokenizer, method, rows, {}, lambda texts, rows: next(rewards), cfg, tmp_path,
                     MetricsLog(tmp_path / "m.jsonl"), None, torch.bfloat16)

    (llm,) = FakeLLM.instances
    assert llm.kwargs["model"] == str(tmp_path / "init") and llm.kwargs["dtype"] == "bfloat16"
    assert llm.kwargs["gpu_memory_utilization"] == 0.25
    # weights at start (a resumed policy differs from the checkpoint), then after each update;
    # the prefix cache is dropped with every push
    assert llm.events == ["push", "reset", "rollout", "push", "reset", "rollout", "push", "reset"]
    assert set(llm.weights) == {name for name, _ in model.named_parameters()}
    assert all(torch.equal(llm.weights[name], p) for name, p in model.named_parameters())
