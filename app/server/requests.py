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

from app.draft_choice import PAIR_DRAFT, REQUEST_CHOICES, DraftChoice, DraftChoiceError
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


class TandemFields(_Part):
    """What a client that knows it talks to Tandem may ask beyond OpenAI's fields (a remote
    Tandem's window does: app/remote/target.py): how this answer drafts, one of the choices a chat
    has ("pair", "model", "ngram", "none"), so it can time the target alone or race the two."""

    draft: str = str(PAIR_DRAFT)
    draft_tokens: int | None = Field(None, ge=1, le=32)  # a fixed draft length (None: adaptive)
    # trees of drafts (docs/trees.md): "auto" the branches that pay, "on" every alternative, "off" chains
    trees: Literal["auto", "on", "off"] = "auto"

    @field_validator("draft")
    @classmethod
    def _a_request_choice(cls, value):
        choices = ", ".join(f"'{choice}'" for choice in REQUEST_CHOICES)
        try:
            choice = DraftChoice.parse(value)
        except DraftChoiceError:
            choice = None
        if choice not in REQUEST_CHOICES:
            raise ValueError(f"must be one of {choices}")
        return value

    def choice(self) -> DraftChoice:
        return DraftChoice.parse(self.draft)


class _Body(_Part):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's range and default
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM's, SGLang's and llama.cpp's field: 0 or -1 keeps every token
    tandem: TandemFields | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop: list[str] = []
    seed: int | None = Field(None, ge=0, lt=2**63)
    # OpenAI's end-user id: here, whose kept caches answer (one slot per user, so two agents that
    # name themselves do not evict each other's conversation)
    user: str | None = Field(None, max_length=256)
    # What OpenAI does and Tandem does not: each is refused (400, naming it) unless it asks for
    # nothing, at the value OpenAI's clients send by default (see _refuse_unless_no_op).
    n: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logprobs: Any = None
    logit_bias: Any = None

    @field_validator("n", "frequency_penalty", "presence_penalty", "logprobs", "logit_bias")
    @classmethod
    def _not_done_here(cls, value, info):
        return _refuse_unless_no_op(info.field_name, value)

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
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
                                seed=self.seed)
        drafter = self.tandem.choice() if self.tandem is not None else PAIR_DRAFT
        draft_tokens = self.tandem.draft_tokens if self.tandem is not None else None
        trees = self.tandem.trees if self.tandem is not None else "auto"
        return ChatRequest(max_tokens=min(self.max_tokens or DEFAULT_MAX_TOKENS, context), params=params,
                           drafter=drafter, draft_tokens=draft_tokens, trees=trees,
                           stop_strings=tuple(self.stop), fit=False,
                           conversation=f"server {self.user}" if self.user else "server", **fields)


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Any = None  # one of TOOL_CHOICES, or {"type": "function", "function": {"name": ...}}
    # vLLM's and SGLang's way to set a template's switches: {"enable_thinking": false} for Qwen3.x
    chat_template_kwargs: dict[str, Any] | None = None
    top_logprobs: Any = None
    response_format: Any = None
    functions: Any = None  # the API's older form of tools
    function_call: Any = None

    @field_validator("top_logprobs", "response_format", "functions", "function_call")
    @classmethod
    def _not_done_in_chats(cls, value, info):
        return _refuse_unless_no_op(info.field_name, value)

    @field_validator("messages", mode="before")
    @classmethod
    def _roles(cls, value):
        for i, message in enumerate(value if isinstance(value, list) else ()):
            if isinstance(message, dict) and message.get("role") not in ROLES:
                raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {message.get('role')!r}")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value, info):
        named = isinstance(value, dict) and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str)
        if not (value is None or named or (isinstance(value, str) and value in TOOL_CHOICES)):
            raise ValueError(f"must be one of {', '.join(TOOL_CHOICES)}, "
                             "or {'type': 'function', 'function': {'name': ...}}")
        if "tools" not in info.data:  # the tools were refused themselves: that is the error to send
            return value
        names = [tool.function.name for tool in info.data["tools"] or ()]
        if named and value["function"]["name"] not in names:
            offered = f"tools holds {', '.join(repr(n) for n in names)}" if names else "no tools were sent"
            raise ValueError(f"names the tool {value['function']['name']!r}, but {offered}: name one of "
                             "the tools sent, or send the tool")
        if value == "required" and not names:
            raise ValueError("'required' asks for a tool call, but no tools were sent: send tools, "
                             "or leave tool_choice out")
        return value

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
        if isinstance(choice, dict):  # one of the tools: checked as the body was read
            return tuple(t for t in tools if t["function"]["name"] == choice["function"]["name"])
        return tuple(tools)


class CompletionBody(_Body):
    prompt: str
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    @field_validator("echo", "best_of", "suffix")
    @classmethod
    def _not_done_in_completions(cls, value, info):
        return _refuse_unless_no_op(info.field_name, value)

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


def _is(*values):
    """A test for exactly one of `values` (False is not 0 here, nor 1 True)."""
    return lambda value: any(type(value) is type(v) and value == v for v in values)


# OpenAI's request fields that Tandem does not act on: (is this the value that asks for nothing,
# why it is refused, what to send instead). A field's type is checked here too, so that any other
# value is the same clear refusal.
_NOT_DONE = {
    "n": (_is(1), "one answer per request", "leave it out or 1, and send more requests for more answers"),
    "best_of": (_is(1), "one answer per request", "leave it out or 1"),
    "frequency_penalty": (_is(0, 0.0), "the answer is the model's own", "leave it out or 0"),
    "presence_penalty": (_is(0, 0.0), "the answer is the model's own", "leave it out or 0"),
    "logprobs": (_is(False), "Tandem does not return log-probabilities", "leave it out or false"),
    "top_logprobs": (_is(0), "Tandem does not return log-probabilities", "leave it out"),
    "logit_bias": (_is({}), "Tandem does not bias tokens", "leave it out or {}"),
    "response_format": (_is({"type": "text"}), "Tandem cannot hold an answer to JSON or to a schema",
                        "leave it out or {'type': 'text'}, and ask for JSON in the prompt"),
    "functions": (_is([]), "that is the older form of tools", "send tools and tool_choice"),
    "function_call": (_is("none", "auto"), "that is the older form of tool_choice", "send tools and tool_choice"),
    "echo": (_is(False), "Tandem writes the answer only", "leave it out or false"),
    "suffix": (_is(""), "Tandem writes after the prompt only, not into a gap before a suffix", "leave it out"),
}


def _refuse_unless_no_op(field: str, value):
    """`value` if it asks for nothing (None, or the field's no-op value), else a ValueError
    that says what is not supported and what to send."""
    asks_nothing, why, instead = _NOT_DONE[field]
    if value is None or asks_nothing(value):
        return value
    raise ValueError(f"not supported ({why}): {instead}")


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
