"""Aggregation, the summary table (SPEC 6.4) and the summary sections under it."""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import KIND_INSTANT
from .._frames import format_frame, innermost_user_frame, shown_stack
from ._events import FunctionEvent
from ._memory import threads_by_node
from ._table import SCOPES, X_EXTRA, EventTable

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["EventAverages", "FunctionEventAvg", "Summary", "key_averages", "summarize"]

GROUP_BY: Final = ("name", "track", "stack", "node")
_STACK_DEPTH: Final = 5


class FunctionEventAvg:
    """One row of :meth:`aprof.profile.key_averages`: a group of events.

    Times are nanoseconds. ``running_ns`` and ``waiting_ns`` split the total
    of task ranges into time on the loop and time suspended (0 when unknown).
    ``max_step_ns`` is the longest single step of the group's tasks (how long
    one of them held the loop at once; 0 for other rows); ``queued_ns`` and
    ``queued_count`` sum the time executor jobs waited from submit to start.
    ``samples``, ``sampled_ns`` and ``self_sampled_ns`` come from stack
    samples (SPEC 8.4), never from ranges: for a function, the samples with
    it on the stack and with it on top; for a range, task or executor job,
    the samples taken on its track while it ran; for a track, its samples.

    With ``profile_memory`` (issue 21): ``allocated_bytes``, ``freed_bytes``
    and ``allocation_count`` sum the group's events (children included);
    ``cpu_memory_usage`` is their net bytes (allocated, not freed by stop),
    ``self_cpu_memory_usage`` the same without children, ``peak_memory``
    the largest peak of live bytes of one event. By track: the task's or
    thread's own allocations, in every step.
    """

    __slots__ = (
        "allocated_bytes", "allocation_count", "count", "cpu_memory_usage", "freed_bytes", "key", "max_ns",
        "max_step_ns", "min_ns", "peak_memory", "queued_count", "queued_ns", "running_ns", "sampled_ns",
        "samples", "self_cpu_memory_usage", "self_ns", "self_sampled_ns",
        "stack", "total_ns", "waiting_ns",
    )  # fmt: skip

    def __init__(self, key: str, stack: tuple[tuple[str, int, str], ...] = ()) -> None:
        self.key = key
        self.stack = stack
        self.count = 0
        self.total_ns = 0
        self.self_ns = 0
        self.min_ns = 0
        self.max_ns = 0
        self.running_ns = 0
        self.waiting_ns = 0
        self.max_step_ns = 0
        self.queued_ns = 0
        self.queued_count = 0
        self.samples = 0
        self.sampled_ns = 0
        self.self_sampled_ns = 0
        self.allocated_bytes = 0
        self.freed_bytes = 0
        self.allocation_count = 0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.peak_memory = 0

    @property
    def mean_ns(self) -> float:
        """Average duration."""
        return self.total_ns / self.count if self.count else 0.0

    @property
    def queued_mean_ns(self) -> float:
        """Average time an executor job of the group waited to start (0 if none)."""
        return self.queued_ns / self.queued_count if self.queued_count else 0.0

    def add_totals(self, count: int, total_ns: int, self_ns: int, min_ns: int, max_ns: int) -> None:
        """Add ``count`` ranges by their sums, shortest and longest."""
        if self.count == 0 or min_ns < self.min_ns:
            self.min_ns = min_ns
        if max_ns > self.max_ns:
            self.max_ns = max_ns
        self.count += count
        self.total_ns += total_ns
        self.self_ns += self_ns

    def add(self, ev: FunctionEvent) -> None:
        d = ev.duration_ns
        self.add_totals(1, d, ev.self_duration_ns, d, d)
        if ev.running_ns is not None:
            self.running_ns += ev.running_ns
        if ev.waiting_ns is not None:
            self.waiting_ns += ev.waiting_ns
        extra = ev.extra
        if extra:
            scope = ev.scope
            if scope is RecordScope.TASK:
                step = max_step_ns(extra.get("steps"))
                if step > self.max_step_ns:
                    self.max_step_ns = step
            elif scope is RecordScope.EXECUTOR:
                queued = queued_ns(ev)
                if queued is not None:
                    self.queued_ns += queued
                    self.queued_count += 1

    def __repr__(self) -> str:
        return f"<FunctionEventAvg {self.key!r} count={self.count} total={_fmt(self.total_ns)}>"


_SORT_KEYS: Final[dict[str, Callable[[FunctionEventAvg], Any]]] = {
    "total": lambda r: -r.total_ns,
    "self": lambda r: -r.self_ns,
    "count": lambda r: -r.count,
    "mean": lambda r: -r.mean_ns,
    "max": lambda r: -r.max_ns,
    "min": lambda r: -r.min_ns,
    "running": lambda r: -r.running_ns,
    "waiting": lambda r: -r.waiting_ns,
    "max_step": lambda r: -r.max_step_ns,
    "queued": lambda r: -r.queued_mean_ns,
    "samples": lambda r: -r.samples,
    "sampled": lambda r: -r.sampled_ns,
    "self_sampled": lambda r: -r.self_sampled_ns,
    "cpu_memory_usage": lambda r: -r.cpu_memory_usage,
    "self_cpu_memory_usage": lambda r: -r.self_cpu_memory_usage,
    "allocated": lambda r: -r.allocated_bytes,
    "peak_memory": lambda r: -r.peak_memory,
    "allocations": lambda r: -r.allocation_count,
    "name": lambda r: r.key,
}


class EventAverages:
    """The rows of :meth:`aprof.profile.key_averages`, iterable and indexable by key."""

    def __init__(self, rows: list[FunctionEventAvg], group_by: str) -> None:
        self._rows = rows
        self.group_by = group_by
        #: Samples of a loop waiting for I/O (SPEC 8.4): counted, charged to no row.
        self.idle_samples = 0
        self.idle_ns = 0
        #: With profile_memory: the session's Memory (its totals and "other" bytes).
        self.memory: Any = None

    def __iter__(self) -> Iterator[FunctionEventAvg]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, key: str) -> FunctionEventAvg:
        for r in self._rows:
            if r.key == key:
                return r
        raise KeyError(key)

    def table(self, sort_by: str = "total", row_limit: int | None = None) -> str:
        """Render the rows as a text table.

        Args:
            sort_by: One of ``total``, ``self``, ``count``, ``mean``, ``max``,
                ``min``, ``running``, ``waiting``, ``max_step``, ``queued``,
                ``samples``, ``sampled``, ``self_sampled``, ``name``; with
                ``profile_memory`` also ``cpu_memory_usage`` (net bytes),
                ``self_cpu_memory_usage``, ``allocated``, ``peak_memory``,
                ``allocations``.
            row_limit: Show at most this many rows (all when None).

        Raises:
            ValueError: unknown ``sort_by`` or a negative ``row_limit``.
        """
        key = _SORT_KEYS.get(sort_by)
        if key is None:
            raise ValueError(f"table: unknown sort_by {sort_by!r}; expected one of {', '.join(_SORT_KEYS)}")
        if row_limit is not None and (isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < 0):
            raise ValueError(f"table: row_limit must be an int >= 0 or None, got {row_limit!r}")
        rows = sorted(self._rows, key=key)
        if row_limit is not None:
            rows = rows[:row_limit]
        show_tasks = any(r.running_ns or r.waiting_ns for r in rows)
        show_steps = any(r.max_step_ns for r in rows)
        show_queued = any(r.queued_count for r in rows)
        header = [self.group_by.capitalize(), "Count", "Total", "Self", "Mean", "Min", "Max"]
        if show_tasks:
            header += ["Running", "Waiting"]
        if show_steps:
            header.append("Max step")
        if show_queued:
            header.append("Queued")
        show_samples = any(r.samples for r in self._rows)
        if show_samples:
            header += ["Samples", "Sampled", "Self sampled"]
        show_memory = self.memory is not None
        if show_memory:
            header += ["Allocated", "Net mem", "Self net", "Peak mem", "# Allocs"]
        body = []
        for r in rows:
            label = r.key if len(r.key) <= 60 else r.key[:57] + "..."
            label = label.replace("\n", "\\n").replace("\t", "\\t")
            cells = [label, str(r.count), _fmt(r.total_ns), _fmt(r.self_ns), _fmt(r.mean_ns), _fmt(r.min_ns), _fmt(r.max_ns)]
            if show_tasks:
                cells += [_fmt(r.running_ns), _fmt(r.waiting_ns)]
            if show_steps:
                cells.append(_fmt(r.max_step_ns) if r.max_step_ns else "-")
            if show_queued:
                cells.append(_fmt(r.queued_mean_ns) if r.queued_count else "-")
            if show_samples:
                cells += [str(r.samples), _fmt(r.sampled_ns), _fmt(r.self_sampled_ns)]
            if show_memory:
                cells += [
                    fmt_bytes(r.allocated_bytes), fmt_bytes(r.cpu_memory_usage), fmt_bytes(r.self_cpu_memory_usage),
                    fmt_bytes(r.peak_memory), str(r.allocation_count),
                ]  # fmt: skip
            body.append(cells)
        widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(header)]
        line = "-" * (sum(widths) + 2 * (len(widths) - 1))

        def fmt_row(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        out = [line, fmt_row(header), line, *(fmt_row(c) for c in body), line]
        if show_samples or self.idle_samples:
            out.append(
                "Count..Max: traced ranges and calls; Samples, Sampled: stack samples (SPEC 8.4)"
                + (f"; idle (a loop waiting for I/O): {self.idle_samples} samples, {_fmt(self.idle_ns)}" if self.idle_samples else "")
            )
        if show_memory:
            m = self.memory
            mode = "exact" if m.exact else f"sampled every ~{fmt_bytes(m.interval)}, scaled"
            out.append(
                f"Memory ({mode}): Net mem = allocated and not freed by stop, charged to the range that allocated; "
                f"other (work not profiled): {fmt_bytes(m.other_bytes)} in {m.other_count} allocations"
            )
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<EventAverages group_by={self.group_by!r} rows={len(self._rows)}>"


def fmt_bytes(n: float) -> str:
    """Bytes for a table: 1.5 MB, 12.0 KB, 312 B (1 KB = 1024 bytes)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{sign}{n / size:.1f} {unit}"
    return f"{sign}{n:.0f} B"


def _fmt(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3f}us"
    return f"{ns:.0f}ns"


def _node_label(session: Session, node: int) -> str:
    pid = (session.metadata.get("pids") or {}).get(str(node))
    label = f"node {node} (pid {pid})" if pid is not None else f"node {node}"
    command = (session.metadata.get("commands") or {}).get(str(node))
    return f"{label}: {command}" if type(command) is str else label


def key_averages(session: Session, group_by: str = "name") -> EventAverages:
    """Aggregate a session's events (instants excluded)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"key_averages: unknown group_by {group_by!r}; expected one of {', '.join(GROUP_BY)}")
    rows: dict[Any, FunctionEventAvg] = {}
    tracks = {t.id: t for t in session.tracks()}
    if group_by == "name":
        _by_name(session._table, rows)
    else:
        for ev in session.events():
            if ev.is_instant:
                continue
            stack: tuple[tuple[str, int, str], ...] = ()
            if group_by == "track":
                k: Any = ev.thread_id
                t = tracks.get(ev.thread_id)
                label = f"{t.name if t else ev.track} ({ev.thread_id})"
            elif group_by == "node":  # one row per process of a merged session (SPEC 15.4)
                k = ("node", ev.node_id)
                label = _node_label(session, ev.node_id)
            else:
                stack = tuple(ev.stack[:_STACK_DEPTH]) if ev.stack else ()
                k = (ev.name, stack)
                label = ev.name if not stack else f"{ev.name} @ {stack[0][0]}:{stack[0][1]}"
            row = rows.get(k)
            if row is None:
                row = rows[k] = FunctionEventAvg(label, stack)
            row.add(ev)
    averages = EventAverages(list(rows.values()), group_by)
    _add_samples(session, averages, rows, group_by, tracks)
    _add_memory(session, averages, rows, group_by)
    return averages


def _add_memory(session: Session, averages: EventAverages, rows: dict[Any, FunctionEventAvg], group_by: str) -> None:
    """The memory columns (issue 21): see :class:`FunctionEventAvg`."""
    m = session.memory
    if m is None:
        return
    averages.memory = m
    if group_by == "track":
        for tid, st in m.by_thread().items():
            row = rows.get(tid)
            if row is None:
                name = m.threads.get(tid, (str(tid), ""))[0]
                row = rows[tid] = FunctionEventAvg(f"{name} ({tid})")
                averages._rows.append(row)
            row.allocated_bytes, row.freed_bytes, row.allocation_count = st.allocated, st.freed, st.count
            row.cpu_memory_usage = row.self_cpu_memory_usage = st.net
            row.peak_memory = st.peak
        return
    if group_by == "node":
        # One row per process (SPEC 15.4): the allocations of its threads.
        for node, threads in sorted(threads_by_node(session).items()):
            row = rows.get(("node", node))
            if row is None:
                row = rows[("node", node)] = FunctionEventAvg(_node_label(session, node))
                averages._rows.append(row)
            st = m.of_threads(threads)
            row.allocated_bytes, row.freed_bytes, row.allocation_count = st.allocated, st.freed, st.count
            row.cpu_memory_usage = row.self_cpu_memory_usage = st.net
            row.peak_memory = st.peak
        return
    tab = session._table
    for i in m.events_with_memory():
        both = m.of_event(i)
        if both is None:
            continue
        ev = tab.view(i)
        if group_by == "stack":
            stack = tuple(ev.stack[:_STACK_DEPTH]) if ev.stack else ()
            k: Any = (ev.name, stack)
        elif ev.scope is RecordScope.TASK and ev.extra and ev.extra.get("coro"):
            k = (RecordScope.TASK, f"task {ev.extra['coro']}")
        elif ev.scope is RecordScope.EXECUTOR:
            k = (RecordScope.EXECUTOR, f"executor {ev.name}")
        else:
            k = ev.name
        row = rows.get(k)
        if row is None:
            continue
        incl, own = both
        row.allocated_bytes += incl.allocated
        row.freed_bytes += incl.freed
        row.allocation_count += incl.count
        row.cpu_memory_usage += incl.net
        row.self_cpu_memory_usage += own.net
        if incl.peak > row.peak_memory:
            row.peak_memory = incl.peak



#: Scopes whose rows key_averages names by more than the event's name.
_NAMED_APART: Final = (RecordScope.TASK, RecordScope.LOOP_BLOCK, RecordScope.EXECUTOR)


def _by_name(tab: EventTable, rows: dict[Any, FunctionEventAvg]) -> None:
    """key_averages' rows by name, from the columns. Plain ranges (no
    extra, not on a task's track, not a task, executor job or loop block)
    are summed in one pass (in C when the extension is there); every other
    event goes through :func:`_add_apart`. Rows are created in the order
    their first event comes, so the result is the same as adding event by
    event."""
    apart = bytes(1 if s in _NAMED_APART else 0 for s in SCOPES)
    plain_tracks = bytes(1 if t.steps is None else 0 for t in tab.tracks)
    extra = array("i", sorted(i for i, x in tab.rare.items() if x[X_EXTRA] is not None))
    ext = _native.extension
    if ext is not None:
        try:
            ids, first, count, total, own, low, high, others = ext.name_totals(tab, apart, plain_tracks, extra)
        except OverflowError:  # sums past 64 bits: Python's ints below
            pass
        else:
            plain = ((f, j) for j, f in enumerate(first))
            names = tab.names
            for i, j in heapq.merge(plain, ((i, -1) for i in others)):
                if j < 0:
                    _add_apart(tab.view(i), rows)
                    continue
                name = names[ids[j]]
                row = rows.get(name)
                if row is None:
                    row = rows[name] = FunctionEventAvg(name)
                row.add_totals(count[j], total[j], own[j], low[j], high[j])
            return
    get = rows.get
    names, name_col, start, end, kind, scope, track = (
        tab.names,
        tab.name,
        tab.start,
        tab.end,
        tab.kind,
        tab.scope,
        tab.track,
    )
    with_extra = set(extra)
    off, kids = tab.children_index()
    for i in range(len(tab)):
        if kind[i] & KIND_INSTANT:
            continue
        if i in with_extra or apart[scope[i]] or not plain_tracks[track[i]]:
            _add_apart(tab.view(i), rows)
            continue
        name = names[name_col[i]]
        row = get(name)
        if row is None:
            row = rows[name] = FunctionEventAvg(name)
        d = end[i] - start[i]
        own_ns = d
        for c in kids[off[i] : off[i + 1]]:
            own_ns -= end[c] - start[c]
        row.add_totals(1, d, own_ns, d, d)


def _add_apart(ev: FunctionEvent, rows: dict[Any, FunctionEventAvg]) -> None:
    """Add a range that is not plain: named by its coroutine (tasks, loop
    blocks) or its function (executor jobs), with its running and waiting
    time, steps and queueing."""
    scope = ev.scope
    extra = ev.extra
    if scope is RecordScope.TASK and extra and extra.get("coro"):
        # Tasks are named one by one (Task-7, ...): group them by coroutine.
        label = f"task {extra['coro']}"
        k: Any = (RecordScope.TASK, label)
    elif scope is RecordScope.LOOP_BLOCK and extra and extra.get("coro"):
        # Named after the blocking task: grouped by its coroutine, as tasks are.
        label = f"loop blocked by task {extra['coro']}"
        k = (RecordScope.LOOP_BLOCK, label)
    elif scope is RecordScope.EXECUTOR:
        # Named after the function handed over, which may also be the
        # name of a range inside it: keep the two rows apart.
        label = f"executor {ev.name}"
        k = (RecordScope.EXECUTOR, label)
    else:
        k = label = ev.name
    row = rows.get(k)
    if row is None:
        row = rows[k] = FunctionEventAvg(label)
    row.add(ev)


def _add_samples(
    session: Session, averages: EventAverages, rows: dict[Any, FunctionEventAvg], group_by: str, tracks: dict[int, Any]
) -> None:
    """The sampled columns (SPEC 8.4): see :class:`FunctionEventAvg`."""
    from ._samples import sampled_totals, samples_within

    totals = sampled_totals(session)
    if totals is None or group_by == "stack":
        return
    samples = session.samples
    assert samples is not None
    averages.idle_samples, averages.idle_ns = samples.idle_count, samples.idle_ns
    if group_by == "node":
        for tid, (count, ns) in totals.by_track.items():
            t = session._tracks.get(tid)
            node = t.node_id if t else 0
            row = rows.get(("node", node))
            if row is None:
                row = rows["node", node] = FunctionEventAvg(_node_label(session, node))
                averages._rows.append(row)
            row.samples += count
            row.sampled_ns += ns
        return
    if group_by == "track":
        for tid, (count, ns) in totals.by_track.items():
            row = rows.get(tid)
            if row is None:
                t = session._tracks.get(tid)
                row = rows[tid] = FunctionEventAvg(f"{t.name if t else tid} ({tid})")
                averages._rows.append(row)
            row.samples, row.sampled_ns = count, ns
        return
    # Ranges (not traced Python calls: those are matched by name below),
    # tasks and executor jobs: the samples on their track while they ran.
    for ev in session.events():
        if ev.is_instant or ev.is_async or ev.scope is RecordScope.PYTHON_FUNCTION:
            continue
        count, ns = samples_within(totals, ev.thread_id, ev.start_ns, ev.end_ns)
        if not count:
            continue
        if ev.scope is RecordScope.TASK and ev.extra and ev.extra.get("coro"):
            k: Any = (RecordScope.TASK, f"task {ev.extra['coro']}")
        elif ev.scope is RecordScope.EXECUTOR:
            k = (RecordScope.EXECUTOR, f"executor {ev.name}")
        else:
            k = ev.name
        row = rows.get(k)
        if row is not None:
            row.samples += count
            row.sampled_ns += ns
    # Functions: the samples with the function on the stack (and on top).
    for name, (count, ns, _self_count, self_ns) in totals.by_name.items():
        row = rows.get(name)
        if row is None:
            row = rows[name] = FunctionEventAvg(name)
            averages._rows.append(row)
        row.samples += count
        row.sampled_ns += ns
        row.self_sampled_ns += self_ns


def max_step_ns(steps: Any) -> int:
    """The longest step in a task's flat ``[start, end, ...]`` step list (0 if none)."""
    if not steps:
        return 0
    return max((steps[i + 1] - steps[i] for i in range(0, len(steps) - 1, 2)), default=0)


def queued_ns(ev: FunctionEvent) -> int | None:
    """How long an executor job waited from submit to start, or None if unknown."""
    extra = ev.extra
    submit = extra.get("submit_ns") if extra else None
    if not isinstance(submit, int) or isinstance(submit, bool):
        return None
    return max(0, ev.start_ns - submit)


# ---------------------------------------------------------------------------
# The summary sections: what was slow, in which task, and why
# ---------------------------------------------------------------------------
#
# Each section is a tuple of small frozen records built from the session's
# events alone (so it reads the same from a live profile, a saved session, a
# Chrome trace or an HTML report); ``Summary.render()`` prints them under the
# table, and the HTML report can show the same records.


@dataclass(frozen=True)
class TaskLine:
    """A task in "Slowest tasks": wall time split into running and waiting."""

    name: str
    coro: str
    track_id: int
    total_ns: int
    running_ns: int
    waiting_ns: int
    max_step_ns: int
    steps: int
    outcome: str
    spawned_at: str | None  # the user's line that spawned it, if recorded


@dataclass(frozen=True)
class BlockLine:
    """Stretches that held the event loop with the same culprit ("What
    blocked the loop"): the same coroutine stopped at the same function."""

    count: int
    total_ns: int
    max_ns: int
    start_ns: int  # of the longest
    task: str  # the longest one's task: its name, "(callback)", or "work outside this profile"
    coro: str | None
    culprit: str | None  # the innermost user frame, "file:line function"
    stack: tuple[str, ...]  # the longest one's, shown_stack(): outermost first, library frames collapsed
    outside: bool


@dataclass(frozen=True)
class HotFrame:
    """A function the loop was held in, from the watchdog's samples during
    blocks, by coroutine (the tasks running it)."""

    coro: str
    tasks: int
    frame: str  # "file:line function", the line sampled most
    time_ns: int  # the blocks' time, shared out by the samples' counts
    samples: int


@dataclass(frozen=True)
class WaitLine:
    """A task's longest wait: what it waited on, as far as aprof can tell."""

    task: str
    coro: str
    track_id: int
    duration_ns: int
    what: str  # "" when nothing says what
    kind: str
    where: str  # the user's line that awaited, "" if unknown
    blocked_ns: int  # of the wait, time the loop was blocked (by others)
    blocked_by: str  # the task that blocked it longest, "" if none


@dataclass(frozen=True)
class QueueLine:
    """Executor jobs of one function: how long they waited for a worker."""

    function: str
    jobs: int
    queued_mean_ns: float
    queued_max_ns: int
    run_mean_ns: float


@dataclass(frozen=True)
class PendingLine:
    """Tasks still pending when the program or profile ended, by coroutine."""

    coro: str
    count: int
    spawned_at: str | None
    waiting_on: str | None


@dataclass(frozen=True)
class RepeatLine:
    """Sequential awaits of the same thing in one task (the N+1 pattern)."""

    task: str
    coro: str
    count: int
    total_ns: int
    what: str
    where: str


@dataclass(frozen=True)
class MemoryLine:
    """Memory kept at stop (allocated, not freed) by the ranges of one name,
    or by the tasks of one coroutine (``profile_memory``)."""

    kind: str  # "range" or "task"
    name: str  # the range's name, or the tasks' coroutine (a thread's name)
    count: int  # ranges or tasks
    example: str  # a task's name ("" for ranges)
    net: int
    allocated: int


@dataclass(frozen=True)
class Summary:
    """The sections printed under the summary table (:meth:`aprof.Session.summary`).

    Each is a tuple of records, longest first, empty when there is nothing
    to say. ``str(summary)`` is :meth:`render`.
    """

    tasks: int
    slowest_tasks: tuple[TaskLine, ...]
    loop_blocks: tuple[BlockLine, ...]
    loop_block_count: int
    loop_block_total_ns: int
    loop_block_threshold_ns: int | None
    hot_frames: tuple[HotFrame, ...]
    longest_waits: tuple[WaitLine, ...]
    executor_queueing: tuple[QueueLine, ...]
    pending: tuple[PendingLine, ...]
    pending_count: int
    repeated_awaits: tuple[RepeatLine, ...]
    #: What the profile's memory budget (or the tracer's buffer) did not
    #: keep, by kind (``Session.dropped_by_kind``), only the kinds with any.
    dropped: tuple[tuple[str, int], ...] = ()
    memory_kept: tuple[MemoryLine, ...] = ()
    memory_mode: str = ""

    def render(self) -> str:
        """The sections as text; "" when none has content."""
        return _render(self)

    def __str__(self) -> str:
        return self.render()


#: Sequential awaits of one thing reported from this many on.
REPEAT_MIN: Final = 10
#: Waits shorter than this are not worth a line.
_WAIT_MIN_NS: Final = 1_000_000


def task_label(name: str, coro: str | None) -> str:
    """``'name' (coro)``, or the coroutine alone when the name says nothing more
    (trio names a task after its function)."""
    if not coro:
        return repr(name)
    if name == coro or name.endswith("." + coro):
        return coro
    return f"{name!r} ({coro})"


def summarize(session: Session, limit: int = 5) -> Summary:
    """Build the summary sections of a session (see :class:`Summary`)."""
    # Each section reads a few kinds of event: found in the scope column,
    # and (repeated awaits) the ranges with several children in the children
    # index, so a million plain ranges cost no view each.
    tab = session._table
    tasks = [e for e in map(tab.view, tab.rows_of_scope(RecordScope.TASK)) if not e.is_instant]
    by_track = {e.thread_id: e for e in tasks}
    blocks = list(map(tab.view, tab.rows_of_scope(RecordScope.LOOP_BLOCK)))
    executors = list(map(tab.view, tab.rows_of_scope(RecordScope.EXECUTOR)))
    parents = list(map(tab.view, _many_children(tab, REPEAT_MIN)))
    thresholds = [b.extra.get("threshold_ns") for b in blocks if b.extra]
    pending, pending_count = _pending(tasks, by_track, limit)
    return Summary(
        tasks=len(tasks),
        slowest_tasks=tuple(_task_line(t) for t in sorted(tasks, key=lambda t: -t.duration_ns)[:limit]),
        loop_blocks=tuple(_block_lines(blocks)[:limit]),
        loop_block_count=len(blocks),
        loop_block_total_ns=sum(b.duration_ns for b in blocks),
        loop_block_threshold_ns=next((int(t) for t in thresholds if isinstance(t, int)), None),
        hot_frames=tuple(_hot_frames(blocks, by_track)[:limit]),
        longest_waits=tuple(_longest_waits(executors, tasks, by_track, blocks)[:limit]),
        executor_queueing=tuple(_queueing(executors)[:limit]),
        pending=pending,
        pending_count=pending_count,
        repeated_awaits=tuple(_repeats(parents, executors, tasks, by_track)[:limit]),
        dropped=tuple((k, v) for k, v in session.dropped_by_kind.items() if v),
        memory_kept=tuple(_memory_kept(session, by_track, limit)),
        memory_mode=_memory_mode(session),
    )


def _memory_mode(session: Session) -> str:
    m = session.memory
    if m is None:
        return ""
    return "exact" if m.exact else f"sampled every ~{fmt_bytes(m.interval)}, scaled"


def _memory_kept(session: Session, by_track: dict[int, FunctionEvent], limit: int) -> list[MemoryLine]:
    """What kept the most memory at stop: range names (their own bytes,
    children apart) and task coroutines (everything their tasks made)."""
    m = session.memory
    if m is None:
        return []
    tab = session._table
    ranges: dict[str, list[int]] = {}
    for i in m.events_with_memory():
        both = m.of_event(i)
        if both is None or tab.scope[i] == _TASK_SCOPE_INDEX:
            continue
        own = both[1]
        acc = ranges.setdefault(tab.names[tab.name[i]], [0, 0, 0])
        acc[0] += 1
        acc[1] += own.net
        acc[2] += own.allocated
    tasks: dict[str, list[Any]] = {}
    for tid, st in m.by_thread().items():
        name, kind = m.threads.get(tid, (str(tid), ""))
        task = by_track.get(tid)
        coro = str((task.extra or {}).get("coro") or "") if task is not None else ""
        key = coro or name
        acc2 = tasks.setdefault(key, [0, 0, 0, name if kind != "thread" else ""])
        acc2[0] += 1
        acc2[1] += st.net
        acc2[2] += st.allocated
    # Counts are of all the ranges of the name and all the tasks of the
    # coroutine: sampled, some made no sampled allocation.
    lines = [MemoryLine("range", k, c, "", net, al) for k, (c, net, al) in ranges.items() if net > 0]
    lines.sort(key=lambda x: -x.net)
    lines = [replace(ml, count=tab.name.count(tab.names.index(ml.name))) for ml in lines[:limit]]
    per_coro: dict[str, int] = {}
    for task in by_track.values():
        coro = str((task.extra or {}).get("coro") or "")
        per_coro[coro] = per_coro.get(coro, 0) + 1
    tlines = [MemoryLine("task", k, max(c, per_coro.get(k, 0)), ex, net, al) for k, (c, net, al, ex) in tasks.items() if net > 0]
    tlines.sort(key=lambda x: -x.net)
    return lines + tlines[:limit]


_TASK_SCOPE_INDEX: Final = SCOPES.index(RecordScope.TASK)


def _many_children(tab: EventTable, k: int) -> Sequence[int]:
    """The rows with at least ``k`` children (``many_children`` in
    aprof/_cevents.c: at ten million events the loop here cost a second)."""
    off, _ = tab.children_index()
    ext = _native.extension
    if ext is not None:
        rows = array("i")
        rows.frombytes(ext.many_children(off, k))
        return rows
    return [i for i in range(len(tab)) if off[i + 1] - off[i] >= k]


def _task_line(t: FunctionEvent) -> TaskLine:
    extra = t.extra or {}
    steps = extra.get("steps") or ()
    site = _site(extra.get("spawn_site"))
    return TaskLine(
        name=t.name,
        coro=str(extra.get("coro") or ""),
        track_id=t.thread_id,
        total_ns=t.duration_ns,
        running_ns=t.running_ns or 0,
        waiting_ns=t.waiting_ns or 0,
        max_step_ns=max_step_ns(steps),
        steps=len(steps) // 2,
        outcome=str(extra.get("outcome") or ""),
        spawned_at=site,
    )


def _site(site: Any) -> str | None:
    """A recorded spawn site (``[file, line, function]``, or already text) as text."""
    if not site:
        return None
    if isinstance(site, (list, tuple)) and len(site) == 3:
        return format_frame(site)
    return str(site)


def task_stack(stack: Any, coro: str | None) -> Any:
    """A blocking task's part of a sampled stack (innermost first): up to
    its coroutine's frame, without the loop and the program's start below."""
    if not stack or not coro:
        return stack
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][2] == coro:
            return stack[: i + 1]
    return stack


def _block_lines(blocks: list[FunctionEvent]) -> list[BlockLine]:
    groups: dict[tuple[Any, ...], list[tuple[FunctionEvent, Any, str | None]]] = {}
    for b in blocks:
        extra = b.extra or {}
        outside = extra.get("source") == "outside"
        coro = extra.get("coro")
        stack = task_stack(b.stack, coro)
        frame = innermost_user_frame(stack)
        culprit = format_frame(frame) if frame is not None else None
        # One group per coroutine and function (not line: a loop's body
        # is sampled at different lines).
        key = (outside, coro if coro else extra.get("blocked_task"), frame[0] if frame else None, frame[2] if frame else None)
        groups.setdefault(key, []).append((b, stack, culprit))
    out = []
    for members in groups.values():
        longest, stack, culprit = max(members, key=lambda m: m[0].duration_ns)
        extra = longest.extra or {}
        coro = extra.get("coro")
        out.append(
            BlockLine(
                count=len(members),
                total_ns=sum(m[0].duration_ns for m in members),
                max_ns=longest.duration_ns,
                start_ns=longest.start_ns,
                task=str(extra.get("blocked_task") or "(unknown)"),
                coro=str(coro) if coro else None,
                culprit=culprit,
                stack=tuple(shown_stack(stack)) if stack else (),
                outside=extra.get("source") == "outside",
            )
        )
    out.sort(key=lambda b: -b.total_ns)
    return out


def _hot_frames(blocks: list[FunctionEvent], by_track: dict[int, FunctionEvent]) -> list[HotFrame]:
    # (coro, file, function) -> [time, samples, {task ids}, {line: samples}]
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for b in blocks:
        extra = b.extra or {}
        samples = extra.get("samples") or ()
        total = sum(int(n) for n, _ in samples)
        if not total:
            continue
        task = by_track.get(extra.get("task_id", 0))
        coro = str(extra.get("coro") or (task_label(str(extra.get("blocked_task")), None) if extra.get("blocked_task") else "?"))
        for n, stack in samples:
            frame = innermost_user_frame(task_stack(stack, extra.get("coro")))
            if frame is None:
                if not stack:
                    continue
                frame = (str(stack[0][0]), int(stack[0][1]), str(stack[0][2]))
            a = acc.setdefault((coro, frame[0], frame[2]), [0.0, 0, set(), {}])
            a[0] += b.duration_ns * int(n) / total
            a[1] += int(n)
            a[2].add(task.thread_id if task is not None else extra.get("blocked_task"))
            a[3][frame[1]] = a[3].get(frame[1], 0) + int(n)
    rows = []
    for (coro, filename, function), (time_ns, n, who, lines) in acc.items():
        line = max(lines, key=lambda k: lines[k])
        rows.append(HotFrame(coro, len(who), format_frame((filename, line, function)), int(time_ns), n))
    rows.sort(key=lambda r: -r.time_ns)
    return rows


def _blocked_during(start: int, end: int, blocks: list[FunctionEvent], task_id: int) -> tuple[int, str]:
    """Time in [start, end] the loop was blocked by something other than the task itself, and by whom."""
    total = 0
    worst, worst_ns = "", 0
    for b in blocks:
        extra = b.extra or {}
        if extra.get("task_id") == task_id:
            continue
        ov = min(end, b.end_ns) - max(start, b.start_ns)
        if ov > 0:
            total += ov
            if ov > worst_ns:
                worst, worst_ns = task_label(str(extra.get("blocked_task") or "?"), extra.get("coro")), ov
    return total, worst


def _longest_waits(
    events: list[FunctionEvent], tasks: list[FunctionEvent], by_track: dict[int, FunctionEvent], blocks: list[FunctionEvent]
) -> list[WaitLine]:
    executors: dict[int, list[FunctionEvent]] = {}
    for e in events:
        if e.scope is RecordScope.EXECUTOR and e.forward_thread_id:
            executors.setdefault(e.forward_thread_id, []).append(e)
    children: dict[int, list[FunctionEvent]] = {}
    for t in tasks:
        if t.forward_thread_id in by_track:
            children.setdefault(t.forward_thread_id, []).append(t)
    out: list[WaitLine] = []
    for t in tasks:
        extra = t.extra or {}
        coro = str(extra.get("coro") or "")
        best: tuple[int, int, str, str, str] | None = None  # (duration, end, what, kind, where)
        for run in extra.get("waits") or ():
            # [first_start, last_end, count, total, max, what, kind, where, caller, max_end]
            if best is None or int(run[4]) > best[0]:
                max_end = run[9] if len(run) > 9 else run[1]
                best = (int(run[4]), int(max_end), str(run[5]), str(run[6]), str(run[7]))
        if best is None:
            best = _longest_gap(t, executors.get(t.thread_id, ()), children.get(t.thread_id, ()))
        elif best[3] in ("children", "future", "other"):
            # A task group, a gather or a bare future (an executor job's,
            # once done, no longer says it is one): the job or the child
            # that ended as the wait did, if there is one.
            start = best[1] - best[0]
            named = _what_ended(
                start, best[1], executors.get(t.thread_id, ()), children.get(t.thread_id, ()), _step_before(t, start)
            )
            if named is not None:
                best = (best[0], best[1], named[0], named[1], best[4])
        if best is None or best[0] < _WAIT_MIN_NS:
            continue
        duration, end, what, kind, where = best
        blocked, by = _blocked_during(end - duration, end, blocks, t.thread_id)
        out.append(WaitLine(t.name, coro, t.thread_id, duration, what, kind, where, blocked, by))
    out.sort(key=lambda w: -w.duration_ns)
    return out


def _last_child(children: Any, start: int, end: int) -> FunctionEvent | None:
    """The child task that ended last in [start, end], near its end.

    A wait ends when the task is made runnable, which trio does as the
    last child exits, before the child's own end is stamped: a child that
    ended just after ``end`` (within the slack) counts."""
    slack = max(1_000_000, (end - start) // 20)
    ended = [c for c in children if start <= c.end_ns <= end + slack and end - c.end_ns <= slack]
    return max(ended, key=lambda c: c.end_ns) if ended else None


def _longest_gap(
    t: FunctionEvent, executors: Any, children: Any
) -> tuple[int, int, str, str, str] | None:
    """A task's longest time between two steps, and what it likely waited
    on when its steps alone are known: an executor job it submitted that
    ended in the gap, or a child task that ended just before it resumed."""
    steps = (t.extra or {}).get("steps") or ()
    best = None
    for i in range(1, len(steps) - 1, 2):
        gap = steps[i + 1] - steps[i]
        if best is None or gap > best[0]:
            best = (gap, steps[i], steps[i + 1])
    if best is None:
        return None
    gap, start, end = best
    named = _what_ended(start, end, executors, children, _step_before(t, start))
    what, kind = named if named is not None else ("", "")
    return gap, end, what, kind, ""


def _step_before(t: FunctionEvent, wait_start: int) -> int | None:
    """When the step of task ``t`` that ended at ``wait_start`` began (a wait
    starts as a step ends), or None."""
    steps = (t.extra or {}).get("steps") or ()
    i = bisect_left(steps, wait_start)
    if i < len(steps) and i % 2 == 1 and steps[i] == wait_start:
        return int(steps[i - 1])
    return None


def _what_ended(
    start: int, end: int, executors: Any, children: Any, step_start: int | None = None
) -> tuple[str, str] | None:
    """(what, kind) a task waiting from ``start`` to ``end`` likely waited
    on: an executor job it submitted in the step before the wait (from
    ``step_start``, when known) or during it, that ended in the wait; or
    the child task that ended last, just before it resumed."""
    slack = max(1_000_000, (end - start) // 20)
    since = start - slack if step_start is None else min(start - slack, step_start)
    for e in executors:
        submit = (e.extra or {}).get("submit_ns")
        if isinstance(submit, int) and since <= submit <= end and e.end_ns <= end + slack:
            return f"executor job {e.name}", "executor"
    c = _last_child(children, start, end)
    if c is not None:
        return f"task {task_label(c.name, (c.extra or {}).get('coro'))}", "task"
    return None


def _queueing(events: list[FunctionEvent]) -> list[QueueLine]:
    groups: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.scope is RecordScope.EXECUTOR:
            q = queued_ns(e)
            if q is not None:
                groups.setdefault(e.name, []).append((q, e.duration_ns))
    out = []
    for fn, jobs in groups.items():
        queued = [q for q, _ in jobs]
        mean_q = sum(queued) / len(jobs)
        if mean_q < 1_000_000:  # under a millisecond: the pool kept up
            continue
        out.append(QueueLine(fn, len(jobs), mean_q, max(queued), sum(d for _, d in jobs) / len(jobs)))
    out.sort(key=lambda q: -q.queued_mean_ns * q.jobs)
    return out


def _root_end(t: FunctionEvent, by_track: dict[int, FunctionEvent]) -> int | None:
    """The end of the task that heads ``t``'s family (follows spawners)."""
    seen = set()
    cur = t
    while cur.forward_thread_id in by_track and cur.thread_id not in seen:
        seen.add(cur.thread_id)
        cur = by_track[cur.forward_thread_id]
    return None if cur is t else cur.end_ns


def _pending(
    tasks: list[FunctionEvent], by_track: dict[int, FunctionEvent], limit: int
) -> tuple[tuple[PendingLine, ...], int]:
    """Tasks that never finished on their own: still running at stop, or
    cancelled after the task that heads their family ended (``asyncio.run``
    cancels what is left when its main task returns)."""
    groups: dict[str, list[FunctionEvent]] = {}
    for t in tasks:
        extra = t.extra or {}
        outcome = extra.get("outcome")
        if outcome == "unfinished":
            pass
        elif outcome == "cancelled":
            root_end = _root_end(t, by_track)
            if root_end is None or t.end_ns <= root_end:
                continue
        else:
            continue
        groups.setdefault(str(extra.get("coro") or t.name), []).append(t)
    lines = []
    for coro, ts in groups.items():
        sites: dict[str, int] = {}
        waits: dict[str, int] = {}
        for t in ts:
            extra = t.extra or {}
            site = _site(extra.get("spawn_site"))
            if site:
                sites[site] = sites.get(site, 0) + 1
            on = extra.get("waiting_on")
            if not on and extra.get("waits"):
                on = extra["waits"][-1][5:]
            if on:
                what = str(on[0]) + (f" at {on[2]}" if len(on) > 2 and on[2] else "")
                waits[what] = waits.get(what, 0) + 1
        lines.append(PendingLine(coro, len(ts), _most(sites), _most(waits)))
    lines.sort(key=lambda p: -p.count)
    return tuple(lines[:limit]), sum(p.count for p in lines)


def _most(counts: dict[str, int]) -> str | None:
    return max(counts, key=lambda k: counts[k]) if counts else None


def _repeats(
    parents: list[FunctionEvent],
    executors: list[FunctionEvent],
    tasks: list[FunctionEvent],
    by_track: dict[int, FunctionEvent],
) -> list[RepeatLine]:
    """Repeated sequential awaits: runs among the children of ``parents``,
    runs in the tasks' await chains, and ``executors`` jobs handed over one
    after another."""
    out: list[RepeatLine] = []
    # Ranges: a run of same-named siblings, each of which waited.
    covered: dict[int, list[tuple[int, int]]] = {}  # track -> spans of those runs
    for e in parents:
        kids = e.children
        if len(kids) < REPEAT_MIN:
            continue
        run_name: str | None = None
        run = total = 0
        first: FunctionEvent | None = None
        last: FunctionEvent | None = None
        for k in [*kids, None]:
            waited = k is not None and (k.waiting_ns or 0) > 0 and not k.is_instant
            if k is not None and waited and k.name == run_name:
                run += 1
                total += k.duration_ns
                last = k
                continue
            if run_name is not None and run >= REPEAT_MIN and first is not None and last is not None:
                task = by_track.get(e.thread_id)
                coro = str((task.extra or {}).get("coro") or "") if task is not None else ""
                out.append(RepeatLine(e.track, coro, run, total, run_name, e.name))
                covered.setdefault(e.thread_id, []).append((first.start_ns, last.end_ns))
            run_name, run, total = (k.name, 1, k.duration_ns) if k is not None and waited else (None, 0, 0)
            first = last = k
    # Await chains: a run of waits on the same call at the same line, unless
    # a run of ranges above already says it, or it is a loop's own sleep
    # (pacing or polling, not a repeated query).
    for t in tasks:
        extra = t.extra or {}
        coro = str(extra.get("coro") or "")
        spans = covered.get(t.thread_id, ())
        for run in extra.get("waits") or ():
            if int(run[2]) < REPEAT_MIN:
                continue
            where, caller = str(run[7]), str(run[8]) if len(run) > 8 else ""
            if str(run[6]) == "sleep" and not caller:
                continue
            if any(lo <= int(run[0]) and int(run[1]) <= hi for lo, hi in spans):
                continue
            place = f"{_function_of(where)}" if where else coro
            if caller:
                place += f", called from {_function_of(caller)}"
            out.append(RepeatLine(t.name, coro, int(run[2]), int(run[3]), str(run[5]), place))
    # Executor jobs handed over one after another by one task.
    jobs: dict[tuple[int, str], list[FunctionEvent]] = {}
    for e in executors:
        if e.forward_thread_id in by_track:
            jobs.setdefault((e.forward_thread_id, e.name), []).append(e)
    for (fwd, name), js in jobs.items():
        js.sort(key=lambda e: e.start_ns)
        sequential = all(
            (b.extra or {}).get("submit_ns", b.start_ns) >= a.end_ns for a, b in zip(js, js[1:], strict=False)
        )
        if len(js) >= REPEAT_MIN and sequential:
            task = by_track[fwd]
            coro = str((task.extra or {}).get("coro") or "")
            out.append(RepeatLine(task.name, coro, len(js), sum(e.duration_ns for e in js), f"executor job {name}", coro))
    out.sort(key=lambda r: -r.total_ns)
    return out


def _function_of(label: str) -> str:
    """``file:line function`` -> ``function``."""
    return label.rsplit(" ", 1)[-1] if " " in label else label


def _render(s: Summary) -> str:
    out: list[str] = []
    if s.dropped:
        what = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in s.dropped)
        out.append(f"Data dropped: {what} were not kept (the profile's memory budget or the tracer's buffer)")
    if s.slowest_tasks:
        out.append("Slowest tasks (wall time = running on the loop + waiting)")
        rows = [["Total", "Running", "Waiting", "Max step", "Task"]]
        for t in s.slowest_tasks:
            label = task_label(t.name, t.coro)
            if t.outcome and t.outcome != "returned":
                label += f" [{t.outcome}]"
            if t.spawned_at:
                label += f", spawned at {t.spawned_at}"
            rows.append([_fmt(t.total_ns), _fmt(t.running_ns), _fmt(t.waiting_ns), _fmt(t.max_step_ns), label])
        out += _columns(rows)
    if s.loop_block_count:
        over = f" longer than {_fmt(s.loop_block_threshold_ns)}" if s.loop_block_threshold_ns else ""
        n = s.loop_block_count
        out.append(f"What blocked the loop: {n} step{'s' if n != 1 else ''} or callback{'s' if n != 1 else ''}{over}, {_fmt(s.loop_block_total_ns)} in total")
        for i, b in enumerate(s.loop_blocks):
            many = f" in {b.count} blocks (longest {_fmt(b.max_ns)})" if b.count > 1 else ""
            if b.outside:
                out.append(f"  {_fmt(b.total_ns):>10}{many}: work outside this profile")
                continue
            if not b.coro:
                who = b.task
            elif b.count > 1:
                who = f"{b.coro} tasks, e.g. {b.task!r},"
            else:
                who = "task " + task_label(b.task, b.coro)
            out.append(f"  {_fmt(b.total_ns):>10}{many}: {who}" + (f" at {b.culprit}" if b.culprit else ""))
            if i < 3 and len(b.stack) > 1:
                out += [f"{'':14}{line}" for line in b.stack[-6:]]
    if s.hot_frames:
        out.append("Where the loop was held (the watchdog's samples during the blocks)")
        rows = [["Time", "Samples", "Function", "Coroutine"]]
        for h in s.hot_frames:
            rows.append([_fmt(h.time_ns), str(h.samples), h.frame, h.coro + (f" ({h.tasks} tasks)" if h.tasks > 1 else "")])
        out += _columns(rows, left=2)
    if s.longest_waits:
        out.append("Longest waits (what each task waited on longest)")
        for w in s.longest_waits:
            line = f"  {_fmt(w.duration_ns):>10}  task {task_label(w.task, w.coro)} waited"
            if w.what:
                line += f" on {w.what}" + (f" at {w.where}" if w.where else "")
            if w.blocked_ns >= _WAIT_MIN_NS:
                line += f"; the loop was blocked {_fmt(w.blocked_ns)} of it, mostly by {w.blocked_by}"
            out.append(line)
    if s.executor_queueing:
        out.append("Executor queueing (submit to start: jobs waiting for a worker)")
        for q in s.executor_queueing:
            out.append(
                f"  {q.function}: {q.jobs} job{'s' if q.jobs != 1 else ''}, queued mean {_fmt(q.queued_mean_ns)}, "
                f"max {_fmt(q.queued_max_ns)}; ran mean {_fmt(q.run_mean_ns)}"
            )
    if s.pending_count:
        out.append(f"Tasks pending at exit: {s.pending_count:,}")
        for p in s.pending:
            line = f"  {p.count:>6,}  {p.coro}"
            if p.spawned_at:
                line += f", spawned at {p.spawned_at}"
            if p.waiting_on:
                line += f", waiting on {p.waiting_on}"
            out.append(line)
    if s.repeated_awaits:
        out.append("Repeated sequential awaits (the N+1 pattern)")
        for r in s.repeated_awaits:
            out.append(
                f"  {r.count:>6,}  sequential awaits of {r.what} in {r.where} "
                f"(task {task_label(r.task, r.coro)}), {_fmt(r.total_ns)} in total"
            )
    if s.memory_kept:
        out.append(f"Memory kept at stop (allocated and not freed; {s.memory_mode})")
        rows = [["Kept", "Allocated", "By"]]
        for ml in s.memory_kept:
            if ml.kind == "range":
                who = f"range {ml.name!r}" + (f" ({ml.count} ranges)" if ml.count > 1 else "")
            else:
                who = f"{ml.count} tasks of {ml.name}, e.g. {ml.example!r}" if ml.count > 1 else f"task {task_label(ml.example, ml.name)}"
                if not ml.example:
                    who = f"thread {ml.name!r}"
            rows.append([fmt_bytes(ml.net), fmt_bytes(ml.allocated), who])
        out += _columns(rows)
    return "\n".join(out)


def _columns(rows: list[list[str]], left: int = 1) -> list[str]:
    """Indented rows: the first columns right-aligned, the last ``left`` as they are."""
    n = len(rows[0]) - left
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i < n else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))]
        out.append(("  " + "  ".join([*cells, r[-1]])).rstrip())
    return out
