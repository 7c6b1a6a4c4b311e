"""VLLMEngine on CPU: vLLM itself is faked (a stand-in ``vllm`` module and a scripted ``LLM``),
so these tests check the mapping from vLLM's outputs to ``Sample`` and what the engine asks
vLLM for, not vLLM."""
from __future__ import annotations

import gc
import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from cbpo.rollout.agent import AgentConfig, run_agent
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


def completion(token_ids, positions, finish_reason="length", stop_reason=None, cached=0) -> SimpleNamespace:
    """A vLLM ``RequestOutput`` with one ``CompletionOutput``; ``positions`` are the per-token
    ``{token_id: Logprob}`` dicts, ``cached`` the prompt tokens served from the prefix cache."""
    out = SimpleNamespace(
        token_ids=list(token_ids),
        logprobs=[dict(p) for p in positions],
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return SimpleNamespace(outputs=[out], num_cached_tokens=cached)


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


def test_rollout_counts_add_up_prompts_sent_and_cached(fake_vllm, tokenizer):
    llm = RecordingLLM([completion([5], [only(5)], cached=0), completion([6], [only(6)], cached=32)],
                       [completion([7], [only(7)], cached=None)])
    engine = engine_with(llm, tokenizer)
    zero = {"prefill_tokens": 0, "prefill_cached_tokens": 0, "prefill_computed_tokens": 0, "engine_steps": 0, "engine_step_rows": 0}
    assert engine.rollout_counts() == zero
    engine.sample([[1] * 40, [2] * 50, [3] * 9], [1, 1, 0])  # the cap-0 row is never sent
    engine.sample([[4] * 7], 1)
    # plain sample calls are LLM.generate's steps, not counted
    assert engine.rollout_counts() == {**zero, "prefill_tokens": 97, "prefill_cached_tokens": 32, "prefill_computed_tokens": 65}


def test_push_reloads_through_the_model_runner_then_drops_the_prefix_cache(fake_vllm, tokenizer):
    calls = []

    class PushLLM:
        def collective_rpc(self, method, kwargs):
            calls.append((method, list(kwargs["weights_iterator"])))

        def reset_prefix_cache(self):
            calls.append("reset")
            return True

    weight = torch.ones(2, requires_grad=True)
    engine_with(PushLLM(), tokenizer).push_weights([("model.norm.weight", weight)])
    (method, pairs), reset = calls
    assert method == "reload_weights" and reset == "reset"  # not model.load_weights: vLLM's CPU build prepacks
    assert [name for name, _ in pairs] == ["model.norm.weight"] and not pairs[0][1].requires_grad


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
    VLLMEngine("org/model", tokenizer, top_k_entropy=10, llm_kwargs={"block_size": 64})
    assert FakeLLMClass.built[1]["max_logprobs"] == 20
    if not torch.cuda.is_available():  # vLLM's CPU build: eager, 32-token blocks unless told otherwise
        assert (kwargs["enforce_eager"], kwargs["block_size"]) == (True, 32)
        assert FakeLLMClass.built[1]["block_size"] == 64


def test_missing_vllm_names_the_gpu_environment(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match="needs a GPU environment: see environment.yml"):
        VLLMEngine("org/model", tokenizer)


class ScriptedLLM:
    """Plays back text as vLLM's engine would, over ``enqueue`` and ``llm_engine.step()``: a row's
    k-th request gets ``script[k]`` (``script[prompt][k]`` when ``script`` is keyed by the row's
    first prompt), tokenised and cut at the first stop token, EOS, stop string or ``max_tokens``,
    each token with logprob ``LOGPROB`` and a fixed top-2 distribution around it. A request
    decodes one token per step, so one of n tokens finishes n steps after it was enqueued."""

    LOGPROB = math.log(0.25)
    TOP2 = (math.log(0.5), math.log(0.3))  # top-2 tokens other than the sampled one
    ENTROPY = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3))

    def __init__(self, tokenizer, script: list[str] | dict[tuple[int, ...], list[str]]):
        self.tokenizer = tokenizer
        self.script = script
        self.prompts: list[list[list[int]]] = []  # per enqueue call
        self.sent: list[list[int]] = []  # every request's prompt, in order
        self.live: dict[str, list] = {}  # request id -> [steps left, output]
        self.steps = 0
        self.enqueued_at: list[int] = []  # the step count when each request arrived
        self.llm_engine = self

    def enqueue(self, prompts, params, use_tqdm=True):
        ids = []
        self.prompts.append([p["prompt_token_ids"] for p in prompts])
        for prompt, p in zip(prompts, params):
            ctx = prompt["prompt_token_ids"]
            turns = self.script if isinstance(self.script, list) else next(
                v for k, v in self.script.items() if tuple(ctx[: len(k)]) == k)
            turn = sum(ctx[: len(old)] == old for old in self.sent)  # the row's earlier requests
            out = self._one(turns[turn], p.kwargs)
            request_id = str(len(self.sent))
            self.sent.append(list(ctx))
            self.enqueued_at.append(self.steps)
            self.live[request_id] = [len(out.outputs[0].token_ids), SimpleNamespace(request_id=request_id, finished=True, **vars(out))]
            ids.append(f"{request_id}-{request_id:0>8}")  # vLLM's internal id: the external one and 8 random characters
        return ids

    def step(self):
        self.steps += 1
        for entry in self.live.values():
            entry[0] -= 1
        done = [rid for rid, (left, _) in self.live.items() if left == 0]
        return [self.live.pop(rid)[1] for rid in done]

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


@pytest.mark.parametrize("admission", ["stream", "rounds"])
def test_run_agent_end_to_end_over_vllm_engine(fake_vllm, tokenizer, admission):
    llm = ScriptedLLM(tokenizer, ["<python>print(1)</python>", "<answer>\\boxed{1}</answer>"])
    engine = engine_with(llm, tokenizer, top_k_entropy=2, admission=admission)
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
    assert len(llm.prompts) == 2  # one request per turn
    first_turn = tokenizer.encode("<python>print(1)</python><result>\n1\n</result>", add_special_tokens=False)
    assert llm.prompts[1] == [prompt + first_turn]  # the second turn continues the token prefix
    n = len(t.response_ids)
    assert len(t.model_mask) == len(t.logprobs) == len(t.entropies) == n
    for m, logprob, entropy in zip(t.model_mask, t.logprobs, t.entropies):
        if m:
            assert logprob == pytest.approx(ScriptedLLM.LOGPROB)
            assert entropy == pytest.approx(ScriptedLLM.ENTROPY)
        else:
            assert logprob == 0.0 and entropy == 0.0
    assert engine.rollout_counts()["prefill_tokens"] == len(prompt) + len(prompt + first_turn)


def test_stream_admits_a_row_back_while_others_decode_and_rounds_wait_for_the_slowest(fake_vllm, tokenizer):
    """A short tool call and a long answer: under "stream" the short row's second turn joins at
    the step after its observation, while the long one is still decoding; under "rounds" it waits
    for the long one to end. The trajectories are the same either way."""
    short, long = tokenizer.encode("Short?"), tokenizer.encode("Long?")
    script = {tuple(short): ["<python>1</python>", "<answer>1</answer>"],
              tuple(long): ["<answer>" + "word " * 40 + "</answer>"]}
    runs = {}
    for admission in ("stream", "rounds"):
        llm = ScriptedLLM(tokenizer, script)
        engine = engine_with(llm, tokenizer, top_k_entropy=2, admission=admission)
        done = run_agent(engine, tokenizer, [Trajectory(prompt_ids=short), Trajectory(prompt_ids=long)],
                         {"python": lambda code: "1\n"}, AgentConfig(max_new_tokens=256, max_total_tokens=512))
        runs[admission] = (llm, engine, [(t.response_ids, t.finish) for t in done])
    (s_llm, s_engine, s_out), (r_llm, r_engine, r_out) = runs["stream"], runs["rounds"]
    assert s_out == r_out and all(finish == "answer" for _, finish in s_out)
    first_turn, answer = (len(tokenizer.encode(x, add_special_tokens=False)) for x in ("<python>1</python>", "<answer>1</answer>"))
    long_turn = len(tokenizer.encode("<answer>" + "word " * 40 + "</answer>", add_special_tokens=False))
    assert long_turn > first_turn + answer
    assert s_llm.enqueued_at == [0, 0, first_turn]  # back in at once
    assert r_llm.enqueued_at == [0, 0, long_turn]  # after the slowest row of the round
    assert s_engine.engine_steps == long_turn and r_engine.engine_steps == long_turn + answer
    # the same row-steps of work either way (rows unfinished, summed over steps), in fewer steps
    assert s_engine.engine_step_rows == r_engine.engine_step_rows == first_turn + answer + long_turn


def test_a_failed_run_aborts_its_unfinished_requests(fake_vllm, tokenizer):
    llm = ScriptedLLM(tokenizer, ["<answer>" + "word " * 10 + "</answer>"])
    aborted = []
    llm.abort_request = aborted.extend
    engine = engine_with(llm, tokenizer, top_k_entropy=2)
    with pytest.raises(RuntimeError, match="tool broke"):
        with engine.batch() as batch:
            batch.admit("a", tokenizer.encode("Hi?"), 32)
            raise RuntimeError("tool broke")
    assert aborted == ["0"]


# ----------------------------------------------------------------------------- vLLM itself
# The tests below run the real vLLM (its CPU build here): one engine for the module.


@pytest.fixture(scope="module")
def real(tmp_path_factory, tokenizer):
    """``(engine, model)``: a VLLMEngine (float32, K = 10) over a saved tiny random Qwen3, and
    that model in transformers. Head size 32: the smallest vLLM's CPU attention takes."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3ForCausalLM(config).float().eval()
    path = tmp_path_factory.mktemp("vllm-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    engine = VLLMEngine(str(path), tokenizer, top_k_entropy=10, seed=0, llm_kwargs={"dtype": "float32"})
    yield engine, model
    del engine
    gc.collect()  # frees the engine's KV cache before the next module starts its own


def hf_logprobs_and_entropies(model, trajectories, k=10):
    """Per model token: the sampled token's log-prob and the top-k entropy of one plain
    transformers forward pass over the whole sequence."""
    lps, ents = [], []
    with torch.no_grad():
        for t in trajectories:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            for j, m in enumerate(t.model_mask):
                if m:
                    row = logp[len(t.prompt_ids) + j - 1]
                    top = row.topk(k).values.exp()
                    lps.append(row[t.response_ids[j]].item())
                    ents.append(-(top * top.log()).sum().item())
    return lps, ents


def engine_values(trajectories):
    lps = [lp for t in trajectories for lp, m in zip(t.logprobs, t.model_mask) if m]
    ents = [e for t in trajectories for e, m in zip(t.entropies, t.model_mask) if m]
    return lps, ents


def prompts(tokenizer):
    texts = ["What is 12 + 7 * 3?", "Who wrote the novel?", "def f(x):\n    return x * 2\nprint(f(21))",
             "xyz", "Let me compute it with Python. What is 12 + 7 * 3? The answer is in the passage."]
    return [tokenizer.encode(t) for t in texts]


@pytest.mark.engines
def test_vllm_logprobs_equal_the_trainers_and_entropies_a_transformers_pass(real, tokenizer):
    import numpy as np

    from cbpo.logprobs import rollout_tensors, token_logprobs

    engine, model = real
    start = [Trajectory(prompt_ids=p) for p in prompts(tokenizer) for _ in range(2)]
    done = run_agent(engine, tokenizer, start, {"python": lambda code: "1\n"})
    vllm_lp, vllm_ent = engine_values(done)
    assert len(vllm_lp) > 50
    # The trainer's own pass (left-padded prompts, right-padded responses, one batch).
    credits = [(np.zeros(t.n_model_tokens), np.ones(t.n_model_tokens)) for t in done]
    batch = rollout_tensors(done, credits, tokenizer.pad_token_id)
    with torch.no_grad():
        trainer_lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["n_resp"])
    trainer_lp = trainer_lp[batch["loss_mask"].bool()].tolist()
    _, hf_ent = hf_logprobs_and_entropies(model, done)
    lp_gap = max(abs(a - b) for a, b in zip(vllm_lp, trainer_lp))
    ent_gap = max(abs(a - b) for a, b in zip(vllm_ent, hf_ent))
    print(f"\n{len(vllm_lp)} model tokens: max |log-prob vLLM - trainer| {lp_gap:.2e}, "
          f"max |top-10 entropy vLLM - transformers| {ent_gap:.2e} (float32)")
    assert len(trainer_lp) == len(vllm_lp) == len(hf_ent)
    assert lp_gap < 1e-4 and ent_gap < 1e-4


@pytest.mark.engines
def test_pushed_weights_reach_vllm(real, tokenizer):
    """After a push vLLM samples from the new weights: its log-probs are the changed model's
    (and far from the old one's). vLLM's CPU build used to refuse the push outright."""
    import copy

    engine, model = real
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.2 * torch.randn_like(p))
    start = [Trajectory(prompt_ids=p) for p in prompts(tokenizer)]
    try:
        engine.push_weights(changed.named_parameters())
        done = run_agent(engine, tokenizer, start, {})
        got, _ = engine_values(done)
        new, _ = hf_logprobs_and_entropies(changed, done)
        old, _ = hf_logprobs_and_entropies(model, done)
    finally:
        engine.push_weights(model.named_parameters())
    to_new = max(abs(a - b) for a, b in zip(got, new))
    to_old = max(abs(a - b) for a, b in zip(got, old))
    print(f"\nafter a push: max |vLLM - changed model| {to_new:.2e}, max |vLLM - old model| {to_old:.2e}")
    assert to_new < 1e-4 < 1e-2 < to_old
    again = run_agent(engine, tokenizer, start, {})  # and back: the original weights
    assert max(abs(a - b) for a, b in zip(engine_values(again)[0], hf_logprobs_and_entropies(model, again)[0])) < 1e-4


@pytest.mark.engines
def test_a_branch_prefix_is_served_from_the_prefix_cache_until_a_push(real, tokenizer):
    engine, model = real
    context = tokenizer.encode("Who wrote the novel? " * 12)  # > 2 KV blocks of 32 tokens
    assert len(context) >= 70
    (parent,) = engine.sample([context], 20)
    branch = context + parent.token_ids[:10]

    def cached(ctx):
        before = engine.rollout_counts()
        engine.sample([ctx], 4)
        after = engine.rollout_counts()
        assert after["prefill_tokens"] - before["prefill_tokens"] == len(ctx)
        return after["prefill_cached_tokens"] - before["prefill_cached_tokens"]

    hit = cached(branch)
    print(f"\nbranch of {len(branch)} prompt tokens: {hit} served from the prefix cache")
    assert hit == (len(branch) - 1) // 32 * 32  # whole blocks; the last prompt token is always computed
    engine.push_weights(model.named_parameters())  # same weights, but the cache must go
    assert cached(branch) == 0


@pytest.mark.engines
def test_greedy_stream_and_rounds_sample_the_same_tokens(real, tokenizer):
    """The admission changes when rows join vLLM's batch, not what they sample. Rows start with
    0-16 tokens of their turn already written, so they reach the cap at different steps, and
    each finished parent but the longest is followed by a branch from half its response (as
    CBPO's are): under "stream" the branches join while other rows still decode and the batch
    ends sooner. Greedy, both sample alike."""
    engine, _ = real
    written = [(p * 20)[3:3 + 4 * i] for i, p in enumerate(prompts(tokenizer))]
    start = [Trajectory(prompt_ids=p[:3], response_ids=w, model_mask=[True] * len(w), logprobs=[0.0] * len(w),
                        entropies=[0.0] * len(w)) for p, w in zip(prompts(tokenizer), written)]

    def follow_up(k, t):
        if not 0 < k < len(start):  # the longest parent gets none: under "stream" nothing waits for it
            return []
        n = len(t.response_ids) // 2
        return [Trajectory(prompt_ids=t.prompt_ids, response_ids=t.response_ids[:n], model_mask=t.model_mask[:n],
                           logprobs=t.logprobs[:n], entropies=t.entropies[:n], kind="branch", parent=k)]

    cfg = AgentConfig(max_new_tokens=24, max_total_tokens=96)
    runs, temperature = {}, engine.temperature
    try:
        engine.temperature = 0.0
        for admission in ("stream", "rounds"):
            engine.admission, steps = admission, engine.engine_steps
            done = run_agent(engine, tokenizer, start, {}, cfg, follow_up)
            # follow-ups are appended as their parents finish, which differs: compare them by parent
            runs[admission] = (sorted((t.parent or -1, t.response_ids, t.finish) for t in done), engine.engine_steps - steps)
    finally:
        engine.temperature, engine.admission = temperature, "stream"
    (stream, stream_steps), (rounds, rounds_steps) = runs["stream"], runs["rounds"]
    print(f"\ngreedy, {len(stream)} rows: engine steps stream {stream_steps}, rounds {rounds_steps}")
    assert len(stream) == 2 * len(start) - 1
    assert stream == rounds
    assert stream_steps < rounds_steps
