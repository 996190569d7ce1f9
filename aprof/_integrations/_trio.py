"""trio tasks (SPEC 7.1-7.3), through trio's Instrument API.

trio reports exact task steps (``before_task_step`` / ``after_task_step``),
spawns (``task_spawned``, called in the spawner's step, so the spawner is the
current task) and exits. The instrument is added to the run in which a
profile recording tasks starts, and removed when the last such profile
stops, even on error.

This module is imported only when trio is already running: aprof never
imports trio itself.
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns
from typing import Any, Final

import trio

from .._core import _tracer
from .._core._propagation import hook_to_thread
from .._core._threads import stepping
from ._await_chain import WaitLog
from ._tasks import TaskThread, coro_qualname, note_wait, states_in

__all__ = ["install_instrument", "uninstall_instrument"]


def _exit_outcome() -> tuple[str, str | None]:
    # The Instrument API's task_exited(task) does not pass the outcome; the
    # runner's task_exited(task, outcome) frame, two calls up, has it.
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            break
        if f.f_code.co_name == "task_exited" and "outcome" in f.f_locals:
            outcome = f.f_locals["outcome"]
            error = getattr(outcome, "error", None)
            if error is None:
                return "returned", None
            name = type(error).__name__
            return ("cancelled" if isinstance(error, trio.Cancelled) else f"raised {name}"), name
        f = f.f_back  # type: ignore[assignment]
    return "finished", None


_TRIO_DIR: Final = os.path.dirname(os.path.abspath(trio.__file__)) + os.sep
_APROF_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _machinery(task: trio.lowlevel.Task) -> bool:
    """trio's own tasks (``<init>``, the run_sync_soon task) and aprof's
    heartbeat: system tasks whose coroutine is trio's or aprof's code. The
    program's main task is a system task too, and is kept."""
    nursery = task.parent_nursery
    if nursery is not None and nursery.parent_task.parent_nursery is not None:
        return False  # an ordinary task (its nursery is not the system nursery)
    code = getattr(task.coro, "cr_code", None)
    filename = code.co_filename if code is not None else ""
    return filename.startswith(_TRIO_DIR) or filename.startswith(_APROF_DIR)


class TaskInstrument(trio.abc.Instrument):
    """Opens TASK records at spawn, stamps steps, closes them at exit."""

    def __init__(self) -> None:
        self.count = 1
        self._tasks: dict[trio.lowlevel.Task, TaskThread] = {}
        self.undo_to_thread = hook_to_thread()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        states = states_in(task.context)
        if not states or _machinery(task):
            return
        tt = TaskThread("trio", task.name, coro_qualname(task.coro), states)
        tt.bind(task, "trio")
        self._tasks[task] = tt
        if _tracer.running():
            task.context.run(_tracer.publish_task, tt)  # for the Python tracer

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        tt = self._tasks.get(task)
        stepping.lt = tt
        if tt is not None:
            steps = tt.steps
            n = len(steps)
            if n and not n % 2 and tt.ready_ns - steps[-1] >= WaitLog.min_ns:
                # The wait ended when trio made the task runnable (its time
                # in the run queue is the run loop's); it still waits there.
                note_wait(tt, task, steps[-1], tt.ready_ns)
            steps.append(perf_counter_ns())

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        tt = self._tasks.get(task)
        if tt is not None:
            tt.ready_ns = perf_counter_ns()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        # Cleared whatever the task: its last step ends after task_exited
        # has already forgotten it.
        stepping.lt = None
        tt = self._tasks.get(task)
        if tt is not None:
            steps = tt.steps
            if len(steps) % 2 == 1:
                steps.append(perf_counter_ns())

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        tt = self._tasks.pop(task, None)
        if tt is not None:
            end = perf_counter_ns()
            tt.current_name()  # the task is alive now; at stop it may be gone
            outcome, exc_name = _exit_outcome()
            tt.finished(outcome, exc_name, end)


_installed: dict[Any, TaskInstrument] = {}
_lock = threading.Lock()


def install_instrument() -> Any:
    """Add (or count one more user of) the instrument in the current trio run.

    Returns:
        A token for :func:`uninstall_instrument`.
    """
    runner_token = trio.lowlevel.current_trio_token()
    with _lock:
        inst = _installed.get(runner_token)
        if inst is not None:
            inst.count += 1
            return runner_token
        inst = TaskInstrument()
        _installed[runner_token] = inst
    trio.lowlevel.add_instrument(inst)
    return runner_token


def uninstall_instrument(runner_token: Any) -> None:
    """Drop one user; the last one removes the instrument, if its run is alive."""
    with _lock:
        inst = _installed.get(runner_token)
        if inst is None:
            return
        inst.count -= 1
        if inst.count > 0:
            return
        del _installed[runner_token]
    inst.undo_to_thread()
    try:
        runner_token.run_sync_soon(_remove, inst)
    except (trio.RunFinishedError, OSError):
        # The run ended (its instruments went with it); OSError: it ended
        # before its first task ran, and its wake-up socket is closed.
        return
    try:
        trio.lowlevel.remove_instrument(inst)  # in the run: now, not later
    except (RuntimeError, KeyError):
        return  # not inside the run (stopped from a thread): run_sync_soon does it
    # Removed inside a step (the profile stopped in a task): that step's
    # after_task_step will not come to clear the stepping slot.
    lt = stepping.lt
    if type(lt) is TaskThread and lt.kind == "trio":
        stepping.lt = None


def _remove(inst: TaskInstrument) -> None:
    try:
        trio.lowlevel.remove_instrument(inst)
    except KeyError:
        pass  # already removed


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
