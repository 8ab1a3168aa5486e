"""Tool calls (generation/tools.py): the checks of tools and tool_choice, the grammar each choice
builds (followed token by token with SmolLM2's tokenizer: what it lets through and what it stops),
and the prompt a template with and without tools gets."""

from __future__ import annotations

import json
import os

import pytest

from tpu_worker.errors import WorkerError
from tpu_worker.generation.chat import ChatTemplate, check_messages
from tpu_worker.generation.tools import parse_tools, render_chat, tools_format

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIMER = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1}}},
    },
}


@pytest.fixture(scope="module")
def tokenizer(models_dir):
    import tokenizers
    from llguidance import LLTokenizer

    tk = tokenizers.Tokenizer.from_file(os.path.join(models_dir, "smollm2-135m-instruct", "tokenizer.json"))
    spec = json.loads(tk.to_str())
    spec["padding"] = spec["truncation"] = None
    return tk, LLTokenizer(json.dumps(spec), n_vocab=tk.get_vocab_size(), eos_token=2)


def follows(tokenizer, choice, text: str) -> bool:
    """Whether the grammar of `choice` over both functions takes `text` whole and complete."""
    from llguidance import LLMatcher

    tk, ll = tokenizer
    fmt = tools_format(parse_tools({"tools": [WEATHER, TIMER], "tool_choice": choice}))
    m = LLMatcher(ll, fmt.grammar, log_level=0)
    return all(m.consume_token(t) for t in tk.encode(text, add_special_tokens=False).ids) and m.is_accepting()


CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}\n</tool_call>'
TIMER_CALL = '<tool_call>\n{"name":"set_timer","arguments":{"minutes":5}}\n</tool_call>'


def test_auto_takes_text_or_valid_calls_and_nothing_else(tokenizer):
    assert follows(tokenizer, "auto", "It is sunny.")
    assert follows(tokenizer, "auto", CALL)
    assert follows(tokenizer, "auto", f"{CALL}\n{TIMER_CALL}")
    # An argument outside its schema, an unknown function, a missing required argument.
    assert not follows(tokenizer, "auto", CALL.replace('"c"', '"kelvin"'))
    assert not follows(tokenizer, "auto", CALL.replace("get_weather", "get_wether"))
    assert not follows(tokenizer, "auto", CALL.replace(',"unit":"c"', ""))


def test_required_and_a_named_choice_take_only_calls(tokenizer):
    assert not follows(tokenizer, "required", "It is sunny.")
    assert follows(tokenizer, "required", TIMER_CALL)
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert follows(tokenizer, named, CALL)
    assert not follows(tokenizer, named, TIMER_CALL)
    assert tools_format(parse_tools({"tools": [WEATHER], "tool_choice": "none"})) is None


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"tool_choice": "auto"}, "args.tool_choice needs args.tools"),
        ({"tools": []}, "args.tools must be a list of 1..32"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "function.name must be"),
        ({"tools": [WEATHER, WEATHER]}, "is given twice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "args.tool_choice must be"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "names 'x', which is not among args.tools",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}]},
            "of type object",
        ),
    ],
)
def test_bad_tools_and_choices_are_refused_saying_what_to_change(args, fragment):
    with pytest.raises(WorkerError, match=fragment):
        parse_tools(args)


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18"},
]


def test_a_template_without_tools_gets_the_fallback_prompt_and_the_calls_as_written():
    chat = ChatTemplate("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", {})
    assert not chat.takes_tools
    spec = parse_tools({"tools": [WEATHER]})
    text = render_chat(chat, check_messages(CONVERSATION, 10_000), spec, True)
    assert text.startswith("[system] You can call these functions")
    assert '"name": "get_weather"' in text
    assert f"[assistant] {CALL}" in text
    assert "[user] Result of get_weather (call c1):\n18" in text


def test_a_template_that_reads_tools_renders_them_itself():
    source = (
        "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}"
        "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
        "{% if m.role == 'tool' %} NAME {{ m.name }} ID {{ m.tool_call_id }}{% endif %}\n{% endfor %}"
    )
    chat = ChatTemplate(source, {})
    assert chat.takes_tools
    text = render_chat(chat, check_messages(CONVERSATION, 10_000), parse_tools({"tools": [WEATHER]}), True)
    assert text.startswith("TOOL get_weather\n[user] Weather in Paris?")
    assert 'CALL get_weather {"city": "Paris", "unit": "c"}' in text
    assert "[tool] 18 NAME get_weather ID c1" in text
    assert "You can call" not in text


def test_a_tool_message_must_answer_an_earlier_call():
    with pytest.raises(WorkerError, match="tool_call_id must name a call"):
        check_messages([{"role": "tool", "tool_call_id": "c9", "content": "1"}], 100)
    with pytest.raises(WorkerError, match="unknown field"):
        check_messages([{"role": "user", "content": "x", "tool_calls": []}], 100)
