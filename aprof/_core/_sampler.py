"""The sampler's driver (SPEC 8.4): start, stop, hand the samples to post-processing.

The sampling half is ``aprof._ctracer.Sampler`` (C: a thread of its own that
never runs Python code; see the comments in ``aprof/_csampler.c``) or, when
the extension is missing, its pure-Python twin ``aprof._core._sampler_py``;
both follow the contract in ``aprof/_ctracer.pyi``. At stop the raw samples
become the session's :class:`aprof.Samples` (``aprof._post._samples``).

How a sample knows its logical thread. The C sampler reads each thread's
*current context* (the thread state's ``context``, which asyncio, uvloop and
trio switch at every task step): ``RF_STATE`` there says whether the work is
this profile's (context scope) and whether recording is on; ``TRACER_LT``
there names the task, which publishes itself in its own context at its
first step while a tracer or a sampler runs (:func:`aprof._core._tracer.publish_task`).
Anything else on a thread is the thread's own logical thread.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
from contextvars import Token
from typing import TYPE_CHECKING, Any, Final

from . import _native, _tracer
from ._callbacks import RF_STATE, AprofWarning
from ._threads import LogicalThread, current_logical_thread
from ._tracer import APROF_DIR, TRACER_LT

if TYPE_CHECKING:
    from .._post._session import Session
    from ._recorder import Recorder

__all__ = ["SAMPLE_BYTES", "WAITS", "SamplerRun", "check_interval"]

#: Where a loop (or a thread pool) waits for work: (file name suffix,
#: qualified name) of the innermost frame. A sample of a thread outside any
#: task that waits here is idle, charged to nobody (SPEC 8.4).
#: Bytes a sample takes in the sampler's buffer (three 64-bit words).
SAMPLE_BYTES: Final = 24

WAITS: Final = (
    # asyncio's selector loops, in the selector
    ("selectors.py", "EpollSelector.select"),
    ("selectors.py", "PollSelector.select"),
    ("selectors.py", "SelectSelector.select"),
    ("selectors.py", "KqueueSelector.select"),
    ("selectors.py", "DevpollSelector.select"),
    # a loop written in C (uvloop) waits inside run_until_complete: no task
    # runs and the innermost Python frame is the runner's
    ("asyncio" + os.sep + "runners.py", "Runner.run"),
    # trio's run loop, in its I/O manager
    ("_io_epoll.py", "EpollIOManager.get_events"),
    ("_io_kqueue.py", "KqueueIOManager.get_events"),
    ("_io_windows.py", "WindowsIOManager.get_events"),
    # idle pool workers waiting for a job
    ("concurrent" + os.sep + "futures" + os.sep + "thread.py", "_worker"),
    ("_thread_cache.py", "WorkerThread._work"),
)

_runs: list[SamplerRun] = []
_forced: Any = None  # tests: force one implementation (module), None: choose
_warned = False


def implementation() -> Any:
    """The sampler module in use: ``aprof._ctracer``, or the twin."""
    global _warned
    if _forced is not None:
        return _forced
    if _native.extension is not None and hasattr(_native.extension, "Sampler"):
        return _native.extension
    from . import _sampler_py

    if not _warned and not _native.FORCED_PURE:
        _warned = True
        warnings.warn(
            "aprof: the C extension aprof._ctracer is not built (no compiler at install time?); "
            "the sampler runs as a Python thread, which costs more and cannot tell executor threads' work apart",
            AprofWarning,
            stacklevel=4,
        )
    return _sampler_py


def check_interval(value: object) -> float | None:
    """``profile(sample_interval=...)``: None, or seconds in [10 us, 60 s].

    Raises:
        ValueError: anything else; the message names the option.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1e-5 <= value <= 60:
        raise ValueError(f"profile: option 'sample_interval' must be a number of seconds from 0.00001 to 60, got {value!r}")
    return float(value)


class SamplerRun:
    """One profile's sampler, from start to its samples in the session.

    Args:
        recorder: The profile's recorder (context scope), or None (global).
        interval: Seconds between samples.
        max_samples: Keep at most this many samples (0: unbounded).
        keep_latest: Past ``max_samples``, each sample takes the oldest's
            place (a ring) instead of being dropped.
    """

    def __init__(
        self, recorder: Recorder | None, interval: float, max_samples: int = 0, keep_latest: bool = False
    ) -> None:
        impl = implementation()
        self.impl = impl
        self.interval = interval
        self.sampler = impl.Sampler(
            RF_STATE, recorder, TRACER_LT, APROF_DIR, interval, WAITS, max_samples, keep_latest=keep_latest
        )
        self._token: Token[tuple[LogicalThread, int] | None] | None = None
        self._forked = False
        self._taken: tuple[bytes, bytes, list[Any], list[int]] | None = None

    def start(self) -> None:
        """Start sampling. The task that starts it publishes itself, as
        spawned tasks do at their first step."""
        lt = current_logical_thread()
        token = TRACER_LT.set((lt, threading.get_ident())) if lt.kind != "thread" else None
        add_task = getattr(self.sampler, "add_task", None)
        if add_task is not None:
            add_task(lt)  # the twin finds tasks by their coroutine's frame
        try:
            self.sampler.start()
        except BaseException:
            if token is not None:
                TRACER_LT.reset(token)
            raise
        self._token = token
        _runs.append(self)
        _tracer.sampling.append(self)
        _tracer.publishing.append(self)

    def stop(self) -> None:
        """Stop sampling (idempotent). The samples are kept for :meth:`attach`."""
        self.sampler.stop()
        if self in _runs:
            _runs.remove(self)
        if self in _tracer.sampling:
            _tracer.sampling.remove(self)
            _tracer.publishing.remove(self)
        token, self._token = self._token, None
        if token is not None:
            try:
                TRACER_LT.reset(token)
            except (ValueError, RuntimeError):
                pass  # stopped from another context: the starting one keeps a stale, harmless value
        if self._taken is None and not self._forked:
            self._taken = self.sampler.take()

    def attach(self, session: Session, node_id: int) -> None:
        """Give ``session`` its samples (once; a forked child's copy gets none)."""
        from .._post._samples import attach_samples  # post-processing reads, never writes back

        taken, self._taken = self._taken, None
        if taken is None or self._forked:
            return
        attach_samples(session, taken, self.interval, int(self.sampler.dropped), int(self.sampler.idle), node_id)


    def attach_window(self, session: Session, node_id: int, since_ns: int) -> None:
        """Give ``session`` a copy of the samples taken since ``since_ns``,
        sampling on (a flight recorder's dump)."""
        from .._post._samples import attach_samples  # post-processing reads, never writes back

        if self._forked or not self.sampler.active:
            return
        taken = self.sampler.peek()
        attach_samples(
            session, taken, self.interval, int(self.sampler.dropped), int(self.sampler.idle), node_id, since_ns=since_ns
        )


def _stop_all() -> None:
    """Stop every sampler: at interpreter exit (before the interpreter tears
    down what a sampling thread reads) and in a forked child."""
    for run in list(_runs):
        try:
            run.stop()
        except Exception:  # noqa: BLE001 - never fail an exit
            pass


def _after_fork_in_child() -> None:
    """A forked child samples nothing for its parent's profiles (LC-01)."""
    for run in list(_runs):
        run._forked = True
    ext = _native.extension
    if ext is not None and hasattr(ext, "_sampler_after_fork"):
        ext._sampler_after_fork()
    if "aprof._core._sampler_py" in sys.modules:
        sys.modules["aprof._core._sampler_py"].after_fork_in_child()
    _stop_all()


atexit.register(_stop_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
