"""A target served by another engine, on the runner's side: the server's model as the loaded
target, each chat request one streamed call to its OpenAI-compatible API, and the answer as the
engine's own events (Traced rounds, Notices, one Finished), so the window, the CLI, the history
and the exports take it as they take a local answer.

What each engine lets the panel show (docs/remote.md):
- another Tandem sends every round it ran in each chunk's `tandem` field: the rounds arrive as
  they were, chips and all;
- any other server sends text: one chipless round per chunk, with the tokens counted from
  `usage` at the end (servers put several tokens in one chunk, more so with speculation).
Timings are this machine's wall clock: the first token's wait and the stream after it, what the
user waits for, network included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from app.chat.thinking import ANSWER, THINKING, ThinkingSplitter
from app.chat.trace import ACCEPTED, REJECTED, TARGET, RoundTrace, round_from_row
from app.chat.traced import Text, Traced
from app.draft_choice import DraftKind
from app.engine.events import Finished, GenerationStats, Notice, Round
from app.remote import keys
from app.remote.client import RemoteClient, RemoteError, RemoteModel
from app.remote.engines import ServerFigures, VllmCounters, llamacpp_figures, vllm_counters, vllm_figures
from app.remote.endpoint import Endpoint, RemoteSpec, parse_endpoint

# owned_by in /v1/models, as each engine writes it -> its name in the window
ENGINES = {"tandem": "Tandem", "vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp's server"}
FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


# what the panel shows of each engine's speculation (app/remote/engines.py; docs/remote.md)
SHOWS = {"tandem": "every round is shown as it ran there",
         "vllm": "the panel shows its drafts and acceptance by position, from its /metrics",
         "llamacpp": "the panel shows its drafts and how many it accepted, from its timings"}
SHOWS_ELSE = "the panel shows its tokens/s and the first token's wait"


def engine_name(owned_by: str) -> str:
    return ENGINES.get(owned_by.lower(), "an OpenAI-compatible server")


class RemoteTarget:
    """One server's model as the loaded target. Used from the runner's thread only."""

    def __init__(self, spec: RemoteSpec, progress: Callable[[str], None] = print):
        self.endpoint: Endpoint = parse_endpoint(spec.address)
        key = spec.key if spec.key is not None else keys.load(self.endpoint.origin)
        progress(f"Connecting to {self.endpoint.origin} ...")
        self.client = RemoteClient(self.endpoint, key, spec.ca_file)
        try:
            self.model = _choose(self.client.models(), spec.model, self.endpoint)
        except BaseException:
            self.client.close()
            raise
        self.engine = engine_name(self.model.owned_by)
        self.kind = self.model.owned_by.lower()  # "tandem", "vllm", "llamacpp", "sglang", or another
        self.is_tandem = self.kind == "tandem"
        self._said: set[str] = set()  # what this server cannot show, said once per load
        self.context_length = self.model.max_model_len or 0  # 0: the server does not say

    def close(self) -> None:
        self.client.close()

    def describe(self) -> str:
        return f"{self.model.id} on {self.engine} at {self.endpoint.origin}"

    def shows(self) -> str:
        return SHOWS.get(self.kind, SHOWS_ELSE)

    def can_choose_draft(self) -> bool:
        """Whether a request may turn speculation off (a Race, the target-alone baseline): only
        another Tandem takes that per request; vLLM fixes it at start."""
        return self.is_tandem

    def body(self, request) -> tuple[str, dict]:
        """(path, JSON body) of a ChatRequest (app/runner.py), streamed with its usage at the end."""
        params = request.params
        body: dict = {"model": self.model.id, "stream": True, "stream_options": {"include_usage": True},
                      "max_tokens": request.max_tokens, "temperature": params.temperature, "top_p": params.top_p}
        if params.top_k:
            body["top_k"] = params.top_k  # vLLM's, SGLang's, llama.cpp's and Tandem's field
        if params.seed is not None:
            body["seed"] = params.seed
        if request.stop_strings:
            body["stop"] = list(request.stop_strings)
        if self.is_tandem:  # what only another Tandem takes (app/server/requests.TandemFields)
            body["tandem"] = {"draft": str(request.drafter)}
            if request.draft_tokens:
                body["tandem"]["draft_tokens"] = request.draft_tokens
            if request.trees != "auto":
                body["tandem"]["trees"] = request.trees
        if request.prompt is not None:
            body["prompt"] = request.prompt
            return "/completions", body
        body["messages"] = [{"role": m["role"], "content": m.get("content") or ""} for m in request.messages]
        if request.thinking is not None:  # the switch vLLM, SGLang and Tandem read
            body["chat_template_kwargs"] = {"enable_thinking": request.thinking}
        return "/chat/completions", body

    def chat(self, request) -> Iterator[Notice | Traced | Text | Finished]:
        if request.drafter.kind is not DraftKind.PAIR and not self.can_choose_draft():
            yield Notice(f"{self.engine} sets its speculation when it starts, so this answer drafts as the server "
                         "does, whatever the chat's setting.")
        path, body = self.body(request)
        before = self._vllm_counters() if self.kind == "vllm" else None
        stream = _Answer(self, time.perf_counter())
        for event in self.client.stream(path, body, cancelled=lambda: request.cancel.cancelled):
            yield from stream.feed(event)
        yield from self._figures(stream, before)
        yield from stream.finish(request.cancel.cancelled)

    def _vllm_counters(self) -> VllmCounters | str:
        """vLLM's speculative counters now, or why they cannot be read (a gateway, a replica)."""
        try:
            return vllm_counters(self.client.get_text("/metrics"), self.model.id)
        except RemoteError as exc:
            return str(exc)

    def _figures(self, stream: _Answer, before) -> Iterator[Notice]:
        """The answer's speculation as the engine reported it (app/remote/engines.py), or, once per
        load, why there is none to show."""
        figures, why = None, ""
        if self.kind == "llamacpp":
            figures = llamacpp_figures(stream.timings)
            why = "" if figures or stream.timings is None else "llama-server drafted nothing for this answer " \
                                                                "(started without --spec-type or a draft model?)"
        elif self.kind == "vllm":
            after = self._vllm_counters()
            if isinstance(before, str) or isinstance(after, str):
                why = (f"vLLM's /metrics cannot be read from here ({before if isinstance(before, str) else after}), "
                       "so its speculation is not shown")
            else:
                figures = vllm_figures(before, after, _count((stream.usage or {}).get("completion_tokens")))
                why = "" if figures else "vLLM reports no speculative counters: it runs without speculation"
        elif self.kind == "sglang":
            why = ("SGLang reports its speculation only on its native /generate, not on the OpenAI API Tandem "
                   "speaks: the panel shows tokens/s and the first token's wait")
        elif not self.is_tandem:
            why = (f"{self.engine} reports nothing of its speculation: the panel shows tokens/s and the first "
                   "token's wait")
        if figures is not None:
            stream.figures_reported = figures
            yield Notice(figures.words())
        elif why and why not in self._said:
            self._said.add(why)
            yield Notice(why[0].upper() + why[1:] + ".")


def _choose(models: list[RemoteModel], wanted: str | None, endpoint: Endpoint) -> RemoteModel:
    if not models:
        raise RemoteError(f"{endpoint.base}/models lists no models: load one on the server first.")
    if wanted:
        found = next((m for m in models if m.id == wanted), None)
        if found is None:
            raise RemoteError(f"The server at {endpoint.origin} serves {_ids(models)}, not “{wanted}”: choose one "
                              "of those.")
        return found
    if len(models) > 1:
        raise RemoteError(f"The server at {endpoint.origin} serves {len(models)} models ({_ids(models)}): choose "
                          "one (tandem-cli: --remote-model).")
    return models[0]


def _ids(models: list[RemoteModel]) -> str:
    shown = ", ".join(f"“{m.id}”" for m in models[:8])
    return shown + (f" and {len(models) - 8} more" if len(models) > 8 else "")


class _Answer:
    """One streamed answer, chunk by chunk, into the engine's events."""

    def __init__(self, target: RemoteTarget, started: float):
        self.target, self.started = target, started
        self.first_at: float | None = None
        self.index = 0  # chipless rounds' numbers (a server that sends no rounds)
        self.splitter = ThinkingSplitter(False)  # a server without a reasoning parser sends the tags as text
        self.rounds: list[RoundTrace] = []
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.figures: dict = {}  # a Tandem's own, from its last chunk
        self.timings: dict | None = None  # llama-server's, from its last chunk
        self.figures_reported: ServerFigures | None = None  # another engine's (app/remote/engines.py)
        self.text: list[str] = []

    def feed(self, event: dict) -> Iterator[Traced]:
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        extra = event.get("tandem") if isinstance(event.get("tandem"), dict) else {}
        rows = extra.get("rounds") if isinstance(extra.get("rounds"), list) else []
        if "finish" in extra:
            self.figures = extra
        pieces: list[tuple[str, str]] = []
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else None
            if delta is None and isinstance(choice.get("text"), str):  # a completion's chunk
                delta = {"content": choice["text"]}
            delta = delta or {}
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thinking, str) and thinking:
                pieces.append((THINKING, thinking))
            content = delta.get("content")
            if isinstance(content, str) and content:
                pieces.extend(self.splitter.feed(content))
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        if not pieces and not rows:
            return
        now = time.perf_counter()
        self.first_at = self.first_at or now
        at = now - self.first_at
        self.text.extend(text for kind, text in pieces if kind == ANSWER)
        traces = [t for t in (_trace(row, at) for row in rows) if t is not None]
        if not traces:  # a server that sends text only: one chipless round per chunk
            answer = "".join(text for kind, text in pieces if kind == ANSWER)
            traces = [RoundTrace(self.index, 0, "", (), answer, 0, at,
                                 thinking=any(kind == THINKING for kind, _ in pieces))]
            self.index += 1
        self.rounds.extend(traces)
        for i, trace in enumerate(traces):  # the chunk's text goes with its first round
            yield Traced(_round(trace), trace, tuple(pieces) if i == 0 else ())

    def finish(self, cancelled: bool) -> Iterator[Text | Finished]:
        rest = self.splitter.finish()
        if rest:
            self.text.extend(text for kind, text in rest if kind == ANSWER)
            yield Text(tuple(rest))
        yield Finished(self.stats(cancelled), "".join(self.text))

    def stats(self, cancelled: bool) -> GenerationStats:
        end = time.perf_counter()
        usage = self.usage or {}
        prompt = _count(usage.get("prompt_tokens"))
        chips = [t for t in self.rounds if t.chips]
        tokens = _count(usage.get("completion_tokens"))
        if tokens is None:  # a server that sends no usage: the rounds' tokens where it sent rounds
            tokens = sum(t.tokens for t in chips)
        passes = len({t.index for t in chips if t.index > 0})
        drafted = sum(t.drafted for t in chips)
        accepted = sum(t.count(ACCEPTED) for t in chips)
        by_position = _by_position(chips)
        reported = self.figures_reported
        if reported is not None and not chips:  # counted by the engine itself
            drafted, accepted = reported.drafted, reported.accepted
            width = len(reported.accepted_by_position)
            # every proposal reached every position only where each was full length
            full = reported.drafts and reported.drafted == reported.drafts * width
            by_position = (reported.accepted_by_position, (reported.drafts,) * width if full else (), ())
        prefill_s = (self.first_at or end) - self.started
        reason = "cancelled" if cancelled else FINISH.get(self.finish_reason or "", "stop")
        if self.figures.get("finish") in ("context", "stop_string") and not cancelled:
            reason = self.figures["finish"]  # a Tandem says why, more exactly than OpenAI's reasons
        return GenerationStats(prompt_tokens=prompt or 0, tokens=tokens or 0, rounds=passes,
                               decode_tokens=max((tokens or 0) - 1, 0), drafted=drafted, accepted=accepted,
                               prefill_s=prefill_s, decode_s=end - self.first_at if self.first_at else 0.0,
                               finish_reason=reason, accepted_by_position=by_position[0],
                               drafted_by_position=by_position[1], reached_by_position=by_position[2],
                               reused_tokens=_count(self.figures.get("reused_prompt_tokens")) or 0)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _trace(row, at: float) -> RoundTrace | None:
    """A remote Tandem's round (app/chat/trace.round_row), stamped with this machine's clock;
    None for a row this version cannot read (it is left out of the panel, not the answer)."""
    try:
        trace = round_from_row(row)
    except (TypeError, ValueError, OverflowError):
        return None
    if any(chip.kind not in (ACCEPTED, REJECTED, TARGET) for chip in trace.chips):
        return None
    return RoundTrace(trace.index, trace.k, trace.source, trace.chips, trace.text, trace.own_chars, at,
                      trace.draft_s, trace.verify_s, trace.thinking)


def _round(trace: RoundTrace) -> Round:
    """The engine's Round a trace was drawn from (app/chat/trace.trace_round, backwards)."""
    drafted = tuple(c for c in trace.chips if c.kind in (ACCEPTED, REJECTED))
    accepted = sum(c.kind == ACCEPTED for c in drafted)
    emitted = tuple(c.token for c in trace.chips if c.kind in (ACCEPTED, TARGET))
    return Round(trace.index, tuple(c.token for c in drafted), accepted, emitted, trace.text,
                 tuple(c.p or 0.0 for c in drafted), tuple(c.q or 0.0 for c in drafted), trace.draft_s,
                 trace.verify_s, trace.k, trace.source)


def _by_position(traces: list[RoundTrace]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(accepted, drafted, reached) by draft position, as the engine counts them (GenerationStats)."""
    width = max((t.drafted for t in traces), default=0)
    accepted, drafted, reached = [0] * width, [0] * width, [0] * width
    for t in traces:
        n = t.count(ACCEPTED)  # a prefix of the drafts, as in app/engine/speculative.py's count
        for i in range(t.drafted):
            drafted[i] += 1
            accepted[i] += i < n
            reached[i] += i <= n
    return tuple(accepted), tuple(drafted), tuple(reached)

