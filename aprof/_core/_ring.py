"""A profile's memory budget (issue 19): keep the first records, or the latest.

``profile(max_events=..., max_bytes=..., keep=...)`` bounds everything a
profile holds while it records: ranges, instants, tasks (with their steps)
and loop blocks. Every recording path takes room in the profile's
:class:`Budget` before it records (the C range fast path inline, a count and
a compare; the Python paths through ``Budget.take``). When the count reaches
the budget's limit, :meth:`Ring.on_full` runs, once:

- ``keep="first"``: it measures what is held; past the budget, the budget is
  *full* and every later record is dropped, counted by kind in the budget.
- ``keep="latest"`` (a ring): the records are kept in *generations*. The
  current generation is the profile's ``lists`` and ``task_records``; when
  it holds an eighth of the budget it is *sealed* (swapped out, its bytes
  estimated) and a new one begins, and the oldest sealed generations are
  let go while the rest hold more than seven eighths. An event belongs to
  the generation in which it started, so whole events are dropped, oldest
  first, and counted exactly, by kind, as they go.

A rotation does only that on the recording thread. The rest of a
generation's work (measuring the one sealed: its blocks trimmed to size,
its bytes; freeing the one let go) is done in *pieces*: while any is
pending, the budget's limit brings ``on_full`` back every
1/``_PIECES`` of a generation's records, and it works for about
``PIECE_NS`` each time. What is still pending at the next rotation is done
then. So no record waits for a whole generation's work (issue 19: a
server's p99).

A range still open when its generation is let go is dropped with it (it
started before everything kept); its end, written later, goes nowhere. A
task's record holds its steps: they are dropped with it, and a task still
running then stops keeping them (a long-lived task, a server's connection,
does not grow the ring: it is dropped whole when its generation goes, and its
ranges after that are kept on its track like any others).

Bytes are the records' own memory, measured after a generation is sealed
(``ring_seal``, ``ring_records``): blocks, tuples, the ints in them, and
strings only the record holds (an ``args`` string made for the range);
names the program holds anyway are not counted. Until then, the bytes of a
generation are estimated from the last measured one's bytes per event.
Measuring also takes the sealed lists and finished task records out of the
cyclic GC's lists (they can be in no cycle), so full collections do not
walk the ring.
"""

from __future__ import annotations

import sys
import warnings
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Final, Literal

from . import _native
from ._callbacks import AprofWarning

if TYPE_CHECKING:
    from ._recorder import ProfilerState
    from ._threads import LogicalThread

__all__ = ["KEEP", "KIND_NAMES", "Budget", "Ring", "buffer_limit", "check_budget"]

#: A finished task's record's types (a running task's is its object).
_RECORDS: Final = _native.TASK_RECORD_TYPES
KEEP: Final = ("first", "latest")
#: The budget's kinds, in the order of ``Budget.take``'s ``kind`` and of
#: ``session.dropped_by_kind``'s keys (the tracer's events and the sampler's
#: samples, bounded by their own buffers, are added to it at stop).
KIND_NAMES: Final = ("ranges", "instants", "tasks", "steps")
RANGE: Final = 0  # the recorder's KIND_RANGE
INSTANT: Final = 1  # the recorder's KIND_INSTANT
TASK: Final = 2

#: The ring's generations: the budget is let go an eighth at a time.
GENERATIONS: Final = 8
#: Bytes per event assumed before a generation is measured (a range in a
#: block is 48).
_FIRST_GUESS: Final = 64.0
#: The work a rotation leaves (measuring the generation it sealed, freeing
#: the one it let go) is done in pieces of about this long (ns)...
PIECE_NS: Final = 200_000
#: ... one every generation / _PIECES records while any is pending.
_PIECES: Final = 256
#: Lists or records a piece handles between two reads of the clock.
_CHUNK: Final = 64
#: A ring by bytes measures its first records (an eighth of the first
#: generation its guess makes, at most this many) to size that generation.
_PROBE: Final = 1_024
#: keep="first" stops at this close to the byte budget.
_SLACK: Final = 16


class _PyBudget:
    """The pure-Python twin of the extension's ``Budget`` (aprof/_cblocks.c)."""

    __slots__ = ("_dropped", "_in_full", "count", "full", "limit", "on_full")

    def __init__(self, on_full: Callable[[], object], limit: int) -> None:
        if not callable(on_full) or type(limit) is not int or limit < 1:
            raise ValueError("Budget(on_full: callable, limit: int >= 1)")
        self.on_full = on_full
        self.limit = limit
        self.count = 0
        self.full = False
        self._in_full = False
        self._dropped = [0, 0, 0, 0]

    def take(self, kind: int, n: int = 1) -> bool:
        if self.full:
            self._dropped[kind] += n
            return False
        self.count += n
        if self.count >= self.limit and not self._in_full:
            self._in_full = True
            try:
                self.on_full()
            except Exception:  # noqa: BLE001 - on_full warns first; never into the program
                pass
            finally:
                self._in_full = False
        return True

    @property
    def dropped(self) -> tuple[int, int, int, int]:
        d = self._dropped
        return d[0], d[1], d[2], d[3]


Budget: Any = _PyBudget if _native.extension is None else _native.extension.Budget


def check_budget(max_events: object, max_bytes: object, keep: object) -> None:
    """Raise a clear error for a bad budget option (``profile()``'s)."""
    for name, value in (("max_events", max_events), ("max_bytes", max_bytes)):
        if value is not None and (type(value) is not int or value <= 0):
            raise ValueError(f"profile: option {name!r} must be an int > 0 or None, got {value!r}")
    if keep not in KEEP:
        raise ValueError(f"profile: option 'keep' must be 'first' or 'latest', got {keep!r}")
    if keep == "latest" and max_events is None and max_bytes is None:
        raise ValueError("profile: keep='latest' needs a budget: max_events or max_bytes")
    if type(max_bytes) is int and max_bytes < 1 << 16:
        raise ValueError(f"profile: option 'max_bytes' must be at least 65536 (64 KiB), got {max_bytes!r}")


def buffer_limit(max_events: int | None, max_bytes: int | None, record_bytes: int) -> int:
    """How many records of ``record_bytes`` each a buffer of its own may
    hold under a profile's budget (the tracer's events, the sampler's
    samples, the allocation records; 0: no limit): ``max_events`` of them,
    and no more than ``max_bytes`` of them (apart from the ranges' bytes)."""
    limits = []
    if max_events is not None:
        limits.append(max_events)
    if max_bytes is not None:
        limits.append(max(1, max_bytes // record_bytes))
    return min(limits, default=0)


def _seal(lists: dict[LogicalThread, list[Any]]) -> int:
    # list(): another thread may add its first list to the dict meanwhile.
    ext = _native.extension
    if ext is None:
        return sum(sys.getsizeof(lst) + sum(map(sys.getsizeof, lst)) for lst in list(lists.values()))
    seal = ext.raw_seal
    return sum(seal(lst) for lst in list(lists.values()))


def _seal_sealed(lists: list[list[Any]]) -> int:
    """The bytes raw lists of a sealed generation hold (the extension's
    ``ring_seal`` also trims their blocks and takes the lists out of the
    cyclic GC's lists)."""
    ext = _native.extension
    if ext is None:
        return sum(sys.getsizeof(lst) + sum(map(sys.getsizeof, lst)) for lst in lists)
    return int(ext.ring_seal(lists))


def _task_bytes(records: list[Any]) -> int:
    total = 0
    for rec in list(records):
        steps = rec[11] if type(rec) in _RECORDS else rec.steps
        total += sys.getsizeof(rec) + sys.getsizeof(steps)
    return total


def _measure_records(records: list[Any]) -> tuple[int, int, list[int]]:
    """The bytes task records hold, the steps of those finished, and where
    those still running are (the extension's ``ring_records``, which also
    takes the finished ones out of the cyclic GC's lists, in Python)."""
    ext = _native.extension
    if ext is not None:
        return ext.ring_records(records)  # type: ignore[no-any-return]
    nbytes = steps = 0
    running = []
    for k, rec in enumerate(records):
        if type(rec) in _RECORDS:
            s = rec[11]
            steps += (len(s) + 1) // 2
        else:
            s = rec.steps
            running.append(k)
        nbytes += sys.getsizeof(rec) + sys.getsizeof(s)
    return nbytes, steps, running


def _counts(lists: dict[LogicalThread, list[Any]], records: list[Any]) -> tuple[int, int, int, int, list[Any]]:
    """(ranges, instants, tasks, steps) that raw lists and task records
    hold, and the records of tasks still running (the extension's
    ``ring_counts``, in Python)."""
    ext = _native.extension
    if ext is not None:
        return ext.ring_counts(lists, records)  # type: ignore[no-any-return]
    ranges = instants = steps = 0
    for lst in list(lists.values()):
        for t in lst:
            if type(t[0]) is int:
                continue
            if len(t) == 10 and t[8] == 1:  # KIND_INSTANT
                instants += 1
            else:
                ranges += 1
    running = []
    for rec in list(records):
        if type(rec) in _RECORDS:
            s = rec[11]
        else:
            s = rec.steps
            running.append(rec)
        steps += (len(s) + 1) // 2
    return ranges, instants, len(records), steps, running


class _Generation:
    __slots__ = (
        "_mbytes", "_mlists", "_mrecords", "_order", "_running", "_steps", "bytes", "events", "lists", "measured", "start_ns",
        "task_records",
    )  # fmt: skip

    def __init__(
        self, lists: dict[LogicalThread, list[Any]], task_records: list[Any], start_ns: int, nbytes: int, events: int
    ) -> None:
        self.lists = lists
        self.task_records = task_records
        self.start_ns = start_ns
        #: Estimated when sealed (events x the ring's bytes per event), then
        #: measured, in pieces (``measured`` once done).
        self.bytes = nbytes
        self.events = events
        self.measured = False
        self._order: list[list[Any]] | None = None  # the lists being measured
        self._mlists = self._mrecords = self._mbytes = 0  # how far, and what so far
        #: The steps of the task records measured that had finished; where
        #: those still running were (counted when the generation goes).
        self._steps = 0
        self._running: list[int] = []


class Ring:
    """A bounded profile's budget and, with ``keep="latest"``, its sealed
    generations (see the module's docstring)."""

    __slots__ = (
        "__weakref__", "_bpe", "_dropped", "_dying", "_dying_bytes", "_every", "_failed", "_gen_limit", "_held_bytes",
        "_held_events", "_measuring", "_probe", "_start_ns", "budget", "keep", "max_bytes", "max_events", "pins", "sealed", "state",
    )  # fmt: skip

    def __init__(
        self, state: ProfilerState, max_events: int | None, max_bytes: int | None, keep: Literal["first", "latest"]
    ) -> None:
        self.state = state
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.keep = keep
        self.sealed: deque[_Generation] = deque()
        #: Sealed generations not measured yet, oldest first.
        self._measuring: deque[_Generation] = deque()
        #: Generations let go (counted) whose records are not all freed yet.
        self._dying: deque[_Generation] = deque()
        self._dying_bytes = 0
        self._held_bytes = 0
        self._held_events = 0
        self._dropped = [0, 0, 0, 0]  # let go with their generations
        self._bpe = _FIRST_GUESS
        self._start_ns = state.start_ns
        self._failed = False
        #: Readers copying the generations (a flight recorder's dump): while
        #: any is, generations are sealed but none is let go.
        self.pins = 0
        self._gen_limit = self._limit(0)
        self._every = max(1, self._gen_limit // _PIECES)
        # A ring by bytes sizes its first generation from a guess: measure
        # its first records (at most _PROBE) instead of a whole generation's
        # worth sized by it (tasks hold several times the guess).
        probe = min(_PROBE, self._gen_limit // 8)
        self._probe = keep == "latest" and max_bytes is not None and probe > 0
        self.budget = Budget(self.on_full, probe if self._probe else self._gen_limit)

    # -- the budget ------------------------------------------------------------

    def _limit(self, taken: int) -> int:
        """The budget's next limit: records per generation for the ring; to
        keep the first, the records let in since the start (``taken`` so far)."""
        limits = []
        if self.keep == "latest":
            if self.max_events is not None:
                limits.append(max(1, self.max_events // GENERATIONS))
            if self.max_bytes is not None:
                limits.append(max(1, int(self.max_bytes / GENERATIONS / self._bpe)))
        else:
            if self.max_events is not None:
                limits.append(self.max_events)
            if self.max_bytes is not None:
                limits.append(taken + max(1, int((self.max_bytes - self._held_bytes) / self._bpe)))
        return min(limits)

    def on_full(self) -> None:
        """The budget's count reached its limit: rotate (or do a piece of the
        work a rotation left), or fill. Never raises into the program: a
        failure warns once and fills the budget."""
        try:
            if self.keep == "first":
                self._fill()
            elif self.budget.count >= self._gen_limit:
                self._rotate()
            else:
                if self._probe:
                    self._probe_first()
                self._work(perf_counter_ns() + PIECE_NS)
                self._schedule()
        except Exception as exc:
            self.budget.full = True
            if not self._failed:
                self._failed = True
                try:
                    warnings.warn(
                        f"aprof: the profile's memory budget failed, recording stopped: {exc!r}", AprofWarning, stacklevel=2
                    )
                except Exception:  # warnings turned into errors: still never into the program
                    pass
            raise

    def _fill(self) -> None:
        budget, state = self.budget, self.state
        taken = budget.count
        if self.max_events is not None and taken >= self.max_events:
            budget.full = True
            return
        if self.max_bytes is None:
            budget.limit = self._limit(taken)
            return
        held = _seal(state.lists) + _task_bytes(state.task_records)  # copies: other threads record meanwhile
        if taken:
            self._bpe = max(held / taken, 8.0)
        self._held_bytes = held
        if held + _SLACK * self._bpe >= self.max_bytes:
            budget.full = True
            return
        budget.limit = self._limit(taken)

    def _rotate(self) -> None:
        state, budget = self.state, self.budget
        # What the last rotation left undone (a ring of few records a
        # generation, or pieces that could not keep up): done now.
        self._work(None)
        now = perf_counter_ns()
        # New records go to a new generation from here on (swapped first:
        # other threads record while this runs); ranges still open end in
        # the lists they started in.
        lists, records = state.lists, state.task_records
        state.lists = {}
        state.task_records = []
        events = budget.count
        # Its bytes are measured later, in pieces; until then, estimated.
        gen = _Generation(lists, records, self._start_ns, int(events * self._bpe), events)
        self.sealed.append(gen)
        self._measuring.append(gen)
        self._start_ns = now
        self._held_bytes += gen.bytes
        self._held_events += events
        keep_bytes = None if self.max_bytes is None else self.max_bytes - self.max_bytes // GENERATIONS
        keep_events = None if self.max_events is None else self.max_events - self.max_events // GENERATIONS
        while self.sealed and not self.pins and (
            (keep_bytes is not None and self._held_bytes > keep_bytes)
            or (keep_events is not None and self._held_events > keep_events)
        ):
            self._evict(self.sealed[0])
        # What other threads took while this ran is the new generation's.
        budget.count -= events
        self._gen_limit = self._limit(0)
        self._every = max(1, self._gen_limit // _PIECES)
        self._schedule()

    def _probe_first(self) -> None:
        """The first generation's bytes per event, from its first records."""
        self._probe = False
        state, taken = self.state, self.budget.count
        if taken > 0:
            held = _seal(state.lists) + _task_bytes(state.task_records)
            self._bpe = max(held / taken, 8.0)
            self._gen_limit = self._limit(0)
            self._every = max(1, self._gen_limit // _PIECES)

    def _schedule(self) -> None:
        """The budget's next limit: the generation's end, or sooner, for the
        next piece of the work pending."""
        budget = self.budget
        if self._measuring or self._dying:
            budget.limit = max(1, min(self._gen_limit, budget.count + self._every))
        else:
            budget.limit = self._gen_limit

    def _evict(self, gen: _Generation) -> None:
        """Let go of ``gen``, the oldest sealed generation: count what it
        holds (exact: its lists now, its task records as measured, the
        running ones and any added since now) and free it in pieces from
        here on."""
        if not gen.measured:
            self._measure(gen, None)
            self._measuring.remove(gen)
        records = gen.task_records
        measured = gen._mrecords
        recount = [records[i] for i in gen._running]
        recount += records[measured:]
        ranges, instants, _, steps, running = _counts(gen.lists, recount)
        tasks = max(measured, len(records))
        d = self._dropped
        # No call between these stores (as in _measure); a dump reading the
        # counts meanwhile (another thread) sees the generation counted
        # and gone together, or neither.
        d[0] += ranges
        d[1] += instants
        d[2] += tasks
        d[3] += gen._steps + steps
        self._held_bytes -= gen.bytes
        self._held_events -= gen.events
        del self.sealed[0]
        for rec in running:  # still running: it keeps no steps for us any more
            rec.let_go(self.state)
        self._dying.append(gen)
        self._dying_bytes += gen.bytes

    # -- the work a rotation leaves, in pieces ------------------------------------

    def _work(self, deadline: int | None) -> None:
        """Free the generations let go, then measure the sealed ones, until
        ``deadline`` (``perf_counter_ns``; None: all of it)."""
        dying, measuring = self._dying, self._measuring
        while dying:
            if not self._free(dying[0], deadline):
                return
            self._dying_bytes -= dying.popleft().bytes
        while measuring:
            if not self._measure(measuring[0], deadline):
                return
            measuring.popleft()

    def _measure(self, gen: _Generation, deadline: int | None) -> bool:
        """Measure ``gen``'s bytes (its blocks trimmed to size) from where
        the last piece stopped; whether it is done."""
        order = gen._order
        if order is None:
            order = gen._order = list(gen.lists.values())  # list(): another thread may add one meanwhile
        while gen._mlists < len(order):
            i = gen._mlists
            gen._mbytes += _seal_sealed(order[i : i + _CHUNK])
            gen._mlists = i + _CHUNK
            if deadline is not None and perf_counter_ns() >= deadline:
                return False
        records = gen.task_records
        while gen._mrecords < len(records):
            i = gen._mrecords
            chunk = records[i : i + _CHUNK]
            nbytes, steps, running = _measure_records(chunk)
            where = [i + k for k in running]
            end = i + len(chunk)
            # No call between these stores: a signal's exception (raised
            # only at a call or a loop's end) cannot leave them half done.
            gen._mbytes += nbytes
            gen._steps += steps
            gen._running += where
            gen._mrecords = end
            if deadline is not None and perf_counter_ns() >= deadline:
                return False
        nbytes = gen._mbytes
        gen._order = None
        self._held_bytes += nbytes - gen.bytes
        gen.bytes = nbytes
        gen.measured = True
        if gen.events:
            self._bpe = max(nbytes / gen.events, 8.0)
        self._gen_limit = self._limit(0)
        return True

    def _free(self, gen: _Generation, deadline: int | None) -> bool:
        """Free ``gen``'s records (a generation let go) from where the last
        piece stopped; whether it is done. Cleared, not just let go: a range
        still open keeps its list, a task still running its records list,
        and neither must keep the generation's other records alive."""
        lists = gen.lists
        while lists:
            for _ in range(min(_CHUNK, len(lists))):
                lists.popitem()[1].clear()
            if deadline is not None and perf_counter_ns() >= deadline:
                return False
        records = gen.task_records
        while records:
            del records[-_CHUNK:]
            if deadline is not None and perf_counter_ns() >= deadline:
                return False
        return True

    # -- reading -------------------------------------------------------------

    def dropped(self) -> dict[str, int]:
        """Events dropped so far, by kind (``KIND_NAMES``)."""
        full = self.budget.dropped
        return {name: self._dropped[k] + full[k] for k, name in enumerate(KIND_NAMES)}

    def held_bytes(self) -> int:
        """Bytes the kept records hold (sealed generations measured, the
        current one estimated)."""
        if self.keep == "first":
            return self._held_bytes if self.max_bytes is not None else int(self.budget.count * self._bpe)
        return self._held_bytes + self._dying_bytes + int(self.budget.count * self._bpe)

    def lists(self) -> dict[int, tuple[LogicalThread, list[list[Any]]]]:
        """Every logical thread's raw lists, oldest first, by its id (an
        eager task's lists change their key when it adopts its first
        step's logical thread)."""
        out: dict[int, tuple[LogicalThread, list[list[Any]]]] = {}
        for gen_lists in [g.lists for g in tuple(self.sealed)] + [self.state.lists]:
            for lt, lst in list(gen_lists.items()):
                if not lst:
                    continue
                have = out.get(lt.id)
                if have is None:
                    out[lt.id] = (lt, [lst])
                else:
                    have[1].append(lst)
                    out[lt.id] = (lt, have[1])
        return out

    def task_records(self) -> list[Any]:
        """Every kept task record, oldest generation first."""
        out: list[Any] = []
        for g in tuple(self.sealed):  # a recording thread may seal one meanwhile
            out += g.task_records
        out += self.state.task_records
        return out

    def window_start_ns(self) -> int:
        """When the oldest kept generation began."""
        return self.sealed[0].start_ns if self.sealed else self._start_ns

    def clear(self) -> None:
        """Let every generation go (a forked child's copy)."""
        for g in (*self.sealed, *self._dying):
            self._free(g, None)
        self.sealed.clear()
        self._measuring.clear()
        self._dying.clear()
        self._dying_bytes = 0
