"""Task ranges shared by the asyncio and trio hooks (SPEC 7.1-7.3).

A task spawned in a profiled context is a :class:`TaskThread`: its own
logical thread (so its track), its TASK range from spawn to finish, linked
to the spawner by ``forward_thread_id`` and ``sequence_nr``, and its steps
(the stretches in which it ran on the loop) as a flat array of 64-bit
start/end pairs, 16 bytes a step (a C ``StepLog`` the C step hooks append
to, else an ``array`` of :data:`STEPS_TYPECODE`), from which consolidation
derives running and waiting time for the task and for every range on its
track.

Each profile recording the task keeps it in one list per profile
(``ProfilerState.task_records``): the running task's object while it runs,
replaced when it finishes by one flat record of ints and strings and the
step log (the ``array``, copied to its size, or the C ``StepLog`` itself,
fitted: no new object, and none the cyclic GC tracks). The record is the
extension's ``TaskRecord``, a sequence that is no GC container, else a
tuple (``aprof._core._native.new_task_record``). A finished task so keeps
no object of its own and no logical thread (unless ranges were recorded on
its track), and the cyclic GC sees one object per running task, not a
handful, nor counts one per finished task towards its next collection.

Finished record: ``(id, name, kind, os_thread_id, coro, spawn_ns, seq, fwd,
end_ns, outcome, exception_name, steps, waits, spawn_site)`` (see
:data:`TASK_RECORD_FIELDS`).

What a task waited on (issue 16 item 3): when a task is made runnable again
(the loop is asked to run its step; trio's ``task_scheduled``) at least
:attr:`WaitLog.min_ns <aprof._integrations._await_chain.WaitLog.min_ns>`
after its last step ended, the next step's hook calls :func:`note_wait`
before the step runs (the coroutine is still suspended where it waited),
which walks the await chain and adds the wait to the task's
:class:`~aprof._integrations._await_chain.WaitLog`. Only
long waits pay for the walk (a few microseconds); shorter steps cost nothing
more. ``spawn_site`` is the user's frame that spawned the task, taken at
spawn (a walk of a few frames).
"""

from __future__ import annotations

import gc
import types
import warnings
from array import array
from collections import deque
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from typing import Any, Final

from .._core import _native, _record_function, _ring, _threads
from .._core._callbacks import EMPTY_RF_STATE, RF_STATE, AprofWarning, RFState
from .._core._recorder import ProfilerState, Recorder, first_start
from .._core._threads import LogicalThread, current_logical_thread, stepping
from .._frames import Frame, _library_cache, is_library_cached, user_site
from ._await_chain import Wait, describe_task, describe_wait, new_wait_log

__all__ = ["TASK_RECORD_FIELDS", "TaskThread", "global_task_recorders", "note_wait", "states_for", "states_in"]

#: Recorders of running global-scope profiles that record tasks.
global_task_recorders: list[Recorder] = []

TASK_RECORD_FIELDS: Final = (
    "id", "name", "kind", "os_thread_id", "coro", "spawn_ns", "seq", "fwd", "end_ns", "outcome", "exception", "steps",
    "waits", "spawn_site",
)  # fmt: skip

#: Typecode of the step arrays: unsigned 64-bit. perf_counter_ns() values are
#: positive, and appending to an "L" array converts the int directly, where
#: "q" goes through argument parsing and a byte-array conversion (about twice
#: the cost, on every step). "L" is 64-bit on Linux and macOS, not on Windows.
STEPS_TYPECODE: Final = "L" if array("L").itemsize == 8 else "Q"

#: The steps of a task no running profile records any more: appends vanish.
DISCARD_STEPS: Final[deque[int]] = deque(maxlen=0)

#: Makes a task's step log: the C one (the C step hooks append to it
#: without a method call), else an array.
new_steps: Callable[[], Any] = (
    _native.extension.StepLog if _native.extension is not None else (lambda: array(STEPS_TYPECODE))
)

_ids = _threads._ids
_new_record = _native.new_task_record
_sequence_numbers = _record_function._sequence_numbers  # next() on it is next_sequence_nr()
_get_rf_state = RF_STATE.get


def states_for(st: RFState) -> list[ProfilerState]:
    """The running profiles that want a TASK range for a task spawned under ``st``."""
    out: list[ProfilerState] = []
    if st.enabled:
        rec = st.recorder
        if rec is not None:
            ps = rec.state
            if ps is not None and ps.tasks and ps.running:
                out.append(ps)
        for g in global_task_recorders:
            ps = g.state
            if ps is not None and g is not rec:
                out.append(ps)
    return out


def states_in(context: Any) -> ProfilerState | list[ProfilerState] | None:
    """The profiles that want a TASK range for a task spawned in ``context``
    (a ``contextvars.Context``, or None for the current one): one state (the
    common case, no list made), a list of them, or None."""
    # A context that never set the variable has its default: a global
    # profile's tasks spawn in such contexts (a trio run started by `aprof run`).
    st = _get_rf_state() if context is None else context.get(RF_STATE, EMPTY_RF_STATE)
    if not global_task_recorders:
        rec = st.recorder
        if rec is None or not st.enabled:
            return None
        ps = rec.state
        if ps is not None and ps.tasks and ps.running:
            return ps
        return None
    return states_for(st) or None


class TaskThread(LogicalThread):
    """A recorded task: its logical thread, its steps and its TASK records.

    Created at spawn, in the spawner (whose logical thread is the link).
    The hooks stamp ``steps`` (a start and an end per step) and call
    :meth:`finished` once; after that the object holds no profile.
    """

    __slots__ = (
        "_block", "_idx", "_more", "_records", "_state", "coro_name", "fwd", "ready_ns", "seq", "spawn_ns", "spawn_site",
        "steps", "waits",
    )  # fmt: skip

    coro_name: str
    fwd: int
    seq: int
    spawn_ns: int
    spawn_site: Frame | None  # the user's frame that spawned it
    ready_ns: int  # (trio) when it was last made runnable: its wait ended
    steps: Any  # a StepLog (C) or array(STEPS_TYPECODE), or DISCARD_STEPS once no running profile records the task
    waits: Any  # its long waits (a WaitLog: the C one, or the twin), once it had one

    def __init__(
        self,
        kind: str,
        name: str,
        coro_name: str,
        states: ProfilerState | list[ProfilerState],
        spawner: LogicalThread | None = None,
    ) -> None:
        if spawner is None:
            spawner = stepping.lt or current_logical_thread()
        self.id = next(_ids)
        self.kind = kind
        self.name = name
        # Tasks run on the thread that spawns them (their loop's): share its int.
        self.os_thread_id = spawner.os_thread_id if spawner.os_thread_id == get_ident() else get_ident()
        self._task_ref = None
        self.coro_name = coro_name
        self.fwd = spawner.id
        self.seq = next(_sequence_numbers)
        self.steps = new_steps()
        self.waits = None
        self.ready_ns = 0
        c_site = _c_user_site
        self.spawn_site = c_site(_library_cache, is_library_cached) if c_site is not None else user_site()
        self._more: list[tuple[ProfilerState, list[Any], int]] | None = None
        self._state: ProfilerState | None = None
        # Where its record sits: a bounded profile starts a new list of
        # task records with each generation (aprof._core._ring).
        self._records: list[Any] = _NO_RECORDS
        self._idx = 0
        # The block of TASK_BLOCKS its plain ranges go to (the C range path's).
        self._block: Any = None
        self.spawn_ns = perf_counter_ns()
        # Complete before it is published: another thread may stop a profile
        # (and read this object) as soon as it is in a list.
        for ps in (states,) if type(states) is ProfilerState else states:  # type: ignore[union-attr]
            if ps.budget is not None and not ps.admit(_ring.TASK):  # a full budget: not recorded there
                continue
            lst = ps.task_records
            lst.append(self)
            # Another thread may append at the same moment: find our slot
            # from the end (nothing is ever removed, so it stays put).
            i = len(lst) - 1
            while lst[i] is not self:
                i -= 1
            if self._state is None:
                self._state, self._records, self._idx = ps, lst, i
            else:
                if self._more is None:
                    self._more = []
                self._more.append((ps, lst, i))

    def finished(self, outcome: str, exc_name: str | None, end_ns: int) -> None:
        """Close the TASK range in every profile still recording it."""
        steps = self.steps
        if len(steps) % 2 == 1:  # finished mid-step (e.g. cancelled while running)
            steps.append(end_ns)
        st = self._state
        if st is None:
            return
        # Exact size: the log over-allocates as it grows.
        if type(steps) is array:
            steps = steps[:]
        elif type(steps) is not deque:
            steps = steps.fit()  # the C StepLog: held as it is, its room cut to its times
        waits = self.waits
        rec = _new_record(
            self.id, self.name, self.kind, self.os_thread_id, self.coro_name, self.spawn_ns, self.seq, self.fwd,
            end_ns, outcome, exc_name, steps, waits, self.spawn_site,
        )  # fmt: skip
        _put(self._records, self._idx, self, rec)
        more = self._more
        if more is not None:
            for _, lst, i in more:
                _put(lst, i, self, rec)
            self._more = None
        self._state = None
        self._records = _NO_RECORDS
        self.steps = DISCARD_STEPS  # the record has them now
        self.waits = None
        self._task_ref = None  # named above for good: one object fewer for the cyclic GC to walk

    def stopped(self) -> None:
        """A profile recording the task stopped while it runs: stop keeping
        its steps if no running profile records it any more."""
        profiles = [self._state] + [ps for ps, _, _ in self._more or ()]
        if not any(ps is not None and ps.running for ps in profiles):
            self.steps = DISCARD_STEPS
            self._state = self._more = None

    def let_go(self, state: ProfilerState) -> None:
        """``state``'s ring let go of this running task's record (its
        generation went, aprof._core._ring): stop keeping its steps, unless
        another running profile records it."""
        if self._state is state and not self._more:
            self.steps = DISCARD_STEPS
            self._state = None
            self._records = _NO_RECORDS

    def waiting_on(self) -> Wait | None:
        """What the task, still pending, waits on now (None if it is gone,
        running, or not waiting on anything aprof can name)."""
        ref = self._task_ref
        task = ref() if ref is not None else None
        if task is None:
            return None
        try:
            return describe_task(task)
        except Exception:  # an odd task or coroutine: nothing to say
            return None

    def adopt(self, lt: LogicalThread) -> None:
        """Become ``lt``, the logical thread a lookup made for this task
        before aprof saw it created (an eager task's first step, on the
        paths where that step is not watched): take its id and its event
        lists, so its first step's ranges stay on the task's track; the
        task's range then starts where the first of them did."""
        self.id = lt.id
        starts = [self.spawn_ns]
        for ps in [self._state, *(ps for ps, _, _ in self._more or ())]:
            if ps is None:
                continue
            lst = ps.lists.pop(lt, None)
            if lst is None:
                continue
            ps.lists[self] = lst
            first = first_start(lst)
            if first is not None:
                starts.append(first)
        self.spawn_ns = min(starts)

    def __repr__(self) -> str:
        return f"<TaskThread {self.id} {self.kind} {self.name!r}>"


def note_wait(tt: TaskThread, task: Any, start_ns: int, end_ns: int) -> None:
    """(step hooks) ``task`` waited from ``start_ns`` to ``end_ns`` and its
    next step is about to run: add what it waited on to its log. Never
    raises into the program."""
    try:
        # describe_task(task), inline: this runs at every long wait.
        get_coro = getattr(task, "get_coro", None)
        coro = get_coro() if get_coro is not None else getattr(task, "coro", None)
        if coro is None or getattr(coro, "cr_running", False):
            return
        wait = describe_wait(coro, task if get_coro is not None else None)
        if wait is None:
            return
        log = tt.waits
        if log is None:
            log = tt.waits = new_wait_log()
        log.add(start_ns, end_ns, wait)
    except Exception as exc:  # aprof's bug: reported, the step runs on
        report("await chain", exc)


_warned: set[str] = set()


def report(where: str, exc: BaseException) -> None:
    """aprof's own task bookkeeping failed: say so once per kind, never
    raise into the program."""
    if where in _warned:
        return
    _warned.add(where)
    try:
        warnings.warn(f"aprof: recording tasks failed ({where}): {exc!r}", AprofWarning, stacklevel=2)
    except Exception:  # warnings turned into errors: still never into the program
        pass


_NO_RECORDS: Final[list[Any]] = []


def _put(lst: list[Any], idx: int, task: TaskThread, rec: Any) -> None:
    # After stop nobody reads the list, and a bounded profile empties the
    # list of a generation it lets go: the late end is dropped.
    if idx < len(lst) and lst[idx] is task:
        lst[idx] = rec


#: aprof._frames.user_site in C (without sys._getframe's audit event), or None.
_c_user_site: Callable[[dict[str, bool], Callable[[str], bool]], Frame | None] | None = getattr(
    _native.extension, "user_site", None
)


def coro_qualname(coro: Any) -> str:
    """The qualified name of the user's coroutine behind ``coro``.

    anyio (4.x with ``TaskHandle``) spawns every task on a wrapper coroutine,
    ``TaskHandle._run_coro``, that awaits the user's coroutine, and on trio
    its ``TaskGroup.start`` spawns ``run_coro_with_task_status``, which calls
    the user's function in its first step: name the one the user wrote.

    Before its first step a coroutine's arguments are in its frame, and its
    function (with the closure) is referenced by it. They are read through
    ``gc.get_referents``, never through ``frame.f_locals``: on 3.11 and 3.12
    that stores a snapshot of the locals on the frame, which then keeps a
    failed task's exception and traceback alive in a cycle (SPEC 15.6).
    """
    name = getattr(coro, "__qualname__", None) or type(coro).__qualname__
    if "run_coro" in name and (name == "TaskHandle._run_coro" or name.endswith(".run_coro_with_task_status")):
        inner = _wrapped_name(coro, name == "TaskHandle._run_coro")
        if inner is not None:
            return inner
    return str(name)


def _wrapped_name(coro: Any, handle: bool) -> str | None:
    code = getattr(coro, "cr_code", None)
    if code is None:
        return None
    for ref in gc.get_referents(coro):
        if handle:
            # TaskHandle._run_coro(self): the handle is its first local.
            inner = getattr(ref, "_coro", None) if type(ref).__name__ == "TaskHandle" else None
            if inner is not None:
                return coro_qualname(inner)
        elif type(ref) is types.FunctionType and ref.__code__ is code and ref.__closure__:
            # run_coro_with_task_status closes over the user's `func`.
            cells = dict(zip(code.co_freevars, ref.__closure__, strict=False))
            cell = cells.get("func")
            try:
                func = cell.cell_contents if cell is not None else None
            except ValueError:  # an empty cell
                func = None
            func_name = getattr(func, "__qualname__", None)
            if isinstance(func_name, str):
                return func_name
    return None
