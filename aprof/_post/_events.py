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

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from operator import itemgetter
from types import CodeType
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import (
    ASYNC_SAME_THREAD,
    FLAG_ASYNC,
    FLAG_UNFINISHED,
    KIND_INSTANT,
    KIND_RANGE,
    NO_LASTI,
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
    TASK_BLOCKS,
)
from .._core._threads import LogicalThread
from . import _table
from ._memory import MemoryStats
from ._table import SCOPES, X_ARGS, X_EXC, X_EXTRA, X_INPUTS, X_STACK, EventTable

__all__ = ["EventTable", "FunctionEvent", "Track", "consolidate"]


class Track:
    """One logical thread's row in the timeline.

    Attributes:
        id: The logical thread id.
        name: The task's or thread's name.
        kind: ``"asyncio"``, ``"trio"`` or ``"thread"``.
        os_thread_id: The OS thread it ran on.
        node_id: The process (node) it belongs to.
    """

    __slots__ = ("id", "kind", "name", "node_id", "os_thread_id", "steps")

    def __init__(self, id: int, name: str, kind: str, os_thread_id: int, node_id: int) -> None:
        self.steps: list[int] | None = None  # a task's (start, end) step pairs, flat
        self.id = id
        self.name = name
        self.kind = kind
        self.os_thread_id = os_thread_id
        self.node_id = node_id

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "os_thread_id": self.os_thread_id, "node_id": self.node_id}

    def __repr__(self) -> str:
        return f"<Track {self.id} {self.kind} {self.name!r}>"


class _PyEventView:
    """FunctionEvent's fields: its table and row. The C extension's
    ``EventView`` (aprof/_cevents.c) is the same in C, made by the table's
    ``ViewCache``; FunctionEvent subclasses whichever is active."""

    __slots__ = ("_i", "_tab")


if TYPE_CHECKING:
    _EventView = _PyEventView
else:
    _EventView = _PyEventView if _native.extension is None else _native.extension.EventView


class FunctionEvent(_EventView):
    """One recorded range or instant, after consolidation (SPEC 6.2).

    Times are ``time.perf_counter_ns()`` values. ``parent`` and ``children``
    link ranges nested on the same track; async ranges, and the TASK or
    EXECUTOR range of spawned work, have a parent (the range they started in,
    or were spawned from) but are not anyone's child.

    An event is a view of one row of its session's columns
    (:class:`~aprof._post._table.EventTable`), made when asked for: the
    fields are read through properties. While a caller holds an event,
    asking for the same row again gives the same object.
    """

    __slots__ = ()

    _tab: EventTable
    _i: int

    @property
    def _t(self) -> Track:
        tab = self._tab
        return tab.tracks[tab.track[self._i]]

    @property
    def parent(self) -> FunctionEvent | None:
        """The enclosing range, or the range it was spawned from; None."""
        tab = self._tab
        p = tab.parent[self._i]
        return None if p < 0 else tab.view(p)

    @property
    def children(self) -> list[FunctionEvent]:
        """Ranges nested directly in this one, on its track, in start order."""
        return self._tab.children_of(self._i)

    @property
    def is_async(self) -> bool:
        """Ended in another logical thread, or outlived the range it started in."""
        return bool(self._tab.kind[self._i] & FLAG_ASYNC)

    @property
    def unfinished(self) -> bool:
        """Still open at stop (closed at the stop time)."""
        return bool(self._tab.kind[self._i] & FLAG_UNFINISHED)

    @property
    def running_ns(self) -> int | None:
        """Time of its span during which its task was running on the loop.

        None outside recorded tasks (threads, tasks that started before the
        profile) and for instants.
        """
        tab = self._tab
        i = self._i
        steps = tab.tracks[tab.track[i]].steps
        if steps is None or tab.kind[i] & KIND_INSTANT:
            return None
        return overlap(steps, tab.start[i], tab.end[i])

    @property
    def waiting_ns(self) -> int | None:
        """Time of its span during which its task was suspended."""
        running = self.running_ns
        if running is None:
            return None
        return max(0, self.duration_ns - running)

    @property
    def name(self) -> str:
        """The range's name (for a TASK range, the task's name)."""
        tab = self._tab
        return tab.names[tab.name[self._i]]

    @property
    def scope(self) -> RecordScope:
        """The kind of range."""
        return SCOPES[self._tab.scope[self._i]]

    @property
    def start_ns(self) -> int:
        """When it started."""
        return self._tab.start[self._i]

    @property
    def end_ns(self) -> int:
        """When it ended (the stop time if it was still open)."""
        return self._tab.end[self._i]

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        tab = self._tab
        i = self._i
        return tab.end[i] - tab.start[i]

    @property
    def thread_id(self) -> int:
        """The logical thread that started it (its track)."""
        return self._t.id

    @property
    def end_thread_id(self) -> int:
        """The logical thread that ended it."""
        v = self._tab.end_lt[self._i]
        return self._t.id if v == -1 else v

    @property
    def os_thread_id(self) -> int:
        """The OS thread its track ran on."""
        return self._t.os_thread_id

    @property
    def track(self) -> str:
        """The name of its track (the task's or thread's name)."""
        return self._t.name

    @property
    def node_id(self) -> int:
        """The node (process) it was recorded in."""
        return self._t.node_id

    @property
    def is_instant(self) -> bool:
        """Whether it is an instant (``aprof.mark``), not a range."""
        return bool(self._tab.kind[self._i] & KIND_INSTANT)

    def _rare(self, field: int) -> Any:
        x = self._tab.rare.get(self._i)
        return None if x is None else x[field]

    @property
    def exception(self) -> str | None:
        """The type name of the exception that ended it, or None."""
        return self._rare(X_EXC)  # type: ignore[no-any-return]

    @property
    def sequence_nr(self) -> int:
        """Sequence number linking it to a spawn or submission (-1 if none)."""
        return self._tab.seq[self._i]

    @property
    def forward_thread_id(self) -> int:
        """The logical thread that spawned or submitted it (0 if none)."""
        return self._tab.fwd[self._i]

    @property
    def inputs(self) -> tuple[str, ...] | None:
        """Reprs of its inputs (``record_inputs=True``), or None."""
        return self._rare(X_INPUTS)  # type: ignore[no-any-return]

    @property
    def stack(self) -> tuple[tuple[str, int, str], ...] | None:
        """(file, line, function) frames at its start, innermost first, or None."""
        return self._rare(X_STACK)  # type: ignore[no-any-return]

    @property
    def args(self) -> str | None:
        """The ``args`` string given to ``record_function``, or None."""
        return self._rare(X_ARGS)  # type: ignore[no-any-return]

    @property
    def extra(self) -> dict[str, Any] | None:
        """Kind-specific fields (tasks: coro, outcome, steps; executors: submit_ns)."""
        return self._rare(X_EXTRA)  # type: ignore[no-any-return]

    @property
    def self_duration_ns(self) -> int:
        """Duration minus the time spent in nested children on the same track."""
        return self.duration_ns - sum(c.duration_ns for c in self.children)

    # -- memory (profile_memory, issue 21): None when the session has none --

    def _memory(self, inclusive: bool) -> MemoryStats | None:
        m = self._tab.memory
        if m is None:
            return None
        both = m.of_event(self._i)
        if both is None:
            return MemoryStats()
        return both[0] if inclusive else both[1]

    @property
    def memory(self) -> MemoryStats | None:
        """Allocations made in this range and its children (bytes allocated,
        freed, peak live, count), or None if the profile did not track
        memory. A free counts for the range that allocated the block."""
        return self._memory(True)

    @property
    def self_memory(self) -> MemoryStats | None:
        """As :attr:`memory`, without the children's allocations."""
        return self._memory(False)

    @property
    def cpu_memory_usage(self) -> int:
        """Net bytes (allocated minus freed) of this range and its children
        (0 without ``profile_memory``), as torch.profiler names it."""
        st = self._memory(True)
        return st.net if st is not None else 0

    @property
    def self_cpu_memory_usage(self) -> int:
        """Net bytes allocated by this range itself, children left out."""
        st = self._memory(False)
        return st.net if st is not None else 0

    def iter_descendants(self) -> Iterator[FunctionEvent]:
        """Children, grandchildren and so on, depth first."""
        # An explicit stack, not recursion: traced call trees (and files
        # read back) can nest deeper than Python's recursion limit.
        todo = [iter(self.children)]
        while todo:
            for c in todo[-1]:
                yield c
                kids = c.children
                if kids:
                    todo.append(iter(kids))
                break
            else:
                todo.pop()

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
        flags = "".join(f" {f}" for f, on in (("async", self.is_async), ("unfinished", self.unfinished)) if on)
        exc = f" exception={self.exception}" if self.exception else ""
        return (
            f"<FunctionEvent {self.name!r} {self.scope.name} track={self.track!r} "
            f"{self.duration_ns / 1e3:.1f}us{flags}{exc}>"
        )


def add_event(tab: EventTable, rec: list[Any], track: Track, is_async: bool, unfinished: bool) -> int:
    """Add the event of ``rec`` to ``tab``, with no parent yet (used when
    loading sessions); its index."""
    rec[R_KIND] |= (FLAG_ASYNC if is_async else 0) | (FLAG_UNFINISHED if unfinished else 0)
    return tab.append(rec, tab.add_track(track))


def stack_from_json(stack: Any) -> Any:
    """A stack read from a session file as a tuple of frame tuples; anything
    else is left as it is for validate_session to name."""
    if type(stack) is list and all(type(f) is list for f in stack):
        return tuple(tuple(f) for f in stack)
    return stack


def set_parents(tab: EventTable, parents: list[int] | array[int]) -> None:
    """Link events read back from a file: ``parents[i]`` is the index of
    event i's parent, or -1. An async range is not its parent's child, nor
    is an event on another track (:meth:`EventTable.children_index`)."""
    if len(parents) != len(tab):
        raise ValueError(f"{len(parents)} parent indexes for {len(tab)} events")
    tab.parent = array("i", parents)
    tab.links_changed()


def consolidate(
    lists: Mapping[LogicalThread, list[Any] | tuple[list[Any], ...]],
    stop_ns: int,
    node_id: int,
    task_records: list[Any] | None = None,
    with_stack: bool = False,
) -> tuple[EventTable, dict[int, Track]]:
    """Build the event table and tracks from a stopped profile's raw lists.

    Each track's raw records are paired into consolidated records, nested
    and written into the table's columns, then let go: open ones get the
    stop time as their end, and the ending logical thread is reduced to its
    id. Each task in ``task_records`` (``ProfilerState.task_records``)
    becomes the TASK event heading its own track. With ``with_stack``, the
    raw stacks recorded at range starts are named here (:func:`name_stacks`).
    """
    stack_names: dict[Any, Any] | None = {} if with_stack else None
    task_tracks, task_recs = _task_events(task_records or (), stop_ns)
    # The tasks' blocks (TASK_BLOCKS): those of a task with a TASK record
    # kept go with it below, the rest become lists of their own.
    lists, owned = owned_blocks(lists, task_tracks)
    # Unless raw stacks need naming, the extension pairs, orders and nests a
    # track in one pass (consolidate_raw), with no record per range.
    ext = _native.extension
    one_pass = ext.consolidate_raw if ext is not None and stack_names is None else None
    one_pass_first = ext.raw_first_start if one_pass is not None and ext is not None else None
    # Per track, in parallel lists (no tuple per track: a task per request
    # makes tens of thousands, and every container made here is one more
    # for the cyclic GC to walk while the program runs): its first start,
    # the track, its raw list for one_pass (or None), its task record (or
    # None) on the one-pass path, else all its records. Task tracks come
    # first in spawn order, then the lists in the order they were made.
    firsts: list[int] = []
    row_tracks: list[Track] = []
    raws: list[Any] = []
    leads: list[Any] = []
    if one_pass is not None and ext is not None and getattr(ext, "track_rows", None) is not None:
        # The loop below, in one C call (a task per request: tens of
        # thousands of tracks); make_track for a thread's track.
        def make_track(lt: LogicalThread) -> Track:
            return Track(lt.id, lt.current_name(), lt.kind, lt.os_thread_id, node_id)

        ext.track_rows(lists, task_tracks, task_recs, make_track, firsts, row_tracks, raws, leads)
        lists = {}
    for lt, raw in lists.items():
        if not raw:
            continue
        tid = lt.id
        track = task_tracks.pop(tid, None)
        rec = None
        if track is not None:
            rec = task_recs.pop(tid)
        else:
            track = Track(tid, lt.current_name(), lt.kind, lt.os_thread_id, node_id)
        if one_pass is not None:
            assert ext is not None
            first = ext.raw_first_start(raw)
            if rec is not None and (first is None or rec[R_START] < first):
                first = rec[R_START]
            if first is not None:
                firsts.append(first)
                row_tracks.append(track)
                raws.append(raw)
                leads.append(rec)
            continue
        records = records_of(unpack_blocks(raw), tid)  # reads a snapshot: later appends are dropped
        if stack_names is not None:
            name_stacks(records, stack_names)
        if rec is not None:
            records.insert(0, rec)
        # Out of order when an eager task's first step recorded before its
        # TASK record was appended (the task is created by its own first
        # step's caller), or when the tracer's replay appended its calls.
        sort_by_start(records)
        if records:
            firsts.append(records[0][R_START])
            row_tracks.append(track)
            raws.append(None)
            leads.append(records)
    for tid, track in task_tracks.items():
        rec = task_recs[tid]
        blocks = owned.get(tid)
        if blocks is None:
            firsts.append(rec[R_START])
            row_tracks.append(track)
            raws.append(None)
            leads.append(rec if one_pass is not None else [rec])
        elif one_pass_first is not None:
            first = one_pass_first(blocks)
            firsts.append(rec[R_START] if first is None or rec[R_START] < first else first)
            row_tracks.append(track)
            raws.append(blocks)
            leads.append(rec)
        else:
            records = records_of(unpack_blocks(blocks), tid)
            records.insert(0, rec)
            sort_by_start(records)
            firsts.append(records[0][R_START])
            row_tracks.append(track)
            raws.append(None)
            leads.append(records)
    del task_tracks, task_recs, owned
    # Tracks in the order their first event started (a track's list is made
    # when its first range starts, so this is the order they were made):
    # a stable sort of the indexes, so equal starts keep that order.
    order = sorted(range(len(firsts)), key=firsts.__getitem__)

    tab = EventTable()
    tracks: dict[int, Track] = {}
    spans: dict[int, tuple[int, int]] = {}
    linked: list[int] = []
    # On the one-pass path the tracks' rows are staged in C and added to the
    # columns once at the end (a session of many small tracks, a task per
    # request, would otherwise pay ten array appends per track).
    stage = ext.ColumnStage() if one_pass is not None and ext is not None else None
    empty: list[Any] = []
    # The table is new and each Track a new object: add_track's bookkeeping
    # inline (its method call and lookups cost a tenth of a second at 50k
    # tracks); staged rows are counted by the stage alone until the flush.
    tab_tracks, track_ids = tab.tracks, tab._track_ids
    if one_pass is not None and ext is not None and getattr(ext, "consolidate_tracks", None) is not None:
        # The loop below, in one C call (a task per request makes tens of
        # thousands of tracks).
        assert stage is not None
        assert len(tab) == 0  # rows go to the stage until the flush
        ext.consolidate_tracks(order, row_tracks, raws, leads, node_id, stop_ns, tab, linked, stage, tracks, spans)
        stage.flush(tab)
    elif one_pass is not None:
        assert stage is not None
        assert len(tab) == 0  # rows go to the stage until the flush
        n_stage = stage.__len__
        for k in order:
            track = row_tracks[k]
            raw, lead = raws[k], leads[k]
            raws[k] = leads[k] = None  # each track's records are let go once written
            tid = track.id
            tracks[tid] = track
            track.node_id = node_id
            ti = track_ids[id(track)] = len(tab_tracks)
            tab_tracks.append(track)
            first = n_stage()
            one_pass(empty if raw is None else raw, tid, empty if lead is None else [lead], ti, stop_ns, tab, linked, stage)
            del raw, lead
            spans[tid] = (first, n_stage())
        stage.flush(tab)
    else:
        for k in order:
            track = row_tracks[k]
            lead = leads[k]
            leads[k] = None
            tid = track.id
            tracks[tid] = track
            track.node_id = node_id
            first = len(tab)
            nest(lead, tab.add_track(track), stop_ns, tab, linked)
            del lead
            spans[tid] = (first, len(tab))
    _link_across_tracks(tab, spans, linked)
    return tab, tracks


def name_stacks(records: list[list[Any]], cache: dict[Any, Any]) -> None:
    """Name the raw stacks of ``records`` in place (with_stack, SPEC 8.3).

    A raw stack is ``(codes, lastis)`` (aprof._core._recorder.RawStack): it
    becomes ``((file, line, qualified name), ...)``, innermost first, and
    the code objects are let go. Stacks already named (loop blocks) are
    left as they are. ``cache`` (one per consolidation, while the code
    objects are alive) shares the tuples of frames and of whole stacks seen
    before: a loop of ranges at one place names its stack once.
    """
    for rec in records:
        raw = rec[R_STACK]
        if raw is None or len(raw) != 2 or type(raw[1]) is not bytes:
            continue
        codes, lastis = raw
        key = (lastis, *map(id, codes))
        named = cache.get(key)
        if named is None:
            named = cache[key] = tuple(
                _frame_name(code, lasti, cache) for code, lasti in zip(codes, array("I", lastis), strict=True)
            )
        rec[R_STACK] = named


def _frame_name(code: CodeType, lasti: int, cache: dict[Any, Any]) -> tuple[str, int, str]:
    key = (id(code), lasti)
    frame: tuple[str, int, str] | None = cache.get(key)
    if frame is None:
        line: int | None = code.co_firstlineno
        if lasti != NO_LASTI:
            # frame.f_lineno's rule: the line of the byte range holding the
            # last instruction (None for an artificial one: 0 here).
            line = 0
            for start, end, ln in code.co_lines():
                if start <= lasti < end:
                    line = ln
                    break
        frame = cache[key] = (code.co_filename, line or 0, code.co_qualname)
    return frame


def _nest(records: list[list[Any]], track: int, stop_ns: int, tab: EventTable, linked: list[int]) -> None:
    """Append one track's events to ``tab``, in start order, with their parents.

    ``records`` are the track's consolidated records in start order;
    ``track`` its index in ``tab.tracks``. Open ones get the stop time as
    their end and the ``unfinished`` flag; a range that ended on another
    logical thread or outlived the range it started in gets the ``async``
    flag (so it is not its parent's child). The indexes of top-level events
    with a forward thread (spawned or submitted work) go to ``linked``, for
    ``_link_across_tracks``.
    """
    append = tab.append
    stack: list[int] = []
    ends: list[int] = []
    for rec in records:
        i = len(tab)
        start = rec[R_START]
        end = rec[R_END]
        if end is None:
            end = rec[R_END] = stop_ns if stop_ns > start else start
            rec[R_KIND] |= FLAG_UNFINISHED
        end_lt = rec[R_END_LT]
        instant = rec[R_KIND] & KIND_INSTANT
        # Pop ranges that ended before this one started.
        while ends and (ends[-1] < start or (ends[-1] == start and not instant)):
            ends.pop()
            stack.pop()
        if stack:
            parent = stack[-1]
            if end_lt is not None or end > ends[-1]:
                rec[R_KIND] |= FLAG_ASYNC  # ended elsewhere, or outlived its enclosing range
            elif not instant:
                stack.append(i)
                ends.append(end)
        else:
            parent = -1
            if rec[R_FWD]:
                linked.append(i)
            if end_lt is not None:
                rec[R_KIND] |= FLAG_ASYNC
            elif not instant:
                stack.append(i)
                ends.append(end)
        append(rec, track, parent)


_start_of: Final = itemgetter(R_START)


def _sort_by_start(records: list[list[Any]]) -> None:
    """Sort records by start time in place, unless they already are in order."""
    if any(records[i][R_START] > records[i + 1][R_START] for i in range(len(records) - 1)):
        records.sort(key=_start_of)


_SCOPES: Final = {s.value: s for s in RecordScope}
if _native.extension is not None:  # a record's scope leads no cycle back (see _task_events)
    _native.extension.untrack_exempt(tuple(RecordScope))
_TASK: Final = RecordScope.TASK
_EXECUTOR: Final = RecordScope.EXECUTOR


def owned_blocks(
    lists: Mapping[LogicalThread, list[Any] | tuple[list[Any], ...]], task_tracks: Mapping[int, Any]
) -> tuple[Mapping[LogicalThread, list[Any] | tuple[list[Any], ...]], dict[int, list[Any]]]:
    """Hand the tasks' blocks under ``TASK_BLOCKS`` back to their tasks:
    ``(lists, owned)``, ``lists`` without that key and ``owned`` the blocks
    of the tasks in ``task_tracks`` (their TASK records kept: the caller
    puts them on those tracks), each task's in order. A task's blocks are
    one more chunk of its logical thread's raw records where it has a list
    of its own (ranges with a stack, instants); a task with neither that
    nor a kept TASK record (a ring's older generation let it go) gets a
    list of its own under a logical thread made from its blocks (its name,
    kind and OS thread then)."""
    shared = lists.get(TASK_BLOCKS)
    ext = _native.extension  # (blocks exist only with it)
    if shared is None or ext is None:
        return lists, {}
    owned: dict[int, list[Any]] = ext.group_owned(shared)
    out: dict[LogicalThread, list[Any] | tuple[list[Any], ...]] = {}
    for lt, raw in lists.items():  # threads, and tasks with lists of their own: a few
        if lt is TASK_BLOCKS:
            continue
        blocks = owned.pop(lt.id, None)
        out[lt] = raw if blocks is None else (*(raw if type(raw) is tuple else (raw,)), blocks)
    for owner in [o for o in owned if o not in task_tracks]:
        blocks = owned.pop(owner)
        first = blocks[0]
        lt = LogicalThread.__new__(LogicalThread)
        lt.id, lt.kind, lt.name, lt.os_thread_id, lt._task_ref = (
            owner, first.owner_kind, first.owner_name, first.owner_os_tid, None
        )
        out[lt] = blocks
    return out, owned


def _task_events(task_records: Iterable[Any], stop_ns: int) -> tuple[dict[int, Track], dict[int, list[Any]]]:
    """The track and the consolidated TASK record of each recorded task, by
    track id (two dicts: no tuple per task).

    A finished task's record is a ``TaskRecord`` or the twin's tuple
    (``aprof._integrations._tasks``); a running one is its ``TaskThread``, read as it is now and closed at the
    stop time (its steps after stop are no longer kept, unless another
    running profile records it).
    """
    tracks: dict[int, Track] = {}
    recs: dict[int, list[Any]] = {}
    # Each task's containers hold plain data: off the cyclic GC's lists as
    # they are made (a snapshot of a flight recorder's ring makes tens of
    # thousands, which would set off full collections of the program's heap).
    ext = _native.extension
    untrack = ext.untrack_acyclic if ext is not None else None
    records = list(task_records)  # a snapshot
    # The finished tasks' records (most of them) go through the
    # extension's twin of this loop, in order, a run at a time.
    todo = range(len(records)) if ext is None else _c_task_runs(ext, records, stop_ns, tracks, recs)
    for k in todo:
        t = records[k]
        waiting_on = None
        if type(t) in _native.TASK_RECORD_TYPES:
            tid, name, kind, os_tid, coro, spawn_ns, seq, fwd, end_ns, outcome, exc, steps, waits, site = t
            flat = list(steps)
        else:
            tid, kind, os_tid, coro, spawn_ns, seq, fwd = t.id, t.kind, t.os_thread_id, t.coro_name, t.spawn_ns, t.seq, t.fwd
            name = t.current_name()
            end_ns = exc = None
            outcome = "unfinished"
            flat = _steps_until(list(t.steps), stop_ns)
            log, site = t.waits, t.spawn_site
            waits = log.runs if log is not None else None
            waiting_on = t.waiting_on()
            t.stopped()
        if len(flat) % 2:  # finished mid-step
            flat.append(end_ns)
        extra = {"coro": coro, "spawn_ns": spawn_ns, "steps": flat, "outcome": outcome}
        if site is not None:
            extra["spawn_site"] = list(site)
        if waits:
            extra["waits"] = [run[:] for run in waits if run[0] < stop_ns]
        if waiting_on is not None:
            extra["waiting_on"] = list(waiting_on)
        rec = [name, _TASK, spawn_ns, end_ns, None, exc, None, seq, fwd, None, None, KIND_RANGE, extra]
        track = Track(tid, name, kind, os_tid, 0)
        track.steps = flat
        if untrack is not None:
            untrack(*extra.get("waits", ()), flat, *extra.values(), extra, track, rec)
        tracks[tid] = track
        recs[tid] = rec
    return tracks, recs


def _c_task_runs(ext: Any, records: list[Any], stop_ns: int, tracks: dict[int, Track], recs: dict[int, list[Any]]) -> Iterator[int]:
    """The indexes of ``records`` the extension's ``task_events`` leaves to
    the Python loop (running tasks), after it has done the runs of finished
    ones before each."""
    i, n = 0, len(records)
    while i < n:
        i = ext.task_events(records, i, stop_ns, tracks, recs, Track, _TASK, KIND_RANGE)
        if i < n:
            yield i
            i += 1


def _steps_until(flat: list[int], stop_ns: int) -> list[int]:
    """A running task's steps up to the stop: later ones dropped, one running
    across the stop cut there."""
    out: list[int] = []
    for i in range(0, len(flat), 2):
        start = flat[i]
        if start >= stop_ns:
            break
        end = flat[i + 1] if i + 1 < len(flat) else stop_ns
        out += (start, end if end < stop_ns else stop_ns)
    return out


def unpack_blocks(raw: list[Any] | tuple[list[Any], ...]) -> list[Any]:
    """``raw`` with each RangeBlock (``aprof/_cblocks.c``: the C paths' plain
    ranges, packed) spelled out as start and end tuples, for the paths that
    pair tuples (``records_of``); the end tuples already there are renumbered
    to their starts' new places. ``raw`` itself if it is one list with no
    block. A tuple of lists is a bounded profile's chunks of one logical
    thread (aprof._core._ring), each end naming a start in its own chunk:
    they are joined into one list."""
    block = _native.extension.RangeBlock if _native.extension is not None else None
    chunks = raw if type(raw) is tuple else (raw,)
    if type(raw) is not tuple and (block is None or not any(type(t) is block for t in raw)):
        return raw  # type: ignore[return-value]
    out: list[Any] = []
    ends: list[tuple[Any, ...]] = []
    for chunk in chunks:
        moved: dict[int, int] = {}  # old index of a start tuple -> its new one
        for i, t in enumerate(chunk):
            if type(t) is block:
                for name, scope, start, args, end, end_tid, exc in t.rows():
                    if end is not None:
                        ends.append((len(out), end, end_tid, exc))
                    out.append((name, scope, start, args))
            elif type(t[0]) is int:
                new = moved.get(t[0])
                if new is not None:
                    ends.append((new, *t[1:]))
            else:
                moved[i] = len(out)
                out.append(t)
    return out + ends


def _records_of(raw: list[tuple[Any, ...]], tid: int) -> list[list[Any]]:
    """Pair one thread's start and end tuples into consolidated records.

    See ``aprof._core._recorder`` for the tuple layouts. Ranges with no end
    keep ``None`` as their end (consolidation closes them at the stop time);
    a second end for the same start (a range ended twice), or an end naming
    no start, is ignored. An EXECUTOR range's extra may be its submit time
    alone (an int).
    """
    raw = list(raw)  # a snapshot: appends made while this loop runs are dropped
    at: list[list[Any] | None] = [None] * len(raw)
    records: list[list[Any]] = []
    scopes = _SCOPES
    for i, t in enumerate(raw):
        if type(t[0]) is not int:  # an end names its start by index; a start, by name (str or a subclass)
            if len(t) == 4:  # the fast path's user range
                rec = [t[0], scopes[t[1]], t[2], None, None, None, t[3], -1, 0, None, None, 0, None]
            elif len(t) == 5:  # the same, with its raw stack (with_stack)
                rec = [t[0], scopes[t[1]], t[2], None, None, None, t[3], -1, 0, None, t[4], 0, None]
            else:
                name, scope, start, args, seq, fwd, inputs, stack, kind, extra = t
                if type(extra) is int:
                    extra = {"submit_ns": extra}
                rec = [name, scopes[scope], start, start if kind & KIND_INSTANT else None, None, None, args, seq, fwd,
                       inputs, stack, kind, extra]  # fmt: skip
            at[i] = rec
            records.append(rec)
        else:
            idx, end, end_tid, exc = t
            started = at[idx] if 0 <= idx < i else None
            if started is None or started[R_END] is not None:
                continue
            started[R_END] = end
            if end_tid != tid:
                started[R_END_LT] = tid if end_tid == ASYNC_SAME_THREAD else end_tid
            if exc is not None:
                started[R_EXC] = exc
    return records


def overlap(flat: list[int], start: int, end: int) -> int:
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


def _link_across_tracks(tab: EventTable, spans: dict[int, tuple[int, int]], linked: list[int]) -> None:
    """Give spawned and submitted work a parent on the spawner's track.

    A TASK or EXECUTOR event that is top-level on its own track gets as
    parent the innermost range open on the spawning track at the spawn (or
    submit) time. It is not that range's child: it runs concurrently, so
    it is not part of the range's self time.
    """
    starts, ends, kind, parent, fwds, rare = tab.start, tab.end, tab.kind, tab.parent, tab.fwd, tab.rare
    skip = FLAG_ASYNC | KIND_INSTANT
    for i in linked:
        fwd = fwds[i]
        if not fwd or parent[i] >= 0:
            continue
        span = spans.get(fwd)
        if span is None:
            continue
        x = rare.get(i)
        extra = None if x is None else x[X_EXTRA]
        link_ns = starts[i]
        if extra:
            link_ns = int(extra.get("spawn_ns", extra.get("submit_ns", link_ns)))
        lo, hi = span
        cand = bisect_right(starts, link_ns, lo, hi) - 1
        if cand < lo:
            continue
        while cand >= 0 and (kind[cand] & skip or ends[cand] < link_ns):
            cand = parent[cand]
        parent[i] = cand
    tab.links_changed()


def roots(events: Iterable[FunctionEvent]) -> list[FunctionEvent]:
    """Events with no parent on their track."""
    return [e for e in events if e.parent is None]


_table.view_class = FunctionEvent

# Consolidation's three steps run in C when the extension is active
# (aprof/_cevents.c: a million events would cost about a second per step in
# Python); _records_of, _sort_by_start and _nest are their pure-Python twins.
records_of = _records_of
sort_by_start = _sort_by_start
nest = _nest
if not TYPE_CHECKING and _native.extension is not None:
    _native.extension._events_setup(
        FunctionEvent,
        SCOPES,
        _SCOPES,
        _start_of,
        (R_NAME, R_SCOPE, R_START, R_END, R_END_LT, R_EXC, R_ARGS, R_SEQ, R_FWD, R_INPUTS, R_STACK, R_KIND, R_EXTRA,
         KIND_INSTANT, FLAG_UNFINISHED, FLAG_ASYNC, ASYNC_SAME_THREAD),
    )  # fmt: skip
    records_of = _native.extension.records_of
    sort_by_start = _native.extension.sort_by_start
    nest = _native.extension.nest
