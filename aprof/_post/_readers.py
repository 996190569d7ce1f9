"""Reading any file aprof writes back into a :class:`Session` (SPEC 10.1).

``aprof report`` and ``aprof convert`` accept a session (``.aprof``), a
Chrome trace (``.json`` / ``.json.gz``, aprof's or another tool's), an HTML
report, a speedscope file and folded stacks. :func:`aprof.load` stays strict (SPEC 6.5: it reads sessions and
refuses foreign files); :func:`read_profile` is the forgiving reader the
command line uses.

A Chrome trace holds less than a session: ranges nested on a track become
parent and children again, ``b``/``e`` pairs become async ranges, the rows of
a task's running slices become its steps, and the fields aprof writes into
``args`` are read back. What a trace never had (a foreign tool's categories,
links between tracks) is left empty. Speedscope files and folded stacks
hold less again: call trees of named frames per track (see
:func:`read_speedscope` and :func:`read_folded`).
"""

from __future__ import annotations

import re
from os import PathLike
from pathlib import Path
from typing import Any

from .._core._callbacks import RecordScope
from .._core._recorder import FLAG_ASYNC, FLAG_UNFINISHED, KIND_INSTANT, KIND_RANGE
from .._export._labels import split_process_label
from ._binary import MAGIC as SESSION_MAGIC
from ._compact import FORMAT as COMPACT_FORMAT
from ._compact import session_from_compact
from ._events import EventTable, Track
from ._memory import Memory, recharge
from ._session import FORMAT as SESSION_FORMAT
from ._session import Session, load, session_from_document
from ._stitch import STITCHED_SUFFIX  # profiles that are views of the others: skipped
from ._validate import decompress, parse_json, validate_session

__all__ = ["read_chrome_trace", "read_folded", "read_profile", "read_speedscope"]

_OLD_RUNNING_TID_BASE = 1 << 40  # running rows' tids before aprof wrote otherData.running_tid_base
_LINK_CATEGORY = "spawn"  # as in aprof._export._chrome: the slices flow arrows start on
_KINDS = ("asyncio", "trio", "thread")
_SCOPES = {s.value: s for s in RecordScope}
_FRAME = re.compile(r"^(.*):(\d+) (.*)$")
_DATA_TAG = re.compile(rb'<script type="application/json" id="aprof-data">(.*?)</script>', re.S)
_KNOWN_ARGS = frozenset(
    ("args", "exception", "unfinished", "inputs", "sequence_nr", "forward_thread_id", "end_thread_id", "stack", "running_ns", "waiting_ns")
)


def read_profile(path: str | PathLike[str]) -> Session:
    """Read a session, a Chrome trace, an HTML report, a speedscope file or
    folded stacks.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is none of those, or damaged (the message
            names the file).
    """
    p = Path(path)
    if p.name.lower().endswith(".aprof"):
        return load(p)  # its own, more precise errors
    raw = p.read_bytes()
    if raw.startswith(SESSION_MAGIC):  # a binary session under another name
        return load(p)
    where = repr(str(p))
    try:
        raw = decompress(raw)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None
    head = raw[:4096].lstrip().lower()
    if p.name.lower().endswith(FOLDED_SUFFIXES) or _looks_folded(head):
        try:
            return read_folded(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{where} is not valid folded stacks ({exc})") from None
    if head.startswith((b"<!doctype html", b"<html")):
        m = _DATA_TAG.search(raw)
        if m is None:
            raise ValueError(f"{where} is an HTML page but not an aprof report (no embedded profile data)")
        raw = m.group(1)
    try:
        doc = parse_json(raw, not_json="is not a session, a Chrome trace or an HTML report")
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        return session_from_document(doc, where)
    try:
        if isinstance(doc, dict) and doc.get("format") == COMPACT_FORMAT:
            session = session_from_compact(doc)
        elif (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)) or isinstance(doc, list):
            session = read_chrome_trace(doc)
        elif is_speedscope(doc):
            session = read_speedscope(doc)
        else:
            raise ValueError(f"{where} is not a session, a Chrome trace or an HTML report")
    except (KeyError, TypeError, IndexError, AttributeError, OverflowError) as exc:
        raise ValueError(f"{where} is damaged ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where} is damaged (ValueError: {exc})") from None
    try:
        validate_session(session._table, session._tracks, session.metadata)
    except ValueError as exc:
        raise ValueError(f"{where} is damaged: {exc}") from None
    return session


def read_chrome_trace(doc: dict[str, Any] | list[Any]) -> Session:
    """Rebuild a session from a parsed Chrome trace (object or array form)."""
    other: dict[str, Any] = {}
    if isinstance(doc, list):
        trace_events = doc
    else:
        trace_events = doc["traceEvents"]
        if isinstance(doc.get("otherData"), dict):
            other = doc["otherData"]
    base = int(other.get("start_ns", 0))
    run_base = _int_or(other.get("running_tid_base"), _OLD_RUNNING_TID_BASE)
    own = other.get("producer") == "aprof"

    def ns(ts: Any) -> int:
        return base + round(float(ts) * 1000)

    labels: dict[tuple[Any, Any], str] = {}
    node_of_pid: dict[Any, int] = {}
    for e in trace_events:
        if not isinstance(e, dict) or e.get("ph") != "M":
            continue
        if e.get("name") == "thread_name":
            labels[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
        elif e.get("name") == "process_name":
            m = re.fullmatch(r"aprof node (\d+)", str((e.get("args") or {}).get("name", "")))
            if m:
                node_of_pid[e.get("pid")] = int(m.group(1))

    tracks: dict[tuple[Any, Any], Track] = {}
    used_ids: set[int] = set()

    def track_for(pid: Any, tid: Any) -> Track:
        key = (pid, tid)
        t = tracks.get(key)
        if t is None:
            label = labels.get(key, f"thread {tid}")
            kind = "thread"
            for k in _KINDS:
                if label.endswith(f" [{k}]"):
                    label, kind = label[: -len(k) - 3], k
            tid_i = tid if isinstance(tid, int) and tid not in used_ids else max(used_ids, default=0) + 1
            used_ids.add(tid_i)
            node = node_of_pid.get(pid, 0)
            t = tracks[key] = Track(tid_i, label, kind, tid if isinstance(tid, int) else 0, node)
        return t

    steps_of: dict[tuple[Any, Any], list[tuple[int, int]]] = {}
    ranges: list[tuple[Track, list[Any], bool, bool]] = []  # track, record, is_async, unfinished
    open_async: dict[tuple[Any, ...], list[tuple[Track, list[Any], dict[str, Any]]]] = {}
    last_ns = base
    for e in trace_events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E", "b", "e", "i", "I", "n"):
            continue
        pid, tid = e.get("pid"), e.get("tid")
        start = ns(e.get("ts", 0))
        if ph == "X" and own and e.get("cat") == "sampled":
            continue  # samples' rows: the samples come back whole from otherData (below)
        if ph == "X" and isinstance(tid, int) and tid >= run_base and e.get("cat") == "step":
            steps_of.setdefault((pid, tid - run_base), []).append((start, start + round(float(e.get("dur", 0)) * 1000)))
            continue
        if ph == "X" and own and e.get("cat") == _LINK_CATEGORY:
            continue  # where a flow arrow starts: a drawing aid, not a range
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        if ph == "X":
            end = start + round(float(e.get("dur", 0)) * 1000)
            rec = _record(e, args, start, end, KIND_RANGE, own)
            ranges.append((track_for(pid, tid), rec, False, bool(args.get("unfinished"))))
            last_ns = max(last_ns, end)
        elif ph in ("i", "I", "n"):
            ranges.append((track_for(pid, tid), _record(e, args, start, start, KIND_INSTANT, own), False, False))
        elif ph == "b":
            key = (pid, e.get("cat"), _async_id(e), e.get("name"))
            open_async.setdefault(key, []).append((track_for(pid, tid), _record(e, args, start, start, KIND_RANGE, own), args))
            last_ns = max(last_ns, start)
        elif ph == "e":
            key = (pid, e.get("cat"), _async_id(e), e.get("name"))
            stack = open_async.get(key)
            if stack:
                track, rec, bargs = stack.pop()
                rec[3] = start
                ranges.append((track, rec, True, bool(bargs.get("unfinished"))))
            last_ns = max(last_ns, start)
        # B/E duration pairs are rare in Chrome traces from profilers; they are skipped.
    for stack in open_async.values():
        for track, rec, _ in stack:
            rec[3] = last_ns
            ranges.append((track, rec, True, True))

    for track_key, pairs in steps_of.items():
        found = tracks.get(track_key)
        if found is not None:
            pairs.sort()
            found.steps = [x for pair in pairs for x in pair]

    if own:  # aprof adds a task's coroutine to its track's name: take it off
        for track, rec, _, _ in ranges:
            coro = rec[12].get("coro") if rec[1] is RecordScope.TASK and rec[12] else None
            if coro and track.name.endswith(f" (task {coro})"):
                track.name = track.name[: -len(f" (task {coro})")]
    by_track: dict[int, tuple[Track, list[tuple[list[Any], bool, bool]]]] = {}
    for track, rec, is_async, unfinished in ranges:
        if rec[1] is RecordScope.TASK and track.steps is not None:
            rec[12] = {**(rec[12] or {}), "steps": track.steps}
        by_track.setdefault(track.id, (track, []))[1].append((rec, is_async, unfinished))
    tab = EventTable()
    for track, recs in by_track.values():
        _nest_records(tab, track, recs)
    metadata: dict[str, Any] = {
        "aprof_version": other.get("aprof_version"),
        "start_ns": base,
        "stop_ns": _int_or(other.get("stop_ns"), max(tab.end, default=base)),
        "dropped": int(other.get("dropped", 0)),
        "source": "chrome trace",
    }
    by_kind = other.get("dropped_by_kind")
    if type(by_kind) is dict and all(type(v) is int and v >= 0 for v in by_kind.values()):
        metadata["dropped_by_kind"] = {str(k): v for k, v in by_kind.items()}
    if _int_or(other.get("unix_offset_ns"), None) is not None:
        metadata["unix_offset_ns"] = other["unix_offset_ns"]
    for field in ("session_id", "boot_id"):  # for merges (aprof/_post/_merge.py)
        if isinstance(other.get(field), str) and len(other[field]) <= 64:
            metadata[field] = other[field]
    pids = {str(node): pid for pid, node in node_of_pid.items() if type(pid) is int and 0 < pid < 2**31}
    if own and pids:
        metadata["pids"] = pids
    samples = _samples_of(other, labels, track_for)
    session = Session(tab, {t.id: t for t in tracks.values()}, metadata, samples)
    if own:
        _memory_of(other, session)
    return session


def _nest_records(tab: EventTable, track: Track, recs: list[tuple[list[Any], bool, bool]]) -> None:
    """Add one track's records (with their async and unfinished flags) to
    ``tab`` in start order, each nested in the latest range that contains
    it, as consolidation nests them (async ones are nobody's child)."""
    ti = tab.add_track(track)
    recs.sort(key=lambda x: (x[0][2], -x[0][3]))
    open_stack: list[tuple[int, int]] = []  # (index, end)
    for rec, is_async, unfinished in recs:
        i = len(tab)
        parent = -1
        if not is_async:
            end = rec[3]
            # Sorted by start, so the top contains the record unless it ends first.
            while open_stack and open_stack[-1][1] < end:
                open_stack.pop()
            if open_stack:
                parent = open_stack[-1][0]
            if not rec[11] & KIND_INSTANT:
                open_stack.append((i, end))
        rec[11] |= (FLAG_ASYNC if is_async else 0) | (FLAG_UNFINISHED if unfinished else 0)
        tab.append(rec, ti, parent)


def _samples_of(other: dict[str, Any], labels: dict[tuple[Any, Any], str], track_for: Any) -> Any:
    """aprof's stack samples, kept whole in ``otherData`` (SPEC 8.4), with a
    track for each of their threads (one may have only samples)."""
    from ._samples import Samples

    doc = other.get("aprof_samples")
    if doc is None:
        return None
    samples = Samples.from_json(doc)
    pid_of = {tid: pid for pid, tid in labels}
    for tid in set(samples.thread_id):
        track_for(pid_of.get(tid), tid)
    return samples


def _memory_of(other: dict[str, Any], session: Session) -> None:
    """profile_memory's allocations, kept whole in ``otherData.aprof_memory``
    (its ``records``), charged again to the events read back (issue 21).
    A trace written before aprof carried them gives no memory figures (its
    per-event ``args.memory`` alone cannot give a task's peak or a range's
    self bytes)."""
    doc = other.get("aprof_memory")
    if type(doc) is not dict or doc.get("records") is None:
        return
    try:
        m = Memory.from_records_json(doc["records"])
    except ValueError as exc:
        raise ValueError(f"otherData.aprof_memory: {exc}") from None
    recharge(m, session._table)
    session.memory = m


def _int_or(value: Any, default: Any) -> Any:
    """``value`` if it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _async_id(e: dict[str, Any]) -> Any:
    if "id2" in e and isinstance(e["id2"], dict):
        return tuple(sorted(e["id2"].items()))
    return e.get("id")


def _record(e: dict[str, Any], args: dict[str, Any], start: int, end: int, kind: int, own: bool = False) -> list[Any]:
    scope = _SCOPES.get(str(e.get("cat")), RecordScope.FUNCTION)
    stack = None
    if isinstance(args.get("stack"), list):
        frames = []
        for f in args["stack"]:
            m = _FRAME.match(str(f))
            frames.append((m.group(1), int(m.group(2)), m.group(3)) if m else (str(f), 0, ""))
        stack = tuple(frames)
    extra = {k: v for k, v in args.items() if k not in _KNOWN_ARGS and not (own and k == "memory")}
    end_tid = args.get("end_thread_id")
    inputs = args.get("inputs")
    return [
        str(e.get("name", "")), scope, start, end,
        int(end_tid) if end_tid is not None else None,
        args.get("exception"), args.get("args") if isinstance(args.get("args"), str) else None,
        int(args.get("sequence_nr", -1)), int(args.get("forward_thread_id", 0)),
        tuple(str(x) for x in inputs) if isinstance(inputs, list) else None,
        stack, kind, extra or None,
    ]  # fmt: skip


# ---------------------------------------------------------------------------
# speedscope and folded stacks (what export_speedscope and export_folded write)
# ---------------------------------------------------------------------------

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
FOLDED_SUFFIXES = (".folded", ".folded.txt")
_FOLDED_LINE = re.compile(rb"^[^\s{\[<][^\n]*;[^\n]* \d+(\.\d+)?\r?$", re.M)
_UNIT_NS = {"nanoseconds": 1, "microseconds": 1_000, "milliseconds": 1_000_000, "seconds": 1_000_000_000}
_TRACK_LABEL = re.compile(r"^(.*) \((\d+)\)$")


def is_speedscope(doc: Any) -> bool:
    """Whether a parsed JSON document is a speedscope file."""
    return isinstance(doc, dict) and (
        doc.get("$schema") == SPEEDSCOPE_SCHEMA or (isinstance(doc.get("shared"), dict) and isinstance(doc.get("profiles"), list))
    )


def _looks_folded(head: bytes) -> bool:
    """Whether the start of a file (not named .folded) reads as folded stacks."""
    first = head.split(b"\n", 1)[0]
    return bool(_FOLDED_LINE.match(first))


def _ranges_session(per_track: list[tuple[Track, list[list[Any]]]], metadata: dict[str, Any]) -> Session:
    """A session from per-track lists of range records (no async ranges):
    each track's ranges nest by start order, as consolidation nests them."""
    tab = EventTable()
    tracks: dict[int, Track] = {}
    for track, recs in per_track:
        tracks[track.id] = track
        _nest_records(tab, track, [(rec, False, False) for rec in recs])
    metadata.setdefault("stop_ns", max(tab.end, default=metadata["start_ns"]))
    return Session(tab, tracks, metadata)


def _range(name: str, scope: RecordScope, start: int, end: int, extra: dict[str, Any] | None = None) -> list[Any]:
    return [name, scope, start, end, None, None, None, -1, 0, None, None, KIND_RANGE, extra]


def read_speedscope(doc: dict[str, Any]) -> Session:
    """Rebuild a session from a parsed speedscope file (SPEC 10.1).

    Each profile becomes a track (aprof names its profiles ``track (id)``,
    and the id comes back); evented profiles give their frames back as
    nested ranges, sampled profiles as ranges laid end to end, weights as
    durations. A file aprof wrote gives back its tasks and executor jobs
    (frames named ``task <coroutine>`` and ``executor <function>``); the
    ``[who awaits whom]`` profiles are views of the others and are skipped.

    Raises:
        KeyError, TypeError, ValueError, IndexError: the file is damaged
            (``read_profile`` turns these into a ``ValueError`` naming it).
    """
    frames = [str(f["name"]) for f in doc["shared"]["frames"]]
    own = str(doc.get("exporter", "")).startswith("aprof")
    per_track: list[tuple[Track, list[list[Any]]]] = []
    used: set[int] = set()
    start_ns: int | None = None
    for p in doc["profiles"]:
        name = str(p.get("name", ""))
        if own and name.endswith(STITCHED_SUFFIX):
            continue
        scale = _UNIT_NS.get(str(p.get("unit")), 1)
        m = _TRACK_LABEL.match(name) if own else None
        tid = int(m.group(2)) if m else 0
        if not tid or tid in used:
            tid = max(used, default=0) + 1
        used.add(tid)
        node, bare = split_process_label(m.group(1)) if m else (0, name)
        track = Track(tid, bare, "thread", 0, node)  # a merged session's: its process back as its node id
        recs: list[list[Any]] = []
        if p["type"] == "evented":
            stack: list[tuple[int, int]] = []
            for ev in p["events"]:
                at = round(float(ev["at"]) * scale)
                if ev["type"] == "O":
                    stack.append((int(ev["frame"]), at))
                elif ev["type"] == "C":
                    if not stack or stack[-1][0] != int(ev["frame"]):
                        raise ValueError(f"profile {name!r} closes frame {ev['frame']} that is not the innermost open one")
                    frame, opened = stack.pop()
                    recs.append(_frame_range(frames[frame], opened, at, own, track))
            if stack:
                raise ValueError(f"profile {name!r} leaves {len(stack)} frame(s) open")
        elif p["type"] == "sampled":
            recs = _sampled_ranges(p, frames, scale)
        else:
            raise ValueError(f"profile {name!r} has unknown type {p['type']!r}")
        begin = round(float(p.get("startValue", 0)) * scale)
        start_ns = begin if start_ns is None else min(start_ns, begin)
        per_track.append((track, recs))
    metadata: dict[str, Any] = {"aprof_version": None, "start_ns": start_ns or 0, "dropped": 0, "source": "speedscope"}
    return _ranges_session(per_track, metadata)


def _frame_range(name: str, start: int, end: int, own: bool, track: Track) -> list[Any]:
    if own and name.startswith("task "):  # aprof names a task's frame after its coroutine
        if track.kind == "thread":
            track.kind = "asyncio"  # a task's track; which runtime is not in the file
        return _range(track.name, RecordScope.TASK, start, end, {"coro": name[5:]})
    if own and name.startswith("executor "):
        return _range(name[9:], RecordScope.EXECUTOR, start, end)
    return _range(name, RecordScope.FUNCTION, start, end)


def _sampled_ranges(p: dict[str, Any], frames: list[str], scale: int) -> list[list[Any]]:
    """Samples laid end to end: a frame open across consecutive samples is one range."""
    recs: list[list[Any]] = []
    t = round(float(p.get("startValue", 0)) * scale)
    open_: list[tuple[int, int]] = []  # (frame, start)
    for stack, weight in zip(p["samples"], p["weights"], strict=True):
        stack = [int(f) for f in stack]
        keep = 0
        while keep < len(open_) and keep < len(stack) and open_[keep][0] == stack[keep]:
            keep += 1
        while len(open_) > keep:
            frame, opened = open_.pop()
            recs.append(_range(frames[frame], RecordScope.FUNCTION, opened, t))
        open_ += [(f, t) for f in stack[keep:]]
        w = float(weight)
        if w < 0:
            raise ValueError(f"profile {p.get('name')!r} has a negative weight")
        t += round(w * scale)
    while open_:
        frame, opened = open_.pop()
        recs.append(_range(frames[frame], RecordScope.FUNCTION, opened, t))
    return recs


def read_folded(text: str) -> Session:
    """Rebuild a session from folded stacks (``a;b;c 123`` lines) (SPEC 10.1).

    The first frame of each line is its track (aprof writes the track's name
    there; other tools write the process name); the rest nest under it, each
    line's value (microseconds, as aprof writes it) is the self time of its
    innermost frame. Frames named ``task <coroutine>`` and ``executor
    <function>`` (as aprof names them) come back as tasks and executor jobs. Folded stacks keep no order in time, so each track's
    call tree is laid out from time 0, children first, then the frame's own
    time. aprof writes spaces in names as no-break spaces, which come back as
    spaces.

    Raises:
        ValueError: a line is not ``stack value`` (the message names it).
    """
    trees: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        stack, _, value = line.rpartition(" ")
        try:
            us = int(value) if value.isdigit() else float(value)
        except ValueError:
            stack = ""
        if not stack or us < 0:
            raise ValueError(f"line {lineno} is not 'frame;frame;... value': {line[:80]!r}")
        names = [n.replace("\u00a0", " ") for n in stack.split(";")]
        node = trees.setdefault(names[0], {"self": 0, "kids": {}})
        for n in names[1:]:
            node = node["kids"].setdefault(n, {"self": 0, "kids": {}})
        node["self"] += round(us * 1000)
    per_track: list[tuple[Track, list[list[Any]]]] = []
    for i, (track_name, root) in enumerate(trees.items(), 1):
        recs: list[list[Any]] = []
        end = 0
        for name, kid in root["kids"].items():
            end = _lay_out(name, kid, end, recs)
        pid, bare = split_process_label(track_name)  # a merged session's: "pid N · track"
        if root["self"]:
            recs.append(_range(bare, RecordScope.FUNCTION, 0, end + root["self"]))  # time on the track itself
        track = Track(i, bare, "thread", 0, pid)
        per_track.append((track, [_frame_range(r[0], r[2], r[3], True, track) for r in recs]))
    return _ranges_session(per_track, {"aprof_version": None, "start_ns": 0, "dropped": 0, "source": "folded stacks"})


def _lay_out(name: str, node: dict[str, Any], start: int, out: list[list[Any]]) -> int:
    """Append ``node``'s range and its descendants' from ``start``: children
    end to end, then the node's own time; returns the node's end. Iterative:
    a folded line can be deeper than Python's recursion limit."""
    order: list[dict[str, Any]] = []  # pre-order; totals are summed in reverse
    todo = [node]
    while todo:
        nd = todo.pop()
        order.append(nd)
        todo.extend(nd["kids"].values())
    for nd in reversed(order):
        nd["total"] = nd["self"] + sum(k["total"] for k in nd["kids"].values())
    place = [(name, node, start)]
    while place:
        n, nd, t = place.pop()
        out.append(_range(n, RecordScope.FUNCTION, t, t + nd["total"]))
        for kn, kid in nd["kids"].items():
            place.append((kn, kid, t))
            t += kid["total"]
    return start + int(node["total"])
