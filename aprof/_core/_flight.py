"""The flight recorder (issue 19): a profile that stays on, and dumps its
last seconds when asked.

A :class:`flight_recorder` runs a profile bounded by a ring
(``max_bytes``, ``keep="latest"``, aprof._core._ring) for as long as the
program runs, and on a trigger writes the last ``window`` seconds as a
normal trace or session file, without stopping:

- a call: :meth:`flight_recorder.dump`;
- a signal (``SIGUSR2`` by default): the handler only sets a flag (it takes
  no lock: it may run while the main thread holds any), which the recorder's
  dump thread reads every 0.1 s and writes
  ``dump_dir/aprof-flight-<pid>-<time>-<n>.<format>``;
- a slow request: with ``slow_request``, every request through
  :class:`aprof.ProfilerMiddleware` slower than that is dumped the same way
  (with ``max_dumps_per_minute`` as the rate limit);
- a loop block: with ``slow_loop_block``, the loop-block watchdog's
  heartbeat, late by more than that, dumps the same way;
- :func:`aprof.enable_remote_control`'s ``aprof ctl PID dump OUT``.

A dump copies the ring's raw records in one C call (no thread records in
between), then consolidates the copy and writes it, atomically (a temporary
file renamed over the target): the profile records on meanwhile, a failed
write leaves the previous file as it was, and the error is reported once
(``last_error`` keeps it). The file holds only the events that started in
the window and had ended at the dump, with the tracks they need.
"""

from __future__ import annotations

import gc
import os
import signal as _signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from . import _native
from ._callbacks import RF_STATE, AprofWarning, start_unrecorded_thread
from ._memory import DEFAULT_INTERVAL
from ._profiler import profile
from ._recorder import FLAG_UNFINISHED

# kind byte -> 1 if it has the unfinished flag, else 0 (for bytes.translate)
_UNFINISHED: Final = bytes(1 if k & FLAG_UNFINISHED else 0 for k in range(256))
_UNFINISHED_BYTE: Final = 1
_CHUNK: Final = 4096  # rows of starts a dump checks with one min()

if TYPE_CHECKING:
    from .._post._session import Session

__all__ = ["active", "flight_recorder"]

#: What a dump triggered by a signal or a slow request is written as.
FORMATS: Final = ("json.gz", "json", "aprof", "html")

#: How often the dump thread looks for a signal's request (seconds).
_POLL: Final = 0.1

_lock = threading.Lock()
_active: flight_recorder | None = None


@contextmanager
def _unrecorded() -> Iterator[None]:
    """Recording off in this context for the body: a dump's own work
    (copying the ring, writing the file: megabytes allocated, seconds of
    stacks) is not the program's."""
    token = RF_STATE.set(RF_STATE.get().replace(enabled=False))
    try:
        yield
    finally:
        RF_STATE.reset(token)


def active() -> flight_recorder | None:
    """The flight recorder running in this process, or None."""
    return _active


class flight_recorder:
    """Record continuously into a bounded ring; dump the last ``window``
    seconds on demand (issue 19). One runs per process at a time.

    Use as ``with``/``async with``, or call :meth:`start` and :meth:`stop`.

    Args:
        window: Seconds of history a dump holds (at most what the ring
            still has: a busy program fills ``max_bytes`` sooner).
        max_bytes: The ring's size: the most the recorded events hold.
        scope: ``"global"`` (the default: every thread and task in the
            process) or ``"context"`` (this context and what it spawns).
        tasks: Record tasks (their ranges, steps and spawn links).
        sample_interval: Also take a stack sample of every running thread
            every this many seconds (SPEC 8.4), each charged to the task or
            thread that ran: a dump then says where the slow request spent
            its time, not only that it was slow. The samples are a ring of
            their own (24 bytes each, at most ``max_bytes / 24``); a dump
            holds those of its window. ``None`` (the default): no sampling.
        python_tracer: Also record every Python call (SPEC 8.1; several
            times slower, for a stretch being chased, not for a server's
            whole life): the tracer's buffer is a ring of its own (16 bytes
            an event, at most ``max_bytes / 16``), and a dump holds the
            calls of its window that had ended, on their tasks' tracks.
        profile_memory: Also track allocations (issue 21), each charged to
            the task and the innermost range that made it; a dump holds the
            allocations of its window, so a request that allocated too much
            shows it. The records are a ring of their own (48 bytes each,
            at most ``max_bytes / 48``). Needs the C extension.
        memory_interval: With ``profile_memory``, sample an allocation
            every this many bytes on average (as ``profile()``).
        loop_block_threshold: Record what held the event loop longer than
            this many seconds (SPEC 7.5; the blocks are found when the
            recorder stops, so dumps do not hold them).
        signal: Dump when this signal arrives (``None``: no handler). The
            handler is installed only from the main thread, and the one it
            replaces is restored at stop.
        dump_dir: Where signal and slow-request dumps go (default: the
            current directory). Created 0700 if missing.
        dump_format: Their format: ``"json.gz"`` (Chrome trace, the
            default), ``"json"``, ``"aprof"`` (session) or ``"html"``.
        slow_request: Dump the ring when a request through
            :class:`aprof.ProfilerMiddleware` takes longer than this many
            seconds.
        slow_loop_block: Dump the ring when something holds the event loop
            longer than this many seconds (seen by the loop-block
            watchdog's heartbeat when the loop comes back; it switches on
            ``loop_block_threshold`` if needed).
        max_dumps_per_minute: The most automatic dumps (signal, slow
            request) written in any 60 seconds; the rest are counted in
            ``skipped``.

    Raises:
        TypeError, ValueError: an option is of the wrong type or out of range.
        RuntimeError: (at start) another flight recorder is running.
    """

    def __init__(
        self,
        *,
        window: float = 30.0,
        max_bytes: int = 50_000_000,
        scope: Literal["context", "global"] = "global",
        tasks: bool = True,
        sample_interval: float | None = None,
        python_tracer: bool = False,
        profile_memory: bool = False,
        memory_interval: int = DEFAULT_INTERVAL,
        loop_block_threshold: float | None = None,
        signal: int | None = _signal.SIGUSR2 if hasattr(_signal, "SIGUSR2") else None,
        dump_dir: str | PathLike[str] | None = None,
        dump_format: str = "json.gz",
        slow_request: float | None = None,
        slow_loop_block: float | None = None,
        max_dumps_per_minute: int = 6,
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 < window < float("inf"):
            raise ValueError(f"flight_recorder: window must be a number of seconds > 0, got {window!r}")
        if slow_request is not None and (
            isinstance(slow_request, bool) or not isinstance(slow_request, (int, float)) or not slow_request > 0
        ):
            raise ValueError(f"flight_recorder: slow_request must be a number of seconds > 0 or None, got {slow_request!r}")
        if slow_loop_block is not None and (
            isinstance(slow_loop_block, bool) or not isinstance(slow_loop_block, (int, float)) or not slow_loop_block > 0
        ):
            raise ValueError(
                f"flight_recorder: slow_loop_block must be a number of seconds > 0 or None, got {slow_loop_block!r}"
            )
        if slow_loop_block is not None:  # the watchdog must see blocks that short
            loop_block_threshold = min(loop_block_threshold or slow_loop_block, slow_loop_block)
        if dump_format not in FORMATS:
            raise ValueError(f"flight_recorder: dump_format must be one of {', '.join(FORMATS)}, got {dump_format!r}")
        if type(max_dumps_per_minute) is not int or max_dumps_per_minute < 1:
            raise ValueError(f"flight_recorder: max_dumps_per_minute must be an int >= 1, got {max_dumps_per_minute!r}")
        if signal is not None and (isinstance(signal, bool) or not isinstance(signal, int)):
            raise TypeError(f"flight_recorder: signal must be a signal number or None, got {signal!r}")
        self.window = float(window)
        self.signal = signal
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.dump_format = dump_format
        self.slow_request = slow_request
        self.slow_loop_block = slow_loop_block
        self.max_dumps_per_minute = max_dumps_per_minute
        # The options are checked here, by profile().
        self.profile = profile(
            scope=scope,
            tasks=tasks,
            sample_interval=sample_interval,
            python_tracer=python_tracer,
            profile_memory=profile_memory,
            memory_interval=memory_interval,
            loop_block_threshold=loop_block_threshold,
            max_bytes=max_bytes,
            keep="latest",
        )
        #: Files written by dumps, oldest first (the last 100).
        self.dumps: deque[Path] = deque(maxlen=100)
        #: Automatic dumps not written: past the rate limit, or one was running.
        self.skipped = 0
        #: The last dump's error, or None.
        self.last_error: BaseException | None = None
        self._reported: set[str] = set()
        self._times: deque[float] = deque()
        self._dump_lock = threading.Lock()
        self._wake = threading.Event()
        self._signalled = 0
        self._pending: list[tuple[str, dict[str, Any]]] = []
        # The dump thread is a bare _thread, which the program does not see
        # in threading.enumerate() (SPEC 15.6); _done is its join.
        self._done: threading.Event | None = None
        self._old_handler: Any = None
        self._running = False
        self.session: Session | None = None

    # -- lifecycle ----------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> flight_recorder:
        """Start recording.

        Raises:
            RuntimeError: a flight recorder is already running in this process.
        """
        global _active
        done = threading.Event()
        with _lock:
            if _active is not None:
                raise RuntimeError("aprof: a flight recorder is already running in this process")
            self.profile.start()
            _active = self
            self._running = True
        self._done = done
        # The dump thread records nothing of its own work (a global profile
        # would see its allocations, samples and calls as the program's).
        start_unrecorded_thread(self._dump_main, done)
        if self.signal is not None and threading.current_thread() is threading.main_thread():
            self._old_handler = _signal.signal(self.signal, self._on_signal)
        return self

    def stop(self) -> Session:
        """Stop recording; the profile's session (the whole ring) is returned
        and kept in ``session``. A dump running finishes first."""
        global _active
        if not self._running:
            if self.session is None:
                raise RuntimeError("aprof: this flight recorder was not started")
            return self.session
        if self._old_handler is not None:
            try:
                _signal.signal(self.signal, self._old_handler)  # type: ignore[arg-type]
            except (ValueError, OSError):  # not the main thread now: leave it
                pass
            self._old_handler = None
        with _lock:
            self._running = False
            if _active is self:
                _active = None
        self._wake.set()
        if self._done is not None:
            self._done.wait(timeout=30)
            self._done = None
        with self._dump_lock:  # a dump in progress reads the profile's state
            self.profile.stop()
        self.session = self.profile.session
        return self.session

    def __enter__(self) -> flight_recorder:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> flight_recorder:
        return self.start()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- dumps --------------------------------------------------------------

    def snapshot(self, window: float | None = None) -> Session:
        """The last ``window`` seconds (default: the recorder's) as a session,
        without stopping: the events that started in it and have ended.

        Raises:
            RuntimeError: the recorder is not running.
        """
        with _unrecorded(), self._dump_lock:
            return self._snapshot(self.window if window is None else window, None)

    def dump(self, path: str | PathLike[str], window: float | None = None) -> Path:
        """Write the last ``window`` seconds to ``path`` (format by suffix,
        as ``aprof run -o``), atomically, without stopping.

        Raises:
            RuntimeError: the recorder is not running.
            OSError, ValueError: the file cannot be written or its suffix is
                unknown (the previous file at ``path`` is left as it was).
        """
        from .._export._files import write_by_suffix

        out = Path(path)
        with _unrecorded(), self._dump_lock:
            session = self._snapshot(self.window if window is None else window, None)
            write_by_suffix(session, out)
        self.dumps.append(out)
        return out

    def trigger(self, reason: str, **info: Any) -> bool:
        """Ask for an automatic dump (as a signal or a slow request does):
        written by the recorder's thread into ``dump_dir``, unless past the
        rate limit. Not from a signal handler (it takes a lock): give the
        recorder the ``signal`` instead. Returns whether it was queued."""
        if not self._running:
            return False
        now = time.monotonic()
        times = self._times
        while times and now - times[0] >= 60.0:
            times.popleft()
        if len(times) >= self.max_dumps_per_minute or len(self._pending) >= 4:
            self.skipped += 1
            return False
        times.append(now)
        self._pending.append((reason, info))
        self._wake.set()
        return True

    def request_done(self, name: str, duration_ns: int) -> None:
        """(ProfilerMiddleware) A request took ``duration_ns``: dump if it
        was slower than ``slow_request``."""
        slow = self.slow_request
        if slow is not None and duration_ns > slow * 1e9:
            self.trigger("slow request", request=name, duration_ns=duration_ns)

    def loop_blocked(self, duration_ns: int) -> None:
        """(the loop-block watchdog's heartbeat, on the loop) The loop was
        held about ``duration_ns``: dump if longer than ``slow_loop_block``."""
        slow = self.slow_loop_block
        if slow is not None and duration_ns > slow * 1e9:
            self.trigger("loop block", duration_ns=duration_ns)

    def records(self, state: object) -> bool:
        """Whether ``state`` is this recorder's profile's (running) state."""
        return self.profile._state is state

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only a flag: the handler runs between two bytecodes of the main
        # thread, which may hold any lock (the wake-up Event's among them).
        # The dump thread looks at it every _POLL seconds.
        self._signalled = signum

    def _dump_main(self, done: threading.Event) -> None:
        try:
            self._dump_loop()
        finally:
            done.set()

    def _dump_loop(self) -> None:
        while True:
            self._wake.wait(_POLL)
            self._wake.clear()
            signum, self._signalled = self._signalled, 0
            if signum:
                self.trigger("signal", signal=signum)
            while self._pending:
                reason, info = self._pending.pop(0)
                self._auto_dump(reason, info)
            if not self._running:
                return

    def _auto_dump(self, reason: str, info: dict[str, Any]) -> None:
        if not self._running:  # asked for as the recorder stops: nothing to write, nothing to report
            return
        directory = self.dump_dir or Path.cwd()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
        out = directory / f"aprof-flight-{os.getpid()}-{stamp}-{len(self.dumps) + self.skipped}.{self.dump_format}"
        try:
            from .._export._files import write_by_suffix

            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._dump_lock:
                if not self._running or not self.profile.running:
                    return
                session = self._snapshot(self.window, {"reason": reason, **info})
                write_by_suffix(session, out)
            self.dumps.append(out)
        except Exception as exc:  # reported once per kind; the recorder runs on
            self.last_error = exc
            kind = type(exc).__name__
            if kind not in self._reported:
                self._reported.add(kind)
                try:
                    warnings.warn(f"aprof: the flight recorder's dump to {out} failed: {exc!r}", AprofWarning, stacklevel=1)
                except Exception:  # warnings turned into errors: never into the program
                    pass

    def _snapshot(self, window: float, trigger: dict[str, Any] | None) -> Session:
        from .._post._events import consolidate
        from .._post._session import Session, dropped_metadata

        prof = self.profile
        state = prof._state
        if not self._running or state is None or state.ring is None or not state.running:
            raise RuntimeError("aprof: the flight recorder is not running")
        ring = state.ring
        now = perf_counter_ns()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # no finalizer runs (and records) while the records are copied
        ring.pins += 1  # and no generation is let go (emptied) under the copy
        try:
            views = list(ring.lists().values())
            records = ring.task_records()
            ext = _native.extension
            flat = [lst for _, chunks in views for lst in chunks]
            copies = ext.raw_snapshot(flat) if ext is not None else [list(lst) for lst in flat]
            dropped = ring.dropped()
            if prof._tracer is not None:  # the tracer's ring lets go of its own
                dropped["tracer_events"] = int(prof._tracer.tracer.dropped)
            lists: dict[Any, Any] = {}
            k = 0
            for lt, chunks in views:
                got = copies[k : k + len(chunks)]
                k += len(chunks)
                lists[lt] = got[0] if len(got) == 1 else tuple(got)
            # Gone before the GC runs again: a task per request makes tens of
            # thousands of these, which a collection would otherwise move to
            # the old generation (and set off a full collection of the heap).
            del views, flat, copies
        finally:
            ring.pins -= 1
            if gc_was_enabled:
                gc.enable()
        tracer = prof._tracer
        if tracer is not None:  # its calls so far, as more chunks of their threads' lists
            by_id = {lt.id: lt for lt in lists}
            for lt, calls in tracer.peek_lists().items():
                key = by_id.get(lt.id, lt)
                have = lists.get(key)
                lists[key] = calls if have is None else (*(have if type(have) is tuple else (have,)), calls)
        # Consolidated with the cyclic GC on: the dump runs beside the
        # program, whose collections must not wait for it.
        table, tracks = consolidate(lists, now, state.node_id, records, state.with_stack)
        since = max(now - int(window * 1e9), ring.window_start_ns())
        kind, start = table.kind, table.start
        # Left out: the events that started before the window or had not
        # ended. Mostly the whole ring is in the window and all but a few
        # events (a server's running tasks, its open ranges) have ended, so
        # both are found in C: a min() per chunk of the starts (a chunk that
        # starts in the window is not looked into), a byte translate and
        # find() of the kinds; the rest of the table is kept as it is, or cut
        # around those few rows (a row-by-row test in Python and take() of
        # a list of the rows kept cost about 2,900 instructions a row).
        rows: set[int] = set()
        for at in range(0, len(table), _CHUNK):
            chunk = start[at : at + _CHUNK]
            if min(chunk) < since:
                rows.update(at + j for j, t in enumerate(chunk) if t < since)
        open_rows = kind.tobytes().translate(_UNFINISHED)
        i = open_rows.find(_UNFINISHED_BYTE)
        while i >= 0:
            rows.add(i)
            i = open_rows.find(_UNFINISHED_BYTE, i + 1)
        if not rows:
            kept = table
        elif 2 * len(rows) < len(table):
            kept = table.drop(sorted(rows))
        else:  # a window much shorter than the ring: most rows are left out
            kept = table.take([i for i in range(len(table)) if i not in rows])
        metadata: dict[str, Any] = {
            **Session.base_metadata(state, now),
            **dropped_metadata(dropped),
            "flight_recorder": {
                "window_ns": int(window * 1e9),
                "since_ns": since,
                "events_in_ring": len(table),
                "trigger": trigger or {"reason": "dump"},
            },
        }
        session = Session(kept, tracks, metadata)
        sampler = prof._sampler
        if sampler is not None:
            sampler.attach_window(session, state.node_id, since)
        memory = prof._memory
        if memory is not None:
            memory.attach_window(session, since)
        return session
