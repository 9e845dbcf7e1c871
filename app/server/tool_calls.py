"""Tool calls in a model's own words, read back as OpenAI `tool_calls`.

The chat template renders the tools (each family its own way); what the model writes back to
call one is read here, in the formats of the families the catalog offers:

- "hermes": Qwen 2.5/3.x, Hermes, and most fine-tunes: `<tool_call>{"name", "arguments"}</tool_call>`;
- "mistral": `[TOOL_CALLS] [{"name", "arguments"}, ...]`;
- "llama3": Llama 3.1-3.3: the answer is one JSON object `{"name", "parameters"}`, optionally
  after `<|python_tag|>`.

While an answer streams, text that may begin a call is held back (`ToolCallSplitter`), so a
client never sees half a call as content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

HERMES, MISTRAL, LLAMA3 = "hermes", "mistral", "llama3"
_OPENERS = {HERMES: "<tool_call>", MISTRAL: "[TOOL_CALLS]", LLAMA3: "<|python_tag|>"}
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's API carries it
    id: str

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def tool_format(chat_template: str) -> str | None:
    """Which way the template's family writes calls (None: the template renders no tools)."""
    if "tools" not in chat_template:
        return None
    if "<tool_call>" in chat_template:
        return HERMES
    if "[TOOL_CALLS]" in chat_template:
        return MISTRAL
    if "<|python_tag|>" in chat_template or "parameters" in chat_template:
        return LLAMA3
    return HERMES  # the most common convention among templates that render tools at all


def _call(obj: object) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), "call_" + secrets.token_hex(12))


def parse_tool_calls(text: str, fmt: str | None) -> tuple[str, list[ToolCall]]:
    """(the answer's content, its tool calls). Text that does not read as a call stays content."""
    if fmt is None:
        return text, []
    if fmt == HERMES:
        start = text.find("<tool_call>")
        if start < 0:
            return text, []
        calls = []
        for body in _HERMES_CALL.findall(text[start:]):
            try:
                call = _call(json.loads(body))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []  # a malformed call: the client sees what the model wrote
            calls.append(call)
        return text[:start].rstrip(), calls
    if fmt == MISTRAL:
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return text, []
        try:
            objs = json.loads(text[start + len("[TOOL_CALLS]"):].strip())
        except json.JSONDecodeError:
            return text, []
        calls = [_call(o) for o in (objs if isinstance(objs, list) else [objs])]
        return (text[:start].rstrip(), calls) if calls and None not in calls else (text, [])
    body = text.strip().removeprefix("<|python_tag|>").strip()
    try:
        objs = json.loads(body)
    except json.JSONDecodeError:
        return text, []
    calls = [_call(o) for o in (objs if isinstance(objs, list) else [objs])]
    return ("", calls) if calls and None not in calls else (text, [])


class ToolCallSplitter:
    """Streams an answer's content while holding back what may be a tool call."""

    def __init__(self, fmt: str | None):
        self.fmt = fmt
        self._text = ""
        self._sent = 0  # characters of _text already given out as content
        self._held = False  # a call has begun: nothing more is content until the end

    def feed(self, delta: str) -> str:
        """The content that is safe to send now."""
        self._text += delta
        if self.fmt is None:
            return self._give(len(self._text))
        if self._held:
            return ""
        opener = _OPENERS[self.fmt]
        if self.fmt == LLAMA3 and not self._sent:  # a Llama call is the whole answer
            start = self._text.lstrip()
            if start.startswith(("{", opener)) or opener.startswith(start):
                return ""  # it may be a call: decided at the end
        at = self._text.find(opener, self._sent)
        if at >= 0:
            self._held = True
            return self._give(len(self._text[:at].rstrip()))
        # what may begin a call stays back, and so does trailing space (it goes if a call follows)
        end = len(self._text) - _partial_suffix(self._text, opener)
        return self._give(len(self._text[:end].rstrip()))

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet sent, the calls) once the answer has ended."""
        content, calls = parse_tool_calls(self._text, self.fmt)
        if not calls:
            return self._give(len(self._text)), []
        rest = content[self._sent:] if content.startswith(self._text[:self._sent]) else ""
        self._sent = len(self._text)
        return rest, calls

    def _give(self, end: int) -> str:
        out = self._text[self._sent:end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return out


def _partial_suffix(text: str, opener: str) -> int:
    """The length of the longest end of `text` that begins `opener` (it may complete next)."""
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0


def messages_for_template(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages as chat templates read them: a tool call's arguments as an object
    (templates write them with `tojson`), content parts joined into text."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            message["content"] = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        elif content is None:
            message["content"] = ""
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [_call_for_template(call) for call in calls]
        out.append(message)
    return out


def _call_for_template(call: dict) -> dict:
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            function["arguments"] = json.loads(args)
        except json.JSONDecodeError:
            pass  # the template writes the string as it came
    return {**call, "function": function}
