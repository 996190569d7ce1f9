"""A strict validator for speedscope files: the published JSON schema, and the
rules speedscope's importer enforces beyond it.

The schema is ``tests/data/speedscope-file-format-schema.json``, a verbatim
copy of https://www.speedscope.app/file-format-schema.json (speedscope is
MIT-licensed; the copy is the gh-pages "Deploy 2025-12-03" build, commit
43ca88abe517112cf45a1a4d0bb35c1afc4d6d40 of jlfwong/speedscope, generated from
``src/lib/file-format-spec.ts``). ``check_schema`` is a small JSON-schema
validator for the keywords that schema uses (draft-07: ``$ref``, ``anyOf``,
``type``, ``properties``, ``required``, ``enum``, ``const``, ``items``); any
other keyword is an error, so a newer schema cannot be half-checked.

The importer's rules (``src/lib/file-format.ts`` and ``src/lib/profile.ts``,
``CallTreeProfileBuilder``), which throw or misdraw when broken:

- every ``frame`` index points into ``shared.frames``;
- evented profiles: ``at`` never decreases and is never below
  ``startValue`` ("Samples must be provided in increasing order of
  cumulative value"); every ``C`` closes the frame on top of the stack
  ("Tried to leave frame ... while frame ... was at the top"); the stack is
  empty at the end ("non-empty stack"); ``endValue >= startValue``;
- sampled profiles: as many weights as samples, none negative;
- ``activeProfileIndex``, when given, names a profile, and there is at
  least one (speedscope opens on that profile).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).parent / "data" / "speedscope-file-format-schema.json"
_KNOWN = {"$schema", "$ref", "definitions", "title", "anyOf", "type", "properties", "required", "enum", "const", "items"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    raise AssertionError(f"schema type {kind!r} not handled by this validator")


def check_schema(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str = "$") -> None:
    """Raise AssertionError naming the first place ``value`` breaks ``schema``."""
    unknown = set(schema) - _KNOWN
    assert not unknown, f"schema keyword(s) {sorted(unknown)} not handled by this validator"
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/definitions/"), f"unsupported $ref {ref}"
        check_schema(value, root["definitions"][ref.split("/", 2)[2]], root, where)
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                check_schema(value, option, root, where)
                break
            except AssertionError as exc:
                errors.append(str(exc))
        else:
            raise AssertionError(f"{where}: matches none of anyOf: {errors}")
    if "type" in schema:
        assert _type_ok(value, schema["type"]), f"{where}: expected {schema['type']}, got {type(value).__name__} {value!r:.80}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not one of {schema['enum']}"
    if "const" in schema:
        assert value == schema["const"], f"{where}: {value!r} is not {schema['const']!r}"
    if "required" in schema:
        missing = [k for k in schema["required"] if k not in value]
        assert not missing, f"{where}: missing {missing}"
    if "properties" in schema and isinstance(value, dict):
        for key, sub in schema["properties"].items():
            if key in value:
                check_schema(value[key], sub, root, f"{where}.{key}")
    if "items" in schema and isinstance(value, list):
        for i, item in enumerate(value):
            check_schema(item, schema["items"], root, f"{where}[{i}]")


def validate_speedscope(path: str | Path) -> dict[str, Any]:
    """Load and check a speedscope file; returns the parsed document."""
    doc = json.loads(Path(path).read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    check_schema(doc, schema, schema)
    frames = doc["shared"]["frames"]
    profiles = doc["profiles"]
    assert profiles, "no profiles: speedscope has nothing to open"
    if "activeProfileIndex" in doc:
        assert 0 <= doc["activeProfileIndex"] < len(profiles), f"activeProfileIndex {doc['activeProfileIndex']} names no profile"
    for p in profiles:
        where = f"profile {p['name']!r}"
        assert p["endValue"] >= p["startValue"], f"{where}: endValue before startValue"
        if p["type"] == "evented":
            stack: list[int] = []
            last = p["startValue"]
            for ev in p["events"]:
                assert 0 <= ev["frame"] < len(frames), f"{where}: frame {ev['frame']} out of range"
                assert ev["at"] >= last, f"{where}: event at {ev['at']} before {last}"
                last = ev["at"]
                if ev["type"] == "O":
                    stack.append(ev["frame"])
                else:
                    assert stack, f"{where}: close of frame {ev['frame']} with nothing open"
                    top = stack.pop()
                    assert top == ev["frame"], f"{where}: closes frame {ev['frame']} while frame {top} is on top"
            assert not stack, f"{where}: frames {stack} never closed"
        else:
            assert len(p["samples"]) == len(p["weights"]), f"{where}: samples and weights differ in length"
            assert all(w >= 0 for w in p["weights"]), f"{where}: negative weight"
            for stack_ in p["samples"]:
                assert all(0 <= f < len(frames) for f in stack_), f"{where}: frame out of range in {stack_}"
    return doc
