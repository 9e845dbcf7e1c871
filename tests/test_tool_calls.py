"""Tool calls read back from what a model writes, in each family's format (app/server/tool_calls.py),
whole and while streaming, and OpenAI messages made ready for chat templates."""

from __future__ import annotations

import json

import pytest

from app.server.tool_calls import (HERMES, LLAMA3, MISTRAL, ToolCallSplitter, messages_for_template,
                                   parse_tool_calls, tool_format)

HERMES_OUT = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' \
             '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
MISTRAL_OUT = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]'
LLAMA_OUT = '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}'


def _named(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("fmt, text, content", [(HERMES, HERMES_OUT, "Sure."), (MISTRAL, MISTRAL_OUT, "")])
def test_each_format_reads_every_call(fmt, text, content):
    got, calls = parse_tool_calls(text, fmt)
    assert got == content and _named(calls) == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_llama_writes_one_json_object_with_parameters():
    assert _named(parse_tool_calls(LLAMA_OUT, LLAMA3)[1]) == [("add", {"a": 1, "b": 2})]
    assert _named(parse_tool_calls('{"name": "now", "parameters": {}}', LLAMA3)[1]) == [("now", {})]
    assert parse_tool_calls('{"answer": 4}', LLAMA3) == ('{"answer": 4}', [])  # JSON, but not a call


@pytest.mark.parametrize("text", ['<tool_call>\n{"name": "add", "arguments": {"a": 1</tool_call>',  # cut short
                                  '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
                                  '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>'])  # not an object
def test_a_malformed_call_stays_text_the_client_can_read(text):
    assert parse_tool_calls(text, HERMES) == (text, [])


def test_arguments_written_as_a_json_string_are_read_too():
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert _named(parse_tool_calls(text, HERMES)[1]) == [("add", {"a": 1})]


def test_the_format_is_the_templates():
    assert tool_format("{% for tool in tools %}...<tool_call>{% endfor %}") == HERMES
    assert tool_format("{% if tools %}[AVAILABLE_TOOLS]...[TOOL_CALLS]{% endif %}") == MISTRAL
    assert tool_format("{% if tools %}...<|python_tag|>...{% endif %}") == LLAMA3
    assert tool_format("{{ message.content }}") is None  # renders no tools: none can be called


@pytest.mark.parametrize("cut", range(1, len(HERMES_OUT)))
def test_streaming_never_sends_part_of_a_call_as_text(cut):
    splitter = ToolCallSplitter(HERMES)
    sent = splitter.feed(HERMES_OUT[:cut]) + splitter.feed(HERMES_OUT[cut:])
    rest, calls = splitter.finish()
    assert sent + rest == "Sure." and "<" not in sent and len(calls) == 2


def test_streaming_text_without_a_call_arrives_whole():
    text = "a < b, and <tool is not a call; tabs\tand ends  "
    splitter = ToolCallSplitter(HERMES)
    sent = "".join(splitter.feed(ch) for ch in text)
    rest, calls = splitter.finish()
    assert sent + rest == text and calls == []
    assert sent.startswith("a < b, and <tool is not a call")  # only a possible opener is held back


def test_a_llama_answer_that_is_not_a_call_is_sent_at_the_end():
    splitter = ToolCallSplitter(LLAMA3)
    assert splitter.feed('{"answer"') == ""  # it may be a call
    assert splitter.feed(': 4}') == ""
    assert splitter.finish() == ('{"answer": 4}', [])
    plain = ToolCallSplitter(LLAMA3)
    assert plain.feed("Four.") == "Four."  # text from its first character is never a Llama call


def test_openai_messages_become_what_templates_read():
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    messages = messages_for_template([
        {"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]}])
    assert messages[0]["content"] == "one two" and messages[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}  # templates write it with tojson
    assert call["function"]["arguments"] == '{"a": 1}'  # the client's own message is left as it was
