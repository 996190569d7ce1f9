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
  it holds an eighth of the budget it is *sealed* (its blocks trimmed to
  size, its bytes measured) and a new one begins, and the oldest sealed
  generations are let go while the rest hold more than seven eighths. An
  event belongs to the generation in which it started, so whole events are
  dropped, oldest first, and counted exactly, by kind, as they go.

A range still open when its generation is let go is dropped with it (it
started before everything kept); its end, written later, goes nowhere. A
task's record holds its steps: they are dropped with it, and a task still
running then stops keeping them (a long-lived task, a server's connection,
does not grow the ring: it is dropped whole when its generation goes, and its
ranges after that are kept on its track like any others).

Bytes are the records' own memory, measured when a generation is sealed
(``raw_seal``): blocks, tuples, the ints in them, and strings only the
record holds (an ``args`` string made for the range); names the program
holds anyway are not counted. Between seals, the bytes of the current
generation are estimated from the last sealed one's bytes per event.
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

__all__ = ["KEEP", "KIND_NAMES", "Budget", "Ring", "check_budget"]

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


def _seal(lists: dict[LogicalThread, list[Any]]) -> int:
    # list(): another thread may add its first list to the dict meanwhile.
    ext = _native.extension
    if ext is None:
        return sum(sys.getsizeof(lst) + sum(map(sys.getsizeof, lst)) for lst in list(lists.values()))
    seal = ext.raw_seal
    return sum(seal(lst) for lst in list(lists.values()))


def _task_bytes(records: list[Any]) -> int:
    total = 0
    for rec in list(records):
        steps = rec[11] if type(rec) is tuple else rec.steps
        total += sys.getsizeof(rec) + sys.getsizeof(steps)
    return total


def _counts(lists: dict[LogicalThread, list[Any]], records: list[Any]) -> tuple[int, int, int, int]:
    """(ranges, instants, tasks, steps) that raw lists and task records hold."""
    ranges = instants = steps = 0
    ext = _native.extension
    for lst in lists.values():
        if ext is not None:
            r, i = ext.raw_counts(lst)
        else:
            r = i = 0
            for t in lst:
                if type(t[0]) is int:
                    continue
                if len(t) == 10 and t[8] == 1:  # KIND_INSTANT
                    i += 1
                else:
                    r += 1
        ranges += r
        instants += i
    for rec in records:
        s = rec[11] if type(rec) is tuple else rec.steps
        steps += (len(s) + 1) // 2
    return ranges, instants, len(records), steps


class _Generation:
    __slots__ = ("bytes", "events", "lists", "start_ns", "task_records")

    def __init__(
        self, lists: dict[LogicalThread, list[Any]], task_records: list[Any], start_ns: int, nbytes: int, events: int
    ) -> None:
        self.lists = lists
        self.task_records = task_records
        self.start_ns = start_ns
        self.bytes = nbytes
        self.events = events


class Ring:
    """A bounded profile's budget and, with ``keep="latest"``, its sealed
    generations (see the module's docstring)."""

    __slots__ = (
        "__weakref__", "_bpe", "_dropped", "_failed", "_held_bytes", "_held_events", "_start_ns", "budget", "keep",
        "max_bytes", "max_events", "pins", "sealed", "state",
    )  # fmt: skip

    def __init__(
        self, state: ProfilerState, max_events: int | None, max_bytes: int | None, keep: Literal["first", "latest"]
    ) -> None:
        self.state = state
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.keep = keep
        self.sealed: deque[_Generation] = deque()
        self._held_bytes = 0
        self._held_events = 0
        self._dropped = [0, 0, 0, 0]  # let go with their generations
        self._bpe = _FIRST_GUESS
        self._start_ns = state.start_ns
        self._failed = False
        #: Readers copying the generations (a flight recorder's dump): while
        #: any is, generations are sealed but none is let go.
        self.pins = 0
        self.budget = Budget(self.on_full, self._limit(0))

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
        """The budget's count reached its limit: rotate or fill. Never raises
        into the program: a failure warns once and fills the budget."""
        try:
            if self.keep == "latest":
                self._rotate()
            else:
                self._fill()
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
        now = perf_counter_ns()
        # New records go to a new generation from here on (swapped first:
        # other threads record while this runs); ranges still open end in
        # the lists they started in.
        lists, records = state.lists, state.task_records
        state.lists = {}
        state.task_records = []
        events = budget.count
        gen = _Generation(lists, records, self._start_ns, 0, events)
        self.sealed.append(gen)
        gen.bytes = nbytes = _seal(lists) + _task_bytes(records)
        if events:
            self._bpe = max(nbytes / events, 8.0)
        self._start_ns = now
        self._held_bytes += nbytes
        self._held_events += events
        keep_bytes = None if self.max_bytes is None else self.max_bytes - self.max_bytes // GENERATIONS
        keep_events = None if self.max_events is None else self.max_events - self.max_events // GENERATIONS
        while self.sealed and not self.pins and (
            (keep_bytes is not None and self._held_bytes > keep_bytes)
            or (keep_events is not None and self._held_events > keep_events)
        ):
            self._evict(self.sealed.popleft())
        # What other threads took while this ran is the new generation's.
        budget.count -= events
        budget.limit = self._limit(0)

    def _evict(self, gen: _Generation) -> None:
        counts = _counts(gen.lists, gen.task_records)
        for k in range(4):
            self._dropped[k] += counts[k]
        self._held_bytes -= gen.bytes
        self._held_events -= gen.events
        # Cleared, not just let go: a range still open keeps its list, a
        # task still running its records list, and neither must keep the
        # generation's other records alive.
        for lst in gen.lists.values():
            lst.clear()
        gen.lists.clear()
        for rec in gen.task_records:
            if type(rec) is not tuple:  # still running: it keeps no steps for us any more
                rec.let_go(self.state)
        gen.task_records.clear()

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
        return self._held_bytes + int(self.budget.count * self._bpe)

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
        for g in self.sealed:
            for lst in g.lists.values():  # a range still open keeps its list, not the rest
                lst.clear()
            g.lists.clear()
            g.task_records.clear()
        self.sealed.clear()
