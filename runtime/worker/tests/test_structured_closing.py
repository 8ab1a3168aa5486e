"""Structured output that parses (issue 44), the pure parts on the real SmolLM2 tokenizer without
the model: a schema's default bounds (generation/bounds.py), the closing of a constrained text
(generation/closing.py) and the repetition penalty inside a JSON string (generation/repetition.py)."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
import torch

from tpu_worker.generation import bounds, repetition
from tpu_worker.generation.grammar import Grammars, parse_response_format
from tpu_worker.generation.repetition import ValueTokens

MODEL = "smollm2-135m-instruct"
ITEM = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
    "required": ["name", "qty", "price"],
}
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "maxLength": 8},
        "status": {"enum": ["open", "paid"]},
        "lines": {"type": "array", "items": ITEM, "minItems": 1},
        "ship": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "note": {"type": "string", "minLength": 3},
    },
    "required": ["id", "status", "lines", "ship", "note"],
}
ANSWERS = [
    '{"id":"A1","status":"paid","lines":[{"name":"LIMA-LIMA","qty":12,"price":-3.25},'
    '{"name":"pen","qty":1,"price":0.5}],"ship":{"city":"Lima","zip":15001},"note":"fast \\"please\\""}',
    '{"id":"","status":"open","lines":[{"name":"x","qty":100,"price":1000}],"ship":{"city":"","zip":99999},"note":"abc"}',
]


@pytest.fixture(scope="module")
def grammars(models_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(models_dir, MODEL, "tokenizer.json"))
    return tok, Grammars(tok, tok.get_vocab_size(), tok.token_to_id("<|im_end|>"))


def matcher(grammars, schema: dict):
    _, g = grammars
    return g.compile(parse_response_format({"type": "json_schema", "schema": schema})).matcher


def test_unbounded_strings_and_numbers_get_default_bounds_where_the_schema_sets_none():
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "string"},
            "short": {"type": "string", "maxLength": 5},
            "coded": {"type": "string", "pattern": "^[A-Z]+$"},
            "long": {"type": "string", "minLength": 300},
            "n": {"type": ["number", "null"]},
            "low": {"type": "integer", "minimum": 3},
            "huge": {"type": "integer", "minimum": 10**13},
            "open": {"type": "number", "exclusiveMaximum": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
            "pick": {"type": "string", "enum": ["a", "b"]},
            "any": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/s"}]},
        },
        "$defs": {"s": {"type": "string"}},
    }
    out = bounds.bound_schema(schema)
    p, big = out["properties"], bounds.MAX_NUMBER
    assert p["free"]["maxLength"] == bounds.MAX_STRING_CHARS == out["$defs"]["s"]["maxLength"]
    assert p["tags"]["items"]["maxLength"] == bounds.MAX_STRING_CHARS
    assert p["short"]["maxLength"] == 5 and "maxLength" not in p["coded"] and "maxLength" not in p["long"]
    assert (p["n"]["minimum"], p["n"]["maximum"]) == (-big, big)
    assert (p["low"]["minimum"], p["low"]["maximum"]) == (3, big)
    assert "maximum" not in p["huge"]  # a bound under the schema's minimum would leave no value
    assert "maximum" not in p["open"] and p["open"]["minimum"] == -big
    assert p["pick"] == {"type": "string", "enum": ["a", "b"]}
    assert p["any"]["anyOf"][0] == {"type": "integer", "minimum": -big, "maximum": big}
    assert "maxLength" not in schema["properties"]["free"]  # the caller's schema is left as it was


def test_the_bounded_grammar_stops_a_number_at_its_digits_and_a_string_at_its_characters(grammars):
    tok, _ = grammars
    props = {"n": {"type": "integer"}, "s": {"type": "string"}}
    schema = {"type": "object", "properties": props, "required": ["n", "s"]}
    m = matcher(grammars, schema)
    assert m.consume_tokens(tok.encode('{"n":' + "9" * bounds.MAX_INTEGER_DIGITS).ids)
    assert not m.deep_copy().consume_tokens(tok.encode("9").ids)  # a 13th digit
    m = matcher(grammars, schema)
    assert m.consume_tokens(tok.encode('{"n":1,"s":"' + "a" * bounds.MAX_STRING_CHARS).ids)
    assert not m.deep_copy().consume_tokens(tok.encode("a").ids)


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_closing_of_every_prefix_of_an_answer_completes_one_that_validates(grammars, answer):
    tok, g = grammars
    closer = g.closer()
    jsonschema.validate(json.loads(answer), ORDER)
    ids = tok.encode(answer).ids
    for k in range(len(ids)):
        m = matcher(grammars, ORDER)
        assert m.consume_tokens(ids[:k])
        closing = closer.plan(m, 10_000)
        assert closing is not None and len(closing) <= 80, tok.decode(ids[:k])
        text = b"".join(closer.token_bytes[t] for t in ids[:k] + closing).decode()
        jsonschema.validate(json.loads(text), ORDER)
        # Following the closing one token on, the closing is the rest of it: it never grows.
        if closing:
            assert closer.plan(m, len(closing) - 1) is None  # the limit holds
            assert m.consume_token(closing[0])
            assert closer.plan(m, 10_000) == closing[1:]


def test_the_tokens_of_the_current_string_are_the_penalized_ones(grammars):
    tok, g = grammars
    closer = g.closer()
    v = ValueTokens()

    def write(text: str) -> list[int]:
        ids = tok.encode(text).ids
        for t in ids:
            v.push(t, closer.token_bytes[t])
        return ids

    write('{"a":')
    assert v.seen == set()
    inside = write('"LIMA-LIMA')
    assert v.seen and v.seen <= set(inside) and not any(b'"' in closer.token_bytes[t] for t in v.seen)
    write('\\"x')  # an escaped quote stays inside the string
    assert v.seen
    write('","b":1.12345')
    assert v.seen == set() and not v.fraction_full
    write("6")
    assert v.fraction_full
    write("}")
    assert not v.fraction_full


def test_penalize_scales_a_row_s_seen_tokens_and_blocks_digits_only_where_something_else_is_allowed():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5], [1.0, 1.0, float("-inf"), float("-inf")]])
    digits = torch.tensor([True, True, False, False])
    a, b = ValueTokens(), ValueTokens()
    a.seen = {0, 1}
    b._fraction = repetition.MAX_FRACTION_DIGITS  # a number with all its fraction digits
    out = repetition.penalize(logits.clone(), [(0, a), (1, b)], digits)
    assert out[0].tolist() == pytest.approx([2.0 / repetition.PENALTY, -2.0 * repetition.PENALTY, 1.0, 0.5])
    assert out[1].tolist() == [1.0, 1.0, float("-inf"), float("-inf")]  # only digits allowed: kept
    c = ValueTokens()
    c._fraction = repetition.MAX_FRACTION_DIGITS
    row = torch.tensor([[1.0, 1.0, 0.0, float("-inf")]])
    assert repetition.penalize(row, [(0, c)], digits)[0].tolist() == [float("-inf"), float("-inf"), 0.0, float("-inf")]
