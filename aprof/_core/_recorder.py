"""The profiler's recording half: raw records and per-thread event lists.

Recording does as little as possible. A range appends two small tuples to the
list of the logical thread that started it: a *start* tuple when it starts,
and an *end* tuple, naming the start's index in that list, when it ends,
wherever that happens (a range ended in another task is "popped on its
originating thread", as in the seed).

The tuples hold only strings, ints and None, so CPython's cyclic GC untracks
them at its first pass: a profile of a million ranges does not make every
later collection walk a million records (with mutable lists, the GC cost more
than the recording itself). Building ``FunctionEvent`` objects, nesting, names
and flags all happen at stop (``aprof._post._events.consolidate``).

On the C paths, a plain range (a name and maybe args, from
``record_function``'s fast path or the tracer's replay) is not two tuples but
a 48-byte slot of a ``RangeBlock`` (``aprof/_cblocks.c``) at the list's tail:
its end is written into the slot, nothing is appended.

Start tuple: ``(name, scope_value, start_ns, args)`` from the fast path, or
``(name, scope_value, start_ns, args, seq, fwd, inputs, stack, kind, extra)``.
End tuple: ``(start_index, end_ns, end_thread_id, exception_name)``; an
``end_thread_id`` of ``ASYNC_SAME_THREAD`` marks a range declared async that
ended where it started.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Final, Literal

from . import _native
from ._threads import LogicalThread

if TYPE_CHECKING:
    from ._callbacks import RecordScope
    from ._record_function import RecordFunction
    from ._ring import Ring

ASYNC_SAME_THREAD: Final = -1

# Layout of a consolidated record (a list built at stop; FunctionEvent reads it).
R_NAME: Final = 0  # str
R_SCOPE: Final = 1  # RecordScope
R_START: Final = 2  # perf_counter_ns at start
R_END: Final = 3  # perf_counter_ns at end, None while open
R_END_LT: Final = 4  # id of the logical thread that ended it, None if the starting one
R_EXC: Final = 5  # exception type name that ended it, or None
R_ARGS: Final = 6  # the user's args string, or None
R_SEQ: Final = 7  # sequence number, -1 if none
R_FWD: Final = 8  # forward (spawning/submitting) logical thread id, 0 if none
R_INPUTS: Final = 9  # tuple of input reprs (record_inputs), or None
R_STACK: Final = 10  # tuple of (file, line, function) frames (with_stack; raw until stop), or None
R_KIND: Final = 11  # KIND_RANGE or KIND_INSTANT, plus FLAG_* bits set at stop
R_EXTRA: Final = 12  # dict of extra fields (tasks: outcome, ...), or None

KIND_RANGE: Final = 0
KIND_INSTANT: Final = 1
FLAG_UNFINISHED: Final = 2  # set by consolidation: still open at stop
FLAG_ASYNC: Final = 4  # set by consolidation: shown as an async slice


def safe_repr(value: object, limit: int = 200) -> str:
    """repr() that never raises and never runs away."""
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001 - a user's __repr__ may raise anything
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"<{type(value).__qualname__} object (repr raised {type(exc).__name__})>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


#: aprof's own files (this file is aprof/_core/_recorder.py).
_APROF_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: A raw stack, as recorded (SPEC 8.3): the frames' code objects, innermost
#: first, and their last instruction offsets as native uint32s (``NO_LASTI``
#: for a frame not started). Named at stop (aprof._post._events.name_stack),
#: which drops the code objects.
RawStack = tuple[tuple[CodeType, ...], bytes]
NO_LASTI: Final = 0xFFFFFFFF


def _stack_here_py(skip: int, prefix: str) -> RawStack:
    """The pure-Python twin of the extension's ``stack_here``."""
    try:
        f: FrameType | None = sys._getframe(skip + 1)
    except ValueError:
        return (), b""
    while f is not None and f.f_code.co_filename.startswith(prefix):
        f = f.f_back
    codes = []
    lastis = array("I")
    while f is not None:
        codes.append(f.f_code)
        lasti = f.f_lasti
        lastis.append(NO_LASTI if lasti < 0 else lasti)
        f = f.f_back
    return tuple(codes), lastis.tobytes()


_stack_here: Callable[[int, str], RawStack] = (
    _stack_here_py if _native.extension is None else _native.extension.stack_here
)
if _native.extension is not None:
    _native.extension._set_stack_prefix(_APROF_DIR)  # for the C range fast path


def capture_stack(skip: int) -> RawStack:
    """The Python call stack of the caller, raw: named at stop.

    Leading frames of aprof itself (``record_function.__enter__``, the
    decorator wrappers, ...) are dropped whatever ``skip`` says, so the stack
    starts at the user's code however the range was opened. Walking the
    frames and keeping their code objects costs a fraction of naming them
    (~16 us a range at depth 23 when this named every frame); the code
    objects are kept only until stop.
    """
    return _stack_here(skip + 1, _APROF_DIR)


def first_start(lst: list[Any]) -> int | None:
    """The earliest start recorded in a raw list (start tuples and, on the C
    paths, RangeBlocks), or None if it has none."""
    ext = _native.extension
    if ext is not None:
        start: int | None = ext.raw_first_start(lst)
        return start
    return min((t[2] for t in lst if type(t[0]) is not int), default=None)


def index_of(lst: list[Any], record: tuple[Any, ...], hint: int) -> int:
    """The index of ``record`` in ``lst``, searched from ``hint`` down.

    A start tuple's index is read after it is appended; if a signal handler
    opened ranges on the same list in between, the record is below the end.
    """
    for i in range(min(hint, len(lst) - 1), -1, -1):
        if lst[i] is record:
            return i
    raise AssertionError("aprof: a start record vanished from its list")  # pragma: no cover


def _task_blocks_key() -> LogicalThread:
    lt = LogicalThread.__new__(LogicalThread)
    lt.id, lt.kind, lt.name, lt.os_thread_id, lt._task_ref = 0, "tasks", "tasks' ranges", 0, None
    return lt


#: The key of a generation's one list of tasks' plain ranges (the C range
#: path's, aprof/_cranges.c): RangeBlocks, each naming its task
#: (``RangeBlock.owner``, a logical thread id), which consolidation hands
#: back to their tasks (``aprof._post._events.owned_blocks``). A task per
#: request then leaves no list of its own nor its logical thread as a key.
#: Its id, 0, is no logical thread's (they count from 1).
TASK_BLOCKS: Final = _task_blocks_key()


class ProfilerState:
    """A running profile's recorded data: one raw event list per logical thread."""

    __slots__ = (
        "__weakref__",
        "budget",
        "dropped",
        "lists",
        "node_id",
        "record_inputs",
        "ring",
        "running",
        "start_lt",
        "start_ns",
        "stop_ns",
        "task_records",
        "tasks",
        "with_stack",
    )

    def __init__(
        self, *, record_inputs: bool, with_stack: bool, node_id: int, start_lt: LogicalThread, tasks: bool = False
    ) -> None:
        self.tasks = tasks
        # The raw lists by logical thread, and the tasks' plain ranges in
        # one list under TASK_BLOCKS.
        self.lists: dict[LogicalThread, list[tuple[Any, ...]]] = {}
        # The TASK ranges: the task's record while it runs, its finished tuple
        # after (aprof._integrations._tasks); read at stop with ``lists``.
        self.task_records: list[Any] = []
        self.running = True
        self.record_inputs = record_inputs
        self.with_stack = with_stack
        self.node_id = node_id
        self.start_lt = start_lt
        self.start_ns = perf_counter_ns()
        self.stop_ns: int | None = None
        self.dropped = 0
        # A bounded profile's budget (issue 19, aprof._core._ring): every
        # recording path takes room in it first. None: unbounded.
        self.ring: Ring | None = None
        self.budget: Any = None

    def bound(self, max_events: int | None, max_bytes: int | None, keep: Literal["first", "latest"]) -> None:
        """Hold at most this much while recording (see aprof._core._ring)."""
        from ._ring import Ring

        self.ring = Ring(self, max_events, max_bytes, keep)
        self.budget = self.ring.budget

    def raw_lists(self) -> Mapping[LogicalThread, list[Any] | tuple[list[Any], ...]]:
        """Every logical thread's raw records: its list, or a bounded
        profile's lists from each generation, oldest first."""
        ring = self.ring
        if ring is None:
            return self.lists
        return {lt: chunks[0] if len(chunks) == 1 else tuple(chunks) for lt, chunks in ring.lists().values()}

    def all_task_records(self) -> list[Any]:
        """Every task record kept (a bounded profile's from each generation)."""
        ring = self.ring
        return self.task_records if ring is None else ring.task_records()

    def admit(self, kind: int) -> bool:
        """Room in the budget for one record of ``kind`` (aprof._core._ring)?"""
        budget = self.budget
        return budget is None or bool(budget.take(kind))

    def list_for(self, lt: LogicalThread) -> list[tuple[Any, ...]]:
        lst = self.lists.get(lt)
        if lst is None:
            # Only lt's own OS thread appends to lt's list, so no lock is
            # needed for the append. setdefault, not a get-then-store: a
            # signal handler recording in between must not lose its list.
            lst = self.lists.setdefault(lt, [])
        return lst


class Recorder:
    """The profile's recording callback (the seed's profiler callback).

    It lives in the context (or the global registry), and points at the
    profile's state until the profile stops; stopping empties ``state`` so
    that any context still holding the recorder records nothing more and
    keeps nothing alive.
    """

    __slots__ = ("__weakref__", "fast", "state")

    def __init__(self, state: ProfilerState) -> None:
        self.state: ProfilerState | None = state
        # The inline path in record_function handles plain ranges, with their
        # raw stack if asked; input reprs go through start()/end() below.
        self.fast = not state.record_inputs

    def start(self, rf: RecordFunction, lt: LogicalThread, skip: int) -> tuple[list[Any], int] | None:
        """Append a start tuple; returns where it is, for :meth:`end`."""
        st = self.state
        if st is None or not st.running:
            return None
        inputs = None
        if st.record_inputs and (rf._inputs or rf._kwinputs):
            # Reprs, bounded in length, never the objects (SPEC 12).
            inputs = tuple(safe_repr(v) for v in rf._inputs)
            if rf._kwinputs:
                inputs += tuple(f"{k}={safe_repr(v)}" for k, v in rf._kwinputs.items())
        kind = KIND_INSTANT if rf._instant else KIND_RANGE
        if not st.admit(kind):
            return None
        stack = capture_stack(skip + 1) if st.with_stack else None
        lst = st.list_for(lt)
        t = (rf.name, rf.scope.value, perf_counter_ns(), rf._args, rf.seq_nr, rf.forward_thread_id, inputs, stack, kind, rf._extra)
        lst.append(t)
        if kind != KIND_RANGE:
            return None
        idx = len(lst) - 1  # after the append: see index_of
        if lst[idx] is not t:
            idx = index_of(lst, t, idx)
        return lst, idx

    @staticmethod
    def end(where: tuple[list[Any], int], end_thread_id: int, exc: str | None) -> None:
        """Append the end tuple of the range started at ``where``.

        After stop the list is no longer read, so a late end is dropped
        without any check here.
        """
        lst, idx = where
        lst.append((idx, perf_counter_ns(), end_thread_id, exc))

    def instant(self, name: str, scope: RecordScope, lt: LogicalThread, args: str | None) -> None:
        st = self.state
        if st is None or not st.running:
            return
        if not st.admit(KIND_INSTANT):
            return
        stack = capture_stack(2) if st.with_stack else None
        st.list_for(lt).append((name, scope.value, perf_counter_ns(), args, -1, 0, None, stack, KIND_INSTANT, None))
