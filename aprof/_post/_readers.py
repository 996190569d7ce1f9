"""Reading any file aprof writes back into a :class:`Session` (SPEC 10.1).

``aprof report`` and ``aprof convert`` accept a session (``.aprof``), a
Chrome trace (``.json`` / ``.json.gz``, aprof's or another tool's) and an
HTML report. :func:`aprof.load` stays strict (SPEC 6.5: it reads sessions and
refuses foreign files); :func:`read_profile` is the forgiving reader the
command line uses.

A Chrome trace holds less than a session: ranges nested on a track become
parent and children again, ``b``/``e`` pairs become async ranges, the rows of
a task's running slices become its steps, and the fields aprof writes into
``args`` are read back. What a trace never had (a foreign tool's categories,
links between tracks) is left empty.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from os import PathLike
from pathlib import Path
from typing import Any

from .._core._callbacks import RecordScope
from .._core._recorder import KIND_INSTANT, KIND_RANGE
from ._compact import FORMAT as COMPACT_FORMAT
from ._compact import session_from_compact
from ._events import FunctionEvent, Track, add_child, make_event
from ._session import FORMAT as SESSION_FORMAT
from ._session import Session, load

__all__ = ["read_chrome_trace", "read_profile"]

_RUNNING_TID_BASE = 1 << 40  # as in aprof._export._chrome
_KINDS = ("asyncio", "trio", "thread")
_SCOPES = {s.value: s for s in RecordScope}
_FRAME = re.compile(r"^(.*):(\d+) (.*)$")
_DATA_TAG = re.compile(rb'<script type="application/json" id="aprof-data">(.*?)</script>', re.S)
_KNOWN_ARGS = frozenset(
    ("args", "exception", "unfinished", "inputs", "sequence_nr", "forward_thread_id", "end_thread_id", "stack", "running_ns", "waiting_ns")
)


def read_profile(path: str | PathLike[str]) -> Session:
    """Read a session, a Chrome trace or an HTML report.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is none of those, or damaged (the message
            names the file).
    """
    p = Path(path)
    if p.name.lower().endswith(".aprof"):
        return load(p)  # its own, more precise errors
    raw = p.read_bytes()
    where = repr(str(p))
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(f"{where} is a truncated or corrupt gzip file ({exc})") from None
    head = raw[:4096].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        m = _DATA_TAG.search(raw)
        if m is None:
            raise ValueError(f"{where} is an HTML page but not an aprof report (no embedded profile data)")
        raw = m.group(1)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not a session, a Chrome trace or an HTML report ({exc})") from None
    except RecursionError:
        raise ValueError(f"{where} is not a session, a Chrome trace or an HTML report (JSON nested too deeply)") from None
    if isinstance(doc, dict) and doc.get("format") == SESSION_FORMAT:
        return load(p)
    try:
        if isinstance(doc, dict) and doc.get("format") == COMPACT_FORMAT:
            return session_from_compact(doc)
        if (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)) or isinstance(doc, list):
            return read_chrome_trace(doc)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ValueError(f"{where} is damaged ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"{where} is not a session, a Chrome trace or an HTML report")


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
        if ph == "X" and isinstance(tid, int) and tid >= _RUNNING_TID_BASE and e.get("cat") == "sampled":
            continue  # samples' rows: the samples come back whole from otherData (below)
        if ph == "X" and isinstance(tid, int) and tid >= _RUNNING_TID_BASE and e.get("cat") == "step":
            steps_of.setdefault((pid, tid - _RUNNING_TID_BASE), []).append((start, start + round(float(e.get("dur", 0)) * 1000)))
            continue
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        if ph == "X":
            end = start + round(float(e.get("dur", 0)) * 1000)
            rec = _record(e, args, start, end, KIND_RANGE)
            ranges.append((track_for(pid, tid), rec, False, bool(args.get("unfinished"))))
            last_ns = max(last_ns, end)
        elif ph in ("i", "I", "n"):
            ranges.append((track_for(pid, tid), _record(e, args, start, start, KIND_INSTANT), False, False))
        elif ph == "b":
            key = (pid, e.get("cat"), _async_id(e), e.get("name"))
            open_async.setdefault(key, []).append((track_for(pid, tid), _record(e, args, start, start, KIND_RANGE), args))
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

    by_track: dict[int, list[FunctionEvent]] = {}
    for track, rec, is_async, unfinished in ranges:
        if rec[1] is RecordScope.TASK and track.steps is not None:
            rec[12] = {**(rec[12] or {}), "steps": track.steps}
        ev = make_event(rec, track, is_async, unfinished)
        by_track.setdefault(track.id, []).append(ev)
    events: list[FunctionEvent] = []
    for evs in by_track.values():
        evs.sort(key=lambda ev: (ev.start_ns, -ev.end_ns))
        open_stack: list[FunctionEvent] = []
        for ev in evs:
            events.append(ev)
            if ev.is_async:
                continue
            # Sorted by start, so the top contains ``ev`` unless it ends first.
            while open_stack and open_stack[-1].end_ns < ev.end_ns:
                open_stack.pop()
            if open_stack:
                ev.parent = open_stack[-1]
                add_child(open_stack[-1], ev)
            if not ev.is_instant:
                open_stack.append(ev)
    metadata: dict[str, Any] = {
        "aprof_version": other.get("aprof_version"),
        "start_ns": base,
        "stop_ns": _int_or(other.get("stop_ns"), max((ev.end_ns for ev in events), default=base)),
        "dropped": int(other.get("dropped", 0)),
        "source": "chrome trace",
    }
    if _int_or(other.get("unix_offset_ns"), None) is not None:
        metadata["unix_offset_ns"] = other["unix_offset_ns"]
    samples = _samples_of(other, labels, track_for)
    return Session(events, {t.id: t for t in tracks.values()}, metadata, samples)


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


def _int_or(value: Any, default: Any) -> Any:
    """``value`` if it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _async_id(e: dict[str, Any]) -> Any:
    if "id2" in e and isinstance(e["id2"], dict):
        return tuple(sorted(e["id2"].items()))
    return e.get("id")


def _record(e: dict[str, Any], args: dict[str, Any], start: int, end: int, kind: int) -> list[Any]:
    scope = _SCOPES.get(str(e.get("cat")), RecordScope.FUNCTION)
    stack = None
    if isinstance(args.get("stack"), list):
        frames = []
        for f in args["stack"]:
            m = _FRAME.match(str(f))
            frames.append((m.group(1), int(m.group(2)), m.group(3)) if m else (str(f), 0, ""))
        stack = tuple(frames)
    extra = {k: v for k, v in args.items() if k not in _KNOWN_ARGS}
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
