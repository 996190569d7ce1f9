"""A strict validator for exported Chrome traces (RELIABILITY.md), with the
rules Perfetto's JSON importer applies.

RELIABILITY.md's rules:

- ``json.loads`` with NaN and Infinity rejected;
- every ``B`` has a matching ``E`` on the same pid/tid;
- ``X`` events have ``dur >= 0``;
- events on a track nest properly (no partial overlap);
- async slices (``b``/``e``) are paired by id.

Perfetto's rules, read from its importer (google/perfetto,
``src/trace_processor/importers/json/json_trace_tokenizer.cc`` and
``json_trace_parser.cc``, ``importers/common/slice_tracker.cc`` and
``flow_tracker.cc``), where breaking them loses or misplaces data silently:

- ``pid`` and ``tid`` are integers that fit in 32 bits: any other value is
  read as 0, so the event lands on the process's main thread, and a
  ``thread_name`` for it renames that thread;
- a ``tid`` belongs to one process: the same ``tid`` under two ``pid`` s is
  read as a thread id reused by another process, which splits the track;
- every event but metadata has a ``ts`` (events without one are dropped);
  times are read as integer nanoseconds (``llround(us * 1000)``);
- a slice that starts inside another on the same thread and ends after it
  is dropped (``slice_drop_overlapping_complete_event``);
- ``b``/``e`` pairs match by category, id and name;
- a flow start ``s`` (and a flow end ``f`` with ``"bp":"e"``) binds to the
  slice on top of the thread's slice stack when it is read, and is dropped
  when there is none (``flow_no_enclosing_slice``). The stack only pops ended
  slices when a new slice begins, so the top can be a slice that ended
  before the flow event: the arrow then starts from a slice that is not
  there. We require the top slice to contain the flow event's time. Events
  are read in order of time; at one time, ``E`` first, then ``X`` from the
  longest, then the rest in file order (``trace_sorter.h``);
- flow ids: each has one ``s`` and one ``f``, with the same category and
  name (a v1 flow is identified by id, category and name);
- ``thread_sort_index`` fits in 32 bits (signed).

Why a replay of the rules and not the real importer: the PyPI ``perfetto``
package (checked at 0.11.0) ships only the Python client; its
``TraceProcessor`` downloads the ``trace_processor`` binary from
get.perfetto.dev at first use, so tests cannot load a trace in Perfetto's
own importer offline.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def load_trace(path: str | Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    assert isinstance(doc, dict), "the trace is not a JSON object"
    assert isinstance(doc.get("traceEvents"), list), "no traceEvents list"
    return doc


def _ns(us: Any) -> int:
    """A time in microseconds as Perfetto reads it: integer nanoseconds."""
    assert isinstance(us, (int, float)), f"time {us!r} is not a number"
    assert not isinstance(us, bool), f"time {us!r} is not a number"
    return round(us * 1000)


def _is_uint32(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= UINT32_MAX


def _on_thread(ev: dict[str, Any]) -> bool:
    """Whether the event is a slice on its thread's track in Perfetto."""
    ph = ev["ph"]
    if ph in ("X", "B", "E"):
        return True
    return ph in ("i", "I") and ev.get("s", "t") == "t"


def validate_trace(path: str | Path) -> dict[str, Any]:
    """Load and check a trace; returns the parsed document."""
    doc = load_trace(path)
    events = doc["traceEvents"]
    stacks: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    spans: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    async_open: dict[tuple[Any, ...], int] = defaultdict(int)
    pid_of_tid: dict[Any, Any] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    flows: dict[Any, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: {"s": [], "f": []})
    rows: dict[tuple[Any, Any], list[tuple[int, int, int, dict[str, Any]]]] = defaultdict(list)
    for order, ev in enumerate(events):
        ph = ev.get("ph")
        assert isinstance(ph, str), f"event without ph: {ev}"
        if ph == "M":
            assert _is_uint32(ev.get("pid")), f"metadata with a pid Perfetto reads as 0: {ev}"
            if ev.get("name") in ("thread_name", "thread_sort_index"):
                assert _is_uint32(ev.get("tid")), f"metadata with a tid Perfetto reads as 0: {ev}"
                pid_of_tid.setdefault(ev["tid"], ev["pid"])
                assert pid_of_tid[ev["tid"]] == ev["pid"], f"tid {ev['tid']} in two processes: {ev}"
            if ev.get("name") == "thread_name":
                key = (ev["pid"], ev["tid"])
                assert key not in thread_names, f"row {key} named twice: {thread_names[key]!r} and {ev}"
                thread_names[key] = ev["args"]["name"]
            if ev.get("name") == "thread_sort_index":
                index = ev["args"]["sort_index"]
                assert isinstance(index, int), f"sort index not an integer: {ev}"
                assert -INT32_MAX - 1 <= index <= INT32_MAX, f"sort index out of range: {ev}"
            continue
        assert "pid" in ev, f"event without pid: {ev}"
        assert "tid" in ev, f"event without tid: {ev}"
        assert _is_uint32(ev["pid"]), f"pid Perfetto reads as 0 (not a 32-bit unsigned int): {ev}"
        assert _is_uint32(ev["tid"]), f"tid Perfetto reads as 0 (not a 32-bit unsigned int): {ev}"
        pid_of_tid.setdefault(ev["tid"], ev["pid"])
        assert pid_of_tid[ev["tid"]] == ev["pid"], f"tid {ev['tid']} in two processes: {ev}"
        assert "ts" in ev, f"event without ts (Perfetto drops it): {ev}"
        ts = _ns(ev["ts"])
        assert ts >= 0, f"negative ts: {ev}"
        key = (ev["pid"], ev["tid"])
        if ph == "X":
            dur = _ns(ev["dur"])
            assert dur >= 0, f"negative dur: {ev}"
            spans[key].append((ts, ts + dur, ev["name"]))
            rows[key].append((ts, 2**63 - 1 - dur, order, ev))
        elif ph == "B":
            stacks[key].append(ev)
            rows[key].append((ts, 2**63 - 1, order, ev))
        elif ph == "E":
            assert stacks[key], f"E without B on {key}: {ev}"
            stacks[key].pop()
            rows[key].append((ts, -(2**63), order, ev))
        elif ph in ("b", "e"):
            ident = ev.get("id2", ev.get("id"))
            assert ident is not None, f"async event without id: {ev}"
            akey = (ev["pid"], ev.get("cat"), json.dumps(ident, sort_keys=True), ev.get("name"))
            async_open[akey] += 1 if ph == "b" else -1
            assert async_open[akey] >= 0, f"async end before begin (ends match by cat, id and name): {ev}"
        elif ph in ("i", "I"):
            if _on_thread(ev):
                spans[key].append((ts, ts, ev["name"]))
                rows[key].append((ts, 2**63 - 1, order, ev))
        elif ph in ("s", "f"):
            assert "id" in ev, f"flow event without id: {ev}"
            flows[ev["id"]][ph].append(ev)
            if ph == "s" or ev.get("bp") == "e":
                rows[key].append((ts, 2**63 - 1, order, ev))
        elif ph in ("t", "C"):
            pass
        else:
            raise AssertionError(f"unexpected phase {ph!r}: {ev}")
    if doc.get("otherData", {}).get("producer") == "aprof":
        # aprof names every row it puts an event on (no nameless tracks).
        nameless = {(e["pid"], e["tid"]) for e in events if e.get("ph") != "M"} - set(thread_names)
        assert not nameless, f"events on rows without a thread_name: {sorted(nameless)[:5]}"
    for key, st in stacks.items():
        assert not st, f"unclosed B events on {key}: {st}"
    for akey, n in async_open.items():
        assert n == 0, f"unpaired async slice {akey}"
    for key, sp in spans.items():
        sp.sort(key=lambda s: (s[0], -s[1]))
        open_stack: list[tuple[int, int, str]] = []
        for start, end, name in sp:
            while open_stack and open_stack[-1][1] <= start and not (open_stack[-1][0] == open_stack[-1][1] == start):
                open_stack.pop()
            if open_stack:
                assert end <= open_stack[-1][1], f"{name!r} {start}-{end} ns overlaps {open_stack[-1]} on track {key}"
            open_stack.append((start, end, name))
    for ident, pair in flows.items():
        counts = (len(pair["s"]), len(pair["f"]))
        assert counts == (1, 1), f"flow {ident}: {counts[0]} starts, {counts[1]} ends"
        s, f = pair["s"][0], pair["f"][0]
        assert (s.get("cat"), s.get("name")) == (f.get("cat"), f.get("name")), f"flow {ident}: start and end differ in cat/name"
        assert _ns(s["ts"]) <= _ns(f["ts"]), f"flow {ident} ends before it starts"
    for key, row in rows.items():
        _check_flow_binding(key, row)
    return doc


def _check_flow_binding(key: tuple[Any, Any], row: list[tuple[int, int, int, dict[str, Any]]]) -> None:
    """Replay one thread row as Perfetto's slice tracker does, and check that
    every flow start/end binds to a slice that is there at its time."""
    row.sort(key=lambda r: (r[0], r[1], r[2]))
    open_end = 2**63 - 1  # a B slice's end until its E is read
    stack: list[tuple[int, int]] = []  # (start, end) in ns
    for ts, _, _, ev in row:
        ph = ev["ph"]
        if ph in ("s", "f"):
            what = "start" if ph == "s" else "end"
            assert stack, f"flow {ev['id']} {what} at {ts} ns on {key} with no slice there (Perfetto drops it): {ev}"
            start, end = stack[-1]
            inside = start <= ts < end or start == end == ts
            assert inside, (
                f"flow {ev['id']} {what} at {ts} ns on {key} would bind to a slice at {start}-{end} ns that does not "
                f"contain it: {ev}"
            )
            continue
        if ph == "E":
            while stack and stack[-1][1] != open_end:
                stack.pop()
            if stack:
                stack.pop()
            continue
        dur = _ns(ev["dur"]) if ph == "X" else (open_end - ts if ph == "B" else 0)
        # Pop what ended before this slice begins (slice_tracker.cc MaybeCloseStack).
        while stack:
            start, end = stack[-1]
            if end < ts or (end == ts and not (end == start and dur == 0)):
                stack.pop()
                continue
            break
        stack.append((ts, ts + dur))
