"""The suite's vLLM server for verl (cbpo/backends/verl/server.py) on CPU, without vLLM.

verl's server module imports vLLM at load; as verl itself does where vLLM is missing
(``replica._load_sglang``), vLLM and the packages only it brings (msgspec, zmq) are stand-in
modules while that module and the suite's are imported, and sys.modules is restored afterwards.
A fake engine streams fake ``RequestOutput``s from a scripted distribution per position, so the
entropies, log-probs and finish reasons are known exactly; ``SamplingParams`` is a strict
stand-in that, like vLLM's, refuses a key it does not have."""
import asyncio
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.backends.verl import agent_loop
from cbpo.backends.verl import config as verl_config
from cbpo.rollout.engine import STOP_REASONS

pytest.importorskip("verl")
from verl.trainer.ppo import ray_trainer  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.config import RolloutConfig  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerManager  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402

from cbpo.backends.verl.trainer import SuiteTrainer  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
VLLM_ONLY = ("vllm", "msgspec", "zmq")  # vLLM and what only vLLM installs
# the modules that bind vLLM's names when imported: verl's vLLM modules and the suite's server
LOADED_OVER_STUBS = ("verl.third_party.vllm", "verl.utils.vllm", "verl.workers.rollout.vllm_rollout",
                     "cbpo.backends.verl.server")
VOCAB, EOS, STOP_ID, STOP_STRING = 16, 1, 2, "</python>"


@dataclass
class SamplingParams:
    """vLLM's ``SamplingParams`` as far as verl and the suite use it: an unknown key is a TypeError."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop_token_ids: list = field(default_factory=list)
    stop: list = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0
    ignore_eos: bool = False


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in VLLM_ONLY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        if spec.name == "vllm":
            module.__version__ = "0.24.0"  # environment.yml's pin
            module.SamplingParams, module.TokensPrompt = SamplingParams, dict
        if spec.name == "vllm.inputs":
            module.TokensPrompt = dict  # a TypedDict in vLLM
        return module

    def exec_module(self, module):
        pass


def _stubbed(name: str) -> bool:
    return name.split(".")[0] in VLLM_ONLY or name.startswith(LOADED_OVER_STUBS)


@pytest.fixture(scope="module")
def loaded():
    """verl's server module and the suite's, imported over vLLM stand-ins."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _stubbed(name)}
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    version = importlib.metadata.version
    try:
        # verl checks vLLM's installed version before it loads its vLLM modules
        with patch("importlib.metadata.version", lambda p: "0.24.0" if p == "vllm" else version(p)):
            from cbpo.backends.verl import server
            from verl.workers.rollout.vllm_rollout import vllm_async_server
        yield SimpleNamespace(server=server, verl=vllm_async_server)
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _stubbed(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


# --- a scripted vLLM -------------------------------------------------------------------------

def distribution(prompt_ids) -> tuple[list[np.ndarray], list[int], str]:
    """Per position the full next-token log-probs and the sampled token (ranks 0, 3, 6, 2, ...:
    often outside a small top K), then how the request ends: EOS, the stop token, the stop string."""
    seed = zlib.crc32(str(list(prompt_ids)).encode())
    rng = np.random.default_rng(seed)
    logps = []
    for _ in range(3 + seed % 5):
        z = rng.normal(size=VOCAB) * 2
        logps.append(z - np.log(np.exp(z).sum()))
    tokens = [int(np.argsort(-lp)[(3 * p) % 7]) for p, lp in enumerate(logps)]
    ending = ("eos", "stop_token", "stop_string")[seed // 5 % 3]
    tokens[-1] = {"eos": EOS, "stop_token": STOP_ID}.get(ending, tokens[-1])
    return logps, tokens, ending


def expected_entropies(prompt_ids, k: int, n: int) -> list[float]:
    """Eq. 6 from the full distribution: -sum p log p over its k most likely tokens."""
    logps, _, _ = distribution(prompt_ids)
    tops = [np.sort(lp)[::-1][:k] for lp in logps[:n]]
    return [float(-(np.exp(top) * top).sum()) for top in tops]


def stream(prompt_ids, params: SamplingParams):
    """vLLM's cumulative outputs for one request: one per generated token, the last finished."""
    logps, tokens, ending = distribution(prompt_ids)
    if len(tokens) > params.max_tokens:
        tokens, finish, why = tokens[: params.max_tokens], "length", None
    else:
        finish, why = "stop", {"eos": None, "stop_token": STOP_ID, "stop_string": STOP_STRING}[ending]
    entries = []
    for lp, tok in zip(logps, tokens):
        top = [] if params.logprobs is None else [int(t) for t in np.argsort(-lp)[: params.logprobs]]
        entries.append({t: SimpleNamespace(logprob=float(lp[t])) for t in top + [tok]})
    for m in range(1, len(tokens) + 1):
        done = m == len(tokens)
        yield SimpleNamespace(num_cached_tokens=len(prompt_ids) // 2, prompt_logprobs=None, outputs=[SimpleNamespace(
            token_ids=tokens[:m], logprobs=None if params.logprobs is None else entries[:m],
            finish_reason=finish if done else None, stop_reason=why if done else None)])


class FakeEngine:
    """vLLM's ``AsyncLLM.generate`` over the script; records each request's ``SamplingParams``."""

    def __init__(self):
        self.params = {}

    async def generate(self, prompt, sampling_params, request_id, **_):
        self.params[request_id] = sampling_params
        for output in stream(prompt["prompt_token_ids"], sampling_params):
            await asyncio.sleep(0)  # concurrent requests interleave
            yield output


class FakeLLM:
    """``vllm.LLM.generate`` over the same script, for the local vLLM engine."""

    def generate(self, prompts, params, use_tqdm=False):
        return [list(stream(p["prompt_token_ids"], sp))[-1] for p, sp in zip(prompts, params)]


@pytest.fixture()
def servers(loaded, monkeypatch):
    """The suite's server and verl's stock one, each on a fake engine. verl's constructor (Ray,
    ports, profiler) is replaced by the state its ``generate`` reads."""

    def verl_init(self, config, **_):
        self.config, self.model_config = config, SimpleNamespace(lora_rank=0, lora={}, processor=None)
        self.replica_rank, self.global_steps = 0, None
        self._disaggregation_role, self._pd_decode_peers = "null", []
        self._submission_paused, self._rejecting, self._admitting = False, False, 0

    monkeypatch.setattr(loaded.verl.vLLMHttpServer, "__init__", verl_init)
    config = RolloutConfig(name="vllm", prompt_length=64, response_length=64, max_model_len=256)
    suite, stock = loaded.server.SuiteServer(config=config), loaded.verl.vLLMHttpServer(config=config)
    suite.engine, stock.engine = FakeEngine(), FakeEngine()
    return suite, stock


def request(k=None, cap=5) -> dict:
    """The sampling parameters ``ServerEngine`` sends (with ``TOP_K`` only when k is given)."""
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": cap, "stop_token_ids": [STOP_ID],
              "stop": [STOP_STRING], "include_stop_str_in_output": True, "skip_special_tokens": False,
              "logprobs": True}
    return params if k is None else {**params, agent_loop.TOP_K: k}


PROMPTS = [[10 + i, 11, 12] for i in range(16)]


# --- the server ------------------------------------------------------------------------------

def test_entropies_and_vllms_finish_reasons_come_back_beside_verls_log_probs(servers):
    suite, stock = servers
    k = 3

    async def both(prompt, n):
        return await asyncio.gather(suite.generate(prompt, request(k), f"s{n}"), stock.generate(prompt, request(), f"v{n}"))

    endings, outside_top_k = set(), False
    for n, prompt in enumerate(PROMPTS):
        out, verl = asyncio.run(both(prompt, n))
        assert suite.engine.params[f"s{n}"].logprobs == k and stock.engine.params[f"v{n}"].logprobs == 0
        assert out.token_ids == verl.token_ids and out.log_probs == verl.log_probs  # the sampled tokens' = verl's
        assert out.stop_reason == verl.stop_reason == "completed"
        assert out.extra_fields[agent_loop.ENTROPIES] == pytest.approx(expected_entropies(prompt, k, len(out.token_ids)))
        final = list(stream(prompt, suite.engine.params[f"s{n}"]))[-1].outputs[0]
        assert (out.extra_fields[agent_loop.FINISH], out.extra_fields[agent_loop.STOP]) == (final.finish_reason,
                                                                                             final.stop_reason)
        assert out.extra_fields[agent_loop.CACHED] == len(prompt) // 2  # vLLM's prefix-cache hits, passed on
        endings.add((final.finish_reason, type(final.stop_reason)))
        outside_top_k |= any(len(e) == k + 1 for e in final.logprobs)
    # every way vLLM ends a request, and sampled tokens outside the top K, were exercised
    assert endings == {("stop", type(None)), ("stop", int), ("stop", str), ("length", type(None))} and outside_top_k


def test_a_request_without_k_gets_verls_stock_server(servers):
    suite, stock = servers
    out = asyncio.run(suite.generate(PROMPTS[0], request(), "a"))
    assert out == asyncio.run(stock.generate(PROMPTS[0], request(), "b"))
    assert not {agent_loop.ENTROPIES, agent_loop.FINISH, agent_loop.STOP, agent_loop.CACHED} & set(out.extra_fields)
    assert suite.engine.params["a"].logprobs == 0
    # the suite's key never reaches SamplingParams, which refuses it as vLLM's does
    with pytest.raises(TypeError, match=agent_loop.TOP_K):
        asyncio.run(stock.generate(PROMPTS[0], request(3), "c"))
    asyncio.run(suite.generate(PROMPTS[0], request(3), "d"))
    assert suite.engine.params["d"].logprobs == 3


def test_concurrent_requests_with_different_k_do_not_mix(servers):
    suite, _ = servers
    prompt = PROMPTS[3]

    async def together():
        return await asyncio.gather(suite.generate(prompt, request(2, cap=9), "two"),
                                    suite.generate(prompt, request(5, cap=9), "five"),
                                    suite.generate(prompt, request(cap=9), "none"))

    two, five, none = asyncio.run(together())
    assert [suite.engine.params[r].logprobs for r in ("two", "five", "none")] == [2, 5, 0]
    n = len(two.token_ids)
    assert n > 1 and two.token_ids == five.token_ids == none.token_ids
    assert two.extra_fields[agent_loop.ENTROPIES] == pytest.approx(expected_entropies(prompt, 2, n))
    assert five.extra_fields[agent_loop.ENTROPIES] == pytest.approx(expected_entropies(prompt, 5, n))
    assert agent_loop.ENTROPIES not in none.extra_fields


def test_an_aborted_request_is_an_error_not_a_sample(servers):
    suite, _ = servers

    class Aborting:
        async def generate(self, **_):
            yield SimpleNamespace(outputs=[])  # what vLLM sends for a request verl aborts

    suite.engine = Aborting()
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(suite.generate(PROMPTS[0], request(3), "x"))


def test_verls_router_keeps_one_request_id_on_one_server_and_its_client_sends_vllm_fresh_ids(loaded):
    # ServerEngine sends a problem's requests under one id (#37 item 2): verl 0.9.1's router must
    # then keep them on one server however loaded, and its client must not hand vLLM that id.
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    router = GlobalRequestLoadBalancer({"a": "server a", "b": "server b"})
    first, _ = router.acquire_server("uid-p")
    assert {router.acquire_server("uid-p")[0] for _ in range(8)} == {first}  # 9 in flight there, 0 on the other
    assert router.acquire_server("uid-q")[0] != first  # a new problem goes to the least loaded
    rollout = SimpleNamespace(full_determinism=False)
    client = LLMServerClient(SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout)))
    ids = {client._vllm_request_id("uid-p") for _ in range(4)}
    assert len(ids) == 4 and "uid-p" not in ids


def test_server_engine_over_the_suite_server_samples_as_the_local_vllm_engine(servers):
    from cbpo.rollout.vllm_engine import VLLMEngine

    suite, _ = servers
    k, caps = 3, [5, 4, 7, 5, 6, 5, 3, 5, 7, 5, 4, 6, 5, 7, 5, 5]

    async def client(request_id, *, prompt_ids, sampling_params):
        # verl's LLMServerClient, minus Ray: request_id picks the server, vLLM gets a fresh uuid
        return await suite.generate(prompt_ids, sampling_params, uuid.uuid4().hex)

    async def through_verl():
        engine = agent_loop.ServerEngine(client, asyncio.get_running_loop(), "uid", top_k_entropy=k)
        return await asyncio.to_thread(engine.sample, PROMPTS, caps, {STOP_ID}, (STOP_STRING,))

    remote = asyncio.run(through_verl())
    local = VLLMEngine("scripted", tokenizer=None, top_k_entropy=k, llm=FakeLLM()).sample(
        PROMPTS, caps, {STOP_ID}, (STOP_STRING,))
    assert remote == local
    assert {s.stop for s in local} == set(STOP_REASONS)


# --- the launch path and the config -----------------------------------------------------------

def generated(tmp_path, *overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["preset=paper", "backend=verl", *overrides])
    return verl_config.build(cfg, schema.method_config(cfg), schema.settings(cfg, "rl"), schema.settings(cfg, "verl"),
                             str(tmp_path / "train.parquet"), tmp_path)


def test_the_suites_trainer_makes_verls_vllm_replicas_run_the_suites_server(loaded, tmp_path, monkeypatch):
    """SuiteTaskRunner.run builds SuiteTrainer and calls its init_workers, where verl 0.9.1 builds
    its ``LLMServerManager``; that manager picks the replica class from the launch's config."""
    monkeypatch.setattr(RolloutReplicaRegistry, "_registry", dict(RolloutReplicaRegistry._registry))
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "__init__", lambda self, config, **_: setattr(self, "config", config))
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "init_workers",
                        lambda self: setattr(self, "servers", LLMServerManager(self.config, worker_group=object())))
    config = generated(tmp_path, "method=cbpo")
    trainer = SuiteTrainer(config=config, method=None, run_dir=tmp_path, log=None)
    trainer.init_workers()
    assert trainer.servers.rollout_replica_class is loaded.server.SuiteReplica
    replica = loaded.server.SuiteReplica(0, config.actor_rollout_ref.rollout, None)
    assert replica.server_class.__ray_actor_class__ is loaded.server.SuiteServer


@pytest.mark.parametrize(("method", "max_logprobs"), [("cbpo", 32), ("grpo", 20)])
def test_the_generated_config_asks_vllm_for_raw_top_k_logprobs(tmp_path, method, max_logprobs):
    extra = ["method.top_k=32"] if method == "cbpo" else []
    # verl's server reads its engine arguments from this dataclass (vLLMHttpServer._init_config)
    rollout = omega_conf_to_dataclass(generated(tmp_path, f"method={method}", *extra).actor_rollout_ref.rollout)
    assert rollout.logprobs_mode == "raw_logprobs"
    assert rollout.engine_kwargs["vllm"]["max_logprobs"] == max_logprobs
