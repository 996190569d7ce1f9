"""Loop-block detection (SPEC 7.5): what held the event loop, and where.

A heartbeat runs on the loop (a ``call_later`` chain on asyncio and uvloop, a
system task on trio) every ``interval`` = threshold / 2. A watchdog thread
checks that the heartbeat keeps coming; when it is late by more than the
threshold, the loop is held by one step or callback, and the watchdog reads
the loop thread's current Python stack (``sys._current_frames()``) — the
blocking code — and which task was running. When the heartbeat comes back, it
records the stretch as a ``LOOP_BLOCK`` range with that stack, on a track of
its own ("event loop blocked") so it never breaks the nesting of the task's
ranges.

Nothing here patches ``asyncio.Handle``, so it works on uvloop too. The
stretch's edges are accurate to about one interval.
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns
from typing import Any

from .._core._recorder import KIND_RANGE, ProfilerState
from .._core._threads import LogicalThread

__all__ = ["LoopBlockWatch"]

_MAX_DEPTH = 64
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class LoopBlockWatch:
    """Heartbeat + watchdog for one loop (or trio run) of one profile."""

    def __init__(
        self, state: ProfilerState, threshold_s: float, loop_thread_id: int, current_task: Any, unknown: str
    ) -> None:
        self._unknown = unknown  # what to call the blocker when no task was running
        self.state = state
        self.threshold_ns = int(threshold_s * 1e9)
        self.interval_s = max(threshold_s / 2.0, 0.0005)
        self.interval_ns = int(self.interval_s * 1e9)
        self.loop_thread_id = loop_thread_id
        self._current_task = current_task  # () -> the task running on the loop, or None
        self.lt = LogicalThread("thread", "event loop blocked")
        self.last_beat = perf_counter_ns()
        self._stack: tuple[tuple[str, int, str], ...] | None = None
        self._task_name: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="aprof-loop-watchdog", daemon=True)
        self._thread._aprof_owned = True  # type: ignore[attr-defined]

    def start(self) -> None:
        self.last_beat = perf_counter_ns()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def beat(self) -> None:
        """Called on the loop every interval."""
        now = perf_counter_ns()
        prev = self.last_beat
        self.last_beat = now
        late = now - prev - self.interval_ns
        if late > self.threshold_ns:
            stack, self._stack = self._stack, None
            task_name, self._task_name = self._task_name, None
            st = self.state
            if st.running:
                start = prev + self.interval_ns
                extra = {"blocked_task": task_name or self._unknown, "threshold_ns": self.threshold_ns}
                name = f"loop blocked by {task_name}" if task_name else "loop blocked"
                lst = st.list_for(self.lt)
                idx = len(lst)
                lst.append((name, "loop_block", start, None, -1, 0, None, stack, KIND_RANGE, extra))
                lst.append((idx, now, self.lt.id, None))
        else:
            self._stack = None
            self._task_name = None

    def _watch(self) -> None:
        poll = self.interval_s / 2.0
        while not self._stop.wait(poll):
            behind = perf_counter_ns() - self.last_beat - self.interval_ns
            if behind > self.threshold_ns and self._stack is None:
                self._stack, self._task_name = self._sample()

    def _sample(self) -> tuple[tuple[tuple[str, int, str], ...], str | None]:
        frame = sys._current_frames().get(self.loop_thread_id)
        frames: list[tuple[str, int, str]] = []
        while frame is not None and len(frames) < _MAX_DEPTH:
            code = frame.f_code
            if not code.co_filename.startswith(_OWN_DIR):  # aprof's step proxy is not the culprit
                frames.append((code.co_filename, frame.f_lineno or 0, code.co_qualname))
            frame = frame.f_back
        task_name = None
        try:
            task = self._current_task()
            if task is not None:
                get_name = getattr(task, "get_name", None)
                task_name = str(get_name() if get_name is not None else task.name)
        except Exception:
            task_name = None
        return tuple(frames), task_name


def start_asyncio(state: ProfilerState, threshold_s: float, loop: Any) -> Any:
    """Start watching an asyncio/uvloop loop from its own thread; returns stop()."""
    import asyncio

    watch = LoopBlockWatch(state, threshold_s, threading.get_ident(), lambda: asyncio.current_task(loop), "(callback)")
    handle: list[Any] = [None]

    def beat() -> None:
        watch.beat()
        if not watch._stop.is_set():
            handle[0] = loop.call_later(watch.interval_s, beat)

    def first_beat() -> None:
        # The loop was not running yet (a global profile hooks loops as
        # asyncio.Runner makes them): the time before it ran is no block.
        watch.last_beat = perf_counter_ns()
        watch._stack = watch._task_name = None
        if not watch._stop.is_set():
            handle[0] = loop.call_later(watch.interval_s, beat)

    if loop.is_running():
        handle[0] = loop.call_later(watch.interval_s, beat)
    else:
        handle[0] = loop.call_soon(first_beat)
    watch.start()

    def stop() -> None:
        watch.stop()
        h = handle[0]
        if h is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(h.cancel)
            except RuntimeError:
                pass  # the loop closed meanwhile

    return stop


def start_trio(state: ProfilerState, threshold_s: float) -> Any:
    """Start watching the current trio run from inside it; returns stop()."""
    import trio

    token = trio.lowlevel.current_trio_token()
    # trio keeps its current task in a thread-local of the loop thread, which
    # the watchdog cannot read: the stack names the blocking code instead.
    watch = LoopBlockWatch(state, threshold_s, threading.get_ident(), lambda: None, "(see stack)")
    scope = trio.CancelScope()

    async def heartbeat() -> None:
        with scope:
            while True:
                await trio.sleep(watch.interval_s)
                watch.beat()

    trio.lowlevel.spawn_system_task(heartbeat, name="aprof loop-block heartbeat")
    watch.start()

    def stop() -> None:
        watch.stop()
        try:
            token.run_sync_soon(scope.cancel)
        except trio.RunFinishedError:
            pass

    return stop
