"""Default bounds for the values a JSON schema leaves unbounded (issue 44), written into a copy of
the schema before its grammar compiles: a string without `maxLength` (nor `pattern`, `format`,
`enum` or `const`) gets `maxLength` MAX_STRING_CHARS, and an integer or number without `maximum`
(or `minimum`) gets ±MAX_NUMBER (at most MAX_INTEGER_DIGITS digits before the point, no exponent).
A bound the schema sets is kept as it is. Every answer of the bounded schema validates against
the original one: the bounds only narrow what may be written. (The digits after a number's point
are bounded while decoding, by repetition.py: llguidance's `multipleOf` would refuse negatives.)
"""

from __future__ import annotations

import copy
from typing import Any

MAX_STRING_CHARS = 256
MAX_INTEGER_DIGITS = 12
MAX_NUMBER = 10**MAX_INTEGER_DIGITS - 1

# The keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames")
_ONE += ("unevaluatedItems", "unevaluatedProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def bound_schema(schema: dict) -> dict:
    """A copy of `schema` with the default bounds where it sets none."""
    out = copy.deepcopy(schema)
    _visit(out)
    return out


def _visit(node: Any) -> None:
    if not isinstance(node, dict):
        return
    _bound(node)
    for key in _ONE:
        _visit(node.get(key))
    for key in _LIST:
        if isinstance(node.get(key), list):
            for sub in node[key]:
                _visit(sub)
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for sub in node[key].values():
                _visit(sub)


def _types(node: dict) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _bound(node: dict) -> None:
    if "enum" in node or "const" in node:
        return
    kinds = _types(node)
    if "string" in kinds and not {"maxLength", "pattern", "format"} & node.keys():
        least = node.get("minLength")
        if not isinstance(least, int) or least <= MAX_STRING_CHARS:
            node["maxLength"] = MAX_STRING_CHARS
    if kinds & {"integer", "number"}:
        low, high = _number(node.get("minimum")), _number(node.get("maximum"))
        if "maximum" not in node and "exclusiveMaximum" not in node and (low is None or low < MAX_NUMBER):
            node["maximum"] = MAX_NUMBER
        if "minimum" not in node and "exclusiveMinimum" not in node and (high is None or high > -MAX_NUMBER):
            node["minimum"] = -MAX_NUMBER


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
