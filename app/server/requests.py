"""What the OpenAI API's request bodies may hold, checked with pydantic, and the error object
every refusal is sent as (OpenAI's shape, so clients show the message)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.engine.sampling import SamplingParams
from app.runner import ChatRequest
from app.server.tool_calls import messages_for_template

DEFAULT_MAX_TOKENS = 2048  # when a client names no limit; the context's end ends an answer anyway
MAX_STOP_STRINGS = 4  # OpenAI's limit
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A refusal in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


class _Body(BaseModel):
    # Fields OpenAI defines that change nothing here (user, metadata, ...) are accepted and ignored.
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: dict | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's range and default
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = 1
    # OpenAI's end-user id: here, whose kept caches answer (one slot per user, so two agents that
    # name themselves do not evict each other's conversation)
    user: str | None = Field(None, max_length=256)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @field_validator("n")
    @classmethod
    def _one_answer(cls, value):
        if value != 1:
            raise ValueError("n must be 1: one answer per request (send more requests for more answers)")
        return value

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalties(cls, value, info):
        if value != 0:
            raise ValueError(f"{info.field_name} is not supported: leave it 0 (the answer is the model's own)")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings")
        return stops

    def _request(self, context: int, **fields) -> ChatRequest:
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        return ChatRequest(max_tokens=min(self.max_tokens or DEFAULT_MAX_TOKENS, context), params=params,
                           stop_strings=tuple(self.stop or ()), fit=False,
                           conversation=f"server {self.user}" if self.user else "server", **fields)


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict | None = None
    # vLLM's and SGLang's way to set a template's switches: {"enable_thinking": false} for Qwen3.x
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, value):
        for i, message in enumerate(value):
            if message.get("role") not in ROLES:
                raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {message.get('role')!r}")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value):
        for i, tool in enumerate(value or []):
            if tool.get("type") != "function" or not isinstance((tool.get("function") or {}).get("name"), str):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        return value

    def to_request(self, context: int, with_tools: bool) -> ChatRequest:
        if self.max_completion_tokens and not self.max_tokens:
            self.max_tokens = self.max_completion_tokens
        tools = self._chosen_tools() if with_tools else ()
        # "developer" is OpenAI's newer name for the system role; templates know "system"
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in self.messages]
        thinking = (self.chat_template_kwargs or {}).get("enable_thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise ApiError(400, "chat_template_kwargs.enable_thinking must be true or false.",
                           param="chat_template_kwargs")
        return self._request(context, messages=tuple(messages_for_template(messages)), tools=tools,
                             thinking=thinking)

    def _chosen_tools(self) -> tuple[dict, ...]:
        """The tools the template renders: all of them, none for "none", the named one alone.
        (A model cannot be forced to call one: "required" offers them all, as "auto" does.)"""
        choice = self.tool_choice
        if choice == "none":
            return ()
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            chosen = tuple(t for t in self.tools if t["function"]["name"] == name)
            if not chosen:
                raise ApiError(400, f"tool_choice names '{name}', which is not in tools.", param="tool_choice")
            return chosen
        return tuple(self.tools or ())


class CompletionBody(_Body):
    prompt: str | list[str]
    echo: bool = False
    best_of: int = 1

    @field_validator("echo", "best_of")
    @classmethod
    def _plain(cls, value, info):
        if value not in (False, 1) or (info.field_name == "echo" and value):
            raise ValueError(f"{info.field_name} is not supported: leave it out")
        return value

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("one prompt at a time (a list of one string, or a string)")
            value = value[0]
        return value

    def to_request(self, context: int, with_tools: bool = False) -> ChatRequest:
        return self._request(context, messages=(), prompt=self.prompt)


def parse_body(raw: bytes, kind: type[_Body]) -> _Body:
    """The body read as `kind`; an ApiError (400) that names what is wrong."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The body is not valid JSON ({exc}).") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "The body must be a JSON object.")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        got = repr(first.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        raise ApiError(400, f"{where}: {message} (got {got}).", param=where or None) from exc

