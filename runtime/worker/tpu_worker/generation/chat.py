"""Chat: a conversation rendered into one prompt with the model's own chat template.

The template is the model's: `chat_template` in tokenizer_config.json (a string, or a list of
named templates of which "default" is used) or a `chat_template.jinja` file beside it. It is
rendered in Jinja's immutable sandbox (no attribute access to Python internals, no mutation of
the messages), with the variables Hugging Face templates expect: messages,
add_generation_prompt, the special tokens (bos_token, eos_token, ...), raise_exception.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..errors import WorkerError, invalid

ROLES = ("system", "user", "assistant", "tool")
MAX_CALL_ID_CHARS = 64
MAX_MESSAGES = 256
_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    def __init__(self, source: str, special: dict[str, str]) -> None:
        from jinja2 import meta
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.error: str | None = None  # a template that does not compile refuses every chat

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        self.special = special
        try:
            self.template = env.from_string(source)
            # A template that reads `tools` renders them itself (generation/tools.py otherwise).
            self.takes_tools = "tools" in meta.find_undeclared_variables(env.parse(source))
        except TemplateError as exc:
            self.template, self.error, self.takes_tools = None, f"{type(exc).__name__}: {exc}", False

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None) -> str:
        from jinja2.exceptions import TemplateError

        if self.template is None:
            raise invalid(f"this model's chat template does not compile ({self.error}); fix the model's template")
        try:
            extra = {"tools": tools} if tools else {}
            return self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **extra, **self.special
            )
        except Exception as exc:  # noqa: BLE001 - raise_exception, sandbox refusals, template bugs
            kind = "" if isinstance(exc, TemplateError) else f"{type(exc).__name__}: "
            raise invalid(f"the model's chat template refused the conversation: {kind}{exc}") from None


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):  # a serialised AddedToken
        return v["content"]
    return None


def load_chat_template(read_file) -> ChatTemplate | None:
    """The model's chat template, or None when it has none. `read_file(name)` returns a file's
    text from the model directory (inside the model roots) or None when it is absent."""
    config: dict = {}
    raw = read_file("tokenizer_config.json")
    if raw:
        try:
            config = json.loads(raw)
        except ValueError:
            config = {}
    source = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(source, list):  # [{name, template}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source:
        source = read_file("chat_template.jinja")
    if not source:
        return None
    special = {k: t for k in _TOKEN_KEYS if (t := _token_text(config.get(k))) is not None}
    return ChatTemplate(source, special)


def no_chat_template(entry) -> WorkerError:
    """The refusal of `messages` for a model without a chat template (the worker's own models
    and the vLLM engine alike; the server refuses first when describe has said so)."""
    return invalid(
        f"model {entry.id!r} has no chat template (chat_template in tokenizer_config.json or "
        "chat_template.jinja); send args.texts instead"
    )


def check_messages(raw: Any, max_chars: int) -> list[dict]:
    """args.messages: 1..MAX_MESSAGES {role, content} objects; content totals at most max_chars.
    An assistant message may carry `tool_calls` [{id, name, arguments}], and a `tool` message
    (a call's result) names its call by `tool_call_id` (generation/tools.py renders them)."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MESSAGES:
        raise invalid(f"args.messages must be a list of 1..{MAX_MESSAGES} {{role, content}} objects")
    out, total, calls = [], 0, set()
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise invalid(f"args.messages[{i}] must be {{role: 'system'|'user'|'assistant'|'tool', content: string}}")
        allowed = {"role", "content"} | {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(m["role"], set())
        extra = set(m) - allowed
        if extra:
            raise invalid(f"args.messages[{i}] has unknown field(s) {', '.join(sorted(extra))}")
        total += len(m["content"])
        msg = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _check_calls(m["tool_calls"], i)
            calls.update(c["id"] for c in msg["tool_calls"])
        if m["role"] == "tool":
            ref = m.get("tool_call_id")
            if ref not in calls:
                raise invalid(
                    f"args.messages[{i}].tool_call_id must name a call of an earlier assistant message's tool_calls"
                )
            msg["tool_call_id"] = ref
        out.append(msg)
    if total > max_chars:
        raise invalid(f"args.messages' contents total {total} characters; the limit is {max_chars}")
    return out


def _check_calls(raw: Any, i: int) -> list[dict]:
    shape = f"args.messages[{i}].tool_calls must be a list of {{id, name, arguments: object}}"
    if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
        raise invalid(shape + " (1..16 calls)")
    out = []
    for c in raw:
        if (
            not isinstance(c, dict)
            or set(c) != {"id", "name", "arguments"}
            or not isinstance(c["id"], str)
            or not 1 <= len(c["id"]) <= MAX_CALL_ID_CHARS
            or not isinstance(c["name"], str)
            or not isinstance(c["arguments"], dict)
        ):
            raise invalid(shape)
        out.append({"id": c["id"], "name": c["name"], "arguments": c["arguments"]})
    return out
