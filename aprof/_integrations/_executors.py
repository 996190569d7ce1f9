"""Following bare executor work under ``aprof run`` (issue 16 item 7).

``loop.run_in_executor(None, fn)`` and ``pool.submit(fn)`` do not carry the
caller's context into the worker. A *global* profile records what runs in
the worker anyway (it listens in every thread); what it lacks is the
``EXECUTOR`` range: which job ran, which task handed it over (the arrow), and
how long it waited for a free worker (``submit_ns``, the "Queued" column).

While :func:`follow_executors` is in effect, ``ThreadPoolExecutor.submit``
(which ``run_in_executor`` uses, uvloop's too) wraps the callable so that its
run is that range. Unlike ``install_propagation()``, the worker runs in the
context it would have without aprof: the program sees no difference in its
context variables (SPEC 15.6). Work already wrapped by aprof (``aprof.wrap``,
``propagating``, the ``to_thread`` wrappers) is not wrapped twice.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .._core._propagation import _InWorker, _run_executor_range, _Wrapped

__all__ = ["follow_executors"]


class _Followed(_InWorker):
    """A job handed to a thread pool: runs ``fn`` as an EXECUTOR range, in
    the worker's own context (the link to the submitter is taken as the
    ``to_thread`` wrappers take it)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.__wrapped__
        if isinstance(fn, functools.partial) and _is_context_run(fn.func) and fn.args:
            # asyncio.to_thread's partial(ctx.run, func, ...): name the job
            # after func, and keep running it in ctx as asyncio asked.
            ctx_run, func, rest = fn.func, fn.args[0], fn.args[1:]
            return ctx_run(_run_executor_range, func, (*rest, *args), {**fn.keywords, **kwargs}, self._fwd, self._seq, self._submit_ns)
        return _run_executor_range(fn, args, kwargs, self._fwd, self._seq, self._submit_ns)


def _is_context_run(fn: Any) -> bool:
    return isinstance(getattr(fn, "__self__", None), contextvars.Context) and getattr(fn, "__name__", "") == "run"


def _already_followed(fn: Any) -> bool:
    """aprof's own wrappers record the range already (``to_thread`` hands
    ``partial(ctx.run, wrapped)`` to the pool)."""
    while True:
        if isinstance(fn, (_Wrapped, _InWorker)):  # _Followed is an _InWorker
            return True
        if not isinstance(fn, functools.partial):
            return False
        if fn.args and isinstance(fn.args[0], (_Wrapped, _InWorker)):
            return True
        fn = fn.func


_lock = threading.Lock()
_users = 0
_previous: Any = None
_installed: Any = None


def follow_executors() -> Callable[[], None]:
    """Record bare thread-pool jobs as EXECUTOR ranges until the returned
    undo action runs (reference-counted; the last undo restores the method
    that was there)."""
    global _users, _previous, _installed
    with _lock:
        _users += 1
        if _users == 1:
            previous = _previous = concurrent.futures.ThreadPoolExecutor.submit

            def submit(
                self: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
            ) -> Future[Any]:
                if callable(fn) and not _already_followed(fn):
                    fn = _Followed(fn)
                return previous(self, fn, *args, **kwargs)

            submit.__doc__ = previous.__doc__
            submit.__qualname__ = previous.__qualname__
            submit.__name__ = previous.__name__
            _installed = submit
            concurrent.futures.ThreadPoolExecutor.submit = submit  # type: ignore[method-assign,assignment]
    done = False

    def undo() -> None:
        global _users, _previous, _installed
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _users -= 1
            if _users == 0:
                if concurrent.futures.ThreadPoolExecutor.submit is _installed:
                    concurrent.futures.ThreadPoolExecutor.submit = _previous  # type: ignore[method-assign]
                _previous = _installed = None

    return undo
