"""What the OpenAI API's request bodies may hold, checked with pydantic, and the error object
every refusal is sent as (OpenAI's shape, so clients show the message).

Every part of a body that reaches the chat template or the engine is checked here first, down to
each message's content parts and tool calls: a body of the wrong shape is a 400 that names the
field (`param`, e.g. "messages.0.content"), never a 500 from deep inside the template.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.engine.sampling import SamplingParams
from app.runner import ChatRequest
from app.server.tool_calls import messages_for_template

DEFAULT_MAX_TOKENS = 2048  # when a client names no limit; the context's end ends an answer anyway
MAX_STOP_STRINGS = 4  # OpenAI's limit
ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
# Deeper than any tool's JSON schema goes, and far below where Python's parser, pydantic or the
# template's `tojson` run out of stack (a RecursionError there was a 500).
MAX_JSON_DEPTH = 100
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how a lone surrogate gets into JSON text


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


class _Part(BaseModel):
    # Fields OpenAI defines that change nothing here (user, metadata, ...) are accepted and kept.
    model_config = ConfigDict(extra="allow")


class ContentPart(_Part):
    """One part of a message's content: {"type": "text", "text": ...}; other kinds (an image)
    are kept as they came, and only their text, if any, reaches the template."""

    type: str
    text: str | None = Field(None, validate_default=True)

    @field_validator("text")
    @classmethod
    def _text_part_has_text(cls, value, info):
        if value is None and info.data.get("type") == "text":
            raise ValueError("a text part needs its text: {'type': 'text', 'text': '...'}")
        return value


class FunctionCall(_Part):
    name: str
    arguments: Any = "{}"

    @field_validator("arguments")
    @classmethod
    def _object_or_text(cls, value):
        if not isinstance(value, (str, dict)):
            raise ValueError("must be a JSON object, or a string that holds one")
        return value


class ToolCall(_Part):
    """A call an earlier assistant message made, as a client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Part):
    role: str  # one of ROLES: checked by ChatBody, which names the message
    content: list[ContentPart] | None = None  # a string arrives as one text part
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # a reasoning model's earlier thinking, as some templates read it

    @field_validator("content", mode="before")
    @classmethod
    def _text_or_parts(cls, value):
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if value is None or isinstance(value, list):
            return value
        raise ValueError("must be a string or a list of parts like {'type': 'text', 'text': '...'}")

    def for_template(self) -> dict:
        """The message as the client sent it (checked), with its content parts' text joined."""
        message = self.model_dump(exclude_unset=True)
        if self.content is not None:
            message["content"] = "".join(part.text or "" for part in self.content)
        # "developer" is OpenAI's newer name for the system role; templates know "system"
        if self.role == "developer":
            message["role"] = "system"
        return message


class FunctionTool(_Part):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Part):
    type: Literal["function"]
    function: FunctionTool


class StreamOptions(_Part):
    include_usage: bool = False


class _Body(_Part):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's range and default
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: list[str] = []
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

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value):
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return value
        raise ValueError(f"must be a string or a list of up to {MAX_STOP_STRINGS} strings")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        if len(value) > MAX_STOP_STRINGS or any(not s for s in value):
            raise ValueError(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _request(self, context: int, **fields) -> ChatRequest:
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        return ChatRequest(max_tokens=min(self.max_tokens or DEFAULT_MAX_TOKENS, context), params=params,
                           stop_strings=tuple(self.stop), fit=False,
                           conversation=f"server {self.user}" if self.user else "server", **fields)


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Any = None  # one of TOOL_CHOICES, or {"type": "function", "function": {"name": ...}}
    # vLLM's and SGLang's way to set a template's switches: {"enable_thinking": false} for Qwen3.x
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _roles(cls, value):
        for i, message in enumerate(value if isinstance(value, list) else ()):
            if isinstance(message, dict) and message.get("role") not in ROLES:
                raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {message.get('role')!r}")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        named = isinstance(value, dict) and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str)
        if value is None or named or (isinstance(value, str) and value in TOOL_CHOICES):
            return value
        raise ValueError(f"must be one of {', '.join(TOOL_CHOICES)}, "
                         "or {'type': 'function', 'function': {'name': ...}}")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _thinking_switch(cls, value):
        if value is not None and not isinstance(value.get("enable_thinking", False), bool):
            raise ValueError("chat_template_kwargs.enable_thinking must be true or false")
        return value

    def to_request(self, context: int, with_tools: bool) -> ChatRequest:
        if self.max_completion_tokens and not self.max_tokens:
            self.max_tokens = self.max_completion_tokens
        tools = self._chosen_tools() if with_tools else ()
        messages = [message.for_template() for message in self.messages]
        thinking = (self.chat_template_kwargs or {}).get("enable_thinking")
        return self._request(context, messages=tuple(messages_for_template(messages)), tools=tools,
                             thinking=thinking)

    def _chosen_tools(self) -> tuple[dict, ...]:
        """The tools the template renders: all of them, none for "none", the named one alone.
        (A model cannot be forced to call one: "required" offers them all, as "auto" does.)"""
        choice = self.tool_choice
        if choice == "none":
            return ()
        tools = [tool.model_dump(exclude_unset=True) for tool in self.tools or ()]
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            chosen = tuple(t for t in tools if t["function"]["name"] == name)
            if not chosen:
                raise ApiError(400, f"tool_choice names '{name}', which is not in tools.", param="tool_choice")
            return chosen
        return tuple(tools)


class CompletionBody(_Body):
    prompt: str
    echo: bool = False
    best_of: int = 1

    @field_validator("echo", "best_of")
    @classmethod
    def _plain(cls, value, info):
        if value not in (False, 1) or (info.field_name == "echo" and value):
            raise ValueError(f"{info.field_name} is not supported: leave it out")
        return value

    @field_validator("prompt", mode="before")
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
    except RecursionError as exc:
        raise _too_deep(None) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The body is not valid JSON ({exc}).") from exc
    except ValueError as exc:  # Python reads no integer of more than 4,300 digits
        raise ApiError(400, "The body holds a number thousands of digits long, which no field takes.") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "The body must be a JSON object.")
    _check_json(data, raw)
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        got = repr(first.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        raise ApiError(400, f"{where}: {message} (got {got}).", param=where or None) from exc


def _check_json(data: dict, raw: bytes) -> None:
    """Refuse what parses but would break later: nesting past MAX_JSON_DEPTH, and text with a
    lone surrogate (valid JSON, but no UTF-8 can hold it: the tokenizer fails on it)."""
    stack = [(value, 2, field) for field, value in data.items() if isinstance(value, (dict, list))]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(field)
        inner = value.values() if isinstance(value, dict) else value
        stack.extend((item, depth + 1, field) for item in inner if isinstance(item, (dict, list)))
    if _SURROGATE_ESCAPE.search(raw) is None:
        return  # the common case: no escape that could leave half a character
    for field, value in data.items():
        try:
            json.dumps({field: value}, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            field = _sendable(field)
            raise ApiError(400, f"{field} holds a \\u escape of half a character (a lone surrogate): "
                                "send text as UTF-8, or escape a character outside the BMP as a pair.",
                           param=field) from None


def _too_deep(field: str | None) -> ApiError:
    field = _sendable(field) if field is not None else None
    where = f"{field} nests" if field else "The body nests"
    return ApiError(400, f"{where} JSON more than {MAX_JSON_DEPTH} levels deep, more than any request needs: "
                         "send it flatter.", param=field)


def _sendable(text: str) -> str:
    """`text` with any lone surrogate written as its escape (the error object is sent as UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
