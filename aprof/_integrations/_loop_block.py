"""Loop-block detection (SPEC 7.5): what held the event loop, and where.

Two sources, merged when the profile stops:

* **Task steps.** aprof stamps the start and end of every step of every task
  it records. A step longer than the threshold *is* a loop block by that
  task, exactly: its edges are the step's, two tasks' steps are never merged,
  and a step still running when ``stop()`` is called (the profile stopped by
  the blocking code itself) is cut at the stop time, not lost.
* **A heartbeat and a watchdog**, for what has no steps: callbacks, the task
  that started the profile (it existed before, so it is not recorded), and,
  in a context-scope profile, work outside the profile. A heartbeat runs on
  the loop (a ``call_later`` chain on asyncio and uvloop, a system task on
  trio) every ``interval`` = threshold / 2; a watchdog thread checks that it
  keeps coming. A heartbeat late by more than the threshold is a block whose
  edges are known to about one interval.

While the heartbeat is late the watchdog also *samples* the loop thread's
Python stack (``sys._current_frames()``), every ``interval / 2``. The
samples are what names the blocking code: the block's ``stack`` is the
stack sampled most often inside it (the first seen on a tie), and the
distinct stacks sampled during a block, with how often each was seen, are
kept in ``extra["samples"]`` (the per-task hot frames of the summary). A
sample of running code whose reading was interrupted long enough for the
loop thread to run on (a descheduled watchdog) is dropped: its frames and
its time may belong to different steps. A sample that shows the loop idle in
its I/O wait (a virtual clock, a loop stopped and restarted) is no block.

A context-scope profile must not record other tenants' work (SPEC 5.2): a
heartbeat block whose sampled code is not this profile's (not one of its
tasks, not the task that started it) is kept, since the profile really
waited, but named "loop blocked by work outside this profile", with no
task name, stack or samples.

Blocks are ``LOOP_BLOCK`` ranges on a track of their own per loop thread
("event loop blocked"), so they never break the nesting of a task's ranges.
Nothing here patches ``asyncio.Handle``, so it works on uvloop too.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Final

from .._core import _flight, _native
from .._core._callbacks import start_unrecorded_thread
from .._core._recorder import KIND_RANGE, ProfilerState
from .._core._threads import LogicalThread

__all__ = ["LoopBlocks", "start"]

_MAX_DEPTH: Final = 64
_MAX_SAMPLED_STACKS: Final = 8  # distinct stacks kept per block
_MAX_STALLS: Final = 10_000  # stalls kept until stop (the oldest half goes past it)
_OWN_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
OUTSIDE: Final = "work outside this profile"

Stack = tuple[tuple[str, int, str], ...]


class _Sample:
    __slots__ = ("frames", "idle", "owned", "t", "task_name", "thread_id")

    def __init__(self, t: int, thread_id: int, frames: Stack, task_name: str | None, owned: bool, idle: bool) -> None:
        self.t = t
        self.thread_id = thread_id
        self.frames = frames
        self.task_name = task_name
        self.owned = owned
        self.idle = idle


#: Innermost frames that mean no step or callback is running: the loop
#: waits for I/O, or is between two of them in its own scheduler (there,
#: a late heartbeat is the machine or the runtime, not code that blocked).
_IDLE_FUNCTIONS: Final = frozenset({"select", "poll", "get_events", "_run_once", "unrolled_run"})
_IDLE_FILES: Final = ("selectors.py", "_io_epoll.py", "_io_kqueue.py", "_io_windows.py", "base_events.py", "_run.py")


def _is_idle(frames: Stack) -> bool:
    if not frames:
        return False
    filename, _, function = frames[0]
    return function.rsplit(".", 1)[-1] in _IDLE_FUNCTIONS and filename.endswith(_IDLE_FILES)


class _Watch:
    """Heartbeat bookkeeping and a watchdog thread for one loop (or trio run)."""

    def __init__(
        self,
        blocks: LoopBlocks,
        loop_thread_id: int,
        current: Callable[[list[Any]], tuple[str | None, bool]],
        paused: Callable[[], bool],
        closed: Callable[[], bool],
    ) -> None:
        self.blocks = blocks
        self.loop_thread_id = loop_thread_id
        self._current = current  # (frame objects) -> (task name or None, whether it is this profile's)
        self._paused = paused  # () -> the loop is not running now (between two runs of one loop)
        self._closed = closed  # () -> the loop is closed, or the trio run over: the watch retires
        self.cancel_heartbeat: Callable[[], None] = _nothing
        self.interval_ns = blocks.interval_ns
        self.last_beat = perf_counter_ns()
        self.pending: list[_Sample] = []
        self.was_paused = False
        self.ended = False  # the loop or run is gone: nothing is in progress at stop
        self._stop = threading.Event()
        # The watchdog runs on a bare thread (``_thread``), which the program
        # does not see in threading.enumerate() or threading.active_count()
        # (SPEC 15.6; anyio's tests count threads). ``_done`` is its join.
        self._done = threading.Event()
        self._ident: int | None = None

    def start(self) -> None:
        self.last_beat = perf_counter_ns()
        _live_watches.add(self)
        start_unrecorded_thread(self._main)  # a bare thread, recording nothing of its own

    def _main(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._run()
        finally:
            self._done.set()
            _live_watches.discard(self)

    @property
    def alive(self) -> bool:
        """Whether the watchdog thread still runs."""
        return self in _live_watches

    def stop(self) -> None:
        self._stop.set()
        if self.alive and _thread.get_ident() != self._ident:
            self._done.wait(timeout=5.0)

    def retire(self) -> None:
        """The loop is gone: nothing more to watch, nothing of it to keep."""
        self.ended = True
        self._current = _nobody
        self._paused = self._closed = _yes
        self.cancel_heartbeat = _nothing

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def reset(self) -> None:
        """The loop (re)starts running: the time before is no block."""
        self.last_beat = perf_counter_ns()
        self.pending = []
        self.was_paused = False

    def beat(self) -> None:
        """Called on the loop every interval."""
        now = perf_counter_ns()
        due = self.last_beat + self.interval_ns
        self.last_beat = now
        samples, self.pending = self.pending, []
        if self.was_paused:  # the loop stopped and ran again in between
            self.was_paused = False
            return
        if now - due > self.interval_ns:
            # Late: kept as a stall. Its samples may belong to a task step
            # longer than the threshold even when the lateness is not.
            stalls = self.blocks.stalls
            stalls.append((due, now, self.loop_thread_id, samples))
            if len(stalls) > _MAX_STALLS:  # a profile that stays on (a flight recorder): the oldest half goes
                del stalls[: len(stalls) // 2]
            recorder = _flight.active()
            if recorder is not None and recorder.records(self.blocks.state):
                recorder.loop_blocked(now - due + self.interval_ns)

    def in_progress(self, now: int) -> None:
        """At stop: a stall still under way (the blocking code stopped the profile)."""
        if self.ended or self._paused():
            return
        due = self.last_beat + self.interval_ns
        if now - due > self.interval_ns:
            self.blocks.stalls.append((due, now, self.loop_thread_id, self.pending))
            self.pending = []

    def _run(self) -> None:
        poll = self.interval_ns / 2e9
        while not self._stop.wait(poll):
            if self._closed():
                # A program (or test suite) that runs many loops one after
                # the other: each watch ends with its loop, and lets it go.
                self.retire()
                return
            if self._paused():
                self.was_paused = True
                continue
            behind = perf_counter_ns() - self.last_beat - self.interval_ns
            if behind > self.interval_ns // 2:
                sample = self._sample()
                if sample is not None:
                    self.pending.append(sample)

    def _sample(self) -> _Sample | None:
        t = perf_counter_ns()
        frame = sys._current_frames().get(self.loop_thread_id)
        if frame is None:
            return None
        objects: list[Any] = []
        frames: list[tuple[str, int, str]] = []
        while frame is not None and len(frames) < _MAX_DEPTH:
            objects.append(frame)
            code = frame.f_code
            if not code.co_filename.startswith(_OWN_DIR):  # aprof's own frames are never the culprit
                frames.append((code.co_filename, frame.f_lineno or 0, code.co_qualname))
            frame = frame.f_back
        stack = tuple(frames)
        try:
            task_name, owned = self._current(objects)
        except Exception:  # a task with an odd name: no name, not proven ours
            task_name, owned = None, False
        idle = _is_idle(stack)
        if not idle and perf_counter_ns() - t > max(self.interval_ns // 4, 1_000_000):
            # The loop thread ran while this thread was reading its frames
            # (a busy machine deschedules the watchdog): the frames may be
            # half of one step and half of the next, and which block they
            # belong to cannot be told. Dropped, not misplaced. (An idle
            # sample is kept: the loop did wait for I/O in this stall,
            # which is all an idle sample is used to say.)
            return None
        return _Sample(t, self.loop_thread_id, stack, task_name, owned or self.blocks.global_scope, idle)


#: Watches whose watchdog thread runs (tests and the fork handler read it).
_live_watches: weakref.WeakSet[_Watch] = weakref.WeakSet()


def live_watchdogs() -> int:
    """How many loop-block watchdog threads run now."""
    return len(_live_watches)


def _after_fork_in_child() -> None:
    # A forked child has none of its parent's threads: nothing to wait for.
    for watch in list(_live_watches):
        watch._done.set()
    _live_watches.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _nothing() -> None:
    pass


def _yes() -> bool:
    return True


def _nobody(frames: list[Any]) -> tuple[str | None, bool]:
    return None, False


class LoopBlocks:
    """The loop-block detection of one profile: its watches, stalls and samples.

    ``finish()`` (at stop, before consolidation) turns long task steps and
    long stalls into ``LOOP_BLOCK`` records in the profile's lists.
    """

    def __init__(self, state: ProfilerState, threshold_s: float, global_scope: bool) -> None:
        self.state = state
        self.global_scope = global_scope
        self.threshold_ns = int(threshold_s * 1e9)
        self.interval_ns = max(self.threshold_ns // 2, 500_000)
        self.watches: list[_Watch] = []
        # (due_ns, beat_ns, loop_thread_id, samples): the heartbeat came late.
        self.stalls: list[tuple[int, int, int, list[_Sample]]] = []
        self._finished = False

    # -- watching ------------------------------------------------------------

    def watch_asyncio(self, loop: Any, start_task: Any = None) -> None:
        """Watch an asyncio or uvloop loop, from its own thread.

        The watch holds the loop weakly (uvloop's loops cannot be weakly
        referenced: those are held until the watch ends with them), so a
        program that drops a finished loop sees it freed as without aprof
        (SPEC 15.6): the watchdog thread, the heartbeat scheduled on the
        loop and the cancel hook reach it only through ``loop_of``.
        """
        import asyncio

        loop_of = _weak(loop)
        del loop
        start_ref = _weak(start_task)
        state = self.state

        def current(frames: list[Any]) -> tuple[str | None, bool]:
            lp = loop_of()
            task = asyncio.current_task(lp) if lp is not None else None
            if task is None:
                return None, False
            return str(task.get_name()), _task_is_ours(task, start_ref, state)

        def ended() -> bool:
            lp = loop_of()
            return lp is None or bool(lp.is_closed())

        def paused() -> bool:
            lp = loop_of()
            return lp is None or lp.is_closed() or not lp.is_running()

        watch = _Watch(self, threading.get_ident(), current, paused, ended)
        handle: list[Any] = [None]  # the next heartbeat's handle, weakly (it holds the loop)

        def schedule(callback: Callable[[], None]) -> None:
            lp = loop_of()
            if lp is not None and not watch.stopping:
                handle[0] = _weak(lp.call_later(watch.interval_ns / 1e9, callback))

        def beat() -> None:
            watch.beat()
            schedule(beat)

        def first_beat() -> None:
            # The loop was not running yet (a global profile hooks loops as
            # asyncio.Runner makes them): the time before it ran is no block.
            watch.reset()
            schedule(beat)

        lp = loop_of()
        assert lp is not None  # the caller holds it
        if lp.is_running():
            handle[0] = _weak(lp.call_later(watch.interval_ns / 1e9, beat))
        else:
            handle[0] = _weak(lp.call_soon(first_beat))
        del lp

        def cancel() -> None:
            h, lp = handle[0]() if handle[0] is not None else None, loop_of()
            if h is not None and lp is not None and not lp.is_closed():
                try:
                    lp.call_soon_threadsafe(h.cancel)
                except RuntimeError:
                    pass  # the loop closed meanwhile

        watch.cancel_heartbeat = cancel
        watch.start()
        self.watches.append(watch)

    def watch_trio(self, start_task: Any = None) -> None:
        """Watch the current trio run, from inside it."""
        import trio

        # trio keeps its current task in a thread-local of the loop thread,
        # which the watchdog cannot read. The task that started the profile
        # is recognised by its coroutine's frame on the sampled stack; the
        # profile's other tasks by their steps.
        start_frame = getattr(getattr(start_task, "coro", None), "cr_frame", None)

        def current(frames: list[Any]) -> tuple[str | None, bool]:
            if start_frame is not None and any(f is start_frame for f in frames):
                return str(start_task.name), True
            return None, False

        # No heartbeat task: a task in the run, waking every interval, would
        # be seen by the program (SPEC 15.6): current_statistics() counts it,
        # its deadline changes every I/O wait's timeout (and what a MockClock
        # autojumps to), and wait_all_tasks_blocked(cushion > interval) would
        # never return. An instrument beats instead, at the scheduler's own
        # checkpoints: after every task step, and around every I/O wait
        # (idle: no block), so a stretch longer than the threshold between
        # two checkpoints is one step, callback or instrument that held the run.
        idle = [False]
        watch = _Watch(self, threading.get_ident(), current, lambda: idle[0], lambda: watch.ended)

        class _Beat(trio.abc.Instrument):
            def after_task_step(self, task: Any) -> None:
                if watch.stopping:
                    trio.lowlevel.remove_instrument(self)
                    return
                watch.beat()

            def before_io_wait(self, timeout: float) -> None:
                if watch.stopping:
                    trio.lowlevel.remove_instrument(self)
                    return
                watch.beat()
                idle[0] = True

            def after_io_wait(self, timeout: float) -> None:
                idle[0] = False
                watch.reset()

            def after_run(self) -> None:
                watch.ended = True

        # Nothing to cancel at stop: the instrument takes itself out at its
        # next call (waking the run to remove it would be seen, as above).
        trio.lowlevel.add_instrument(_Beat())
        watch.start()
        self.watches.append(watch)

    # -- at stop ---------------------------------------------------------------

    def finish(self) -> None:
        """Stop watching and record the blocks into the profile's lists."""
        if self._finished:
            return
        self._finished = True
        for w in self.watches:
            w.stop()
            w.cancel_heartbeat()
        st = self.state
        stop_ns = st.stop_ns if st.stop_ns is not None else perf_counter_ns()
        for w in self.watches:
            w.in_progress(stop_ns)
        samples = [s for _, _, _, ss in self.stalls for s in ss if not s.idle]
        samples.sort(key=lambda s: s.t)
        blocks = self._step_blocks(stop_ns)
        blocks += self._stall_blocks(blocks)
        _assign_samples(blocks, samples)
        self._record(blocks)

    def _step_blocks(self, stop_ns: int) -> list[_Block]:
        """Every recorded task step longer than the threshold."""
        out: list[_Block] = []
        threshold = self.threshold_ns
        for rec in self.state.all_task_records():
            info = _task_info(rec)
            if info is None:
                continue
            tid, name, coro, os_tid, steps = info
            n = len(steps)
            for i in range(0, n, 2):
                start = steps[i]
                if start >= stop_ns:
                    break
                end = steps[i + 1] if i + 1 < n else stop_ns
                end = min(end, stop_ns)
                if end - start > threshold:
                    out.append(_Block(start, end, os_tid, "step", name, tid, coro))
        # An eager task's first step runs inside its spawner's step: the
        # inner step is the block; the outer one is one only for the rest.
        out.sort(key=lambda b: (b.thread_id, b.start, -b.end))
        kept: list[_Block] = []
        for b in out:
            inner = sum(c.end - c.start for c in out if c is not b and c.thread_id == b.thread_id and b.start <= c.start and c.end <= b.end)
            if b.end - b.start - inner > threshold:
                kept.append(b)
        return kept

    def _stall_blocks(self, steps: list[_Block]) -> list[_Block]:
        """Stalls longer than the threshold that no task step explains."""
        out: list[_Block] = []
        for due, beat, thread_id, samples in self.stalls:
            if beat - due <= self.threshold_ns:
                continue
            if samples and all(s.idle for s in samples):
                continue  # the loop was waiting for I/O (a virtual clock), not blocked
            if not samples and beat - due <= 2 * self.threshold_ns:
                # Nothing sampled: C code holding the GIL, or the whole
                # process descheduled on a busy machine. Only a long one is
                # worth a line without a stack to show.
                continue
            covered = sum(
                max(0, min(beat, b.end) - max(due, b.start)) for b in steps if b.thread_id == thread_id
            )
            if covered and beat - due - covered <= self.threshold_ns:
                # Mostly a task step's block, recorded exactly from the
                # step; what is left is no longer than the threshold.
                continue
            out.append(_Block(due, beat, thread_id, "stall", None, 0, None))
        return out

    def _record(self, blocks: list[_Block]) -> None:
        st = self.state
        tracks: dict[int, LogicalThread] = {}
        for b in sorted(blocks, key=lambda b: (b.start, -b.end)):
            lt = tracks.get(b.thread_id)
            if lt is None:
                lt = tracks[b.thread_id] = LogicalThread("thread", _track_name(b.thread_id))
                lt.os_thread_id = b.thread_id
            if not st.admit(KIND_RANGE):
                continue
            name, stack, extra = b.describe(self)
            lst = st.list_for(lt)
            idx = len(lst)
            lst.append((name, "loop_block", b.start, None, -1, 0, None, stack, KIND_RANGE, extra))
            lst.append((idx, b.end, lt.id, None))


class _Block:
    __slots__ = ("coro", "end", "samples", "source", "start", "task", "task_id", "thread_id")

    def __init__(
        self, start: int, end: int, thread_id: int, source: str, task: str | None, task_id: int, coro: str | None
    ) -> None:
        self.start = start
        self.end = end
        self.thread_id = thread_id
        self.source = source  # "step": a recorded task's step; "stall": the heartbeat's
        self.task = task
        self.task_id = task_id
        self.coro = coro
        self.samples: list[_Sample] = []

    def describe(self, blocks: LoopBlocks) -> tuple[str, Stack | None, dict[str, Any]]:
        extra: dict[str, Any] = {"threshold_ns": blocks.threshold_ns}
        samples = self.samples
        if self.source == "step":
            extra.update(blocked_task=self.task, task_id=self.task_id, coro=self.coro, source="step")
            name = f"loop blocked by {self.task}"
        else:
            first = samples[0] if samples else None
            if first is not None and not first.owned:
                # Not this profile's work (SPEC 5.2): the wait is real, whose it was is not ours to keep.
                extra.update(blocked_task=OUTSIDE, source="outside")
                return f"loop blocked by {OUTSIDE}", None, extra
            if first is None:
                who = "(not sampled)"
            elif first.task_name is not None:
                who = first.task_name
            else:
                who = "(callback)"
            extra.update(blocked_task=who, source="heartbeat")
            name = f"loop blocked by {who}" if first is not None and first.task_name else "loop blocked"
            samples = [s for s in samples if s.owned]
        if samples:
            counts: dict[Stack, int] = {}
            for s in samples:
                counts[s.frames] = counts.get(s.frames, 0) + 1
            ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:_MAX_SAMPLED_STACKS]
            extra["samples"] = [[n, [list(f) for f in frames]] for frames, n in ranked]
            # The block's stack: the one seen most (the first seen on a tie).
            return name, ranked[0][0], extra
        return name, None, extra


def _assign_samples(blocks: list[_Block], samples: list[_Sample]) -> None:
    """Give each sample to the innermost block on its thread that contains it."""
    for s in samples:
        best: _Block | None = None
        for b in blocks:
            if b.thread_id == s.thread_id and b.start <= s.t <= b.end and (best is None or b.end - b.start < best.end - best.start):
                best = b
        if best is not None:
            best.samples.append(s)


def _task_info(rec: Any) -> tuple[int, str, str, int, list[int]] | None:
    """(track id, name, coroutine, OS thread, flat steps) of a task record:
    a finished task's record or a running task's object
    (``aprof._integrations._tasks``)."""
    try:
        if type(rec) in _native.TASK_RECORD_TYPES:
            return rec[0], rec[1], rec[4], rec[3], list(rec[11])
        return rec.id, rec.current_name(), rec.coro_name, rec.os_thread_id, list(rec.steps)
    except Exception:  # a record of another shape: no steps to read
        return None


def _weak(obj: Any) -> Callable[[], Any]:
    if obj is None:
        return lambda: None
    import weakref

    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _task_is_ours(task: Any, start_ref: Callable[[], Any], state: ProfilerState) -> bool:
    """Whether an asyncio task's work belongs to this context-scope profile:
    the task that started it, or a task whose context runs its recorder
    (3.12+: ``Task.get_context``; on 3.11 only the starting task is known)."""
    if task is start_ref():
        return True
    get_context = getattr(task, "get_context", None)
    if get_context is None:
        return False
    from .._core._callbacks import RF_STATE

    st = get_context().get(RF_STATE, None)
    rec = getattr(st, "recorder", None)
    return rec is not None and rec.state is state


def _track_name(thread_id: int) -> str:
    if thread_id == threading.main_thread().ident:
        return "event loop blocked"
    t = threading._active.get(thread_id)  # type: ignore[attr-defined]
    return f"event loop blocked ({t.name})" if t is not None else "event loop blocked"


# ---------------------------------------------------------------------------
# Starting the watch for a profile
# ---------------------------------------------------------------------------


def start(state: ProfilerState, threshold_s: float, global_scope: bool) -> list[Callable[[], None]]:
    """Watch the running asyncio loop or trio run of a starting profile.

    A global profile started outside any loop (``aprof run``) watches every
    loop ``asyncio.Runner`` makes and every trio run that starts while it
    runs instead. Returns the undo actions; the last one records the blocks.
    """
    blocks = LoopBlocks(state, threshold_s, global_scope)
    undo: list[Callable[[], None]] = []
    started = False
    if "asyncio" in sys.modules:
        from . import _asyncio

        loop = _asyncio.running_loop()
        if loop is not None:
            import asyncio

            blocks.watch_asyncio(loop, asyncio.current_task(loop))
            started = True
    if not started and "trio" in sys.modules:
        import trio

        if trio.lowlevel.in_trio_run():
            task = None
            try:
                task = trio.lowlevel.current_task()
            except RuntimeError:
                pass
            blocks.watch_trio(task)
            started = True
    if not started and global_scope:
        undo += _watch_new_runs(blocks)
    undo.append(blocks.finish)
    return undo


def _watch_new_runs(blocks: LoopBlocks) -> list[Callable[[], None]]:
    from .._core._profiler import _on_new_trio_runs

    undo: list[Callable[[], None]] = []
    state = blocks.state
    if "asyncio" in sys.modules:
        from . import _asyncio

        # The loops watched, weakly (uvloop's cannot be weakly referenced:
        # those until they close): a program's finished loop is freed.
        watched: list[Callable[[], Any]] = []

        def _live(w: Callable[[], Any]) -> bool:
            lp = w()
            return lp is not None and not lp.is_closed()  # a closed loop is never handed out again

        def watch(loop: Any) -> None:
            watched[:] = [w for w in watched if _live(w)]
            if state.running and not any(w() is loop for w in watched):
                watched.append(_weak(loop))
                blocks.watch_asyncio(loop)

        undo.append(_asyncio.on_new_loops(watch))

    def watch_trio_run() -> Callable[[], None]:
        # From before_run: the watch is an instrument, added in place.
        if state.running and not blocks._finished:
            blocks.watch_trio()
        return lambda: None  # finish() stops every watch

    undo.append(_on_new_trio_runs(watch_trio_run))
    return undo
