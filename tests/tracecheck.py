"""A strict validator for exported Chrome traces (RELIABILITY.md).

- ``json.loads`` with NaN and Infinity rejected;
- every ``B`` has a matching ``E`` on the same pid/tid;
- ``X`` events have ``dur >= 0``;
- events on a track nest properly (no partial overlap);
- async slices (``b``/``e``) are paired by id.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def load_trace(path: str | Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_constant=_reject_constant)
    assert isinstance(doc, dict), "the trace is not a JSON object"
    assert isinstance(doc.get("traceEvents"), list), "no traceEvents list"
    return doc


def validate_trace(path: str | Path) -> dict[str, Any]:
    """Load and check a trace; returns the parsed document."""
    doc = load_trace(path)
    events = doc["traceEvents"]
    stacks: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    spans: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    async_open: dict[tuple[Any, Any, str], int] = defaultdict(int)
    for ev in events:
        ph = ev.get("ph")
        assert isinstance(ph, str), f"event without ph: {ev}"
        if ph == "M":
            continue
        assert "pid" in ev, f"event without pid: {ev}"
        assert "tid" in ev, f"event without tid: {ev}"
        key = (ev["pid"], ev["tid"])
        if ph == "X":
            assert ev["dur"] >= 0, f"negative dur: {ev}"
            spans[key].append((ev["ts"], ev["ts"] + ev["dur"], ev["name"]))
        elif ph == "B":
            stacks[key].append(ev)
        elif ph == "E":
            assert stacks[key], f"E without B on {key}: {ev}"
            stacks[key].pop()
        elif ph in ("b", "e"):
            ident = ev.get("id2", ev.get("id"))
            akey = (ev["pid"], ev.get("cat"), json.dumps(ident, sort_keys=True))
            async_open[akey] += 1 if ph == "b" else -1
            assert async_open[akey] >= 0, f"async end before begin: {ev}"
        elif ph in ("i", "I", "s", "f", "t", "C"):
            pass
        else:
            raise AssertionError(f"unexpected phase {ph!r}: {ev}")
    if doc.get("otherData", {}).get("producer") == "aprof":
        # aprof names every row it puts an event on (no nameless tracks).
        named = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
        nameless = {(e["pid"], e["tid"]) for e in events if e.get("ph") != "M"} - named
        assert not nameless, f"events on rows without a thread_name: {sorted(nameless)[:5]}"
    for key, st in stacks.items():
        assert not st, f"unclosed B events on {key}: {st}"
    for akey, n in async_open.items():
        assert n == 0, f"unpaired async slice {akey}"
    for key, sp in spans.items():
        sp.sort(key=lambda s: (s[0], -s[1]))
        open_stack: list[tuple[float, float, str]] = []
        for start, end, name in sp:
            while open_stack and open_stack[-1][1] <= start:
                open_stack.pop()
            if open_stack:
                # 1 ns of slack: timestamps are printed with 3 decimals of a microsecond.
                assert end <= open_stack[-1][1] + 0.001, f"{name!r} {start}-{end} overlaps {open_stack[-1]} on track {key}"
            open_stack.append((start, end, name))
    return doc
