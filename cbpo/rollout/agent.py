"""The tool-integrated agent loop (Sec. 3, Eq. 1): sample, run the tool a turn asks for, append
its observation as non-model tokens, and continue until an answer, EOS, or a cap.

``run_agent`` advances many trajectories in one running batch (continuous batching): a row
leaves at each tool call and rejoins with the observation, and follow-up rollouts (a problem's
branches once its parents are done) join as soon as they are known. ``run_jobs`` drives a
method's per-problem rollout plans through it. A trajectory may start from any prefix (empty,
mid-sentence, right after an observation, inside an unclosed ``<python>`` block): the loop only
looks at how each turn's sample ends.
"""
from __future__ import annotations

import inspect
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, Mapping, Sequence

from cbpo.chat import IM_END, TOOL_NAMES, TOOL_TAGS, format_observation, reserved_pattern, sanitise_observation
from cbpo.tools.sandbox import SandboxRefused
from cbpo.tools.search import NO_RESULTS
from cbpo.tools.search_cache import SearchCacheError
from cbpo.trajectory import Trajectory

Tool = Callable[[str], str]
# A broken setup, not the model's doing: it stops the run instead of poisoning observations.
SETUP_ERRORS = (SandboxRefused, SearchCacheError)

# Tool output is cut to this many characters per observation token before it is tokenised
# (tokenising a 20 MB output took 26 s); real text averages a few characters per token, so
# the token cap stays the one that binds.
OBS_CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class AgentConfig:
    """Caps, and the tags that end a turn (by default those of ``cbpo.chat``, the Tool-Star/ARPO
    format ``<python>…</python>`` → ``<result>…</result>`` → ``<answer>…</answer>``).

    The paper caps tool calls (Sec. 5.1) without giving the number; 3 is ours, room for the demo
    tasks' one or two calls plus a retry. Presets override the token caps.
    """

    max_tool_calls: int = 3  # a turn asking for call number max_tool_calls + 1 ends with "turns"
    max_new_tokens: int = 256  # per turn; a turn that reaches it ends the trajectory ("length")
    max_total_tokens: int = 512  # whole response, model and observation tokens together
    # Tool output kept per observation, in tokens; longer output is cut and a note appended.
    max_obs_tokens: int = 128
    tool_workers: int = 2  # threads running one round's calls of the tools in threaded_tools
    # Tools safe to call from worker threads: the Python sandbox is a subprocess per call.
    threaded_tools: tuple[str, ...] = ("python",)
    tool_tags: Mapping[str, tuple[str, str]] = field(
        default_factory=lambda: {name: TOOL_TAGS[name] for name in TOOL_NAMES}
    )
    answer_close: str = TOOL_TAGS["answer"][1]
    # End-of-turn markers besides the tokenizer's EOS (ChatML's, when it is not the EOS).
    end_strings: tuple[str, ...] = (IM_END,)

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")
        for name in ("tool_workers", "max_new_tokens", "max_total_tokens", "max_obs_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def run_agent(
    engine,
    tokenizer,
    trajectories: Sequence[Trajectory],
    tools: Mapping[str, Tool],
    cfg: AgentConfig | None = None,
    follow_up: Callable[[int, Trajectory], Sequence[Trajectory]] | None = None,
) -> list[Trajectory]:
    """Continue every unfinished trajectory to a finish; return them in the same order.

    The inputs are not modified: each returned trajectory is a new object (``kind``, ``parent``,
    ``at`` and ``reward`` carried over); already finished ones come back as copies.

    ``follow_up(k, t)`` is called as trajectory ``k`` finishes (numbered in the order given,
    then admitted); the trajectories it returns join the running batch at once and are
    appended, in order, to the result. A method whose next rollouts depend on earlier ones
    (CBPO's branches on its parents) thus never waits for the rest of the batch.

    Finishes: "answer" when the model closes ``</answer>``; "eos" on EOS or an end string;
    "length" when a turn reaches ``max_new_tokens`` (a trajectory that starts mid-turn, like a
    branch, counts the turn's tokens it already holds) or the response reaches
    ``max_total_tokens`` or the engine's ``max_context`` (an observation that would cross
    either is cut there); "turns" when the model closes a tool call after ``max_tool_calls``
    calls: that call is not run and gets no observation. A tool that raises, a call with no
    opening tag and an unknown tool each give an error observation instead of a crash; tool
    output is sanitised (``cbpo.chat.sanitise_observation``) so no text can crash the
    tokenizer, end the turn, close the observation or fake an answer.

    An engine with a ``batch`` (``HFEngine``, ``VLLMEngine``) decodes every row in one running
    batch: a row leaves it at a tool call and rejoins with its observation, reusing its own KV
    cache, and rows start from the kept cache of any finished row they continue. Other engines
    (verl's server engine) get one ``sample`` call per round for all unfinished rows.
    """
    cfg = cfg or AgentConfig()
    stops = _stop_table(tokenizer, cfg)
    reserved = reserved_pattern(tokenizer)
    max_context = getattr(engine, "max_context", None)  # engines without a limit have none
    stop_ids = {k for k in stops if isinstance(k, int)}
    stop_strings = [k for k in stops if isinstance(k, str)]
    out: list[Trajectory] = []
    finished: list[int] = []

    def admit(k: int) -> None:
        t = out[k]
        # A branch resumes mid-turn: its turn's cap counts the parent's tokens before the cut.
        budget = min(cfg.max_new_tokens - t.turn_tokens, cfg.max_total_tokens - len(t.response_ids))
        if not t.done and budget <= 0:
            t.finish = "length"
        if t.done:
            finished.append(k)
        else:
            batch.admit(k, t.prompt_ids + t.response_ids, budget)

    def add(trajs: Sequence[Trajectory]) -> None:
        for t in trajs:
            out.append(_copy(t))
            admit(len(out) - 1)

    if hasattr(engine, "batch"):
        running = engine.batch(stop_ids, stop_strings, keep_prefixes=True)
    else:
        running = _Rounds(engine, stop_ids, stop_strings)
    with running as batch, ThreadPoolExecutor(max_workers=cfg.tool_workers) as pool:
        add(trajectories)
        while True:
            while finished:
                k = finished.pop(0)
                if follow_up is not None:
                    add(follow_up(k, out[k]))
                else:  # only a follow-up could continue a finished trajectory
                    batch.forget(k)
            if not batch:
                break
            calls: list[tuple[int, str, str | None]] = []
            for k, s in batch.step():
                t = out[k]
                _extend(t, s.token_ids, True, s.logprobs, s.entropies)
                kind, tool = (s.stop, None) if s.stop in ("length", "eos") else stops[s.stop_match]
                if kind != "tool":
                    t.finish = kind
                elif t.tool_calls >= cfg.max_tool_calls:
                    t.finish = "turns"
                else:
                    calls.append((k, tool, _call_argument(tokenizer, t, *cfg.tool_tags[tool])))
                if t.done:
                    finished.append(k)
            # Calls of one step run together and rejoin together: the order rows join in (and so
            # the draws they get) never depends on how long a tool took.
            for (k, tool, _), (output, seconds) in zip(calls, _run_tools(pool, calls, tools, cfg)):
                t = out[k]
                t.tool_calls += 1
                t.tool_seconds += seconds
                obs = _observation_ids(tokenizer, output, cfg, reserved)
                room = cfg.max_total_tokens - len(t.response_ids)
                if max_context is not None:
                    room = min(room, max_context - len(t.prompt_ids) - len(t.response_ids))
                _extend(t, obs[:room], False)
                if shows_dead_end(output):
                    t.dead_ends.append(t.n_model_tokens)
                if len(obs) >= room:
                    t.finish = "length"
                admit(k)
    return out


class _Rounds:
    """The running-batch interface over an engine that only has ``sample`` (vLLM batches on
    its server): each step samples every waiting row to its stop in one call."""

    def __init__(self, engine, stop_ids, stop_strings):
        self.engine, self.stop_ids, self.stop_strings = engine, stop_ids, stop_strings
        self.waiting: list[tuple[int, list[int], int]] = []

    def __enter__(self) -> "_Rounds":
        return self

    def __exit__(self, *exc) -> None:
        self.waiting = []

    def __len__(self) -> int:
        return len(self.waiting)

    def admit(self, key: int, context: list[int], max_new_tokens: int) -> None:
        self.waiting.append((key, context, max_new_tokens))

    def forget(self, key: int) -> None:
        """Nothing to drop: such an engine keeps no cache between calls."""

    def step(self):
        rows, self.waiting = self.waiting, []
        samples = self.engine.sample([c for _, c, _ in rows], [n for _, _, n in rows], self.stop_ids, self.stop_strings)
        return [(k, s) for (k, _, _), s in zip(rows, samples)]


# A method's rollouts for one problem: yields the trajectories it wants sampled, is sent them
# back completed (same order), and finally returns its result (usually the problem's group).
Job = Generator[list[Trajectory], list[Trajectory], Any]


def run_jobs(jobs: Sequence[Job], sample: Callable[..., list[Trajectory]]) -> list[Any]:
    """Run per-problem jobs and return their results, in order.

    With a sampler that takes ``follow_up`` (``run_agent``'s), everything runs in one batch and
    a job's next request joins it as soon as its previous one is complete: no problem waits for
    another's rollouts. With a plain sampler (``list -> list``), the k-th requests of all jobs
    are sampled in one call, phase by phase. A job's empty request is answered at once.
    """
    results: list[Any] = [None] * len(jobs)
    owner: dict[int, tuple[int, int]] = {}  # sampled trajectory number -> (job, place in its request)
    got: list[list[Trajectory | None]] = [[] for _ in jobs]
    left = [0] * len(jobs)

    def advance(j: int, reply: list[Trajectory] | None) -> list[Trajectory]:
        """Send job ``j`` its completed request; return its next one (numbered), [] once done."""
        while True:
            try:
                request = jobs[j].send(reply)
            except StopIteration as stop:
                results[j] = stop.value
                return []
            if request:
                break
            reply = []
        got[j], left[j] = [None] * len(request), len(request)
        for place in range(len(request)):
            owner[len(owner)] = (j, place)
        return request

    if "follow_up" in inspect.signature(sample).parameters:
        def follow_up(k: int, t: Trajectory) -> list[Trajectory]:
            j, place = owner[k]
            got[j][place] = t
            left[j] -= 1
            return advance(j, got[j]) if left[j] == 0 else []

        first = [t for j in range(len(jobs)) for t in advance(j, None)]
        if first:
            sample(first, follow_up=follow_up)
        return results

    requests = {j: advance(j, None) for j in range(len(jobs))}
    while any(requests.values()):
        done = iter(sample([t for r in requests.values() for t in r]))
        requests = {j: advance(j, [next(done) for _ in r]) for j, r in requests.items() if r}
    return results


def _stop_table(tokenizer, cfg: AgentConfig) -> dict[int | str, tuple[str, str | None]]:
    """Map each stop (a token id where the tag is one token, else the tag string) to what it
    means: ("tool", name), ("answer", None) or ("eos", None)."""
    meanings: list[tuple[str, tuple[str, str | None]]] = [
        (close, ("tool", name)) for name, (_, close) in cfg.tool_tags.items()
    ]
    meanings.append((cfg.answer_close, ("answer", None)))
    meanings += [(s, ("eos", None)) for s in cfg.end_strings]
    table: dict[int | str, tuple[str, str | None]] = {}
    for text, meaning in meanings:
        ids = tokenizer.encode(text, add_special_tokens=False)
        table[ids[0] if len(ids) == 1 else text] = meaning
    return table


def _call_argument(tokenizer, t: Trajectory, open_tag: str, close_tag: str) -> str | None:
    """The text between the last opening tag and the closing tag of the current turn (the
    model tokens since the last observation, which may begin in a copied branch prefix);
    None when the turn has no opening tag."""
    start = len(t.model_mask)
    while start > 0 and t.model_mask[start - 1]:
        start -= 1
    text = tokenizer.decode(t.response_ids[start:], clean_up_tokenization_spaces=False)
    end = text.rfind(close_tag)
    begin = text.rfind(open_tag, 0, end)
    return None if begin < 0 else text[begin + len(open_tag) : end]


def _run_tools(pool, calls, tools: Mapping[str, Tool], cfg: AgentConfig) -> list[tuple[str, float]]:
    """Run one round's calls; those of ``threaded_tools`` go to the pool, the rest run here
    (a tool holding e.g. an SQLite connection must stay on its creating thread)."""
    futures = {
        k: pool.submit(_call_tool, tools, tool, arg)
        for k, (_, tool, arg) in enumerate(calls)
        if tool in cfg.threaded_tools
    }
    here = {k: _call_tool(tools, tool, arg) for k, (_, tool, arg) in enumerate(calls) if k not in futures}
    return [here[k] if k in here else futures[k].result() for k in range(len(calls))]


def _call_tool(tools: Mapping[str, Tool], tool: str, arg: str | None) -> tuple[str, float]:
    if arg is None:  # worded without the tags, so the observation holds no fake tag tokens
        return f"Error: the {tool} call has no opening tag", 0.0
    if tool not in tools:
        return f"Error: no tool named {tool!r} is available", 0.0
    start = time.perf_counter()
    try:
        output = tools[tool](arg)
    except SETUP_ERRORS:
        raise
    except Exception as exc:  # any tool failure is something the model should see
        output = f"Error: {type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    if not isinstance(output, str):
        raise TypeError(f"tool {tool!r} returned {type(output).__name__}, expected str")
    return output, seconds


# What a tool's output starts or holds when the call led nowhere: a Python traceback or the
# sandbox's own errors, a tool that raised (_call_tool's "Error: "), a search that found nothing.
_DEAD_END = re.compile(rf"\A(?:Error: |{re.escape(NO_RESULTS)}\s*\Z)|^(?:Traceback \(most recent call last\)|"
                       r"TimeoutError: execution exceeded|SandboxError: )", re.MULTILINE)


def shows_dead_end(output: str) -> bool:
    """Whether a tool's output shows that its call led nowhere (``Trajectory.dead_ends``)."""
    return _DEAD_END.search(output) is not None


def _observation_ids(tokenizer, output: str, cfg: AgentConfig, reserved) -> list[int]:
    limit = cfg.max_obs_tokens * OBS_CHARS_PER_TOKEN
    cut = len(output) > limit
    output = sanitise_observation(output[:limit], reserved)
    ids = tokenizer.encode(output, add_special_tokens=False)
    if len(ids) > cfg.max_obs_tokens:
        # The decoded prefix can end differently from the text it came from (a split
        # character, a tokenizer's clean-up), so it is sanitised again below.
        output = tokenizer.decode(ids[: cfg.max_obs_tokens], clean_up_tokenization_spaces=False)
        cut = True
    if cut:
        output = sanitise_observation(output + "\n[output truncated]", reserved)
    return tokenizer.encode(format_observation(output), add_special_tokens=False)


def _extend(t: Trajectory, ids, model: bool, logprobs=None, entropies=None) -> None:
    t.response_ids += ids
    t.model_mask += [model] * len(ids)
    t.logprobs += logprobs if model else [0.0] * len(ids)
    t.entropies += entropies if model else [0.0] * len(ids)


def _copy(t: Trajectory) -> Trajectory:
    return replace(
        t,
        prompt_ids=list(t.prompt_ids),
        response_ids=list(t.response_ids),
        model_mask=list(t.model_mask),
        logprobs=list(t.logprobs),
        entropies=list(t.entropies),
        dead_ends=list(t.dead_ends),
    )
