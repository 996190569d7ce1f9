"""Task ranges shared by the asyncio and trio hooks (SPEC 7.1-7.3).

A task spawned in a profiled context gets a ``TASK`` record on its own
track, from spawn to finish, linked to the spawner by ``forward_thread_id``
and ``sequence_nr``. Its steps (the stretches in which it ran on the loop) are
kept as a flat ``array('q')`` of start/end pairs: 16 bytes a step, from which
consolidation derives running and waiting time for the task and for every
range on its track.
"""

from __future__ import annotations

from array import array
from time import perf_counter_ns
from typing import Any, Final

from .._core._callbacks import RF_STATE, RFState
from .._core._record_function import next_sequence_nr
from .._core._recorder import KIND_RANGE, Recorder
from .._core._threads import LogicalThread, current_logical_thread

__all__ = ["TaskRecords", "global_task_recorders", "recorders_for"]

#: Recorders of running global-scope profiles that record tasks.
global_task_recorders: list[Recorder] = []


def recorders_for(st: RFState) -> list[Recorder]:
    """The profiles that want a TASK range for a task spawned under ``st``."""
    out: list[Recorder] = []
    if st.enabled:
        rec = st.recorder
        if rec is not None:
            ps = rec.state
            if ps is not None and ps.running and ps.tasks:
                out.append(rec)
        for g in global_task_recorders:
            if g.state is not None and g is not rec:
                out.append(g)
    return out


def recorders_in(context: Any) -> list[Recorder]:
    """Like :func:`recorders_for`, for a ``contextvars.Context`` (or the current one)."""
    st = context.get(RF_STATE, None) if context is not None else RF_STATE.get()
    if st is None:
        from .._core._callbacks import EMPTY_RF_STATE

        st = EMPTY_RF_STATE
    return recorders_for(st)


STEPS_NONE: Final = array("q")


class TaskRecords:
    """The TASK records of one task (one per profile recording it) and its steps."""

    __slots__ = ("finish_ns", "lt", "recs", "steps")

    def __init__(self, recorders: list[Recorder], lt: LogicalThread, name: str, coro_name: str, spawner: LogicalThread, spawn_ns: int) -> None:
        seq = next_sequence_nr()
        self.lt = lt
        self.steps = array("q")
        self.finish_ns = 0
        recs: list[tuple[list[Any], int, dict[str, Any]]] = []
        for r in recorders:
            ps = r.state
            if ps is None:
                continue
            extra = {"coro": coro_name, "spawn_ns": spawn_ns, "steps": self.steps}
            lst = ps.list_for(lt)
            recs.append((lst, len(lst), extra))
            lst.append((name, "task", spawn_ns, None, seq, spawner.id, None, None, KIND_RANGE, extra))
        self.recs = recs

    def step_started(self) -> None:
        self.steps.append(perf_counter_ns())

    def step_ended(self) -> None:
        steps = self.steps
        if len(steps) % 2 == 1:
            steps.append(perf_counter_ns())

    def finished(self, outcome: str, exc_name: str | None, end_ns: int | None = None) -> None:
        end = end_ns or self.finish_ns or perf_counter_ns()
        self.lt.current_name()  # the task is alive now; at stop it may be gone
        steps = self.steps
        if len(steps) % 2 == 1:  # finished mid-step (e.g. cancelled while running)
            steps.append(end)
        for lst, idx, extra in self.recs:
            # After stop nobody reads lst: a task outliving its profile is
            # shown unfinished, as its stop left it.
            extra["outcome"] = outcome
            lst.append((idx, end, self.lt.id, exc_name))
        self.recs = []


def coro_qualname(coro: Any) -> str:
    """The qualified name of the user's coroutine behind ``coro``.

    anyio (4.x with ``TaskHandle``) spawns every task on a wrapper coroutine,
    ``TaskHandle._run_coro``, that awaits the user's coroutine, and on trio
    its ``TaskGroup.start`` spawns ``run_coro_with_task_status``, which calls
    the user's function in its first step: name the one the user wrote. A
    coroutine's arguments and closure variables are in its frame before its
    first step, so the wrapper's ``self`` or ``func`` can be read at spawn.
    """
    name = getattr(coro, "__qualname__", None) or type(coro).__qualname__
    if name == "TaskHandle._run_coro" or name.endswith(".run_coro_with_task_status"):
        frame = getattr(coro, "cr_frame", None)
        if frame is not None:
            f_locals = frame.f_locals
            inner = getattr(f_locals.get("self"), "_coro", None)
            if inner is not None:
                return coro_qualname(inner)
            func_name = getattr(f_locals.get("func"), "__qualname__", None)
            if isinstance(func_name, str):
                return func_name
    return str(name)


def spawn_records(recorders: list[Recorder], task_lt: LogicalThread, name: str, coro_name: str) -> TaskRecords:
    return TaskRecords(recorders, task_lt, name, coro_name, current_logical_thread(), perf_counter_ns())
