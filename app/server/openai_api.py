"""The OpenAI-compatible HTTP API over the runner service: /v1/models, /v1/chat/completions and
/v1/completions, streamed (server-sent events) or not, on FastAPI.

Every request is one more client of the service (app/service.py), so the window and the server
take fair turns on the one loaded pair. A client that disconnects cancels its request: the engine
stops within one round (app/server/streams.py). Bodies are checked whole before anything renders
(app/server/requests.py); slow clients are timed (app/server/limits.py). Errors are OpenAI's error
object with the status OpenAI uses. Each answer carries its speculative figures in an extra
`tandem` field.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.chat.thinking import THINKING
from app.chat.trace import round_row
from app.engine.events import Finished
from app.server.api_key import RequireKey
from app.server.limits import BodyDeadline, ReadLimits
from app.server.requests import DEFAULT_MAX_TOKENS, ApiError, ChatBody, CompletionBody, parse_body
from app.server.streams import Answer, OpenAnswers
from app.server.tool_calls import ToolCallSplitter, tool_format
from app.service import RunnerService, Text, Traced

MAX_BODY_BYTES = 16 * 1024 * 1024  # an agent's whole repository in context is far less
FINISH_REASONS = {"stop": "stop", "stop_string": "stop", "length": "length", "context": "length",
                  "cancelled": "stop"}


def model_id(service: RunnerService) -> str | None:
    """The loaded model's id as clients send it: "smollm2-135m-instruct" (`api_id`)."""
    loaded = service.runner.loaded
    return None if loaded is None else api_id(loaded.name)


def api_id(name: str) -> str:
    """A model's display name as an API id, the form clients and their config files expect (no
    spaces or parentheses): "SmolLM2 135M Instruct (demo)" -> "smollm2-135m-instruct"."""
    base = re.sub(r"\s*\([^)]*\)\s*$", "", name)
    return re.sub(r"[^a-z0-9._]+", "-", base.lower()).strip("-.") or "model"


def _model_entry(service: RunnerService, name: str) -> dict:
    """A model as /v1/models lists it; `max_model_len` is the context, as vLLM gives it, so a client
    (a remote Tandem among them) knows where a chat must be cut."""
    entry = {"id": name, "object": "model", "created": 0, "owned_by": "tandem"}
    loaded = service.runner.loaded
    if loaded is not None and loaded.context_length:
        entry["max_model_len"] = loaded.context_length
    return entry


def create_app(service: RunnerService, api_key: str | None = None, max_body: int = MAX_BODY_BYTES,
               limits: ReadLimits = ReadLimits()) -> FastAPI:
    """The API app. With `api_key` (ASCII: app/server/api_key.py), every request needs
    `Authorization: Bearer <key>`. `app.state.answers.stop_all()` ends the answers in flight."""
    app = FastAPI(title="Tandem", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    answers = app.state.answers = OpenAnswers()
    app.add_middleware(BodyDeadline, limits=limits)
    if api_key is not None:
        app.add_middleware(RequireKey, key=api_key)  # added last: the outermost, before any body is read

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else None
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=kind).response()

    @app.get("/v1/models")
    async def models() -> dict:
        name = model_id(service)
        return {"object": "list", "data": [] if name is None else [_model_entry(service, name)]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> dict:  # any name: the loaded model answers to each (_loaded_model)
        return _model_entry(service, _loaded_model(service))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        # off the event loop: a 16 MiB body takes a while to parse and check
        body = await run_in_threadpool(parse_body, await _read_body(request, max_body), ChatBody)
        return await _answer(request, service, answers, body, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await run_in_threadpool(parse_body, await _read_body(request, max_body), CompletionBody)
        return await _answer(request, service, answers, body, chat=False)

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` bytes before it is all read (a length header can lie or be absent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # nobody reads the answer; this keeps the log free of a traceback
        raise ApiError(400, "The client went away before its request body arrived.") from None
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is over {limit // (1024 * 1024)} MiB, this server's limit: "
                         "send a shorter conversation.", code="request_too_large")


def _loaded_model(service: RunnerService) -> str:
    """The id of the model that answers. A request may name any model: one is loaded, and it
    answers whatever a client's configuration calls it (as LM Studio and llama.cpp's server do);
    the answer's `model` says which it was."""
    loaded = model_id(service)
    if loaded is None:
        raise ApiError(503, "No model is loaded: load one in Tandem's window, or name one to tandem-cli serve.",
                       type_="server_error", code="model_not_loaded")
    return loaded


async def _answer(http: Request, service: RunnerService, answers: OpenAnswers, body: ChatBody | CompletionBody,
                  chat: bool):
    name = _loaded_model(service)
    runner = service.runner
    if getattr(runner, "remote", None) is not None:  # the window's target is another server: its clients go there
        raise ApiError(503, f"Tandem's target is served by {runner.loaded.remote} now, not on this machine: send "
                            "requests to that server directly.", type_="server_error", code="model_not_loaded")
    fmt = tool_format(runner.tokenizer.chat_template) if chat and body.tools else None
    if chat and body.tools and body.tool_choice != "none" and fmt is None:
        raise ApiError(400, f"{name}'s chat template has no format for tools, so it cannot call them: "
                            "send the request without `tools`, or load a model whose template has them.",
                       param="tools")
    request = body.to_request(runner.loaded.context_length, with_tools=fmt is not None)
    try:
        prompt = await run_in_threadpool(runner.prompt_ids, request)
    except TemplateError as exc:  # the template's own refusal ("roles must alternate", ...)
        raise ApiError(400, f"{name}'s chat template cannot render these messages: {exc}",
                       param="messages" if chat else "prompt") from exc
    context = runner.loaded.context_length
    if len(prompt) >= context:
        raise ApiError(400, f"The prompt is {len(prompt):,} tokens but {name}'s context holds {context:,}: "
                            "shorten the conversation.", param="messages" if chat else "prompt",
                       code="context_length_exceeded")
    limit, limit_note = _max_tokens(body.max_tokens, context - len(prompt))
    request = dataclasses.replace(request, max_tokens=limit)
    answer = answers.open(service, request, len(prompt))
    started = _Started(kind="chat.completion" if chat else "text_completion", model=name, max_tokens=limit,
                       max_tokens_note=limit_note)
    if body.stream:
        return _EventStream(_sse(answer, started, fmt, chat, body.include_usage), answer)
    text, thinking, finished = await answer.whole(http.receive)
    return _whole_response(started, text, thinking, finished, fmt, chat, len(prompt))


class _EventStream(StreamingResponse):
    """Server-sent events whose answer is closed however the response ends: Starlette may cancel
    it before the events' generator has started (a client gone at once), and then no `finally`
    in the generator runs."""

    def __init__(self, events: AsyncIterator[str], answer: Answer):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.answer = answer

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.answer.close()


def _max_tokens(asked: int | None, room: int) -> tuple[int, str | None]:
    """The most tokens an answer may have, and a note for the client where that is not what it
    asked: the answer stops there, however long it would run (a client that asked for more than
    the context holds learns why it ended)."""
    if asked is None:
        if DEFAULT_MAX_TOKENS < room:
            return DEFAULT_MAX_TOKENS, (f"no max_tokens was sent: the answer ends at {DEFAULT_MAX_TOKENS:,} tokens "
                                        f"at most (the context has {room:,} left); send max_tokens for more.")
        return room, f"no max_tokens was sent: the answer ends where the context does, {room:,} tokens on."
    if asked > room:
        return room, (f"max_tokens {asked:,} is more than the {room:,} tokens the context has left after the "
                      "prompt: the answer ends there at most.")
    return asked, None


class _Started:
    """What every part of one answer's response repeats: its id, kind, model and token limit."""

    def __init__(self, kind: str, model: str, max_tokens: int, max_tokens_note: str | None):
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model, self.created = kind, model, int(time.time())
        self.limit = {"max_tokens": max_tokens} if max_tokens_note is None else \
            {"max_tokens": max_tokens, "max_tokens_note": max_tokens_note}


def _stats(finished: Finished | None, prompt_tokens: int) -> tuple[dict, dict]:
    """(OpenAI's usage, Tandem's speculative figures) of an answer."""
    if finished is None:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}, {}
    s = finished.stats
    usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.tokens,
             "total_tokens": s.prompt_tokens + s.tokens}
    figures = {"tokens_per_s": round(s.tokens_per_s, 2), "target_passes": s.rounds,
               "tokens_per_pass": round(s.tokens_per_round, 3), "drafted": s.drafted, "accepted": s.accepted,
               "acceptance": round(s.acceptance_rate, 4), "prefill_s": round(s.prefill_s, 4),
               "decode_s": round(s.decode_s, 4), "reused_prompt_tokens": s.reused_tokens,
               "finish": s.finish_reason}
    return usage, figures


def _finish_reason(finished: Finished | None, calls: list) -> str:
    if calls:
        return "tool_calls"
    return FINISH_REASONS.get(finished.stats.finish_reason, "stop") if finished is not None else "stop"


def _whole_response(started: _Started, text: str, thinking: str, finished: Finished | None, fmt, chat: bool,
                    prompt_tokens: int) -> dict:
    usage, figures = _stats(finished, prompt_tokens)
    if chat:
        splitter = ToolCallSplitter(fmt)
        content = splitter.feed(text)
        rest, calls = splitter.finish()
        message = {"role": "assistant", "content": (content + rest) or (None if calls else "")}
        if thinking:  # the field DeepSeek's API, vLLM and LM Studio use for a reasoning model's thinking
            message["reasoning_content"] = thinking
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(finished, calls)}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish_reason(finished, [])}
    return {"id": started.id, "object": started.kind, "created": started.created, "model": started.model,
            "choices": [choice], "usage": usage, "tandem": {**figures, **started.limit}}


def _chunk(started: _Started, chat: bool, delta: dict | str | None, finish: str | None = None, **extra) -> str:
    if chat:
        choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    payload = {"id": started.id, "object": kind, "created": started.created, "model": started.model,
               "choices": [choice], **extra}
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _sse(answer: Answer, started: _Started, fmt, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    splitter = ToolCallSplitter(fmt)
    finished = None
    if chat:
        yield _chunk(started, chat, {"role": "assistant", "content": ""})
    pending: list[tuple[str, str]] = []  # text not sent yet, by part
    rounds: list[list] = []  # the rounds that wrote it, as the history's rows (app/chat/trace.round_row)

    def flush():
        merged: list[tuple[str, str]] = []
        for kind, text in pending:
            if merged and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + text)
            else:
                merged.append((kind, text))
        pending.clear()
        # Each chunk carries the rounds it covers in its `tandem` field (standard clients ignore
        # it): a remote Tandem's client shows them as its own (app/remote/target.py). Rounds whose
        # text is all held back (a tool call's start) go in a chunk of their own.
        extra = {"tandem": {"rounds": rounds.copy()}} if rounds else {}
        rounds.clear()
        for kind, text in merged:
            if kind == THINKING and chat:
                yield _chunk(started, chat, {"reasoning_content": text}, **extra)
            elif kind == THINKING:  # a completion has one text: the thinking is part of it
                yield _chunk(started, chat, text, **extra)
            else:
                content = splitter.feed(text) if chat else text
                if not content:
                    continue
                yield _chunk(started, chat, {"content": content} if chat else content, **extra)
            extra = {}
        if extra:
            yield _chunk(started, chat, {} if chat else "", **extra)

    try:
        async for item in answer.events():
            if isinstance(item, (Traced, Text)):
                pending.extend(item.pieces)
                if isinstance(item, Traced):
                    rounds.append(round_row(item.trace))
                if not answer.queue.empty():
                    continue  # more rounds wait already (a slow client): one chunk carries them all
            elif isinstance(item, Finished):
                finished = item
            for chunk in flush():
                yield chunk
        for chunk in flush():
            yield chunk
    except ApiError as exc:  # after the stream began (or as the server stops): in the stream, as OpenAI's are
        for chunk in flush():  # what was written before it
            yield chunk
        yield f"data: {json.dumps(exc.body(), ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"
        return
    calls = []
    if chat:
        rest, calls = splitter.finish()
        if rest:
            yield _chunk(started, chat, {"content": rest})
        if calls:
            yield _chunk(started, chat, {"tool_calls": [c.to_openai(i) for i, c in enumerate(calls)]})
    usage, figures = _stats(finished, answer.prompt_tokens)
    yield _chunk(started, chat, {} if chat else "", _finish_reason(finished, calls),
                 tandem={**figures, **started.limit})
    if include_usage:
        payload = {"id": started.id, "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": started.created, "model": started.model, "choices": [], "usage": usage}
        yield f"data: {json.dumps(payload)}\n\n"
    yield "data: [DONE]\n\n"
