"""VLLMEngine on CPU: vLLM itself is faked (a stand-in ``vllm`` module and a scripted ``LLM``),
so these tests check the mapping from vLLM's outputs to ``Sample`` and what the engine asks
vLLM for, not vLLM."""
from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace

import pytest

from cbpo.rollout.agent import run_agent
from cbpo.rollout.vllm_engine import VLLMEngine
from cbpo.trajectory import Trajectory


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLMClass:
    """Stands in for ``vllm.LLM`` when the engine builds one; records its arguments."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        FakeLLMClass.built.append(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    module.TokensPrompt = dict  # a TypedDict in vLLM: calling it makes a plain dict
    module.LLM = FakeLLMClass
    FakeLLMClass.built = []
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def lp(token_id: int, logprob: float) -> tuple[int, SimpleNamespace]:
    return token_id, SimpleNamespace(logprob=logprob)


def completion(token_ids, positions, finish_reason="length", stop_reason=None) -> SimpleNamespace:
    """A vLLM ``RequestOutput`` with one ``CompletionOutput``; ``positions`` are the per-token
    ``{token_id: Logprob}`` dicts."""
    out = SimpleNamespace(
        token_ids=list(token_ids),
        logprobs=[dict(p) for p in positions],
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return SimpleNamespace(outputs=[out])


class RecordingLLM:
    """Returns prepared outputs, one list per ``generate`` call, and records each call."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls: list[tuple[list, list, dict]] = []

    def generate(self, prompts, params, **kwargs):
        self.calls.append((prompts, params, kwargs))
        return self.replies[len(self.calls) - 1]


def only(token_id: int, logprob: float = -0.1):
    """A position whose logprob dict holds just the sampled token (enough for stop tests)."""
    return [lp(token_id, logprob)]


def engine_with(llm, tokenizer, **kwargs) -> VLLMEngine:
    return VLLMEngine("fake/model", tokenizer, llm=llm, **kwargs)


def test_one_generate_call_with_token_prompts_and_per_row_params(fake_vllm, tokenizer):
    llm = RecordingLLM([
        completion([5, 6], [only(5), only(6)]),
        completion([7], [only(7)]),
    ])  # fmt: skip
    engine = engine_with(llm, tokenizer, top_k_entropy=4, temperature=0.7, top_p=0.9)
    samples = engine.sample([[1, 2, 3], [4], [8, 9]], [5, 0, 7], {30, 11}, ["</x>"])

    assert len(llm.calls) == 1
    prompts, params, kwargs = llm.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [8, 9]}]  # cap 0 not sent
    assert kwargs == {"use_tqdm": False}
    assert [p.kwargs["max_tokens"] for p in params] == [5, 7]
    first = params[0].kwargs
    assert first["stop_token_ids"] == [11, 30]
    assert first["stop"] == ["</x>"]
    assert first["include_stop_str_in_output"] is True
    assert first["logprobs"] == 4
    assert (first["temperature"], first["top_p"], first["n"]) == (0.7, 0.9, 1)
    assert "seed" not in first  # identical contexts must not share a request seed

    assert [s.token_ids for s in samples] == [[5, 6], [], [7]]
    assert samples[1].stop == "length" and samples[1].logprobs == [] and samples[1].entropies == []


def test_all_zero_caps_call_nothing(fake_vllm, tokenizer):
    llm = RecordingLLM()
    samples = engine_with(llm, tokenizer).sample([[1], [2]], 0)
    assert llm.calls == []
    assert [(s.token_ids, s.stop) for s in samples] == [([], "length"), ([], "length")]


def test_sampled_logprob_and_top_k_entropy_by_hand(fake_vllm, tokenizer):
    # K = 3. Position 0: the sampled token 42 (p = 0.05) lies outside the top 3 and comes as an
    # extra entry that must not enter the entropy. Position 1: the sampled token 2 is in the
    # top 3. Position 2: masked tokens (log 0) contribute 0 log 0 = 0.
    positions = [
        [lp(1, math.log(0.5)), lp(2, math.log(0.3)), lp(3, math.log(0.1)), lp(42, math.log(0.05))],
        [lp(1, math.log(0.6)), lp(2, math.log(0.2)), lp(3, math.log(0.1))],
        [lp(5, 0.0), lp(6, -math.inf), lp(7, -math.inf)],
    ]
    llm = RecordingLLM([completion([42, 2, 5], positions)])
    (s,) = engine_with(llm, tokenizer, top_k_entropy=3).sample([[1]], 3)

    assert s.token_ids == [42, 2, 5]
    assert s.logprobs == pytest.approx([math.log(0.05), math.log(0.2), 0.0])
    # -(0.5 ln 0.5 + 0.3 ln 0.3 + 0.1 ln 0.1); -(0.6 ln 0.6 + 0.2 ln 0.2 + 0.1 ln 0.1); 0
    assert s.entropies == pytest.approx([0.9380239, 0.8586415, 0.0], abs=1e-6)
    assert all(isinstance(x, float) for x in s.logprobs + s.entropies)


def test_entropy_keeps_only_the_k_largest(fake_vllm, tokenizer):
    # With K = 1 only the top token counts, whichever order vLLM lists the entries in.
    positions = [[lp(9, math.log(0.1)), lp(4, math.log(0.7))]]
    llm = RecordingLLM([completion([9], positions)])
    (s,) = engine_with(llm, tokenizer, top_k_entropy=1).sample([[1]], 1)
    assert s.entropies == pytest.approx([-0.7 * math.log(0.7)])
    assert s.logprobs == pytest.approx([math.log(0.1)])


def test_stop_reasons(fake_vllm, tokenizer):
    eos = tokenizer.eos_token_id
    stop_tag = tokenizer.convert_tokens_to_ids("</python>")
    other_eos = 13  # e.g. a generation-config EOS that vLLM adds to the stop ids itself
    llm = RecordingLLM([
        completion([20, 21], [only(20), only(21)], "length"),
        completion([20, 22], [only(20), only(22)], "stop", "</answer>"),
        completion([20, stop_tag], [only(20), only(stop_tag)], "stop", stop_tag),
        completion([eos], [only(eos)], "stop", None),
        completion([20, other_eos], [only(20), only(other_eos)], "stop", other_eos),
        completion([stop_tag], [only(stop_tag)], "stop", None),  # a stop id that is also an EOS
    ])  # fmt: skip
    samples = engine_with(llm, tokenizer).sample([[1]] * 6, 2, {stop_tag}, ["</answer>"])

    assert [(s.stop, s.stop_match) for s in samples] == [
        ("length", None),
        ("stop_string", "</answer>"),
        ("stop_token", stop_tag),
        ("eos", eos),
        ("eos", other_eos),
        ("stop_token", stop_tag),
    ]
    assert samples[2].token_ids == [20, stop_tag]  # the stop token stays in the output


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (completion([20], [only(20)], "abort"), "finished with 'abort'"),
        (completion([20, 21], [only(20)]), "1 logprob entries for 2 tokens"),
        (completion([20], [only(99)]), "sampled token 20 has no logprob"),
    ],
)
def test_malformed_vllm_output_raises(fake_vllm, tokenizer, reply, message):
    engine = engine_with(RecordingLLM([reply]), tokenizer)
    with pytest.raises(RuntimeError, match=message):
        engine.sample([[1]], 2)


def test_bad_arguments_are_named(fake_vllm, tokenizer):
    engine = engine_with(RecordingLLM(), tokenizer)
    with pytest.raises(ValueError, match="2 entries for 1 contexts"):
        engine.sample([[1]], [1, 2])
    with pytest.raises(ValueError, match="context 1 is empty"):
        engine.sample([[1], []], 1)
    with pytest.raises(ValueError, match=r"max_new_tokens\[0\] is negative"):
        engine.sample([[1]], [-1])
    with pytest.raises(TypeError, match="not one string"):
        engine.sample([[1]], 1, stop_strings="</python>")
    with pytest.raises(ValueError, match="top_k_entropy"):
        engine_with(RecordingLLM(), tokenizer, top_k_entropy=0)


def test_builds_llm_with_prefix_caching_and_raw_logprobs(fake_vllm, tokenizer):
    engine = VLLMEngine("org/model", tokenizer, top_k_entropy=32, seed=3, max_model_len=4096,
                        llm_kwargs={"dtype": "bfloat16"})  # fmt: skip
    assert isinstance(engine.llm, FakeLLMClass)
    (kwargs,) = FakeLLMClass.built
    assert kwargs["model"] == "org/model"
    assert kwargs["enable_prefix_caching"] is True
    assert kwargs["logprobs_mode"] == "raw_logprobs"
    assert kwargs["max_logprobs"] == 32  # above vLLM's default cap of 20
    assert (kwargs["seed"], kwargs["max_model_len"], kwargs["dtype"]) == (3, 4096, "bfloat16")
    VLLMEngine("org/model", tokenizer, top_k_entropy=10)
    assert FakeLLMClass.built[1]["max_logprobs"] == 20


def test_missing_vllm_names_the_gpu_environment(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match="needs a GPU environment: see environment.yml"):
        VLLMEngine("org/model", tokenizer)


class ScriptedLLM:
    """Plays back text as vLLM would: call k gives every prompt ``script[k]``, tokenised and cut
    at the first stop token, EOS, stop string or ``max_tokens``, each token with logprob
    ``LOGPROB`` and a fixed top-2 distribution around it."""

    LOGPROB = math.log(0.25)
    TOP2 = (math.log(0.5), math.log(0.3))  # top-2 tokens other than the sampled one
    ENTROPY = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3))

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer = tokenizer
        self.script = script
        self.prompts: list[list[list[int]]] = []

    def generate(self, prompts, params, use_tqdm=True):
        text = self.script[len(self.prompts)]
        self.prompts.append([p["prompt_token_ids"] for p in prompts])
        return [self._one(text, p.kwargs) for p in params]

    def _one(self, text, kw) -> SimpleNamespace:
        ids, positions = [], []
        for tok in self.tokenizer.encode(text, add_special_tokens=False):
            ids.append(tok)
            positions.append([lp(100000, self.TOP2[0]), lp(100001, self.TOP2[1]), lp(tok, self.LOGPROB)])
            if tok in kw["stop_token_ids"]:
                return completion(ids, positions, "stop", tok)
            if tok == self.tokenizer.eos_token_id:
                return completion(ids, positions, "stop", None)
            hits = [s for s in kw["stop"] if s in self.tokenizer.decode(ids)]
            if hits:
                return completion(ids, positions, "stop", hits[0])
            if len(ids) == kw["max_tokens"]:
                return completion(ids, positions, "length")
        raise AssertionError(f"scripted text {text!r} ended without a stop")


def test_run_agent_end_to_end_over_vllm_engine(fake_vllm, tokenizer):
    llm = ScriptedLLM(tokenizer, ["<python>print(1)</python>", "<answer>\\boxed{1}</answer>"])
    engine = engine_with(llm, tokenizer, top_k_entropy=2)
    codes = []

    def python(code: str) -> str:
        codes.append(code)
        return "1\n"

    prompt = tokenizer.encode("What is 1?")
    (t,) = run_agent(engine, tokenizer, [Trajectory(prompt_ids=prompt)], {"python": python})

    assert t.finish == "answer" and t.tool_calls == 1
    assert codes == ["print(1)"]
    assert tokenizer.decode(t.response_ids) == (
        "<python>print(1)</python><result>\n1\n</result><answer>\\boxed{1}</answer>"
    )
    assert len(llm.prompts) == 2  # one generate call per agent round
    first_turn = tokenizer.encode("<python>print(1)</python><result>\n1\n</result>", add_special_tokens=False)
    assert llm.prompts[1] == [prompt + first_turn]  # the second round continues the token prefix
    n = len(t.response_ids)
    assert len(t.model_mask) == len(t.logprobs) == len(t.entropies) == n
    for m, logprob, entropy in zip(t.model_mask, t.logprobs, t.entropies):
        if m:
            assert logprob == pytest.approx(ScriptedLLM.LOGPROB)
            assert entropy == pytest.approx(ScriptedLLM.ENTROPY)
        else:
            assert logprob == 0.0 and entropy == 0.0
