"""Carrying the caller's context into other threads (SPEC 2.5, 7.4).

Python copies the context into tasks and into ``asyncio.to_thread``, but not
into ``loop.run_in_executor``, ``Executor.submit`` or ``threading.Thread``.
These helpers capture ``contextvars.copy_context()`` at submit time and run
the work inside a fresh copy of it in the worker (anyio's
``WorkerThread.run`` and trio's ``_threads.py`` do the same), so a profile,
and the user's own context variables, follow the work.

Each run is an ``EXECUTOR`` range on the worker's track, carrying the
submitter's logical thread as ``forward_thread_id``, the submission's
sequence number and its time, so exports can draw the arrow.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextvars
import functools
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from time import perf_counter_ns
from types import FunctionType
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from . import _callbacks, _native
from ._callbacks import MODE_FAST, MODE_IDLE, MODE_OFF, RF_STATE, RecordScope
from ._record_function import RecordFunction, next_sequence_nr
from ._recorder import KIND_RANGE, capture_stack, index_of
from ._threads import current_logical_thread, stepping

_get_rf_state = RF_STATE.get

__all__ = ["install_propagation", "launch", "propagating", "uninstall_propagation", "wrap"]

P = ParamSpec("P")
R = TypeVar("R")

_THREAD_PREFIX = "aprof-launch"


def _name_of(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__qualname__


def _run_executor_range_py(fn: Callable[..., R], args: Any, kwargs: Any, fwd: int, seq: int, submit_ns: int) -> R:
    """``fn(*args, **kwargs)`` as an ``EXECUTOR`` range linked to the submit
    point. With the extension, :data:`_run_executor_range` is its C twin
    (``_executor_range`` in ``aprof/_cranges.c``), which handles the inline
    case below itself and calls this function for every other."""
    st = _get_rf_state()
    mode = st.mode
    if mode == MODE_FAST and not _callbacks.global_entries:
        # Only this context's profile listens: append the start and end
        # tuples inline, exactly the records the general path's recorder
        # writes (its extra is the submit time alone; consolidation makes
        # it {"submit_ns": ...}).
        # Per job (a process pool's worker runs one per job; issue 20's
        # target): ps.admit, _name_of and current_logical_thread inlined
        # where that saves a Python call.
        ps = st.recorder.state  # type: ignore[union-attr]
        if ps is None:  # stopped
            return fn(*args, **kwargs)
        budget = ps.budget
        if budget is not None and not budget.take(KIND_RANGE):  # a full budget
            return fn(*args, **kwargs)
        lt = stepping.lt or current_logical_thread()
        lst = ps.lists.get(lt)
        if lst is None:
            lst = ps.list_for(lt)
        stack = capture_stack(0) if ps.with_stack else None
        name = fn.__qualname__ if type(fn) is FunctionType else None
        if not name:
            name = _name_of(fn)
        t = (name, "executor", perf_counter_ns(), None, seq, fwd, None, stack, KIND_RANGE, submit_ns)
        lst.append(t)
        idx = len(lst) - 1  # after the append: a signal handler may record in between (index_of)
        if lst[idx] is not t:
            idx = index_of(lst, t, idx)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            lst.append((idx, perf_counter_ns(), lt.id, type(exc).__name__))
            raise
        lst.append((idx, perf_counter_ns(), lt.id, None))
        return result
    if mode == MODE_OFF or (mode == MODE_IDLE and not _callbacks.global_entries):
        return fn(*args, **kwargs)
    rf = RecordFunction(RecordScope.EXECUTOR)
    if not rf.is_active:
        return fn(*args, **kwargs)
    rf.forward_thread_id = fwd
    rf._extra = {"submit_ns": submit_ns}
    rf.before(_name_of(fn), (), seq)
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        rf._exception = type(exc).__name__
        raise
    finally:
        rf.end()



if TYPE_CHECKING or _native.extension is None:
    _run_executor_range = _run_executor_range_py
else:
    # The same records in C (issue 20: a process pool's worker runs one per
    # job): ~3k instructions a job instead of ~10k.
    _native.extension._executor_setup(_run_executor_range_py, _name_of)
    _run_executor_range = _native.extension._executor_range

class _Wrapped:
    """A callable that runs ``fn`` in a copy of the context it was made in."""

    __slots__ = ("__wrapped__", "_ctx", "_fwd", "_seq", "_submit_ns")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.__wrapped__ = fn
        self._ctx = contextvars.copy_context()
        self._fwd = (stepping.lt or current_logical_thread()).id
        self._seq = next_sequence_nr()
        self._submit_ns = perf_counter_ns()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A fresh copy per call: the same wrapped callable may run in several
        # workers at once, and a Context can be entered by one thread at a time.
        return self._ctx.copy().run(
            _run_executor_range, self.__wrapped__, args, kwargs, self._fwd, self._seq, self._submit_ns
        )

    def __getattr__(self, name: str) -> Any:
        # The wrapped callable's attributes (__name__, __qualname__, ...):
        # trio names its worker thread after the function it runs.
        return getattr(self.__wrapped__, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled: handed to another process (a process pool, from
        # loop.run_in_executor(pool, aprof.wrap(fn))). A context cannot
        # cross, the profile can: in the context captured at wrap(), this
        # becomes the call the child profiles (SPEC 11.4), or fn itself
        # when no profile runs there.
        from .._integrations._processes import process_call

        # A pool worker's profile when it is one (the common case:
        # run_in_executor(process_pool, ...)); a multiprocessing.Process
        # sends its profile as it exits.
        call, _ = self._ctx.run(process_call, self.__wrapped__, self._fwd, self._seq, self._submit_ns, True)
        return (_same, (call,))

    def __repr__(self) -> str:
        return f"<aprof.wrap of {self.__wrapped__!r}>"


def _same(x: Any) -> Any:
    """Unpickles a wrapped callable as what it pickled as."""
    return x


class _InWorker:
    """``fn`` handed to a runtime's ``to_thread``: runs in the worker in the
    context the runtime prepared there (a copy of the caller's, which the
    runtime may have changed: anyio sets sniffio's library to None), inside
    an ``EXECUTOR`` range linked to the point of the call. Reads as ``fn``
    (its name, its attributes, its repr)."""

    __slots__ = ("__wrapped__", "_fwd", "_seq", "_submit_ns")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.__wrapped__ = fn
        self._fwd = (stepping.lt or current_logical_thread()).id
        self._seq = next_sequence_nr()
        self._submit_ns = perf_counter_ns()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _run_executor_range(self.__wrapped__, args, kwargs, self._fwd, self._seq, self._submit_ns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def wrap(fn: Callable[P, R]) -> Callable[P, R]:
    """Return a callable that runs ``fn`` in a copy of the current context.

    For ``loop.run_in_executor``, ``Executor.submit``, callbacks and
    ``threading.Thread(target=...)``. Each call is recorded as an
    ``EXECUTOR`` range on the worker's track, linked to this point.

    Raises:
        TypeError: ``fn`` is not callable.

    Example:
        >>> import asyncio, aprof
        >>> async def main():
        ...     loop = asyncio.get_running_loop()
        ...     return await loop.run_in_executor(None, aprof.wrap(sum), [1, 2])
        >>> asyncio.run(main())
        3
    """
    if not callable(fn):
        raise TypeError(f"wrap: expected a callable, got {fn!r}")
    return _Wrapped(fn)


# ---------------------------------------------------------------------------
# launch: aprof's own pool (the seed's at::launch)
# ---------------------------------------------------------------------------


class _LaunchPool:
    """A small thread pool whose idle workers exit after ``idle_s``.

    Workers do not linger, so aprof owns no threads once work is done, and
    nothing a job's context held is kept alive by an idle worker.
    """

    def __init__(self, max_workers: int, idle_s: float) -> None:
        self._max = max_workers
        self._idle_s = idle_s
        self._q: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], Any, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: set[threading.Thread] = set()
        self._n = 0

    def submit(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            self._q.put((fut, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max:
                self._n += 1
                t = threading.Thread(target=self._worker, name=f"{_THREAD_PREFIX}-{self._n}", daemon=True)
                t._aprof_owned = True  # type: ignore[attr-defined]
                self._threads.add(t)
                t.start()
            else:
                # The submit may land before an idle worker wakes: that is fine,
                # the worker takes it from the queue.
                pass
        return fut

    def _worker(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._q.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._q.empty():
                        self._threads.discard(me)
                        return
                continue
            with self._lock:
                self._idle -= 1
            fut, fn, args, kwargs = item
            del item
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            del fut, fn, args, kwargs

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)


_pool = _LaunchPool(max_workers=min(32, (os.cpu_count() or 1) + 4), idle_s=0.5)


def _reset_pool_after_fork() -> None:
    # The parent's workers do not exist in the child, and another thread may
    # have held a lock at the fork: start over.
    global _pool, _install_lock, _to_thread_lock
    _pool = _LaunchPool(_pool._max, _pool._idle_s)
    _install_lock = threading.Lock()
    _to_thread_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_pool_after_fork)


def launch(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
    """Run ``fn(*args, **kwargs)`` on aprof's thread pool with the caller's context.

    The seed's ``at::launch``: the job sees the caller's context variables
    (so the caller's profile records it, as an ``EXECUTOR`` range on the
    worker's track). Idle workers exit after half a second.

    Returns:
        A ``concurrent.futures.Future`` for the result.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"launch: expected a callable, got {fn!r}")
    return _pool.submit(_Wrapped(fn), args, kwargs)


def launch_threads() -> list[threading.Thread]:
    """aprof's pool threads alive now (for tests and diagnostics)."""
    return _pool.threads()


# ---------------------------------------------------------------------------
# propagating(executor)
# ---------------------------------------------------------------------------


class _PropagatingExecutor(Executor):
    """An executor whose ``submit`` and ``map`` carry the submitter's context."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner
        self._processes = isinstance(inner, concurrent.futures.ProcessPoolExecutor)
        if self._processes:
            # Once here, not per submit: a relative import costs a few
            # microseconds a call, a tenth of a small job (issue 20).
            from .._integrations._processes import submit_to_pool

            self._submit_to_pool = submit_to_pool

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        if not callable(fn):
            raise TypeError(f"propagating(...).submit: expected a callable, got {fn!r}")
        if self._processes:
            # Another process: the profile's options and the link go with
            # the call, and the child's session comes back at stop (SPEC 11.4).
            return self._submit_to_pool(type(self._inner).submit, self._inner, fn, args, kwargs)  # type: ignore[no-any-return]
        return self._inner.submit(_Wrapped(fn), *args, **kwargs)

    def map(self, fn: Callable[..., R], *iterables: Any, timeout: float | None = None, chunksize: int = 1) -> Iterator[R]:
        # Executor.map submits through self.submit, one wrapped call each.
        return super().map(fn, *iterables, timeout=timeout, chunksize=chunksize)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    @property
    def inner(self) -> Executor:
        """The executor that runs the work."""
        return self._inner

    def __repr__(self) -> str:
        return f"<aprof.propagating {self._inner!r}>"


def propagating(executor: Executor) -> Executor:
    """Wrap ``executor`` so ``submit`` and ``map`` carry the submitter's context.

    With a ``ProcessPoolExecutor``, each call runs in the child inside a
    profile with the submitter's profile's options, as an ``EXECUTOR``
    range; at the submitter's ``stop()`` the child's events are merged into
    its session, on the child's tracks under the child's node id (its
    pid), linked to the submit (SPEC 11.4). Work that did not come back
    (the child was killed, or still running at stop) is listed in
    ``session.lost``.

    Args:
        executor: A ``ThreadPoolExecutor``, a ``ProcessPoolExecutor`` or
            any thread-based ``Executor``.

    Returns:
        An ``Executor``; shutting it down shuts down ``executor``.

    Raises:
        TypeError: ``executor`` is not an ``Executor``.

    Example:
        >>> import aprof
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> with aprof.propagating(ThreadPoolExecutor(2)) as pool:
        ...     pool.submit(sum, [1, 2]).result()
        3
    """
    if not isinstance(executor, Executor):
        raise TypeError(f"propagating: expected a concurrent.futures.Executor, got {executor!r}")
    if isinstance(executor, _PropagatingExecutor):
        return executor
    return _PropagatingExecutor(executor)


# ---------------------------------------------------------------------------
# install_propagation: process-wide
# ---------------------------------------------------------------------------

_ORIGINAL_SUBMIT = concurrent.futures.ThreadPoolExecutor.submit
_ORIGINAL_START = threading.Thread.start
_ORIGINAL_TIMER_RUN = threading.Timer.run
_install_lock = threading.Lock()
_installed = False


def _submit(self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
    if callable(fn) and not isinstance(fn, _Wrapped):
        fn = _Wrapped(fn)
    return _ORIGINAL_SUBMIT(self, fn, *args, **kwargs)


def _start(self: threading.Thread) -> None:
    # Executor workers and aprof's own threads run many jobs, each in its own
    # context: giving the worker its starter's context would keep that
    # context (and its profile) alive for the worker's whole life.
    target = getattr(self, "_target", None)
    if (
        target is not None
        and target is not concurrent.futures.thread._worker
        and not getattr(self, "_aprof_owned", False)
        and not isinstance(target, _Wrapped)
    ):
        self._target = _Wrapped(target)  # type: ignore[attr-defined]
    elif isinstance(self, threading.Timer) and type(self).run is _timer_run:
        # A Timer calls self.function from run(), not a target. Its function
        # is left as the program set it (SPEC 15.6): the starter's context
        # and the links ride in a private attribute that _timer_run reads.
        self.__dict__["_aprof_call"] = _Wrapped(self.function)
    _ORIGINAL_START(self)


def _timer_run(self: threading.Timer) -> None:
    """``threading.Timer.run`` while propagation is installed: the same steps
    (they are the same on 3.11-3.13), with the function called as an
    EXECUTOR range in a copy of the context that started the timer."""
    call = self.__dict__.pop("_aprof_call", None)
    if call is None:  # started before install_propagation()
        _ORIGINAL_TIMER_RUN(self)
        return
    self.finished.wait(self.interval)
    if not self.finished.is_set():
        # self.function as it is now: the program may have replaced it.
        call._ctx.copy().run(_run_executor_range, self.function, self.args, self.kwargs, call._fwd, call._seq, call._submit_ns)
    self.finished.set()


def install_propagation(*, processes: bool = False) -> None:
    """Make ``ThreadPoolExecutor.submit`` (so ``loop.run_in_executor`` too,
    uvloop included), ``threading.Thread`` and ``threading.Timer`` carry the
    caller's context, process-wide, until :func:`uninstall_propagation`.
    Idempotent.

    ``Thread`` subclasses that override ``run()`` instead of passing
    ``target=`` are not wrapped, nor are ``Timer`` subclasses that do.

    Args:
        processes: Also carry a running profile into other processes:
            ``ProcessPoolExecutor.submit`` (so ``run_in_executor`` with a
            process pool), ``multiprocessing.Process(target=...).start()``
            and ``multiprocessing.Pool``'s ``apply``/``map``/``starmap``/
            ``imap`` families (each call profiled in the child and merged
            at stop, as with ``propagating(ProcessPoolExecutor)``; SPEC
            11.4). A ``Process`` started so runs a wrapper as its
            ``_target``. Off by default: each call then costs a profile
            and a file in the child. Calling again with ``processes=True``
            adds it to an installed propagation.

    Raises:
        TypeError: ``processes`` is not a bool.
    """
    global _installed
    if not isinstance(processes, bool):
        raise TypeError(f"install_propagation: processes must be True or False, got {processes!r}")
    with _install_lock:
        if processes:
            from .._integrations._processes import install_process_hooks

            install_process_hooks()
        if _installed:
            return
        concurrent.futures.ThreadPoolExecutor.submit = _submit  # type: ignore[method-assign,assignment]
        threading.Thread.start = _start  # type: ignore[method-assign]
        threading.Timer.run = _timer_run  # type: ignore[method-assign,assignment]
        _installed = True


def uninstall_propagation() -> None:
    """Restore the standard library's originals (processes too). Idempotent."""
    global _installed
    from .._integrations._processes import uninstall_process_hooks

    with _install_lock:
        uninstall_process_hooks()
        if not _installed:
            return
        concurrent.futures.ThreadPoolExecutor.submit = _ORIGINAL_SUBMIT  # type: ignore[method-assign]
        threading.Thread.start = _ORIGINAL_START  # type: ignore[method-assign]
        threading.Timer.run = _ORIGINAL_TIMER_RUN  # type: ignore[method-assign]
        _installed = False


def is_propagation_installed() -> bool:
    """Whether :func:`install_propagation` is in effect."""
    return _installed


# ---------------------------------------------------------------------------
# The runtimes' to_thread, while a profile records tasks
# ---------------------------------------------------------------------------

#: (module name, attribute) of the runtimes' "run this in a worker thread"
#: coroutine functions. Each copies the caller's context into the worker
#: already; wrapping the function adds the EXECUTOR range linked to the
#: caller (RELIABILITY CP-02). anyio's trio backend calls trio's run_sync
#: through its own import, so anyio work is wrapped once, by anyio's entry.
TO_THREAD_ENTRIES: Final = (
    ("asyncio", "to_thread"),
    ("asyncio.threads", "to_thread"),
    ("trio.to_thread", "run_sync"),
    ("anyio.to_thread", "run_sync"),
)

_to_thread_lock = threading.Lock()
_to_thread_users = 0
#: (module name, attribute) -> undo, for each entry patched now.
_to_thread_patched: dict[tuple[str, str], Callable[[], None]] = {}


def _wrapping_to_thread(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        if callable(func) and not isinstance(func, (_Wrapped, _InWorker)):
            func = _InWorker(func)
        return await original(func, *args, **kwargs)

    return to_thread


def _patch_to_thread(module_name: str, attr: str) -> None:
    # Under _to_thread_lock, for an entry not patched now.
    module = sys.modules.get(module_name)
    original = getattr(module, attr, None) if module is not None else None
    if original is None:
        return
    replacement = _wrapping_to_thread(original)
    setattr(module, attr, replacement)

    def undo() -> None:
        if getattr(module, attr, None) is replacement:
            setattr(module, attr, original)

    _to_thread_patched[module_name, attr] = undo


def hook_to_thread() -> Callable[[], None]:
    """Make ``asyncio.to_thread``, ``trio.to_thread.run_sync`` and
    ``anyio.to_thread.run_sync`` (those already imported) record each call as
    an ``EXECUTOR`` range linked to the caller, until the returned undo action
    has run as often as this was called.

    Callers that imported the function by name before (``from asyncio import
    to_thread``) keep the original: their work is still recorded on the
    worker's track (the context is copied), without the EXECUTOR range.
    """
    global _to_thread_users
    with _to_thread_lock:
        _to_thread_users += 1
        # Each call patches the runtimes imported since (a global profile
        # starts before the program imports trio or anyio).
        for entry in TO_THREAD_ENTRIES:
            if entry not in _to_thread_patched:
                _patch_to_thread(*entry)
    done = False

    def undo() -> None:
        global _to_thread_users
        nonlocal done
        with _to_thread_lock:
            if done:
                return
            done = True
            _to_thread_users -= 1
            if _to_thread_users == 0:
                actions = list(_to_thread_patched.values())
                _to_thread_patched.clear()
                for action in reversed(actions):
                    action()

    return undo
