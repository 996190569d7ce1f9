"""FunctionEvent, Track and consolidation: raw records -> event trees.

Consolidation runs once, at stop. Each logical thread's raw list is already
in start order (records are appended when ranges start, on that thread), so
nesting is one pass with a stack, no sort.

Nesting rule (RELIABILITY CP-11, documented in docs/how-it-works.md): on one
track, a range that starts inside another and ends after it (out-of-order
exits, a generator's range outliving its consumer's ``with``, an explicit
``start()`` whose ``end()`` comes late) is shown as an async slice on that
track; the enclosing range keeps its place. Every range still open at stop is
closed at the stop time and flagged ``unfinished``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

from .._core._callbacks import RecordScope
from .._core._recorder import (
    KIND_INSTANT,
    R_ARGS,
    R_END,
    R_END_LT,
    R_EXC,
    R_EXTRA,
    R_FWD,
    R_INPUTS,
    R_KIND,
    R_NAME,
    R_SCOPE,
    R_SEQ,
    R_STACK,
    R_START,
)
from .._core._threads import LogicalThread

__all__ = ["FunctionEvent", "Track", "consolidate"]


class Track:
    """One logical thread's row in the timeline.

    Attributes:
        id: The logical thread id.
        name: The task's or thread's name.
        kind: ``"asyncio"``, ``"trio"`` or ``"thread"``.
        os_thread_id: The OS thread it ran on.
        node_id: The process (node) it belongs to.
    """

    __slots__ = ("id", "kind", "name", "node_id", "os_thread_id")

    def __init__(self, id: int, name: str, kind: str, os_thread_id: int, node_id: int) -> None:
        self.id = id
        self.name = name
        self.kind = kind
        self.os_thread_id = os_thread_id
        self.node_id = node_id

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "os_thread_id": self.os_thread_id, "node_id": self.node_id}

    def __repr__(self) -> str:
        return f"<Track {self.id} {self.kind} {self.name!r}>"


class FunctionEvent:
    """One recorded range or instant, after consolidation (SPEC 6.2).

    Times are ``time.perf_counter_ns()`` values. ``parent`` and ``children``
    link ranges nested on the same track; async ranges have a parent (the
    range they started in) but are not anyone's child.
    """

    __slots__ = (
        "args",
        "children",
        "end_ns",
        "end_thread_id",
        "exception",
        "extra",
        "forward_thread_id",
        "inputs",
        "is_async",
        "is_instant",
        "name",
        "node_id",
        "os_thread_id",
        "parent",
        "running_ns",
        "scope",
        "sequence_nr",
        "stack",
        "start_ns",
        "thread_id",
        "track",
        "unfinished",
        "waiting_ns",
    )

    name: str
    scope: RecordScope
    start_ns: int
    end_ns: int
    thread_id: int
    end_thread_id: int
    os_thread_id: int
    track: str
    is_async: bool
    is_instant: bool
    unfinished: bool
    exception: str | None
    parent: FunctionEvent | None
    children: list[FunctionEvent]
    sequence_nr: int
    forward_thread_id: int
    inputs: tuple[str, ...] | None
    stack: tuple[tuple[str, int, str], ...] | None
    node_id: int
    args: str | None
    extra: dict[str, Any] | None
    running_ns: int | None
    waiting_ns: int | None

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns

    @property
    def self_duration_ns(self) -> int:
        """Duration minus the time spent in nested children on the same track."""
        return self.end_ns - self.start_ns - sum(c.end_ns - c.start_ns for c in self.children)

    def iter_descendants(self) -> Iterator[FunctionEvent]:
        """Children, grandchildren and so on, depth first."""
        for c in self.children:
            yield c
            yield from c.iter_descendants()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event's own fields (no parent/children)."""
        return {
            "name": self.name,
            "scope": self.scope.value,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "thread_id": self.thread_id,
            "end_thread_id": self.end_thread_id,
            "os_thread_id": self.os_thread_id,
            "track": self.track,
            "is_async": self.is_async,
            "is_instant": self.is_instant,
            "unfinished": self.unfinished,
            "exception": self.exception,
            "sequence_nr": self.sequence_nr,
            "forward_thread_id": self.forward_thread_id,
            "inputs": list(self.inputs) if self.inputs is not None else None,
            "stack": [list(f) for f in self.stack] if self.stack is not None else None,
            "node_id": self.node_id,
            "args": self.args,
            "extra": self.extra,
            "running_ns": self.running_ns,
            "waiting_ns": self.waiting_ns,
        }

    def __repr__(self) -> str:
        flags = "".join(
            f" {f}" for f, on in (("async", self.is_async), ("unfinished", self.unfinished)) if on
        )
        exc = f" exception={self.exception}" if self.exception else ""
        return (
            f"<FunctionEvent {self.name!r} {self.scope.name} track={self.track!r} "
            f"{self.duration_ns / 1e3:.1f}us{flags}{exc}>"
        )


def consolidate(
    lists: dict[LogicalThread, list[list[Any]]], stop_ns: int, node_id: int
) -> tuple[list[FunctionEvent], dict[int, Track]]:
    """Build events and tracks from a stopped profile's raw lists."""
    events: list[FunctionEvent] = []
    tracks: dict[int, Track] = {}
    append = events.append
    new = FunctionEvent.__new__
    for lt, raw in lists.items():
        if not raw:
            continue
        track_name = lt.current_name()
        tid = lt.id
        os_tid = lt.os_thread_id
        tracks[tid] = Track(tid, track_name, lt.kind, os_tid, node_id)
        stack: list[FunctionEvent] = []
        raw = list(raw)
        if any(raw[i][R_START] > raw[i + 1][R_START] for i in range(len(raw) - 1)):
            # An eager task's first step records before its TASK record is
            # appended (the task is created by its own first step's caller).
            raw.sort(key=_start_of)
        for rec in raw:
            ev = new(FunctionEvent)
            start = ev.start_ns = rec[R_START]
            end = rec[R_END]
            if end is None:
                ev.end_ns = stop_ns if stop_ns > start else start
                ev.unfinished = True
            else:
                ev.end_ns = end
                ev.unfinished = False
            end_lt = rec[R_END_LT]
            ev.name = rec[R_NAME]
            ev.scope = rec[R_SCOPE]
            ev.thread_id = tid
            ev.os_thread_id = os_tid
            ev.track = track_name
            ev.exception = rec[R_EXC]
            ev.sequence_nr = rec[R_SEQ]
            ev.forward_thread_id = rec[R_FWD]
            ev.inputs = rec[R_INPUTS]
            ev.stack = rec[R_STACK]
            ev.args = rec[R_ARGS]
            ev.extra = rec[R_EXTRA]
            ev.running_ns = ev.waiting_ns = None
            ev.node_id = node_id
            ev.children = []
            ev.is_instant = instant = rec[R_KIND] == KIND_INSTANT
            if end_lt is None or end_lt.kind == "marker":
                ev.end_thread_id = tid
            else:
                ev.end_thread_id = end_lt.id
            # Pop ranges that ended before this one started.
            while stack and stack[-1].end_ns <= start and not (instant and stack[-1].end_ns == start):
                stack.pop()
            parent = ev.parent = stack[-1] if stack else None
            if end_lt is not None or (parent is not None and ev.end_ns > parent.end_ns):
                ev.is_async = True  # ended elsewhere, or outlived its enclosing range
            else:
                ev.is_async = False
                if parent is not None:
                    parent.children.append(ev)
                if not instant:
                    stack.append(ev)
            append(ev)
    _finish_tasks(events, tracks)
    _link_across_tracks(events)
    return events, tracks


def _start_of(rec: list[Any]) -> int:
    return rec[R_START]  # type: ignore[no-any-return]


def _finish_tasks(events: list[FunctionEvent], tracks: dict[int, Track]) -> None:
    """Name TASK events after their track; split time into running and waiting.

    A task's steps are the stretches in which it ran on the loop. Every range
    on the task's track gets the part of its span covered by steps as
    ``running_ns``, and the rest as ``waiting_ns``.
    """
    steps_of: dict[int, list[int]] = {}
    for ev in events:
        if ev.scope is RecordScope.TASK and ev.extra is not None:
            raw_steps = ev.extra.get("steps")
            flat = list(raw_steps) if raw_steps is not None else []
            if len(flat) % 2:
                flat.append(ev.end_ns)
            extra = dict(ev.extra)
            extra["steps"] = flat
            extra.setdefault("outcome", "unfinished" if ev.unfinished else "finished")
            ev.extra = extra
            ev.name = tracks[ev.thread_id].name if ev.thread_id in tracks else ev.name
            steps_of[ev.thread_id] = flat
    if not steps_of:
        return
    for ev in events:
        task_steps = steps_of.get(ev.thread_id)
        if task_steps is None or ev.is_instant:
            continue
        running = _overlap(task_steps, ev.start_ns, ev.end_ns)
        ev.running_ns = running
        ev.waiting_ns = max(0, ev.duration_ns - running)


def _overlap(flat: list[int], start: int, end: int) -> int:
    """Time in [start, end] covered by the (start, end) pairs in ``flat``."""
    i = bisect_right(flat, start)
    i -= i % 2  # to the pair that may contain start
    total = 0
    n = len(flat)
    while i < n:
        s0, s1 = flat[i], flat[i + 1]
        if s0 >= end:
            break
        lo = s0 if s0 > start else start
        hi = s1 if s1 < end else end
        if hi > lo:
            total += hi - lo
        i += 2
    return total


def _link_across_tracks(events: list[FunctionEvent]) -> None:
    """Give spawned and submitted work a parent on the spawner's track.

    A TASK or EXECUTOR event that is top-level on its own track gets as
    ``parent`` the innermost range open on the spawning track at the spawn
    (or submit) time. It is not added to that range's ``children``: it runs
    concurrently, so it is not part of the range's self time.
    """
    by_track: dict[int, list[FunctionEvent]] = {}
    for ev in events:
        if not ev.is_async and not ev.is_instant:
            by_track.setdefault(ev.thread_id, []).append(ev)
    starts = {tid: [e.start_ns for e in evs] for tid, evs in by_track.items()}
    for ev in events:
        if ev.parent is not None or not ev.forward_thread_id:
            continue
        link_ns = ev.start_ns
        if ev.extra:
            link_ns = int(ev.extra.get("spawn_ns", ev.extra.get("submit_ns", link_ns)))
        evs = by_track.get(ev.forward_thread_id)
        if not evs:
            continue
        i = bisect_right(starts[ev.forward_thread_id], link_ns) - 1
        cand: FunctionEvent | None = evs[i] if i >= 0 else None
        while cand is not None and cand.end_ns < link_ns:
            cand = cand.parent
        ev.parent = cand


def roots(events: Iterable[FunctionEvent]) -> list[FunctionEvent]:
    """Events with no parent on their track."""
    return [e for e in events if e.parent is None]
