"""profile_memory's driver (issue 21): start, stop, hand the records to post-processing.

The recording half is C (``aprof/_cmemory.c``): hooks on CPython's MEM and
OBJ allocator domains that sample allocations every ``memory_interval``
bytes on average (or every one, ``memory_interval=0``) and note when a
sampled block is freed. Each sample knows its work the way the tracer and
the sampler do, from the running context: ``RF_STATE`` says whether it is
this profile's (context scope); its task is the one aprof's task hooks
publish in the stepping slot (C thread-local storage) around each step,
else the task named in ``TRACER_LT`` (the task that started the profile
sets it), else the OS thread. At stop the records are charged to ranges
and tracks (``aprof._post._memory``).

There is no pure-Python twin: Python code cannot see each allocation
(``tracemalloc`` keeps traces, not events, and costs several times more),
so without the extension ``profile_memory`` raises, naming why.
"""

from __future__ import annotations

import os
import threading
from contextvars import Token
from typing import TYPE_CHECKING, Any, Final

from . import _native
from ._callbacks import RF_STATE
from ._ring import buffer_limit
from ._threads import LogicalThread, current_logical_thread
from ._tracer import TRACER_LT

if TYPE_CHECKING:
    from .._post._session import Session
    from ._recorder import Recorder

__all__ = ["DEFAULT_INTERVAL", "RECORD_BYTES", "MemoryRun", "check_memory_interval", "max_records"]

#: Sample an allocation every this many bytes on average (sampled mode).
DEFAULT_INTERVAL: Final = 16 * 1024
_MAX_INTERVAL: Final = 1 << 40
#: One allocation record's bytes (aprof/_cmemory.c MemRec, 40), and with
#: keep="latest" its block's address (8) so a record let go leaves the
#: table of live blocks too.
RECORD_BYTES: Final = 48

_running: list[MemoryRun] = []
#: Tests: the sampling generator's seed (0: from the clock).
seed = 0


def running() -> bool:
    """Whether a memory profile runs now (the allocator hooks are taken)."""
    return bool(_running)


def check_memory_interval(value: object) -> int:
    """``profile(memory_interval=...)``: bytes between samples, 0 for every allocation.

    Raises:
        ValueError: not an int from 0 to 2**40; the message names the option.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INTERVAL:
        raise ValueError(
            f"profile: option 'memory_interval' must be an int of bytes from 0 (every allocation) to 2**40, got {value!r}"
        )
    return value


def max_records(max_events: int | None, max_bytes: int | None) -> int:
    """How many allocation records a profile's budget lets it hold (0: no
    limit; see ``_ring.buffer_limit``)."""
    return buffer_limit(max_events, max_bytes, RECORD_BYTES)


def unavailable_reason() -> str | None:
    """Why ``profile_memory`` cannot run here, or None if it can."""
    ext = _native.extension
    if ext is None or not hasattr(ext, "_memory_start"):
        why = "APROF_PURE_PYTHON=1 is set" if _native.FORCED_PURE else "it is not built"
        return (
            "profile: profile_memory needs aprof's C extension (aprof._ctracer) to hook the allocator, "
            f"and {why}; Python code cannot see each allocation"
        )
    return None


class MemoryRun:
    """One profile's allocation tracking, from start to its figures in the session.

    Args:
        recorder: The profile's recorder (context scope), or None (global).
        interval: Mean bytes between samples; 0 records every allocation.
        max_records: Keep at most this many sampled allocations (0: no limit).
        keep: Past ``max_records``, keep the ``"first"`` ones (the rest are
            dropped) or the ``"latest"`` (a ring: the oldest record goes).
    """

    def __init__(self, recorder: Recorder | None, interval: int, max_records: int = 0, keep: str = "first") -> None:
        why = unavailable_reason()
        if why is not None:
            raise RuntimeError(why)
        self.recorder = recorder
        self.interval = interval
        self.max_records = max_records
        self.keep = keep
        self._token: Token[tuple[LogicalThread, int] | None] | None = None
        self._taken: tuple[Any, ...] | None = None
        self._started = False

    def start(self) -> None:
        """Hook the allocator. The task that starts it publishes itself, as
        spawned tasks do at their first step."""
        ext = _native.extension
        assert ext is not None
        lt = current_logical_thread()
        token = TRACER_LT.set((lt, threading.get_ident())) if lt.kind != "thread" else None
        try:
            ext._memory_start(RF_STATE, self.recorder, TRACER_LT, self.interval, self.max_records, seed, self.keep == "latest")
        except BaseException:
            if token is not None:
                TRACER_LT.reset(token)
            raise
        self._token = token
        self._started = True
        _running.append(self)

    def stop(self) -> None:
        """Unhook the allocator (idempotent); the records are kept for :meth:`attach`."""
        if not self._started:
            return
        self._started = False
        ext = _native.extension
        assert ext is not None
        if self in _running:
            _running.remove(self)
        self._taken = ext._memory_stop()
        token, self._token = self._token, None
        if token is not None:
            try:
                TRACER_LT.reset(token)
            except (ValueError, RuntimeError):
                pass  # stopped from another context: the starting one keeps a stale, harmless value

    def attach(self, session: Session) -> None:
        """Give ``session`` its memory figures (once)."""
        from .._post._memory import attach_memory  # post-processing reads, never writes back

        taken = self._taken
        if taken is not None:
            attach_memory(session, taken, self.interval)
            self._taken = None  # after: a stop interrupted here (Ctrl-C) attaches again


    def attach_window(self, session: Session, since_ns: int) -> None:
        """Give ``session`` the allocations made since ``since_ns``, tracking
        on (a flight recorder's dump)."""
        from .._post._memory import attach_memory  # post-processing reads, never writes back

        if not self._started:
            return
        ext = _native.extension
        assert ext is not None
        attach_memory(session, ext._memory_peek(), self.interval, since_ns=since_ns)


def _after_fork_in_child() -> None:
    """A forked child's copy of a memory profile records nothing for its parent."""
    for run in list(_running):
        try:
            run.stop()
        except Exception:  # noqa: BLE001 - never fail a fork
            pass
        run._taken = None


os.register_at_fork(after_in_child=_after_fork_in_child)
