"""Hypothesis strategies that draw values from our JSON Schemas (the subset msgspec emits).

Written here because hypothesis-jsonschema does not work with current hypothesis releases.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_ITEMS = 3


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _strategy(schema, schema.get("$defs", {}))


def _strategy(node: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in node:
        return st.deferred(lambda: _strategy(defs[node["$ref"].split("/")[-1]], defs))
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "anyOf" in node:
        return st.one_of([_strategy(option, defs) for option in node["anyOf"]])
    kind = node.get("type")
    if kind == "object":
        return _object(node, defs)
    if kind == "array":
        return st.lists(_strategy(node.get("items", {}), defs), max_size=MAX_ITEMS)
    if kind == "string":
        return _string(node)
    if kind == "integer":
        return st.integers(node.get("minimum", -(2**53)), node.get("maximum", 2**53))
    if kind == "number":
        return st.floats(
            node.get("minimum"), node.get("maximum"), allow_nan=False, allow_infinity=False
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    raise ValueError(f"schema node not supported by the test strategy: {node}")


def _object(node: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    properties = node.get("properties")
    if properties is None:  # a map: keys from propertyNames, values from additionalProperties
        keys = _string(node.get("propertyNames", {"type": "string"}))
        values = _strategy(node.get("additionalProperties", {"type": "number"}), defs)
        return st.dictionaries(keys, values, max_size=MAX_ITEMS)
    required = set(node.get("required", []))
    return st.fixed_dictionaries(
        {k: _strategy(v, defs) for k, v in properties.items() if k in required},
        optional={k: _strategy(v, defs) for k, v in properties.items() if k not in required},
    )


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = node.get("minLength", 0), node.get("maxLength", 40)
    if "pattern" in node:
        return st.from_regex(node["pattern"], fullmatch=True).filter(
            lambda s: low <= len(s) <= high
        )
    return st.text(min_size=low, max_size=min(high, 40))
