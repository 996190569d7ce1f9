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
from typing import Any, Final

from .._core import _threads, _tracer
from .._core._propagation import hook_to_thread
from .._core._threads import stepping
from ._tasks import TaskThread, coro_qualname, states_in

__all__ = ["TimedCoroutine", "install_task_factory", "uninstall_task_factory"]


class TimedCoroutine(TaskThread):
    """A coroutine proxy that records each step of the task driving it.

    It is the task's :class:`~aprof._integrations._tasks.TaskThread` too
    (one object per recorded task). The task sees a coroutine
    (``collections.abc.Coroutine`` is registered below); the coroutine's
    attributes (``cr_frame``, ``__qualname__``, ...) are read through to the
    wrapped coroutine, so reprs and ``task.get_stack()`` are unchanged.

    They are forwarded one by one (:data:`FORWARDED`), not by a
    ``__getattr__``: a class with ``__getattr__`` pays for it on every
    attribute read, its own slots included, which a step makes several of.
    """

    __slots__ = ("__qualname__", "_coro", "_task")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str, coro_name: str, states: Any) -> None:
        self._coro = coro
        # The task, from its creation until its first step (or its end): it
        # may be named only after the factory returns (3.11, 3.12), and a
        # task that never runs is named from it at stop. Held no longer, so
        # recording keeps no running task alive.
        self._task: Any = None
        qualname = getattr(coro, "__qualname__", None)
        if qualname is not None:
            self.__qualname__ = qualname
        TaskThread.__init__(self, "asyncio", name, coro_name, states)

    # A step publishes the task as the one stepping on this thread and
    # clears it after: the loop runs one task step at a time, and the one
    # nesting (an eager task's first step, inside its spawner's step) is
    # undone by the task factory, which restores the spawner.

    def send(self, value: Any, _now: Callable[[], int] = perf_counter_ns) -> Any:
        """One step of the task: stamp it, publish the task as the one
        stepping on this thread, and close the task's range when it ends."""
        steps = self.steps
        if not steps:
            self._first_step()
        stepping.lt = self
        steps.append(_now())
        try:
            result = self._coro.send(value)
        except BaseException as exc:
            stepping.lt = None
            self._ended(exc)
            raise
        steps.append(_now())
        stepping.lt = None
        return result

    def throw(self, *args: Any) -> Any:
        steps = self.steps
        if not steps:
            self._first_step()
        stepping.lt = self
        steps.append(perf_counter_ns())
        try:
            result = self._coro.throw(*args)
        except BaseException as exc:
            stepping.lt = None
            self._ended(exc)
            raise
        steps.append(perf_counter_ns())
        stepping.lt = None
        return result

    def close(self) -> None:
        self._coro.close()

    def _first_step(self) -> None:
        # The task is named by now: take its name and let it go. (An eager
        # task's first step runs inside its constructor, before the factory
        # has it: the factory keeps it instead, until its end.)
        task = self._task
        if task is not None:
            self._task = None
            self._name_from(task)
        if _tracer.running():
            _tracer.publish_task(self)  # in the task's own context, for the Python tracer

    def _name_from(self, task: Any) -> None:
        try:
            self.name = str(task.get_name())
        except Exception:  # a task subclass with an odd name: keep the old one
            pass

    def current_name(self) -> str:
        task = self._task
        if task is not None:
            self._name_from(task)
        return self.name

    def stopped(self) -> None:
        TaskThread.stopped(self)
        if self._state is None:
            self._task = None

    def _ended(self, exc: BaseException) -> None:
        end = perf_counter_ns()
        task, self._task = self._task, None
        if self._state is None:  # no profile records it any more
            return
        # The task may have been renamed while it ran: its name now.
        if task is None:
            task = _threads._asyncio_task()
            if task is not None and getattr(task, "get_coro", None) is not None and task.get_coro() is not self:
                task = None
        if task is not None:
            self._name_from(task)
        if isinstance(exc, StopIteration):
            self.finished("returned", None, end)
            return
        name = type(exc).__name__
        if isinstance(exc, asyncio.CancelledError):
            self.finished("cancelled", name, end)
        else:
            self.finished(f"raised {name}", name, end)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    @property
    def __name__(self) -> str:  # in the class body: a type's __name__ cannot be set to a property
        return getattr(self._coro, "__name__")  # type: ignore[no-any-return]  # noqa: B009

    def __repr__(self) -> str:
        return repr(self._coro)


#: The wrapped coroutine's attributes a TimedCoroutine reads through (those of
#: native and generator-based coroutines, with ``__name__`` and the
#: ``__qualname__`` slot); one it lacks raises AttributeError here too, so
#: ``hasattr`` answers as for the coroutine itself.
FORWARDED: Final = (
    "cr_await", "cr_code", "cr_frame", "cr_origin", "cr_running", "cr_suspended",
    "gi_code", "gi_frame", "gi_running", "gi_suspended", "gi_yieldfrom",
)  # fmt: skip


def _forward(name: str) -> property:
    def get(self: TimedCoroutine) -> Any:
        return getattr(self._coro, name)

    get.__name__ = name
    return property(get)


for _name in FORWARDED:
    setattr(TimedCoroutine, _name, _forward(_name))
del _name

Coroutine.register(TimedCoroutine)

TaskFactory = Callable[..., "asyncio.Future[Any]"]


class _Install:
    __slots__ = ("count", "factory", "prev", "undo_to_thread")

    def __init__(self, prev: TaskFactory | None, factory: TaskFactory) -> None:
        self.count = 1
        self.prev = prev
        self.factory = factory
        self.undo_to_thread = hook_to_thread()


_installs: dict[asyncio.AbstractEventLoop, _Install] = {}
_lock = threading.Lock()


_ASYNCIO_DIR: Final = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep


def _machinery(coro: Any) -> bool:
    """The loop's own tasks, made outside any task: ``asyncio.run`` shutting
    down (``shutdown_asyncgens``, ``shutdown_default_executor``), in
    asyncio's files or uvloop's."""
    code = getattr(coro, "cr_code", None)
    if code is None:
        return False
    filename: str = code.co_filename
    return filename.startswith(_ASYNCIO_DIR) or filename.startswith("uvloop/")


def _make_factory(prev: TaskFactory | None) -> TaskFactory:
    iscoroutine = asyncio.iscoroutine
    Task = asyncio.Task

    def aprof_task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        states = states_in(kwargs.get("context"))
        spawner = stepping.lt
        if not states or not iscoroutine(coro) or (spawner is None and _machinery(coro)):
            if prev is not None:
                return prev(loop, coro, **kwargs)
            return Task(coro, loop=loop, **kwargs)
        name = kwargs.get("name")
        proxy = TimedCoroutine(coro, "Task" if name is None else str(name), coro_qualname(coro), states)
        task = prev(loop, proxy, **kwargs) if prev is not None else Task(proxy, loop=loop, **kwargs)
        # An eager task ran its first step inside: its steps leave no task stepping.
        stepping.lt = spawner
        if proxy._state is not None:  # not finished (an eager task may have)
            proxy._task = task
        return task

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
        inst.undo_to_thread()


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
_loop_listeners: list[Callable[[asyncio.AbstractEventLoop], None]] = []


def _patch_runner() -> None:
    # Under _hook_lock, when the first user or listener arrives.
    global _original_lazy_init
    import asyncio.runners

    original = _original_lazy_init = asyncio.runners.Runner._lazy_init  # type: ignore[attr-defined]

    def _lazy_init(self: Any) -> None:
        # Called by every run() and get_loop(), not only the first that
        # makes the loop: a runner made before the profile started (a test
        # fixture's) is hooked when it is next used. Listeners see a loop
        # once per call, and keep track of the loops they have seen.
        original(self)
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        with _hook_lock:
            hook = _hook_users > 0 and loop not in _hooked_loops
            if hook:
                _hooked_loops.append(loop)
            listeners = list(_loop_listeners)
        if hook:
            install_task_factory(loop)
        for listener in listeners:
            listener(loop)

    asyncio.runners.Runner._lazy_init = _lazy_init  # type: ignore[attr-defined]


def _unpatch_runner() -> None:
    # Under _hook_lock, when the last user and listener are gone.
    import asyncio.runners

    asyncio.runners.Runner._lazy_init = _original_lazy_init  # type: ignore[attr-defined]


def hook_new_loops() -> Callable[[], None]:
    """Install the task factory on every loop ``asyncio.Runner`` creates from now on.

    ``asyncio.run`` and ``uvloop.run`` both go through ``asyncio.Runner``, so
    a global profile started before the program's loop exists (``aprof run``)
    still sees its tasks. Returns the undo action.
    """
    global _hook_users
    with _hook_lock:
        _hook_users += 1
        if _hook_users == 1 and not _loop_listeners:
            _patch_runner()

    def undo() -> None:
        global _hook_users
        with _hook_lock:
            _hook_users -= 1
            if _hook_users > 0:
                return
            if not _loop_listeners:
                _unpatch_runner()
            loops = list(_hooked_loops)
            _hooked_loops.clear()
        for loop in loops:
            uninstall_task_factory(loop)

    return undo


def on_new_loops(listener: Callable[[asyncio.AbstractEventLoop], None]) -> Callable[[], None]:
    """Call ``listener(loop)`` whenever an ``asyncio.Runner`` makes or hands out its loop.

    The same loop comes again on each ``Runner.run``: the listener skips
    the loops it has seen.

    The global profile's loop-block watch starts this way on the program's
    loop. Returns the undo action.
    """
    with _hook_lock:
        if not _loop_listeners and _hook_users == 0:
            _patch_runner()
        _loop_listeners.append(listener)

    def undo() -> None:
        with _hook_lock:
            if listener in _loop_listeners:
                _loop_listeners.remove(listener)
                if not _loop_listeners and _hook_users == 0:
                    _unpatch_runner()

    return undo


def _after_fork_in_child() -> None:
    global _lock, _hook_lock
    _lock = threading.Lock()
    _hook_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
