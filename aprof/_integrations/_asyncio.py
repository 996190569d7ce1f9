"""asyncio and uvloop tasks (SPEC 7.1-7.3), recorded without changing what the program sees (SPEC 15.6).

aprof touches no task, no coroutine and no task factory. While at least one
running profile records tasks, three hooks are in place:

* **Creation.** Every task, made by any path (``loop.create_task``, a task
  factory, the bare ``asyncio.Task(coro, loop=loop)`` constructor, uvloop),
  registers itself in asyncio's module-level ``WeakSet`` of tasks
  (``asyncio.tasks._scheduled_tasks`` on 3.12+, ``_all_tasks`` on 3.11)
  through the set's ``add`` method, looked up on the set: an ``add`` set on
  that one set object sees each task synchronously, in its spawner's
  context and step. A task whose own context (``task.get_context()`` on
  3.12+; on 3.11 the context its constructor schedules its first step with)
  carries a profile recording tasks gets a :class:`TaskThread` (its track,
  its spawn link and its TASK record), kept on the task.
* **Steps.** A task schedules every step and wakeup through
  ``loop.call_soon(callback, ..., context=...)``, looked up on the loop, so
  a ``call_soon`` set on the loop object sees each of them. The steps of a
  recorded task are handed on wrapped in a callable that stamps the step's
  start and end and publishes the task as the one stepping on this OS
  thread; everything else is handed on untouched. The wrapper's repr and
  attributes are the callback's, so ``Handle`` reprs and asyncio's debug
  messages do not change. A loop is hooked when a profile starts on it,
  when a global profile sees ``asyncio.Runner`` make it, or when a recorded
  task is first created on it.
* **Eager first steps** (3.12+, with the C extension). An eager task's first
  step runs inside its constructor, before it registers, and not through
  ``call_soon``; asyncio swaps its current task around that step, and a
  dict watcher on the current-task table sees the swap: the child is
  recorded there, and that step is timed exactly.

Both hot paths (the ``call_soon`` hook and the step wrapper) are in C
(``aprof/_ctasks.c``); the classes below are their pure-Python twins, used
when the extension is missing or ``APROF_PURE_PYTHON=1``. The hooks go when
the last profile recording tasks stops; nothing holds a loop (SPEC 12).
"""

from __future__ import annotations

import asyncio
import asyncio.tasks
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Final

from .._core import _native, _ring, _threads, _tracer
from .._core._callbacks import EMPTY_RF_STATE, RF_STATE, RFState
from .._core._propagation import hook_to_thread
from .._core._recorder import ProfilerState, Recorder
from .._core._threads import LogicalThread, stepping
from .._frames import _library_cache, is_library_cached
from . import _await_chain
from ._await_chain import WaitLog
from ._tasks import (
    _NO_RECORDS,
    DISCARD_STEPS,
    TaskThread,
    _c_user_site,
    _ids,
    _sequence_numbers,
    coro_qualname,
    global_task_recorders,
    note_wait,
    states_in,
)
from ._tasks import report as _report

__all__ = ["hook_loop", "hook_new_loops", "install", "on_new_loops", "running_loop"]

_ext = _native.extension
_TASK_ATTR: Final = _threads._TASK_ATTR
_HAS_GET_CONTEXT: Final = sys.version_info >= (3, 12)

#: The Task classes whose steps are recognised: the C Task (and its
#: subclasses) and the pure-Python one.
_CTask: Final = asyncio.Task
_PyTask: Final[Any] = getattr(asyncio.tasks, "_PyTask", None)
_TASK_TYPES: Final = (_CTask, _PyTask) if _PyTask is not None and _PyTask is not _CTask else (_CTask,)
# The Python Task's step and wakeup (name-mangled in its class body).
_PY_STEP: Final = getattr(_PyTask, "_Task__step", None)
_PY_WAKEUP: Final = getattr(_PyTask, "_Task__wakeup", None)


def _registry() -> Any:
    """asyncio's module-level set of tasks, whose ``add`` every new task calls."""
    return asyncio.tasks._scheduled_tasks if _HAS_GET_CONTEXT else asyncio.tasks._all_tasks  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Recording: creation, eager first steps, ends
# ---------------------------------------------------------------------------

#: getattr default: a task aprof has not seen (its attribute is absent; None
#: once seen and not recorded).
_UNSEEN: Final = object()


#: A step after a wait this long has its await chain described (WaitLog.min_ns).
_WAIT_MIN_NS: Final = WaitLog.min_ns

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


def _name_of(task: Any) -> str:
    try:
        return str(task.get_name())
    except Exception:  # a task subclass with an odd name
        return "Task"


def _not_started(coro: Any) -> bool:
    """Whether ``coro`` has not run yet (a task's first step is still to come)."""
    if type(coro) is types.CoroutineType:  # the common case, without the attribute probing
        return not coro.cr_running and not coro.cr_suspended
    running = getattr(coro, "cr_running", None)
    if running is None:  # a generator-based coroutine, or another awaitable
        running = getattr(coro, "gi_running", False)
        suspended = getattr(coro, "gi_suspended", False)
    else:
        suspended = getattr(coro, "cr_suspended", False)
    return not running and not suspended


def _record(task: Any, ctx: Any, new_only: bool, lt: Any = None) -> TaskThread | None:
    """Record ``task`` if a running profile wants it (from ``ctx``, its
    context, or the current one if None); mark it seen either way.

    ``new_only``: only a task whose coroutine has not started (one being
    created now; a task that ran before aprof looked is not a spawn).
    ``lt``: the task's aprof attribute if the caller read it (_UNSEEN).
    """
    if lt is None:
        lt = getattr(task, _TASK_ATTR, _UNSEEN)
        if type(lt) is TaskThread:
            return None
    states = states_in(ctx)
    if states and isinstance(lt, LogicalThread):
        # A task is never a TASK range of the profile it started itself (a
        # profile started in an eager task's first step, seen at its end).
        states = [ps for ps in ((states,) if type(states) is ProfilerState else states) if ps.start_lt is not lt]  # type: ignore[union-attr]
    coro = task.get_coro() if states else None
    if (
        not states
        or (new_only and not _not_started(coro))  # a task that ran before aprof looked: not one spawned now
        # (inside a step of a recorded task: not the loop's own machinery)
        or (stepping.lt is None and _machinery(coro) and _threads._asyncio_task() is None)
    ):
        if lt is _UNSEEN:
            setattr(task, _TASK_ATTR, None)  # seen: not asked again at each step
        return None
    tt = TaskThread("asyncio", _name_of(task), coro_qualname(coro), states)
    if isinstance(lt, LogicalThread):
        tt.adopt(lt)
    tt.bind(task, "asyncio")
    return tt


def _first_scheduled(task: Any, ctx: Any) -> TaskThread | None:
    """(call_soon hook) A task aprof has not seen schedules a step: a new
    task's first one, from its constructor, with its own context."""
    try:
        if not _EAGER_WATCHED and _HAS_GET_CONTEXT and not _not_started(task.get_coro()):
            tt = _unseen_task(task)  # perhaps an eager task's first step, scheduling its next
            if tt is not None:
                return tt
        return _record(task, ctx, True, _UNSEEN)
    except Exception as exc:
        _report("task creation", exc)
        return None


def _task_created(task: Any) -> None:
    """A task registered itself in asyncio's set of tasks.

    On a hooked loop it was recorded (or not) when it scheduled its first
    step; this sees the rest: a task on a loop aprof has not hooked yet
    (whose first step then runs untimed: the loop is hooked now), and (on
    the paths without the eager watch) an eager task still pending after
    its first step. 3.11 has no ``task.get_context()``: there such a task is
    decided from the context it is created in.
    """
    try:
        if not isinstance(task, _TASK_TYPES):
            return
        if _open_eager.steps:
            _close_eager_steps(task)
        lt = getattr(task, _TASK_ATTR, _UNSEEN)
        if lt is None or type(lt) is TaskThread:
            return  # seen at its first step (or an eager one's, watched)
        ctx = task.get_context() if _HAS_GET_CONTEXT else None  # type: ignore[union-attr]  # 3.12+
        tt = _record(task, ctx, new_only=False)
        if tt is not None:
            hook_loop(task.get_loop())
    except Exception as exc:
        _report("task creation", exc)


def _eager_started(task: Any, spawner: Any) -> TaskThread | None:
    """(C eager watch, 3.12+) ``task``'s eager first step starts inside
    ``spawner``'s step: record the task now if its context asks."""
    try:
        tt = _record(task, task.get_context(), new_only=True)
        if tt is not None:
            hook_loop(task.get_loop())  # its later steps
            if _tracer.running():
                task.get_context().run(_tracer.publish_task, tt)  # for the Python tracer
        return tt
    except Exception as exc:
        _report("eager task", exc)
        return None


def _first_step(tt: TaskThread) -> None:
    """A recorded task's first step, in its own context, while the tracer runs."""
    if _tracer.running():
        _tracer.publish_task(tt)


def _task_done(tt: TaskThread, task: Any) -> None:
    """The task finished in the step that just ended: close its TASK record."""
    end = perf_counter_ns()
    if tt._state is None:  # no profile records it any more
        return
    tt.name = _name_of(task)
    if task.cancelled():
        tt.finished("cancelled", "CancelledError", end)
        return
    exc = task._exception  # not exception(): that would mark it retrieved
    if exc is None:
        tt.finished("returned", None, end)
    else:
        name = type(exc).__name__
        tt.finished(f"raised {name}", name, end)


# ---------------------------------------------------------------------------
# The pure-Python twins of aprof/_ctasks.c
# ---------------------------------------------------------------------------


def _task_of(callback: Any) -> tuple[Any, bool]:
    """The task whose step (True) or wakeup (False) ``callback`` is, else (None, False)."""
    self = getattr(callback, "__self__", None)
    if self is None or not isinstance(self, _TASK_TYPES):
        return None, False
    if type(callback).__name__ == "TaskStepMethWrapper":
        return self, True
    name = getattr(callback, "__name__", None)
    if name == "task_wakeup":
        return self, False
    func = getattr(callback, "__func__", None)
    if func is not None and func is _PY_STEP:
        return self, True
    if func is not None and func is _PY_WAKEUP:
        return self, False
    return None, False


class _OpenEager(threading.local):
    # The twin's eager first steps in progress on this thread (no eager
    # watch): (task, its TaskThread), oldest first.
    steps: list[tuple[Any, TaskThread]]

    def __init__(self) -> None:
        self.steps = []


_open_eager = _OpenEager()


def _unseen_task(task: Any) -> TaskThread | None:
    """(Without the eager watch: the twin) a running task aprof has not seen,
    asked by the logical-thread lookup or by its first ``call_soon``: if it
    is an eager task in its first step (in asyncio's set of eager tasks
    exactly then), record it now, its first step stamped from here to its
    registration or its spawner's step end. The spawner is the task whose
    step is published on this thread, if aprof records it; else the
    profile's starting thread (a twin cannot see which task ran before)."""
    if _EAGER_WATCHED or not _users or task not in _eager_tasks():
        return None
    try:
        states = states_in(task.get_context())
        if not states:
            return None
        spawner = stepping._lt
        if spawner is None or stepping._task is task:
            first = states if type(states) is ProfilerState else states[0]  # type: ignore[index]
            spawner = first.start_lt
        tt = TaskThread("asyncio", _name_of(task), coro_qualname(task.get_coro()), states, spawner=spawner)
        tt.bind(task, "asyncio")
        tt.steps.append(perf_counter_ns())
        _open_eager.steps.append((task, tt))
        return tt
    except Exception as exc:
        _report("eager task", exc)
        return None


def _eager_tasks() -> Any:
    return asyncio.tasks._eager_tasks  # type: ignore[attr-defined]


def _close_eager_steps(task: Any = None) -> None:
    """End the open eager first steps: ``task``'s (it registered: its first
    step is over), or all of them (their spawner's step is over)."""
    now = perf_counter_ns()
    keep = []
    for t, tt in _open_eager.steps:
        if task is not None and t is not task:
            keep.append((t, tt))
            continue
        if len(tt.steps) % 2:
            tt.steps.append(now)
        if t.done():
            _task_done(tt, t)
    _open_eager.steps = keep


class _PyStepCall:
    """A recorded task's step or wakeup, timed (twin of ``_ctasks.c`` StepCall)."""

    __slots__ = ("_cb", "_ready", "_task", "_tt")

    def __init__(self, cb: Any, task: Any, tt: TaskThread) -> None:
        self._cb = cb
        self._task = task
        self._tt = tt
        self._ready = perf_counter_ns()  # the task's wait ended: the loop was asked to run it

    def __call__(self, *args: Any) -> Any:
        tt, task, cb = self._tt, self._task, self._cb
        steps = tt.steps
        if _tracer.running() and not steps:
            _first_step(tt)
        prev_lt, prev_task = stepping._lt, stepping._task
        stepping.publish(tt, task)
        n = len(steps)
        if n and not n % 2 and self._ready - steps[-1] >= _WAIT_MIN_NS:
            # The wait ended when the step was scheduled (its time in the
            # loop's queue is the loop's); the coroutine still waits there.
            note_wait(tt, task, steps[-1], self._ready)
        steps.append(perf_counter_ns())
        try:
            return cb(*args)
        finally:
            steps.append(perf_counter_ns())
            stepping._lt, stepping._task = prev_lt, prev_task
            try:
                if _open_eager.steps:
                    _close_eager_steps()
                if task.done():
                    _task_done(tt, task)
            except Exception as exc:
                _report("task end", exc)
            # As asyncio's Handle._run does: a frame of the step may live on
            # in a traceback, and must not hold the task (a cycle). The
            # wrapper itself holds it until the loop lets go of the handle,
            # as it would hold the callback without aprof.
            self = task = cb = prev_task = None  # type: ignore[assignment]
            args = ()

    # Everything but calling it reads as the wrapped callback.
    def __getattr__(self, name: str) -> Any:
        return getattr(self._cb, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: PLE0307
        return type(self._cb)

    def __repr__(self) -> str:
        return repr(self._cb)


class _PyCallSoonHook:
    """A loop's ``call_soon`` that times recorded tasks' steps (twin of ``_ctasks.c`` CallSoonHook)."""

    __slots__ = ("__weakref__", "_func", "_loop", "_own")

    def __init__(self, call_soon: Callable[..., Any]) -> None:
        # The loop holds its hook: hold it weakly (see CallSoonHook in C).
        self._own: Any = call_soon
        self._func: Any = None
        self._loop: Any = None
        if isinstance(call_soon, types.MethodType):
            try:
                self._loop = weakref.ref(call_soon.__self__)
            except TypeError:  # a loop without weak references: hold it
                return
            self._func, self._own = call_soon.__func__, None

    @property
    def _aprof_call_soon(self) -> Any:
        if self._own is not None:
            return self._own
        loop = self._loop()
        if loop is None:
            raise RuntimeError("call_soon of an event loop that no longer exists")
        return types.MethodType(self._func, loop)

    def __call__(self, callback: Any, *args: Any, context: Any = None) -> Any:
        task, is_step = _task_of(callback)
        if task is not None:
            lt = getattr(task, _TASK_ATTR, _UNSEEN)
            if lt is _UNSEEN and is_step:
                lt = _first_scheduled(task, context)
            if type(lt) is TaskThread and lt._state is not None:
                callback = _PyStepCall(callback, task, lt)
        if self._own is not None:
            handle = self._own(callback, *args, context=context)
        else:
            loop = self._loop()
            if loop is None:
                raise RuntimeError("call_soon of an event loop that no longer exists")
            handle = self._func(loop, callback, *args, context=context)
        # In debug mode the handle remembers where it was created: not here.
        tb = getattr(handle, "_source_traceback", None)
        if tb and isinstance(tb, list) and getattr(tb[-1], "filename", None) == __file__:
            del tb[-1]
        return handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aprof_call_soon, name)

    def __repr__(self) -> str:
        return repr(self._aprof_call_soon)


if _ext is not None:
    CallSoonHook: Any = _ext.CallSoonHook
    _ext._tasks_setup(
        TaskThread, _TASK_ATTR, _CTask, _PyTask, _PY_STEP, _PY_WAKEUP,
        _first_scheduled, _first_step, _task_done, _eager_started, _tracer.publishing, note_wait, _WAIT_MIN_NS,
    )  # fmt: skip
    # A C Task's end, recorded by one profile: _task_done and
    # TaskThread.finished in C (the twins below and in _tasks.py do the rest).
    _ext._task_finish_setup(_NO_RECORDS, DISCARD_STEPS)
    # A long wait of a C Task at a call site already described: note_wait,
    # wait_at and WaitLog.add in C (the twins do the rest).
    _ext._waits_setup(WaitLog, _await_chain._sites, _await_chain.wait_at, asyncio.Future)
    # A new C Task spawned inside a recorded task's step, recorded by one
    # profile: _record and TaskThread.__init__ in C (the twins do the rest).
    if _c_user_site is not None:
        _ext._task_create_setup(
            states_in, _ids, _sequence_numbers, ProfilerState, _c_user_site, _library_cache, is_library_cached,
            coro_qualname, _ring.TASK,
        )  # fmt: skip
        # states_in's common cases (one profile, or none), in C.
        _ext._states_setup(RF_STATE, EMPTY_RF_STATE, RFState, Recorder, global_task_recorders)
else:
    CallSoonHook = _PyCallSoonHook


# ---------------------------------------------------------------------------
# Installing: process-wide while a profile records tasks, loops weakly
# ---------------------------------------------------------------------------

_lock = threading.RLock()
_users = 0  # running profiles that record tasks
_EAGER_WATCHED = False  # the C eager watch is on
_undo_active: list[Callable[[], None]] = []
#: id(loop) -> the hook set on it (weakly: the loop holds its hook, nothing
#: here holds the loop, and uvloop's loops cannot be weakly referenced).
_hooks: dict[int, weakref.ref[Any]] = {}


# The hooks are set and removed with setattr/delattr and found with getattr,
# never through ``__dict__``: reading an object's ``__dict__`` makes CPython
# (3.11+) build it as a real dict, after which every attribute access on the
# object (the loop's ``self._ready``, ``self._debug``, ... at every step) is
# slower, for good (SPEC 15.6).


def _is_hooked(loop: Any) -> bool:
    return type(getattr(loop, "call_soon", None)) is CallSoonHook


def hook_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Time the steps of recorded tasks on ``loop`` (while a profile records tasks)."""
    if _is_hooked(loop):
        return
    with _lock:
        if not _users or _is_hooked(loop):
            return
        own = getattr(loop, "call_soon", None)
        cls_call_soon = getattr(type(loop), "call_soon", None)
        if own is None or cls_call_soon is None or own != cls_call_soon.__get__(loop, type(loop)):
            return  # the program set its own call_soon on this loop: leave it alone
        hook = CallSoonHook(own)
        try:
            loop.call_soon = hook  # type: ignore[method-assign]
        except AttributeError:  # a loop without instance attributes
            return
        key = id(loop)

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            if _hooks.get(key) is ref:
                del _hooks[key]

        _hooks[key] = weakref.ref(hook, forget)


def _unhook_all() -> None:
    # Under _lock, when the last user leaves.
    hooks = [ref() for ref in _hooks.values()]
    _hooks.clear()
    for hook in hooks:
        if hook is None:
            continue
        try:
            loop = getattr(hook._aprof_call_soon, "__self__", None)
        except RuntimeError:  # its loop is gone
            continue
        if loop is not None and getattr(loop, "call_soon", None) is hook:
            try:
                del loop.call_soon
            except AttributeError:
                pass


def _activate() -> None:
    # Under _lock, when the first user arrives.
    ws = _registry()
    add = type(ws).add.__get__(ws)
    if _ext is not None:
        add_and_record: Any = _ext.AddHook(add, _task_created)
    else:

        def add_and_record(item: Any) -> None:
            add(item)
            _task_created(item)

    if ws.add == add:  # not set by the program (or another tool)
        ws.add = add_and_record

    def remove_add() -> None:
        if ws.add is add_and_record:
            del ws.add

    _undo_active.append(remove_add)
    global _EAGER_WATCHED
    if _ext is not None and _ext._watch_eager(asyncio.tasks._current_tasks):  # type: ignore[attr-defined]
        _EAGER_WATCHED = True

        def unwatch() -> None:
            global _EAGER_WATCHED
            _EAGER_WATCHED = False
            _ext._watch_eager(None)

        _undo_active.append(unwatch)
    elif _HAS_GET_CONTEXT:
        _threads.unseen_asyncio_task = _unseen_task

        def forget_unseen() -> None:
            _threads.unseen_asyncio_task = None
            _open_eager.steps = []

        _undo_active.append(forget_unseen)
    _undo_active.append(hook_to_thread())
    _undo_active.append(_unhook_all)


def install(global_scope: bool) -> Callable[[], None]:
    """One more running profile records asyncio tasks; returns its undo action.

    The first one installs the hooks; the last one to undo removes them all.
    The loop running here, if any, is hooked now; a global profile also
    hooks every loop ``asyncio.Runner`` makes while it runs.
    """
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            try:
                _activate()
            except BaseException:
                _users -= 1
                actions = list(reversed(_undo_active))
                _undo_active.clear()
                for action in actions:
                    action()
                raise
    loop = running_loop()
    if loop is not None:
        hook_loop(loop)
    undo_runner = hook_new_loops() if global_scope else None
    done = False

    def undo() -> None:
        global _users
        nonlocal done
        if undo_runner is not None:
            undo_runner()
        with _lock:
            if done:
                return
            done = True
            _users -= 1
            if _users == 0:
                actions = list(reversed(_undo_active))
                _undo_active.clear()
                for action in actions:
                    action()

    return undo


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop running in this thread, if asyncio is in use."""
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
            hook = _hook_users > 0
            listeners = list(_loop_listeners)
        if hook:
            hook_loop(loop)
        for listener in listeners:
            listener(loop)

    asyncio.runners.Runner._lazy_init = _lazy_init  # type: ignore[attr-defined]


def _unpatch_runner() -> None:
    # Under _hook_lock, when the last user and listener are gone.
    import asyncio.runners

    asyncio.runners.Runner._lazy_init = _original_lazy_init  # type: ignore[attr-defined]


def hook_new_loops() -> Callable[[], None]:
    """Hook every loop ``asyncio.Runner`` creates or hands out from now on.

    ``asyncio.run`` and ``uvloop.run`` both go through ``asyncio.Runner``, so
    a global profile started before the program's loop exists (``aprof run``)
    times its main task from the first step. Returns the undo action.
    """
    global _hook_users
    with _hook_lock:
        _hook_users += 1
        if _hook_users == 1 and not _loop_listeners:
            _patch_runner()
    done = False

    def undo() -> None:
        global _hook_users
        nonlocal done
        with _hook_lock:
            if done:
                return
            done = True
            _hook_users -= 1
            if _hook_users == 0 and not _loop_listeners:
                _unpatch_runner()

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
    _lock = threading.RLock()
    _hook_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
