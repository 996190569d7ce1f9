"""The Python tracer's driver (SPEC 8.1): start, stop, hand over to replay.

The recording half is ``aprof._ctracer`` (C) or, when it could not be built,
its pure-Python twin ``aprof._core._tracer_py``; both follow the contract in
``aprof/_ctracer.pyi``. This module picks one, installs it (on 3.12+ through
``sys.monitoring``, on 3.11 the implementation installs its own profile
function; without C calls the C one installs a PEP 523 frame evaluator on
3.11 and 3.12 instead), and at stop hands the packed events to
``aprof._post._replay``.

How the tracer knows which logical thread runs: a task publishes itself in
:data:`TRACER_LT`, a context variable set in the task's own context when its
first step starts (the task hooks call :func:`publish_task`). The tracer reads
it per event with an identity-cached ``PyContextVar_Get``, as it reads the
profile's ``RF_STATE``; no Python runs per event.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from contextvars import ContextVar, Token
from types import CodeType
from typing import TYPE_CHECKING, Any, Final

from . import _native
from ._callbacks import RF_STATE, AprofWarning
from ._threads import LogicalThread, _thread_lt, current_logical_thread

if TYPE_CHECKING:
    from ._recorder import ProfilerState, Recorder

__all__ = ["APROF_DIR", "EVENT_BYTES", "TRACER_LT", "TracerRun", "implementation", "publish_task"]

#: (task's LogicalThread, OS thread ident) in a task's own context, or None.
TRACER_LT: ContextVar[tuple[LogicalThread, int] | None] = ContextVar("aprof.tracer_lt", default=None)

_get_ident = threading.get_ident


#: Running samplers (aprof._core._sampler): tasks publish themselves for them too.
sampling: list[object] = []
#: Running tracers and samplers: non-empty while tasks must publish
#: themselves (the asyncio task hooks' C step reads it).
publishing: list[object] = []
#: Called with each task that publishes itself (the pure-Python sampler's).
publish_hooks: list[Callable[[LogicalThread], None]] = []


def publish_task(lt: LogicalThread) -> None:
    """Tell the tracer and the sampler that the current context is ``lt``'s
    (call in the task's first step, in the task's own context)."""
    TRACER_LT.set((lt, _get_ident()))
    for hook in publish_hooks:
        hook(lt)


#: aprof's own files: their frames (and the C calls they make) are not traced.
APROF_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_MONITORING: Final = sys.version_info >= (3, 12)
_TOOL_NAME: Final = "aprof python_tracer"


def _mon() -> Any:
    return sys.monitoring  # type: ignore[attr-defined]  # 3.12+; mypy checks as 3.11


_running: list[TracerRun] = []  # at most one

#: Bytes a raw tracer event takes (two 64-bit words).
EVENT_BYTES: Final = 16


def running() -> bool:
    """Whether a Python tracer or a sampler runs now (task hooks publish
    their task only then)."""
    return bool(publishing)


_forced: Any = None  # tests: force one implementation (module), None: choose
_forced_c_calls: bool | None = None  # tests: force c_calls, None: as asked
#: Internal switch (tests, bench): False makes the C tracer record Python
#: frames through sys.monitoring (3.12) or the profile function (3.11)
#: instead of its frame evaluator.
_evaluator = True
_warned = False


def implementation() -> Any:
    """The tracer module in use: ``aprof._ctracer``, or the twin if it is
    missing (with one warning) or ``APROF_PURE_PYTHON=1`` asked for it."""
    global _warned
    if _forced is not None:
        return _forced
    if _native.extension is not None:
        return _native.extension
    from . import _tracer_py

    if not _warned and not _native.FORCED_PURE:
        _warned = True
        warnings.warn(
            "aprof: the C extension aprof._ctracer is not built (no compiler at install time?); "
            "the Python tracer runs in pure Python and is much slower",
            AprofWarning,
            stacklevel=4,
        )
    return _tracer_py


def _starting_thread_lt() -> LogicalThread | None:
    """The calling OS thread's logical thread, or None while it is starting.

    A new thread runs a little of ``threading``'s bootstrap before it is
    registered; asking ``current_thread()`` then would make a dummy thread
    (and a track named "Dummy-1"), so the tracer waits until it is.
    """
    if threading._active.get(_get_ident()) is None:  # type: ignore[attr-defined]
        return None
    return _thread_lt()


_CO_TASK_CODE: Final = 0x80 | 0x100 | 0x200  # CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR


def _initial_stack(in_task: bool) -> list[CodeType]:
    """Code of the user's frames on the stack now, outermost first (LC-06).

    In a task, the frames below its outermost coroutine are the event
    loop's, which run outside the task (and, in context scope, outside the
    profiled context): the stack starts at the task's coroutine.
    """
    codes: list[CodeType] = []
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(APROF_DIR):
            codes.append(code)
        f = f.f_back
    codes.reverse()
    if in_task:
        for i, code in enumerate(codes):
            if code.co_flags & _CO_TASK_CODE:
                return codes[i:]
    return codes


if _MONITORING:
    _EVENTS: Final = (
        ("PY_START", "py_start"),
        ("PY_RESUME", "py_resume"),
        ("PY_THROW", "py_throw"),
        ("PY_RETURN", "py_return"),
        ("PY_YIELD", "py_yield"),
        ("PY_UNWIND", "py_unwind"),
    )
    _C_EVENTS: Final = (
        ("CALL", "call"),
        ("C_RETURN", "c_return"),
        ("C_RAISE", "c_raise"),
    )


class TracerRun:
    """One profile's tracer, from start to replay.

    Args:
        recorder: The profile's recorder (context scope), or None (global).
        max_events: Keep at most this many raw events (0: unbounded).
        keep_latest: Past ``max_events``, let the oldest events go (a ring
            of eight segments, the oldest whole segment first) instead of
            dropping the new ones.
        c_calls: Record C calls too (else Python frames only, which on 3.11
            and 3.12 the C tracer records through a PEP 523 frame evaluator
            instead of a profile function or sys.monitoring callbacks, and
            on 3.13 without the CALL events).
        instance_ids: Name method frames after their receiver instance
            (class and serial), not only its class.
    """

    def __init__(
        self,
        recorder: Recorder | None,
        max_events: int = 0,
        c_calls: bool = False,
        instance_ids: bool = False,
        keep_latest: bool = False,
    ) -> None:
        impl = implementation()
        self.impl = impl
        self.c_calls = c_calls if _forced_c_calls is None else _forced_c_calls
        self.tracer = impl.Tracer(
            RF_STATE,
            recorder,
            TRACER_LT,
            _starting_thread_lt,
            APROF_DIR,
            max_events,
            self.c_calls,
            instance_ids,
            _evaluator,
            keep_latest,
        )
        #: Python frames come from the C tracer's frame evaluator (3.11 and
        #: 3.12 without C calls), not from hooks installed here.
        self.evaluator: bool = bool(getattr(self.tracer, "evaluator", False))
        self._token: Token[tuple[LogicalThread, int] | None] | None = None
        self._tool: int | None = None
        self._forked = False
        self._warned_degraded = False

    def check(self) -> None:
        """Raise if the tracer cannot hook the interpreter (before anything is set up).

        Raises:
            RuntimeError: another tool holds the profiler's ``sys.monitoring``
                id (3.12+), another ``sys.setprofile`` hook is installed in
                this thread (3.11 with C calls), another tool's frame
                evaluator is installed (3.11 and 3.12 without C calls), or
                another Python tracer runs (FA-08).
        """
        if _running:
            raise RuntimeError(
                "aprof: another profile with python_tracer=True is running in this process; "
                "only one Python tracer can run at a time"
            )
        if _MONITORING:
            mon = _mon()
            owner = mon.get_tool(mon.PROFILER_ID)
            if owner is not None:
                raise RuntimeError(
                    f"aprof: python_tracer cannot start: sys.monitoring tool id {mon.PROFILER_ID} (PROFILER_ID) "
                    f"is in use by {owner!r}; stop that profiler first (cProfile and other profilers use this id)"
                )
        if self.evaluator:
            other = self.impl.foreign_frame_evaluator()
            if other is not None:
                raise RuntimeError(
                    "aprof: python_tracer cannot start: another tool has replaced the interpreter's frame "
                    f"evaluator (PEP 523; debuggers and torch.compile do) with {other}; stop it first, "
                    "or trace with C calls (c_calls=True), which does not use it"
                )
        elif not _MONITORING:
            current = sys.getprofile()
            if current is not None:
                raise RuntimeError(
                    "aprof: python_tracer cannot start: another profiler is installed with sys.setprofile "
                    f"({current!r}); stop it first (cProfile, yappi and others use the same hook)"
                )

    def start(self) -> None:
        """Start tracing (see :meth:`check` for the errors)."""
        self.check()
        tool = _mon().PROFILER_ID if _MONITORING else None
        lt = current_logical_thread()
        in_task = lt.kind != "thread"
        token = TRACER_LT.set((lt, _get_ident())) if in_task else None
        if tool is not None and self.evaluator:
            # The evaluator records the frames; the id is held all the same
            # (one profiler at a time, as with the callbacks) and is where the
            # C tracer hands over when the C stack runs low (degraded).
            _mon().use_tool_id(tool, _TOOL_NAME)
            self._tool = tool
        try:
            self.tracer.start(_initial_stack(in_task))
        except BaseException:
            if token is not None:
                TRACER_LT.reset(token)
            if self._tool is not None:
                self._tool = None
                _mon().free_tool_id(tool)
            raise
        self._token = token
        _running.append(self)
        publishing.append(self)
        if tool is not None and not self.evaluator:
            mon = _mon()
            mon.use_tool_id(tool, _TOOL_NAME)
            self._tool = tool
            events = 0
            for name, method in self._events():
                ev = getattr(mon.events, name)
                mon.register_callback(tool, ev, getattr(self.tracer, method))
                events |= ev
            # Re-enable the call sites our CALL callback switched off in an
            # earlier run (DISABLE outlives free_tool_id), unless another tool
            # is registered: restart_events() would re-enable its switched-off
            # locations too (coverage relies on them staying off). Then a site
            # that called a Python function in an earlier run keeps missing
            # the C calls it may make now.
            if all(mon.get_tool(i) in (None, _TOOL_NAME) for i in range(6)):
                mon.restart_events()
            mon.set_events(tool, events)

    def _events(self) -> tuple[tuple[str, str], ...]:
        return _EVENTS + _C_EVENTS if self.c_calls else _EVENTS

    def stop(self) -> None:
        """Stop tracing and release the hooks (idempotent)."""
        tool, self._tool = self._tool, None
        if tool is not None:
            mon = _mon()
            mon.set_events(tool, 0)
            for name, _ in self._events():
                mon.register_callback(tool, getattr(mon.events, name), None)
            mon.free_tool_id(tool)
        self.tracer.stop()
        if getattr(self.tracer, "degraded", False) and not self._warned_degraded:
            self._warned_degraded = True
            rest = "sys.monitoring callbacks" if _MONITORING else "the profile function, as with C calls"
            warnings.warn(
                "aprof: a recursion ran the C stack low under the frame evaluator of python_tracer with "
                "c_calls=False (on 3.11 and 3.12 every traced call uses C stack); the rest of the profile "
                f"was traced with {rest}, which is slower",
                AprofWarning,
                stacklevel=3,
            )
        if self in _running:
            _running.remove(self)
            publishing.remove(self)
        token, self._token = self._token, None
        if token is not None:
            try:
                TRACER_LT.reset(token)
            except (ValueError, RuntimeError):
                pass  # stopped from another context: the starting one keeps a stale, harmless value

    def replay_into(self, state: ProfilerState) -> None:
        """Turn the recorded events into records in ``state``'s lists."""
        self.replay_taken(self.take(state), state)

    def take(self, state: ProfilerState) -> tuple[bytes, list[Any], int]:
        """Hand over the recorded events (once: the tracer keeps none) and
        count the dropped ones in ``state``."""
        taken: tuple[bytes, list[Any], int] = self.tracer.take()
        if not self._forked:
            state.dropped += self.tracer.dropped
        return taken

    def peek_lists(self) -> dict[LogicalThread, list[Any]]:
        """The calls recorded so far, replayed into new lists (one per
        logical thread), recording on: a flight recorder's dump. Calls still
        open are open in them, as at a stop."""
        from .._post._replay import replay  # post-processing reads, never writes back

        if self._forked or not self.tracer.active:
            return {}
        data, objs, start_ns = self.tracer.peek()
        out = _Lists()
        replay(data, objs, start_ns, out, getattr(self.impl, "replay", None))  # type: ignore[arg-type]
        return out.lists

    def replay_taken(self, taken: tuple[bytes, list[Any], int], state: ProfilerState) -> None:
        """Replay events from :meth:`take` into ``state``'s lists (a stop
        interrupted here replays them again from the same data)."""
        from .._post._replay import replay  # post-processing reads, never writes back

        if self._forked:
            return  # a forked child's copy: the events are the parent's (LC-01)
        data, objs, start_ns = taken
        replay(data, objs, start_ns, state, getattr(self.impl, "replay", None))


class _Lists:
    """Where :meth:`TracerRun.peek_lists` replays: a list per logical
    thread, as ``ProfilerState.list_for`` gives."""

    def __init__(self) -> None:
        self.lists: dict[LogicalThread, list[Any]] = {}

    def list_for(self, lt: LogicalThread) -> list[Any]:
        return self.lists.setdefault(lt, [])


def _after_fork_in_child() -> None:
    """A forked child stops the tracer it inherited and keeps none of its events."""
    for run in list(_running):
        run._forked = True
        try:
            run.stop()
        except Exception:  # noqa: BLE001 - never fail a fork
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
