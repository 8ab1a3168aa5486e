"""Structured output (generation/grammar.py): response_format on the real instruction model
(smollm2-135m-instruct) through the worker's decode loop: answers that validate against their
JSON schema, a choice, a regex; a cut-off answer reported as incomplete; seeds and streaming
as without a grammar; the bounds and the compile timeout refused with response_format_refused."""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tpu_worker.errors import WorkerError
from tpu_worker.generation import grammar
from tpu_worker.ops import OpContext

MODEL = "smollm2-135m-instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["engineer", "artist", "doctor", "teacher"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "skills", "address"],
    "additionalProperties": False,
}
NAMES = ["Alice", "Bob", "Chen", "Dara", "Eve", "Femi", "Gus", "Hana"]
# The bench's prompts and schemas (bench/structured_parse.ts); LOOPED are those whose answers ran
# to max_new_tokens 160 as invalid JSON before issue 44 (a string of "john-john-…", one attendee
# again and again, a 100-digit email, an unasked-for nested "description").
PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "data", "structured_prompts.jsonl")
LOOPED = ["event-0", "event-1", "event-2", "event-4", "event-6", "product-0"]


def person_prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Describe a person named {NAMES[i % len(NAMES)]} as JSON."}]


@pytest.fixture(scope="module")
def smol(catalog, cpu_probe):
    from tpu_worker.ops import Worker

    w = Worker(catalog, cpu_probe)
    w.handle("load", {"model": MODEL}, [], OpContext("load"))
    yield w
    w.close()


def infer(w, args, ctx=None):
    return w.handle("infer", {"model": MODEL, **args}, [], ctx or OpContext("g"))[0]


def concurrently(w, calls: list[dict]) -> list[dict]:
    """The calls at once, as concurrent callers send them (the decode loop batches them)."""
    with ThreadPoolExecutor(len(calls)) as ex:
        return list(ex.map(lambda a: infer(w, a), calls))


def refusal(w, fmt) -> str:
    with pytest.raises(WorkerError) as err:
        infer(w, {"messages": person_prompt(0), "max_new_tokens": 4, "response_format": fmt})
    assert err.value.code == "response_format_refused", err.value.message
    return err.value.message


def test_answers_validate_against_the_schema_and_unconstrained_ones_do_not(smol):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    calls = [{"messages": person_prompt(i), "max_new_tokens": 96} for i in range(8)]
    constrained = concurrently(smol, [{**c, "response_format": fmt} for c in calls])
    for r in constrained:
        g = r["generations"][0]
        assert g["finish_reason"] == "stop" and g["grammar_complete"] is True, g
        jsonschema.validate(json.loads(g["text"]), PERSON)
        assert r["grammar_compile_ms"] >= 0
    free = concurrently(smol, calls)
    invalid = 0
    for r in free:
        g = r["generations"][0]
        assert "grammar_complete" not in g  # no grammar, no claim
        try:
            jsonschema.validate(json.loads(g["text"]), PERSON)
        except (ValueError, jsonschema.ValidationError):
            invalid += 1
    print(f"unconstrained: {invalid}/{len(free)} answers do not validate")
    assert invalid > 0  # the constraint does the work


def test_prompts_that_looped_until_cut_off_now_end_in_answers_that_parse_and_validate(smol):
    with open(PROMPTS, encoding="utf-8") as fh:
        rows = {r["id"]: r for r in map(json.loads, fh)}
    calls = [
        {
            "messages": [{"role": "user", "content": rows[i]["prompt"]}],
            "max_new_tokens": 160,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": rows[i]["schema"]}},
        }
        for i in LOOPED
    ]
    for i, r in zip(LOOPED, concurrently(smol, calls), strict=True):
        g = r["generations"][0]
        assert g["grammar_complete"] is True, (i, g)
        jsonschema.validate(json.loads(g["text"]), rows[i]["schema"])


def test_a_choice_and_a_regex_are_followed(smol):
    choices = ["positive", "negative", "neutral"]
    pattern = r"[A-Z][a-z]{2,9}, [0-9]{4}"
    calls = [
        {"messages": [{"role": "user", "content": f"Is '{t}' positive or negative?"}], "max_new_tokens": 8}
        for t in ("I love it", "awful", "it is a chair")
    ]
    for r in concurrently(smol, [{**c, "response_format": {"type": "choice", "choices": choices}} for c in calls]):
        g = r["generations"][0]
        assert g["text"] in choices and g["grammar_complete"] is True, g
    ask = [{"role": "user", "content": "Name a city and a year."}]
    r = infer(smol, {"messages": ask, "max_new_tokens": 16, "response_format": {"type": "regex", "pattern": pattern}})
    g = r["generations"][0]
    assert re.fullmatch(pattern, g["text"]) and g["grammar_complete"] is True, g


def test_an_answer_cut_by_max_new_tokens_is_reported_incomplete(smol):
    # 6 tokens cannot hold the shortest PERSON (about 38): no closing fits, the text is cut.
    fmt = {"type": "json_schema", "schema": PERSON}
    r = infer(smol, {"messages": person_prompt(1), "max_new_tokens": 6, "response_format": fmt})
    g = r["generations"][0]
    assert g["finish_reason"] == "length" and g["grammar_complete"] is False, g
    with pytest.raises(ValueError):
        json.loads(g["text"])


def test_a_budget_that_holds_the_shortest_answer_ends_in_one_that_validates(smol):
    # Any JSON object closes in one token; PERSON's shortest answer takes about 38 of 40.
    r = infer(smol, {"messages": person_prompt(1), "max_new_tokens": 6, "response_format": {"type": "json_object"}})
    g = r["generations"][0]
    assert g["finish_reason"] == "stop" and g["grammar_complete"] is True, g
    assert isinstance(json.loads(g["text"]), dict)
    fmt = {"type": "json_schema", "schema": PERSON}
    r = infer(smol, {"messages": person_prompt(2), "max_new_tokens": 40, "response_format": fmt})
    g = r["generations"][0]
    assert g["finish_reason"] == "stop" and g["grammar_complete"] is True, g
    jsonschema.validate(json.loads(g["text"]), PERSON)


def test_43_11_a_stop_sequence_that_ends_a_structured_answer_early_reports_grammar_complete_false(smol):
    # The stop sequence is the answer's last character: the grammar saw a complete sentence,
    # but the text the caller gets lacks its closing brace.
    label = {
        "type": "object",
        "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
        "required": ["label"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "schema": label}
    ask = [{"role": "user", "content": "Is 'I love it' positive or negative? Answer as JSON."}]
    g = infer(smol, {"messages": ask, "max_new_tokens": 32, "stop": ["}"], "response_format": fmt})["generations"][0]
    assert g["finish_reason"] == "stop" and g["text"].startswith('{"label":"') and "}" not in g["text"], g
    assert g["grammar_complete"] is False, g
    with pytest.raises(ValueError):
        json.loads(g["text"])


def test_43_11_a_batch_of_texts_under_one_response_format_gives_valid_json_for_each(smol):
    # One request, several prompts, one compiled grammar: each row decodes with its own matcher.
    fmt = {"type": "json_schema", "schema": PERSON}
    texts = [f"A person named {name} as JSON: " for name in NAMES[:4]]
    r = infer(smol, {"texts": texts, "max_new_tokens": 96, "response_format": fmt})
    assert len(r["generations"]) == len(texts)
    for g in r["generations"]:
        assert g["finish_reason"] == "stop" and g["grammar_complete"] is True and "grammar_error" not in g, g
        jsonschema.validate(json.loads(g["text"]), PERSON)


def test_an_answer_cut_by_a_stop_sequence_is_reported_incomplete(smol):
    fmt = {"type": "json_schema", "schema": PERSON}
    r = infer(smol, {"messages": person_prompt(2), "max_new_tokens": 96, "stop": ['"age"'], "response_format": fmt})
    g = r["generations"][0]
    assert g["finish_reason"] == "stop" and g["grammar_complete"] is False and '"age"' not in g["text"], g


def test_a_seeded_sample_repeats_and_streams_the_same_text(smol):
    fmt = {"type": "json_schema", "schema": PERSON}
    args = {"messages": person_prompt(3), "max_new_tokens": 96, "temperature": 0.9, "seed": 5, "response_format": fmt}
    seen: list[str] = []
    ctx = OpContext("s", progress=lambda p, total=None, message=None, delta=None: seen.append(delta["text"]))
    a = infer(smol, {**args, "stream": True}, ctx)["generations"][0]
    b = infer(smol, args)["generations"][0]
    assert a["text"] == b["text"] and "".join(seen) == a["text"]
    jsonschema.validate(json.loads(a["text"]), PERSON)


def _deep(levels: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


@pytest.mark.parametrize(
    ("fmt", "fragment"),
    [
        ({"type": "xml"}, "response_format.type must be one of"),
        ({"type": "json_schema"}, "must be a JSON schema object"),
        ({"type": "json_schema", "schema": _deep(20)}, "nests deeper than 16 levels"),
        (
            {"type": "json_schema", "schema": {"enum": [f"v{i}" for i in range(300)]}},
            "an enum has 300 values; at most 256",
        ),
        (
            {"type": "json_schema", "schema": {"description": "x" * 20000, "type": "string"}},
            "bytes; at most 16384",
        ),
        ({"type": "json_schema", "schema": {"type": "string", "format": "zzz"}}, "Unknown format"),
        ({"type": "regex", "pattern": "a" * 1025}, "a regex of 1..1024 characters"),
        ({"type": "regex", "pattern": "(a"}, "unclosed group"),
        ({"type": "choice", "choices": []}, "1..256 strings"),
    ],
)
def test_bounds_and_unsupported_grammars_are_refused_saying_what_to_change(smol, fmt, fragment):
    assert fragment in refusal(smol, fmt)


def test_a_compile_past_its_timeout_is_refused_and_the_model_answers_meanwhile(smol):
    compiler = smol.served[MODEL].adapter.grammars
    fmt = grammar.parse_response_format({"type": "json_schema", "schema": PERSON})
    # A compile that cannot finish in time: the grammar thread is held by a stand-in for a
    # hostile compile until the model has answered another call.
    release = threading.Event()
    grammar.Grammars._executor().submit(release.wait, 60)
    try:
        with pytest.raises(WorkerError) as err:
            compiler.compile(fmt, timeout_s=0.2)
        assert err.value.code == "response_format_refused" and "did not compile within 0.2 s" in err.value.message
        r = infer(smol, {"messages": person_prompt(4), "max_new_tokens": 4})
        assert r["generations"][0]["usage"]["completion_tokens"] >= 1
        # The next grammar compiles on a fresh thread, the stuck one left behind.
        fmt = {"type": "choice", "choices": ["yes", "no"]}
        ok = infer(smol, {"messages": person_prompt(4), "max_new_tokens": 8, "response_format": fmt})
        assert ok["generations"][0]["grammar_complete"] is True
    finally:
        release.set()


def test_a_wordpiece_tokenizer_is_refused_naming_a_model_that_works(shared_worker):
    with pytest.raises(WorkerError) as err:
        shared_worker.handle(
            "infer",
            {"model": "tiny-gpt2", "texts": ["a"], "response_format": {"type": "json_object"}},
            [],
            OpContext("w"),
        )
    assert err.value.code == "response_format_refused" and "smollm2-135m-instruct" in err.value.message


def test_masks_forbid_exactly_what_each_row_s_bits_forbid_and_leave_other_rows_alone():
    import torch

    logits = torch.zeros((3, 70))
    bits = torch.full((3, 2), -1, dtype=torch.int32)  # 64 tokens of bits: 64..69 past the mask
    bits[0] = torch.tensor([0b101, 0], dtype=torch.int32)  # row 0: tokens 0 and 2 only
    bits[1, 1] = 0  # row 1: tokens 32..63 forbidden
    out = grammar.apply_masks(logits, bits, torch.arange(32, dtype=torch.int32))
    allowed = ~torch.isinf(out)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert allowed[1].nonzero().flatten().tolist() == list(range(32))
    assert allowed[2].nonzero().flatten().tolist() == list(range(64))
    assert not torch.isinf(logits).any()  # the model's logits are not written to
