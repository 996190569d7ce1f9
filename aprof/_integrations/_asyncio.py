"""asyncio and uvloop tasks (SPEC 7.1-7.3).

A task factory, installed on the running loop while a profile that records
tasks runs there, chained with any factory already installed (the eager task
factory included) and restored when the last such profile stops. For a task
spawned in a profiled context it:

* opens the ``TASK`` record at spawn, on the task's own track, linked to the
  spawner (``forward_thread_id``, ``sequence_nr``);
* wraps the coroutine in :class:`TimedCoroutine`, which stamps each step
  (each ``send``/``throw`` the task makes) and closes the record with the
  outcome when the coroutine finishes. This works on uvloop too, where
  patching ``asyncio.Handle`` would see nothing, and costs two clock reads
  a step.

Tasks spawned in unprofiled contexts go straight to the previous factory.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Generator
from time import perf_counter_ns
from typing import Any

from .._core._threads import LogicalThread, current_task_and_kind, stepping
from .._core._tracer import publish_task
from ._tasks import TaskRecords, coro_qualname, recorders_in, spawn_records

__all__ = ["TimedCoroutine", "install_task_factory", "uninstall_task_factory"]


class TimedCoroutine:
    """A coroutine proxy that records each step of the task driving it.

    The task sees a coroutine (``collections.abc.Coroutine`` is registered
    below); everything else (``cr_frame``, ``__qualname__``, ...) is read
    through to the wrapped coroutine, so reprs and ``task.get_stack()`` are
    unchanged.
    """

    __slots__ = ("_bound", "_coro", "_records")

    def __init__(self, coro: Coroutine[Any, Any, Any], records: TaskRecords) -> None:
        self._coro = coro
        self._records = records
        self._bound = False

    def _bind(self) -> None:
        # The first step runs inside the task (for an eager task, inside its
        # constructor): only now is "the current task" this task.
        self._bound = True
        task, kind = current_task_and_kind()
        if task is not None:
            self._records.lt.bind(task, kind)
            self._records.lt.current_name()
        publish_task(self._records.lt)  # in the task's own context, for the Python tracer

    def send(self, value: Any) -> Any:
        return self._step(self._coro.send, value)

    def throw(self, *args: Any) -> Any:
        return self._step(self._coro.throw, *args)

    def _step(self, advance: Callable[..., Any], *args: Any) -> Any:
        """One step of the task: stamp it, publish the task as the one
        stepping on this thread, and close the task's range when it ends."""
        if not self._bound:
            self._bind()
        records = self._records
        steps = records.steps
        prev = stepping.lt
        stepping.lt = records.lt
        steps.append(perf_counter_ns())
        try:
            return advance(*args)
        except StopIteration:
            self._finish("returned", None)
            raise
        except BaseException as exc:
            self._finish_exc(exc)
            raise
        finally:
            if len(steps) % 2 == 1:
                steps.append(perf_counter_ns())
            stepping.lt = prev

    def close(self) -> None:
        self._coro.close()

    def _finish(self, outcome: str, exc_name: str | None) -> None:
        steps = self._records.steps
        end = perf_counter_ns()
        if len(steps) % 2 == 1:
            steps.append(end)
        self._records.finished(outcome, exc_name, end)

    def _finish_exc(self, exc: BaseException) -> None:
        name = type(exc).__name__
        if isinstance(exc, asyncio.CancelledError):
            self._finish("cancelled", name)
        else:
            self._finish(f"raised {name}", name)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coro, name)

    def __repr__(self) -> str:
        return repr(self._coro)


Coroutine.register(TimedCoroutine)

TaskFactory = Callable[..., "asyncio.Future[Any]"]


class _Install:
    __slots__ = ("count", "factory", "prev")

    def __init__(self, prev: TaskFactory | None, factory: TaskFactory) -> None:
        self.count = 1
        self.prev = prev
        self.factory = factory


_installs: dict[asyncio.AbstractEventLoop, _Install] = {}
_lock = threading.Lock()


def _make_factory(prev: TaskFactory | None) -> TaskFactory:
    def aprof_task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        recorders = recorders_in(kwargs.get("context"))
        if recorders and asyncio.iscoroutine(coro):
            name = kwargs.get("name")
            lt = LogicalThread("asyncio", str(name) if name is not None else "Task")
            coro_name = coro_qualname(coro)
            records = spawn_records(recorders, lt, lt.name, coro_name)
            coro = TimedCoroutine(coro, records)
        if prev is not None:
            return prev(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    return aprof_task_factory


def install_task_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Install (or count one more user of) aprof's task factory on ``loop``."""
    with _lock:
        inst = _installs.get(loop)
        if inst is not None:
            inst.count += 1
            return
        prev = loop.get_task_factory()
        factory = _make_factory(prev)
        loop.set_task_factory(factory)
        _installs[loop] = _Install(prev, factory)


def uninstall_task_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Drop one user; the last one restores the previous factory."""
    with _lock:
        inst = _installs.get(loop)
        if inst is None:
            return
        inst.count -= 1
        if inst.count > 0:
            return
        del _installs[loop]
        if loop.get_task_factory() is inst.factory:
            loop.set_task_factory(inst.prev)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop running in this thread, if asyncio is in use."""
    import sys

    if "asyncio" not in sys.modules:
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------
# Loops created while a global profile runs (asyncio.run, uvloop.run, ...)
# ---------------------------------------------------------------------------

_hook_lock = threading.Lock()
_hook_users = 0
_original_lazy_init: Any = None
_hooked_loops: list[asyncio.AbstractEventLoop] = []


def hook_new_loops() -> Callable[[], None]:
    """Install the task factory on every loop ``asyncio.Runner`` creates from now on.

    ``asyncio.run`` and ``uvloop.run`` both go through ``asyncio.Runner``, so
    a global profile started before the program's loop exists (``aprof run``)
    still sees its tasks. Returns the undo action.
    """
    global _hook_users, _original_lazy_init
    import asyncio.runners

    with _hook_lock:
        _hook_users += 1
        if _hook_users == 1:
            original = _original_lazy_init = asyncio.runners.Runner._lazy_init  # type: ignore[attr-defined]

            def _lazy_init(self: Any) -> None:
                original(self)
                loop = getattr(self, "_loop", None)
                if loop is not None and loop not in _hooked_loops:
                    install_task_factory(loop)
                    _hooked_loops.append(loop)

            asyncio.runners.Runner._lazy_init = _lazy_init  # type: ignore[attr-defined]

    def undo() -> None:
        global _hook_users
        with _hook_lock:
            _hook_users -= 1
            if _hook_users > 0:
                return
            asyncio.runners.Runner._lazy_init = _original_lazy_init  # type: ignore[attr-defined]
            loops = list(_hooked_loops)
            _hooked_loops.clear()
        for loop in loops:
            uninstall_task_factory(loop)

    return undo


def _after_fork_in_child() -> None:
    global _lock, _hook_lock
    _lock = threading.Lock()
    _hook_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
