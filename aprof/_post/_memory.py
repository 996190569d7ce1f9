"""A session's memory figures (``profile(profile_memory=True)``, issue 21).

The recording half (``aprof/_cmemory.c``) hands over one record per sampled
allocation: when, how many bytes it asked for, how many it stands for (its
weight: its size in exact mode, ``size / (1 - exp(-size/interval))`` when
sampled), its logical thread, and when it was freed (0: still live at stop).
Here each allocation is charged to the innermost range open on its track at
that time (ranges nest per track; async slices are left out), and the
figures are summed:

- per event, inclusive of its children (``FunctionEvent.cpu_memory_usage``
  and the rest) and its own (``self_cpu_memory_usage``);
- per track (:meth:`Memory.by_thread`): everything the task or thread
  allocated, in every step, in a range or not.

A free is charged to the range and track that made the allocation, not to
the code that frees it: a range's net bytes are what it allocated and left
alive, which is what a leak is.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Container, Iterable, Iterator
from itertools import groupby
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._recorder import FLAG_ASYNC, KIND_INSTANT

if TYPE_CHECKING:
    from ._session import Session
    from ._table import EventTable

__all__ = ["Memory", "MemoryStats", "attach_memory", "recharge", "threads_by_node"]

_OWN_THREAD: Final = 1 << 63
_REC_WORDS: Final = 5  # t, size, weight, lt, freed (aprof/_cmemory.c MemRec)


class MemoryStats:
    """Allocation figures of one range, task or thread (bytes; counts).

    Attributes:
        allocated: Bytes allocated (estimated from samples unless exact).
        freed: Of those, bytes freed before the profile stopped.
        count: Allocations (estimated when sampled).
        peak: The most of those bytes alive at once.
    """

    __slots__ = ("allocated", "count", "freed", "peak")

    def __init__(self, allocated: int = 0, freed: int = 0, count: int = 0, peak: int = 0) -> None:
        self.allocated = allocated
        self.freed = freed
        self.count = count
        self.peak = peak

    @property
    def net(self) -> int:
        """Bytes allocated and still alive at stop (allocated - freed)."""
        return self.allocated - self.freed

    def to_dict(self) -> dict[str, int]:
        return {
            "allocated": self.allocated,
            "freed": self.freed,
            "net": self.net,
            "peak": self.peak,
            "count": self.count,
        }

    def __repr__(self) -> str:
        return f"<MemoryStats allocated={self.allocated} net={self.net} peak={self.peak} count={self.count}>"


class Memory:
    """The sampled allocations of a session and the figures derived from them.

    Attributes:
        interval: Mean bytes between samples; 0: every allocation (exact).
        time: Each allocation's time (perf_counter_ns).
        size: Bytes it asked for.
        weight: Bytes it stands for (its size in exact mode).
        freed: When it was freed, 0 if still alive at stop.
        thread_id: The logical thread (track id) that made it.
        event: The row of the innermost range open then, -1 for none.
        threads: ``{thread_id: (name, kind)}`` for every thread_id above.
        other_bytes, other_count: Allocations of work the profile did not
            record (another context, a thread aprof does not know): counted
            here, charged to nothing.
        dropped: Sampled allocations not kept (out of memory).
    """

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.time = array("q")
        self.size = array("q")
        self.weight = array("q")
        self.freed = array("q")
        self.thread_id = array("q")
        self.event = array("i")
        self.threads: dict[int, tuple[str, str]] = {}
        self.other_bytes = 0
        self.other_count = 0
        self.dropped = 0
        #: The process (node id) of each thread that has no track of its own
        #: in a merged session; the others are their track's, or the session's.
        self.nodes: dict[int, int] = {}
        self._per_event: dict[int, tuple[MemoryStats, MemoryStats]] | None = None
        self._table: EventTable | None = None

    @property
    def exact(self) -> bool:
        """Whether every allocation was recorded (``memory_interval=0``)."""
        return self.interval == 0

    def __len__(self) -> int:
        return len(self.time)

    # -- figures --------------------------------------------------------------

    def total(self) -> MemoryStats:
        """Everything the profiled work allocated."""
        return _stats(range(len(self.time)), self)

    def by_thread(self) -> dict[int, MemoryStats]:
        """``{thread_id: MemoryStats}``: each task's or thread's allocations, in every step."""
        groups: dict[int, list[int]] = {}
        for i, tid in enumerate(self.thread_id):
            groups.setdefault(tid, []).append(i)
        return {tid: _stats(idx, self) for tid, idx in groups.items()}

    def of_threads(self, threads: Container[int]) -> MemoryStats:
        """The allocations of ``threads`` together (one process of a merged
        session): its peak is theirs at once, not the largest of each."""
        return _stats([i for i, tid in enumerate(self.thread_id) if tid in threads], self)

    def of_event(self, row: int) -> tuple[MemoryStats, MemoryStats] | None:
        """(inclusive, self) figures of event ``row``, or None if it allocated nothing."""
        per = self._per_event
        if per is None:
            per = self._per_event = self._compute_per_event()
        return per.get(row)

    def events_with_memory(self) -> Iterator[int]:
        """The rows of events that allocated anything (in children too)."""
        if self._per_event is None:
            self._per_event = self._compute_per_event()
        return iter(sorted(self._per_event))

    def timeline(self, threads: Container[int] | None = None) -> list[tuple[int, int]]:
        """``[(time_ns, live_bytes)]``: the profiled work's live sampled
        bytes after each allocation and free, in time order; of the
        allocations of ``threads`` only, when given (one process of a
        merged session)."""
        rows: Iterable[int] = range(len(self.time))
        if threads is not None:
            rows = [i for i, tid in enumerate(self.thread_id) if tid in threads]
        time, weight, freed = self.time, self.weight, self.freed
        deltas = [(time[i], weight[i]) for i in rows]
        deltas += [(freed[i], -weight[i]) for i in rows if freed[i] > 0]
        deltas.sort()
        live = 0
        out = []
        for t, d in deltas:
            live += d
            out.append((t, live))
        return out

    def _compute_per_event(self) -> dict[int, tuple[MemoryStats, MemoryStats]]:
        tab = self._table
        per: dict[int, tuple[MemoryStats, MemoryStats]] = {}
        if tab is None:
            return per
        incl: dict[int, list[int]] = {}
        own: dict[int, list[int]] = {}
        parent, track, kind = tab.parent, tab.track, tab.kind
        for i, row in enumerate(self.event):
            if row < 0:
                continue
            own.setdefault(row, []).append(i)
            r = row
            while True:
                incl.setdefault(r, []).append(i)
                p = parent[r]
                if p < 0 or track[p] != track[r] or kind[r] & FLAG_ASYNC:
                    break
                r = p
        for row, idx in incl.items():
            mine = own.get(row)
            per[row] = (_stats(idx, self), _stats(mine, self) if mine else MemoryStats())
        return per

    # -- files ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "time": list(self.time),
            "size": list(self.size),
            "weight": list(self.weight),
            "freed": list(self.freed),
            "thread_id": list(self.thread_id),
            "event": list(self.event),
            "threads": [[tid, name, kind] for tid, (name, kind) in self.threads.items()],
            "other_bytes": self.other_bytes,
            "other_count": self.other_count,
            "dropped": self.dropped,
            **({"nodes": [[tid, node] for tid, node in self.nodes.items()]} if self.nodes else {}),
        }

    @classmethod
    def from_json(cls, doc: Any) -> Memory:
        """Read :meth:`to_json`'s document, checking every field.

        Raises:
            ValueError: a field is missing or of the wrong type or length.
        """
        if type(doc) is not dict:
            raise ValueError("memory is not an object")
        interval = doc.get("interval")
        if type(interval) is not int or interval < 0:
            raise ValueError(f"memory: interval is {interval!r}, not an int >= 0")
        m = cls(interval)
        n = None
        for name, code in (
            ("time", "q"),
            ("size", "q"),
            ("weight", "q"),
            ("freed", "q"),
            ("thread_id", "q"),
            ("event", "i"),
        ):
            col = doc.get(name)
            if type(col) is not list or any(type(x) is not int for x in col):
                raise ValueError(f"memory: {name} is not a list of ints")
            if n is not None and len(col) != n:
                raise ValueError(f"memory: {name} has {len(col)} values, not {n}")
            n = len(col)
            try:
                setattr(m, name, array(code, col))
            except OverflowError:
                raise ValueError(f"memory: a value of {name} is out of range") from None
        threads = doc.get("threads")
        if type(threads) is not list:
            raise ValueError("memory: threads is not a list")
        for t in threads:
            if (
                type(t) is not list
                or len(t) != 3
                or type(t[0]) is not int
                or type(t[1]) is not str
                or type(t[2]) is not str
            ):
                raise ValueError(f"memory: a thread is {t!r}, not [id, name, kind]")
            m.threads[t[0]] = (t[1], t[2])
        for tid in set(m.thread_id):
            if tid not in m.threads:
                raise ValueError(f"memory: an allocation is on thread {tid}, which memory.threads does not name")
        for name in ("other_bytes", "other_count", "dropped"):
            v = doc.get(name)
            if type(v) is not int or v < 0:
                raise ValueError(f"memory: {name} is {v!r}, not an int >= 0")
            setattr(m, name, v)
        nodes = doc.get("nodes", [])
        if type(nodes) is not list:
            raise ValueError("memory: nodes is not a list")
        for x in nodes:
            if type(x) is not list or len(x) != 2 or type(x[0]) is not int or type(x[1]) is not int or x[1] < 0:
                raise ValueError(f"memory: a node is {x!r}, not [thread id, node id]")
            m.nodes[x[0]] = x[1]
        return m

    def records_json(self) -> dict[str, Any]:
        """:meth:`to_json` without the ``event`` column: what a Chrome trace
        or an HTML report carries (their readers rebuild the events in an
        order of their own, and :func:`recharge` charges the allocations to
        them again, by track and time, as consolidation did)."""
        doc = self.to_json()
        del doc["event"]
        return doc

    @classmethod
    def from_records_json(cls, doc: Any) -> Memory:
        """Read :meth:`records_json`'s document (every allocation charged to
        no event until :func:`recharge`).

        Raises:
            ValueError: a field is missing or of the wrong type or length.
        """
        if type(doc) is not dict:
            raise ValueError("memory is not an object")
        time = doc.get("time")
        n = len(time) if type(time) is list else 0
        return cls.from_json({**doc, "event": [-1] * n})

    def check_events(self, count: int) -> None:
        """Every event row must be one of the session's ``count`` events.

        Raises:
            ValueError: a row is out of range.
        """
        for row in self.event:
            if not -1 <= row < count:
                raise ValueError(f"memory: an allocation is charged to event {row}, which the session does not have")

    def __repr__(self) -> str:
        mode = "exact" if self.exact else f"every ~{self.interval} bytes"
        return f"<aprof.Memory {len(self.time)} allocations ({mode})>"


def threads_by_node(session: Session) -> dict[int, set[int]]:
    """The threads that allocated, by process (node id). A merged session's
    processes each get their own counter and ``key_averages(group_by="node")``
    row (SPEC 15.4): a thread is its track's process, or the one
    ``Memory.nodes`` says."""
    m = session.memory
    if m is None:
        return {}
    home = session.metadata.get("node_id", 0)
    home = home if isinstance(home, int) else 0
    node_of = {t.id: t.node_id for t in session._table.tracks}
    by_node: dict[int, set[int]] = {}
    for tid in m.threads:
        by_node.setdefault(node_of.get(tid, m.nodes.get(tid, home)), set()).add(tid)
    return by_node


def _stats(idx: Any, m: Memory) -> MemoryStats:
    """The figures of the allocations ``idx`` (indexes into ``m``'s columns)."""
    weight, freed, time = m.weight, m.freed, m.time
    exact = m.interval == 0
    allocated = freed_b = count = 0
    deltas: list[tuple[int, int]] = []
    for i in idx:
        w = weight[i]
        allocated += w
        # a sample of s bytes stands for w/s allocations of its size
        count += 1 if exact else max(1, round(w / max(1, m.size[i])))
        deltas.append((time[i], w))
        f = freed[i]
        if f > 0:
            freed_b += w
            deltas.append((f, -w))
    deltas.sort()
    live = peak = 0
    for _, d in deltas:
        live += d
        if live > peak:
            peak = live
    return MemoryStats(allocated, freed_b, count, peak)


def attach_memory(session: Session, taken: tuple[Any, ...], interval: int, since_ns: int = 0) -> None:
    """Give ``session`` the records the hooks took at stop (those made at
    ``since_ns`` or later: a flight recorder's window)."""
    raw, idents, lts, other_bytes, other_count, dropped = taken
    if since_ns and raw:
        # Oldest first, so the window is a tail: found by bisection.
        times = memoryview(raw).cast("Q")[0::_REC_WORDS]
        raw = raw[bisect.bisect_left(times, since_ns) * _REC_WORDS * 8 :]
    m = Memory(interval)
    m.other_bytes, m.other_count, m.dropped = int(other_bytes), int(other_count), int(dropped)
    # The records as two arrays of words; the columns are strided slices of
    # them, copied in C (an array built from a memoryview converts every
    # value through a Python int: some 1,000 instructions a record).
    signed = array("q")
    signed.frombytes(raw or b"")
    words = array("Q")
    words.frombytes(raw or b"")
    n = len(words) // _REC_WORDS
    tracks = session._tracks
    own: dict[int, int] = {}  # OS thread slot -> track id

    def own_thread(slot: int) -> int:
        tid = own.get(slot)
        if tid is not None:
            return tid
        ident = idents[slot] if slot < len(idents) else 0
        for t in tracks.values():
            if t.kind == "thread" and t.os_thread_id == ident:
                tid = t.id
                m.threads[tid] = (t.name, "thread")
                break
        else:
            # A thread that recorded no event: named after the OS thread.
            from .._core._threads import _ids

            tid = next(_ids)
            th = threading._active.get(ident)  # type: ignore[attr-defined]
            m.threads[tid] = (th.name if th is not None else f"thread {ident}", "thread")
        own[slot] = tid
        return tid

    # Columns straight from the records (a strided view each: no Python
    # loop per record); the logical threads are resolved once each.
    m.time = signed[0 : n * _REC_WORDS : _REC_WORDS]
    m.size = signed[1 : n * _REC_WORDS : _REC_WORDS]
    m.weight = signed[2 : n * _REC_WORDS : _REC_WORDS]
    m.freed = signed[4 : n * _REC_WORDS : _REC_WORDS]
    raw_lt = words[3 : n * _REC_WORDS : _REC_WORDS]
    resolved: dict[int, int] = {}
    for lt in set(raw_lt):
        if lt & _OWN_THREAD:
            resolved[lt] = own_thread(lt & 0xFFFFFFFF)
        else:
            track = tracks.get(lt)  # named at stop already: the task's name at its end
            obj = lts.get(lt) if track is None else None
            if track is not None:
                m.threads[lt] = (track.name, track.kind)
            else:
                m.threads[lt] = (obj.current_name(), obj.kind) if obj is not None else (f"thread {lt}", "asyncio")
            resolved[lt] = lt
    m.thread_id = array("q", map(resolved.__getitem__, raw_lt))
    m.event = _charge(session._table, m)
    m._table = session._table
    session.memory = m
    kinds = session.metadata.get("dropped_by_kind")
    if isinstance(kinds, dict):  # the budget's counts, by kind (aprof._core._ring)
        kinds["allocations"] = m.dropped


def recharge(m: Memory, tab: EventTable) -> None:
    """Charge ``m``'s allocations to the events of ``tab`` (a session read
    back from a trace or a report, or merged): each to the innermost range
    open on its track at its time, as :func:`attach_memory` did at stop. A
    range the file does not hold (a capped trace, a report past its budget)
    leaves its bytes to the range around it."""
    m.event = _charge(tab, m)
    m._table = tab
    m._per_event = None


def _charge(tab: EventTable, m: Memory) -> array[int]:
    """For each allocation, the row of the innermost range open on its track
    at its time, -1 if none."""
    ext = _native.extension
    if ext is not None and len(m.time):
        out = array("i")
        track_ids = array("q", [t.id for t in tab.tracks])
        out.frombytes(
            ext.charge_allocations(
                tab.track, tab.kind, tab.start, tab.end, track_ids, KIND_INSTANT | FLAG_ASYNC, m.thread_id, m.time
            )
        )
        return out
    return _charge_py(tab, m)


def _charge_py(tab: EventTable, m: Memory) -> array[int]:
    """:func:`_charge`'s pure-Python twin (and its reference)."""
    out = array("i", [-1]) * len(m.time)
    if not len(m.time):
        return out
    time = m.time
    by_track: dict[int, list[int]] = {}
    for i, tid in enumerate(m.thread_id):
        by_track.setdefault(tid, []).append(i)
    # The rows of the tracks that allocated, found by runs of the track
    # column (events are stored track by track; a run is counted in C), so
    # the rows of the other tracks cost nothing here.
    tracks = tab.tracks
    runs: dict[int, list[tuple[int, int]]] = {}
    pos = 0
    for ti, grp in groupby(tab.track):
        n = len(list(grp))
        tid = tracks[ti].id
        if tid in by_track:
            runs.setdefault(tid, []).append((pos, pos + n))
        pos += n
    kind, start, end = tab.kind, tab.start, tab.end
    skip = KIND_INSTANT | FLAG_ASYNC
    for tid, idx in by_track.items():
        spans = runs.get(tid)
        if not spans:
            continue
        rows = [r for lo, hi in spans for r in range(lo, hi) if not kind[r] & skip]
        if not rows:
            continue
        rows.sort(key=lambda r: (start[r], -end[r]))
        starts = [start[r] for r in rows]
        idx.sort(key=time.__getitem__)
        stack: list[int] = []
        p = 0
        nrows = len(rows)
        for i in idx:
            t = time[i]
            while p < nrows and starts[p] <= t:
                r = rows[p]
                while stack and end[stack[-1]] <= start[r]:
                    stack.pop()
                stack.append(r)
                p += 1
            while stack and end[stack[-1]] <= t:
                stack.pop()
            out[i] = stack[-1] if stack else -1
    return out
