"""Logical threads: what is running Python code right now.

A *logical thread* is an asyncio task, a trio task, or an OS thread when no
task is running on it. Each gets a small integer id, unique for the life of
the process, the first time aprof needs to know it.

This lookup runs on every recorded event, so it avoids the Python-level
``asyncio.current_task()`` (about 230 ns on 3.11, because the 3.11 version is
a Python wrapper) and goes straight to the C primitives underneath it: the
running loop is a thread-state read and the current task a dict lookup, about
50 ns together. The logical thread object is cached on the task itself, so a
task's id is computed once.

trio is detected, never imported: only once ``trio`` is in ``sys.modules`` do
we look at its per-thread run context.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from contextvars import ContextVar
from typing import Any, Final

from . import _native


def _detect_asyncio() -> Any:
    """Stand-in for "the running asyncio task" until asyncio is imported.

    aprof must not import ``_asyncio`` itself: importing the C module before
    ``asyncio`` leaves asyncio's Python side with a different current-task
    table (3.11 and 3.12), which breaks ``TaskGroup`` and ``current_task()``.
    So we bind asyncio's C primitives only once the program has imported
    asyncio; until then no task can be running.
    """
    if "asyncio" not in sys.modules:
        return None
    return _bind_asyncio()()


class _LoopCache(threading.local):
    # A weak reference to the thread's running loop (3.11): a finished loop
    # is never kept alive by the cache. uvloop's loops cannot be weakly
    # referenced, and are looked up each time.
    loop: Any = None


def _bind_asyncio() -> Any:
    global _asyncio_task
    import asyncio.events
    import asyncio.tasks

    running_loop = asyncio.events._get_running_loop
    if sys.version_info >= (3, 12):
        global _asyncio_fns
        current_task = asyncio.tasks.current_task  # the C function on 3.12+
        _asyncio_fns = (running_loop, current_task)  # read by the C range path

        def task_312() -> Any:
            loop = running_loop()
            return None if loop is None else current_task(loop)

        _asyncio_task = task_312
    else:
        # 3.11's C _get_running_loop() makes a getpid() system call (~250 ns
        # here), so look only when some task is running somewhere, and keep
        # the thread's loop while it is running (BaseEventLoop._thread_id).
        global _current_tasks_311
        current_tasks = _current_tasks_311 = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
        get_ident = threading.get_ident
        cache = _loop_cache

        def task_311() -> Any:
            if not current_tasks:
                return None
            ref = cache.loop
            loop = ref() if ref is not None else None
            if loop is None or getattr(loop, "_thread_id", None) != get_ident():
                loop = _find_loop_311(current_tasks, running_loop, get_ident())
                if loop is None:
                    return None
                try:
                    cache.loop = weakref.ref(loop)
                except TypeError:  # uvloop
                    cache.loop = None
            return current_tasks.get(loop)

        _asyncio_task = task_311
    return _asyncio_task


_NO_THREAD_ID: Final = object()


def _find_loop_311(current_tasks: dict[Any, Any], running_loop: Any, me: int) -> Any:
    """The loop of this thread among those running a task now, or None (3.11).

    A task runs in this thread only if its loop runs here. asyncio's loops say
    which thread runs them (``BaseEventLoop._thread_id``), so a worker thread
    with no loop is answered without ``_get_running_loop()`` and its
    getpid() system call; a loop that does not say (uvloop) falls back to it.
    """
    unknown = False
    for loop in list(current_tasks):  # list(dict) is one C call: no concurrent-change error
        tid = getattr(loop, "_thread_id", _NO_THREAD_ID)
        if tid == me:
            return loop
        if tid is _NO_THREAD_ID:
            unknown = True
    return running_loop() if unknown else None


#: () -> the asyncio task running in this thread, or None.
_asyncio_task: Any = _detect_asyncio
#: 3.12+, once asyncio is bound: (_get_running_loop, current_task), the C
#: functions underneath; the C range path (aprof/_cranges.c) calls them.
_asyncio_fns: tuple[Any, Any] | None = None

# 3.11 only: the last task logical thread found in this context, checked
# against asyncio's current-task table instead of being looked up again.
_HINTS: Final = sys.version_info < (3, 12)
_hint: ContextVar[LogicalThread | None] = ContextVar("aprof.logical_thread_hint", default=None)
_loop_cache = _LoopCache()
_current_tasks_311: dict[Any, Any] | None = None  # asyncio's table, once bound
_get_ident = threading.get_ident

__all__ = ["LogicalThread", "current_logical_thread", "current_thread_id"]

#: Attribute under which a task caches its logical thread.
_TASK_ATTR: Final = "_aprof_logical_thread"

_ids = itertools.count(1)  # next() on a count is atomic under the GIL.
_tls = threading.local()


class _Stepping(threading.local):
    """The logical thread whose step is running on this OS thread, if known.

    Set by aprof's task hooks around every step of a task they record (the
    asyncio step wrapper, the trio instrument). It lets the hot path skip the
    running-loop lookup, which on 3.11 makes a getpid() system call. With the
    C extension the slot lives in C thread-local storage (same ``.lt``
    attribute), where the C range path reads it with one load.

    An asyncio step publishes its task too (:meth:`publish`): on 3.12+ an
    eager task runs its first step inside its spawner's step, and there
    ``lt`` reads as ``None`` (the lookup then asks asyncio which task runs),
    so the child's ranges never land on the spawner's track. The C slot
    checks the same by comparing the running context with the published one.
    """

    _lt: LogicalThread | None = None
    _task: Any = None

    @property
    def lt(self) -> LogicalThread | None:
        lt = self._lt
        task = self._task
        if task is not None and lt is not None and _asyncio_task() is not task:
            return None
        return lt

    @lt.setter
    def lt(self, value: LogicalThread | None) -> None:
        self._lt = value
        self._task = None

    def publish(self, lt: LogicalThread | None, task: Any) -> None:
        """Publish ``lt`` as stepping for ``task``'s step (an asyncio task)."""
        self._lt = lt
        self._task = task if _EAGER_TASKS else None


#: Whether asyncio can run a task's step inside another's (eager tasks, 3.12+).
_EAGER_TASKS: Final = sys.version_info >= (3, 12)

stepping: _Stepping = _native.extension.stepping if _native.extension is not None else _Stepping()


class LogicalThread:
    """One row of the timeline: a task, or an OS thread outside any task.

    Holds no strong reference to the task, so recording never keeps a user's
    task alive.
    """

    __slots__ = ("__weakref__", "_task_ref", "id", "kind", "name", "os_thread_id")

    id: int
    kind: str  # "asyncio", "trio" or "thread"
    name: str
    os_thread_id: int

    def __init__(self, kind: str, name: str, task: object | None = None) -> None:
        self.id = next(_ids)
        self.kind = kind
        self.name = name
        self.os_thread_id = threading.get_ident()
        self._task_ref = weakref.ref(task) if task is not None else None

    def bind(self, task: object, kind: str) -> None:
        """Make this the logical thread of ``task`` (created before the task was)."""
        self.kind = kind
        self._task_ref = weakref.ref(task)
        try:
            setattr(task, _TASK_ATTR, self)
        except AttributeError:  # a task class with __slots__: keep it in a side table
            _side_table[id(task)] = self
            weakref.finalize(task, _side_table.pop, id(task), None)

    def current_name(self) -> str:
        """The task's (or the thread's) name now (both can be renamed), else
        the name it had."""
        ref = self._task_ref
        task = ref() if ref is not None else None
        if task is not None:
            name = getattr(task, "get_name", None)
            try:
                self.name = str(name() if name is not None else task.name)  # type: ignore[attr-defined]
            except Exception:  # a task subclass with an odd name: keep the old one
                pass
        return self.name

    def __repr__(self) -> str:
        return f"<LogicalThread {self.id} {self.kind} {self.name!r}>"


# trio's per-thread run context, found once trio has been imported.
_trio_run_context: Any = None


def _find_trio_run_context() -> Any:
    global _trio_run_context
    if "trio" not in sys.modules:
        return None
    # trio keeps the running task in a thread-local; trio.lowlevel.current_task()
    # reads the same attribute but raises outside a task, which would cost an
    # exception on every event of a plain thread.
    try:
        from trio._core import _run

        ctx: Any = _run.GLOBAL_RUN_CONTEXT
    except Exception:  # pragma: no cover - a trio without it: fall back to threads
        ctx = threading.local()
    _trio_run_context = ctx
    return ctx


def _new_task_thread(task: Any, kind: str) -> LogicalThread:
    name = task.get_name() if kind == "asyncio" else task.name
    lt = LogicalThread(kind, str(name))
    lt.bind(task, kind)
    return lt


_side_table: dict[int, LogicalThread] = {}

#: Set by the asyncio task hooks while they run: asked (with the task) for a
#: running asyncio task that has no logical thread yet, before one is made;
#: returns the task's logical thread if the hooks record it now, else None.
unseen_asyncio_task: Any = None


def _thread_lt() -> LogicalThread:
    try:
        return _tls.lt  # type: ignore[no-any-return]
    except AttributeError:
        # Named after the thread, as it is named when the profile stops (a
        # pool that names its worker after each job, as trio's thread cache
        # does, then shows the worker's own name, not its first job's).
        thread = threading.current_thread()
        lt = _tls.lt = LogicalThread("thread", thread.name, thread)
        return lt


def current_logical_thread() -> LogicalThread:
    """The logical thread running this code (created on first use)."""
    lt = stepping.lt
    if lt is not None:
        return lt
    if _HINTS:
        lt = _hint.get()
        if lt is not None and lt.os_thread_id == _get_ident():
            ref = lt._task_ref
            task = ref() if ref is not None else None
            tasks = _current_tasks_311  # bound: a hint exists only after a task was found
            if task is not None and tasks is not None and tasks.get(task.get_loop()) is task:  # type: ignore[attr-defined]
                return lt
    task = _asyncio_task()
    if task is not None:
        # None: the task hooks saw the task and do not record it.
        lt = getattr(task, _TASK_ATTR, None)
        if lt is None:
            lt = _side_table.get(id(task))
            if lt is None:
                unseen = unseen_asyncio_task
                if unseen is not None:
                    lt = unseen(task)
                if lt is None:
                    lt = _new_task_thread(task, "asyncio")
        if _HINTS:
            _hint.set(lt)  # in the task's own context: its children re-check it
        return lt
    trio_context = _trio_run_context
    if trio_context is None and "trio" in sys.modules:
        trio_context = _find_trio_run_context()
    if trio_context is not None:
        # The run context is a threading.local: its __dict__ is this
        # thread's. getattr(ctx, "task", None) raises and catches an
        # AttributeError outside a trio run (~1.4 us here; this ~0.17 us).
        task = trio_context.__dict__.get("task")
        if task is not None:
            # trio's Task has __slots__: its logical thread lives in the side table.
            lt = _side_table.get(id(task))
            return lt if lt is not None else _new_task_thread(task, "trio")
    try:
        return _tls.lt  # type: ignore[no-any-return]
    except AttributeError:
        return _thread_lt()


def current_thread_id() -> int:
    """The id of the logical thread running this code.

    A small integer, unique for the life of the process: one per asyncio
    task, per trio task, and per OS thread for code that runs outside any task
    (including event-loop callbacks).

    Returns:
        The logical thread id.

    Example:
        >>> import aprof
        >>> aprof.current_thread_id() == aprof.current_thread_id()
        True
    """
    return current_logical_thread().id


def _reset_after_fork() -> None:
    # The child's main thread is a new OS thread as far as tracks go.
    global _tls
    _tls = threading.local()
    if _native.extension is not None:
        _native.extension._forget_logical_threads()  # the C range path's per-thread answer


if hasattr(sys.modules["os"], "register_at_fork"):
    import os

    os.register_at_fork(after_in_child=_reset_after_fork)
