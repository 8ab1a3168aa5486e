"""Tool calls from the model (issue 46): a generation's `tools` (JSON-schema functions, the
OpenAI-compatible shape) and `tool_choice`, checked; the instructions a model whose chat template
takes no tools is given instead (the fallback prompt); and the grammar that makes every call the
model writes a valid call of one of the functions.

A call is written the way tool-calling chat templates (Hermes, Qwen, SmolLM3) train their models
to write it, one line of compact JSON between tags, one call after another:

    <tool_call>
    {"name":"get_weather","arguments":{"city":"Paris"}}
    </tool_call>

The grammar (a Lark grammar of llguidance, each call's JSON one `%json` schema per function, its
`arguments` the function's bounded `parameters`) allows, by `tool_choice`:
  auto      text that does not begin with "<", or 1..MAX_CALLS calls;
  required  1..MAX_CALLS calls of any of the functions;
  a name    1..MAX_CALLS calls of that function;
  none      no grammar: the model writes text (the fallback prompt then leaves the tools out).
The server reads the calls back out of the text (tools/support/tool_calls.ts).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import invalid
from .bounds import bound_schema
from .grammar import _JSON_OPTIONS, ResponseFormat, check_schema, refused

MAX_TOOLS = 32
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_CALLS = 4
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
CHOICES = ("auto", "none", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def spec(self) -> dict:
        """The OpenAI-compatible shape, as chat templates that take tools read it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Tools:
    tools: tuple[Tool, ...]
    choice: str  # auto | none | required | the name of the one function to call

    def named(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)


def parse_tools(args: dict[str, Any]) -> Tools | None:
    """args.tools and args.tool_choice, checked (None when no tools are given)."""
    raw, choice = args.get("tools"), args.get("tool_choice")
    if raw is None:
        if choice is not None:
            raise invalid("args.tool_choice needs args.tools: give the functions the model may call")
        return None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_TOOLS:
        raise invalid(f"args.tools must be a list of 1..{MAX_TOOLS} {{type: 'function', function}} objects")
    tools: list[Tool] = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise invalid(f"args.tools[{i}] must be {{type: 'function', function: {{name, description, parameters}}}}")
        name, desc = fn.get("name"), fn.get("description", "")
        if not isinstance(name, str) or not NAME.match(name):
            raise invalid(f"args.tools[{i}].function.name must be 1..{MAX_NAME_CHARS} of A-Z a-z 0-9 _ . -")
        if not isinstance(desc, str) or len(desc) > MAX_DESCRIPTION_CHARS:
            raise invalid(f"args.tools[{i}].function.description must be a string of at most {MAX_DESCRIPTION_CHARS}")
        params = fn.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise invalid(f"args.tools[{i}].function.parameters must be a JSON schema of type object")
        check_schema(params, f"tools[{i}].function.parameters")
        if any(x.name == name for x in tools):
            raise invalid(f"args.tools[{i}].function.name {name!r} is given twice: names must be unique")
        tools.append(Tool(name, desc, params))
    return Tools(tuple(tools), _choice(choice, tools))


def _choice(choice: Any, tools: list[Tool]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in CHOICES:
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise invalid("args.tool_choice must be 'auto', 'none', 'required' or {type: 'function', function: {name}}")
    if not any(t.name == name for t in tools):
        raise invalid(f"args.tool_choice names {name!r}, which is not among args.tools")
    return name


def _call_schema(tool: Tool) -> dict:
    """One call of `tool` as a JSON schema: its name, then its (bounded) arguments. The
    parameters' definitions move to the top, where their `#/$defs/...` references point."""
    params = bound_schema(tool.parameters)
    defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        **defs,
        "x-guidance": _JSON_OPTIONS,
    }


def tools_format(spec: Tools) -> ResponseFormat | None:
    """The grammar of `spec`'s answers (None for tool_choice none: the model writes text)."""
    from llguidance import LLMatcher

    if spec.choice == "none":
        return None
    chosen = [spec.named(spec.choice)] if spec.choice not in CHOICES else list(spec.tools)
    rules = [f"fn{i}: %json{json.dumps(_call_schema(t))}" for i, t in enumerate(chosen) if t is not None]
    body = " | ".join(f"fn{i}" for i in range(len(rules)))
    calls = f"call ({json.dumps(chr(10))} call){{0,{MAX_CALLS - 1}}}"
    start = "start: TEXT | calls" if spec.choice == "auto" else "start: calls"
    lark = "\n".join(
        [
            start,
            f"calls: {calls}",
            f"call: {json.dumps(OPEN)} body {json.dumps(CLOSE)}",
            f"body: {body}",
            *rules,
            # Text that is no call: it does not begin with "<" (nor, so, with "<tool_call>").
            r"TEXT: /[^<][\s\S]*/",
        ]
    )
    try:
        grammar = LLMatcher.grammar_from_lark(lark)
    except ValueError as exc:
        raise refused(f"tools: a function's parameters are not supported ({str(exc)[:200]}): change them") from None
    return ResponseFormat("tools", grammar, {"grammar": lark})


def fallback_prompt(spec: Tools) -> str:
    """The system instructions of a model whose chat template takes no tools (docs/tools.md)."""
    listed = "\n".join(json.dumps(t.spec()["function"], ensure_ascii=False) for t in spec.tools)
    if spec.choice == "auto":
        when = "When a function answers the request, call it; otherwise answer in plain text."
    elif spec.choice == "required":
        when = "Call one or more of the functions."
    else:
        when = f"Call the function {spec.choice}."
    return (
        "You can call these functions (JSON schemas of their arguments):\n"
        f"{listed}\n"
        f"{when} To call a function, write exactly:\n"
        '<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>\n'
        "The result of each call comes back in the next message."
    )


def fallback_messages(messages: list[dict], spec: Tools | None) -> list[dict]:
    """The conversation for a template without tools: the instructions in the system message
    (before its own), each assistant call written as the model writes one, each tool result a
    user message that names its call."""
    names = {c["id"]: c["name"] for m in messages for c in m.get("tool_calls", [])}
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            name = names.get(m["tool_call_id"], "?")
            out.append({"role": "user", "content": f"Result of {name} (call {m['tool_call_id']}):\n{m['content']}"})
        elif m.get("tool_calls"):
            calls = [_written(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(x for x in [m["content"], *calls] if x)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if spec is None or spec.choice == "none":
        return out
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{fallback_prompt(spec)}\n\n{out[0]['content']}"}, *out[1:]]
    return [{"role": "system", "content": fallback_prompt(spec)}, *out]


def template_messages(messages: list[dict]) -> list[dict]:
    """The conversation for a template that takes tools, in the shape Hugging Face templates
    read: an assistant's calls as `tool_calls` [{id, type, function: {name, arguments}}], a
    result with its `tool_call_id` and the function's `name`."""
    names = {c["id"]: c["name"] for m in messages for c in m.get("tool_calls", [])}
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({**m, "name": names.get(m["tool_call_id"], "")})
        elif m.get("tool_calls"):
            calls = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": m["content"], "tool_calls": calls})
        else:
            out.append(m)
    return out


def _written(call: dict) -> str:
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"


def render_chat(chat, messages: list[dict], spec: Tools | None, add_generation_prompt: bool) -> str:
    """The prompt of a conversation with `chat` (a ChatTemplate): the tools rendered by the
    template where it reads them, else the fallback prompt's instructions."""
    if chat.takes_tools:
        tools = [t.spec() for t in spec.tools] if spec is not None and spec.choice != "none" else None
        return chat.render(template_messages(messages), add_generation_prompt, tools)
    return chat.render(fallback_messages(messages, spec), add_generation_prompt)
