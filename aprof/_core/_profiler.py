"""The profiler (SPEC 5): start, stop, and hand the data to post-processing.

Context scope (the default): starting pushes a fresh ``ProfilerState`` into the
``PROFILER_STATE`` debug-info slot and the profile's ``Recorder`` into the
context's recording state. Tasks and propagated work spawned afterwards
inherit both, so they are recorded; nothing else is, even on the same loop.
A profile started in a spawned task replaces the recorder in that task's
context: it takes the subtree for itself.

Global scope registers the recorder as a global callback: every logical
thread in the process is recorded while it runs.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from .._integrations import _processes
from . import _callbacks
from ._callbacks import RF_STATE, AprofWarning, RecordFunctionCallback
from ._debug_info import DEBUG_INFO, DebugInfoKind, SlotRef
from ._memory import DEFAULT_INTERVAL, MemoryRun, check_memory_interval, max_records
from ._memory import unavailable_reason as memory_unavailable
from ._record_function import RecordFunction, get_default_node_id
from ._recorder import ProfilerState, Recorder
from ._ring import buffer_limit, check_budget
from ._sampler import SAMPLE_BYTES, SamplerRun, check_interval
from ._schedule import ProfilerAction, check_schedule
from ._threads import current_logical_thread
from ._tracer import EVENT_BYTES, TracerRun

if TYPE_CHECKING:
    from os import PathLike

    from .._post._analysis import EventAverages, Summary
    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["profile"]

_SCOPES: Final = ("context", "global")


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"profile: option {name!r} must be True or False, got {value!r}")
    return value


class profile:
    """Profile the current context and everything it spawns (SPEC 5).

    Use as ``async with``/``with``, or call :meth:`start` and :meth:`stop`.
    After stop, :meth:`events`, :meth:`key_averages`,
    :meth:`export_chrome_trace` and :meth:`save` give the results.

    Args:
        record_inputs: Keep ``repr()`` of each range's inputs (never the objects).
        with_stack: Attach the Python call stack at each range's start.
        python_tracer: Record every Python call and return (and, with
            ``c_calls``, C calls) in the profiled logical threads (SPEC
            8.1): each call is a
            ``PYTHON_FUNCTION`` range on the track of the task or thread
            that ran it.
        max_events: Hold at most this many events while recording:
            ranges, instants, tasks and loop blocks (a task's steps are part
            of its task), and, with ``python_tracer``, this many raw tracer
            events (16 bytes each, a buffer of their own); with
            ``sample_interval``, this many samples too (24 bytes each,
            counted in ``session.samples.dropped``). What is not kept is
            counted, by kind, in ``session.dropped_by_kind``. ``None``: no
            limit.
        max_bytes: Hold at most this many bytes of recorded ranges,
            instants, tasks (with their steps) and loop blocks (the records'
            own memory: a range is 48 bytes; at least 64 KiB), and at most
            ``max_bytes / 16`` raw tracer events and ``max_bytes / 24``
            samples. ``None``: no limit.
        keep: Past ``max_events`` or ``max_bytes``: ``"first"`` (the
            default) keeps what was recorded first and drops the rest;
            ``"latest"`` is a ring: the oldest whole events are let go, an
            eighth of the budget at a time, so the profile can stay on (see
            "In production" in the guide). The tracer's buffer is then a
            ring as well (eight segments, the oldest let go whole), and so
            are the samples (the newest takes the oldest's place).
        sample_interval: Take a stack sample of every thread running the
            profiled work every this many seconds (SPEC 8.4), each charged
            to the task or thread that was running (``session.samples``).
            ``None`` (the default): no sampling.
        c_calls: With ``python_tracer``, record the C functions Python code
            calls too (SPEC 8.1). Off by default: Python frames only cost a
            fraction of it (on 3.11 the tracer then uses a frame evaluator,
            PEP 523, instead of the profile function that slows every
            instruction; on 3.12+ it registers no ``sys.monitoring`` CALL
            events).
        instance_ids: With ``python_tracer``, name each method frame after
            the instance it ran on (``Module.__call__ [Linear#1]``: class,
            and serial per class in order of first sight), as the seed's
            module attribution does. Without it a method frame names the
            receiver's class when that is not the class defining the
            method (``Module.__call__ [Linear]``).
        tasks: Record every spawned task as a TASK range on its own track.
        loop_block_threshold: Record every stretch in which one step or
            callback held the event loop longer than this many seconds, with
            the stack of the blocking code (LOOP_BLOCK ranges).
        scope: ``"context"`` (the default: this context and what it spawns)
            or ``"global"`` (every logical thread in the process).
        schedule: A step schedule (:func:`aprof.schedule`): record only in
            the active steps of each cycle, as torch.profiler does.
        on_trace_ready: Called with the profile at the end of each cycle.
        node_id: Tag events with this node id (default:
            :func:`aprof.get_default_node_id`).
        profile_memory: Track allocations (issue 21): each is charged to
            the task or thread that made it and to the innermost range open
            there (``FunctionEvent.memory``, ``cpu_memory_usage``, the
            memory columns of ``key_averages()``, ``session.memory``). Needs
            the C extension. One memory profile at a time. Its records
            (48 bytes each, a buffer of their own) are bounded by
            ``max_events`` and ``max_bytes`` and follow ``keep``; those not
            kept are ``session.dropped_by_kind["allocations"]``.
        memory_interval: With ``profile_memory``, sample an allocation
            every this many bytes on average, weighted so that totals stay
            unbiased (default 16 KiB); ``0`` records every allocation
            exactly (tests, small runs: it costs more).

    Raises:
        TypeError: an option has the wrong type (unknown options are
            rejected by Python itself, naming the option).
        ValueError: ``scope`` is not ``"context"`` or ``"global"``, or
            ``sample_interval`` is not a number of seconds in 0.00001..60.
        RuntimeError: (at start) ``python_tracer`` cannot hook the
            interpreter: another profiler holds the hook, or another
            profile's tracer is running. ``profile_memory`` without the C
            extension (raised here, at construction), or (at start) while
            another profile tracks memory.

    Example:
        >>> import asyncio, aprof
        >>> async def main():
        ...     async with aprof.profile() as prof:
        ...         with aprof.record_function("work"):
        ...             await asyncio.sleep(0)
        ...     return prof
        >>> prof = asyncio.run(main())
        >>> [e.name for e in prof.events()]
        ['work']
    """

    def __init__(
        self,
        *,
        record_inputs: bool = False,
        with_stack: bool = False,
        python_tracer: bool = False,
        max_events: int | None = None,
        max_bytes: int | None = None,
        keep: Literal["first", "latest"] = "first",
        sample_interval: float | None = None,
        c_calls: bool = False,
        instance_ids: bool = False,
        tasks: bool = True,
        scope: Literal["context", "global"] = "context",
        loop_block_threshold: float | None = None,
        schedule: Callable[[int], ProfilerAction] | None = None,
        on_trace_ready: Callable[[profile], Any] | None = None,
        node_id: int | None = None,
        profile_memory: bool = False,
        memory_interval: int = DEFAULT_INTERVAL,
    ) -> None:
        self.record_inputs = _check_bool("record_inputs", record_inputs)
        self.with_stack = _check_bool("with_stack", with_stack)
        self.tasks = _check_bool("tasks", tasks)
        self.python_tracer = _check_bool("python_tracer", python_tracer)
        check_budget(max_events, max_bytes, keep)
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.keep: Literal["first", "latest"] = keep
        self.sample_interval = check_interval(sample_interval)
        self.c_calls = _check_bool("c_calls", c_calls)
        self.instance_ids = _check_bool("instance_ids", instance_ids)
        if scope not in _SCOPES:
            raise ValueError(f"profile: option 'scope' must be 'context' or 'global', got {scope!r}")
        if node_id is not None and (isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0):
            raise ValueError(f"profile: option 'node_id' must be an int >= 0, got {node_id!r}")
        if loop_block_threshold is not None and (
            isinstance(loop_block_threshold, bool)
            or not isinstance(loop_block_threshold, (int, float))
            or not loop_block_threshold > 0
            or loop_block_threshold == float("inf")
        ):
            raise ValueError(
                f"profile: option 'loop_block_threshold' must be a number of seconds > 0, got {loop_block_threshold!r}"
            )
        self.loop_block_threshold = loop_block_threshold
        self.profile_memory = _check_bool("profile_memory", profile_memory)
        self.memory_interval = check_memory_interval(memory_interval)
        if self.profile_memory:
            why = memory_unavailable()
            if why is not None:
                raise RuntimeError(why)
        check_schedule(schedule, on_trace_ready)
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self._active = False
        self._action = ProfilerAction.RECORD
        self.scope = scope
        self.node_id = node_id
        self._state: ProfilerState | None = None
        self._recorder: Recorder | None = None
        self._slot: SlotRef | None = None
        self._global_handle: int | None = None
        self._prev_recorder: Recorder | None = None
        self._prev_slot: object = None
        self._task_hooks: list[Callable[[], None]] = []
        self._session: Session | None = None
        self._tracer: TracerRun | None = None
        self._sampler: SamplerRun | None = None
        self._memory: MemoryRun | None = None
        # Stops not finished yet (a KeyboardInterrupt landed in one): the
        # next stop(), step(), start() or read of the results finishes them.
        self._stopping: list[_Stopping] = []

    # -- lifecycle ----------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the profile is between start() and stop()."""
        return self._active

    def start(self) -> profile:
        """Start the profile: recording, or following its schedule.

        Raises:
            RuntimeError: this profile is already running, or another profile
                is already running in this same logical thread's context.
        """
        if self._active:
            raise RuntimeError("profile.start: this profile is already running")
        self._finish_stops()  # an interrupted stop's hooks must be gone first
        self.step_num = 0
        self._session = None
        if self.schedule is None:
            self._begin()
        else:
            self._action = self.schedule(0)
            if self._action is not ProfilerAction.NONE:
                self._begin()
        self._active = True
        return self

    def step(self) -> None:
        """Mark the end of a step: move along the schedule (SPEC 5.6).

        At the end of a cycle the recorded events become the profile's
        results and ``on_trace_ready(prof)`` is called.

        Raises:
            RuntimeError: the profile is not running.
        """
        if not self._active:
            raise RuntimeError("profile.step: this profile is not running")
        self._finish_stops()
        self.step_num += 1
        if self.schedule is None:
            return
        prev, new = self._action, self.schedule(self.step_num)
        self._action = new
        A = ProfilerAction
        try:
            if prev is A.RECORD_AND_SAVE or (prev is A.RECORD and new in (A.NONE, A.WARMUP)):
                self._finish(notify=True)
            elif prev is A.WARMUP and new is not A.WARMUP:
                self._discard()
        finally:
            # A failing on_trace_ready (a full disk) propagates once, and the
            # schedule goes on: the next cycle records as it would have.
            if new is not A.NONE and self._state is None and self._active and not self._stopping:
                self._begin()

    def _trace_ready(self) -> None:
        handler = self.on_trace_ready
        if handler is not None:
            handler(self)

    def _discard(self) -> None:
        # Warmup events are recorded (so the first recorded step pays no
        # start-up cost) and thrown away, as torch.profiler does.
        self._finish(consolidate=False)

    def _begin(self) -> None:
        lt = current_logical_thread()
        node = get_default_node_id() if self.node_id is None else self.node_id
        state = ProfilerState(
            record_inputs=self.record_inputs, with_stack=self.with_stack, node_id=node, start_lt=lt, tasks=self.tasks
        )
        if self.max_events is not None or self.max_bytes is not None:
            state.bound(self.max_events, self.max_bytes, self.keep)
        recorder = Recorder(state)
        tracer = None
        if self.python_tracer:
            # Checked first, so that a refused start (another tool holds the
            # hook, RELIABILITY FA-08) leaves nothing to undo; started last,
            # so aprof's own set-up is not traced.
            tracer = TracerRun(
                recorder if self.scope == "context" else None,
                buffer_limit(self.max_events, self.max_bytes, EVENT_BYTES),
                self.c_calls,
                self.instance_ids,
                keep_latest=self.keep == "latest",
            )
            tracer.check()
        if self.scope == "global":
            self._global_handle = _callbacks.add_global_callback(_global_callback(recorder))
        else:
            st = RF_STATE.get()
            cur = st.recorder
            if cur is not None and cur.state is not None and cur.state.start_lt is lt:
                raise RuntimeError(
                    "profile.start: a profile is already running in this context; "
                    "stop it first, or start the new one in a spawned task to profile that subtree"
                )
            self._prev_recorder = cur
            slot = SlotRef(state)
            cur_debug = DEBUG_INFO.get()
            k = DebugInfoKind.PROFILER_STATE
            self._prev_slot = cur_debug[k]
            DEBUG_INFO.set((*cur_debug[:k], slot, *cur_debug[k + 1 :]))
            RF_STATE.set(st.replace(recorder=recorder))
            self._slot = slot
        self._state = state
        self._recorder = recorder
        _running.add(recorder)
        _live_add(self)
        if self.tasks:
            self._task_hooks = _install_task_hooks(recorder, global_scope=self.scope == "global")
        if self.loop_block_threshold is not None:
            self._task_hooks += _start_loop_watch(state, self.loop_block_threshold, self.scope == "global")
        if tracer is not None:
            try:
                tracer.start()
            except BaseException:
                self._finish()
                self._session = None
                raise
            self._tracer = tracer
        if self.sample_interval is not None:
            sampler = SamplerRun(
                recorder if self.scope == "context" else None,
                self.sample_interval,
                buffer_limit(self.max_events, self.max_bytes, SAMPLE_BYTES),
                keep_latest=self.keep == "latest",
            )
            try:
                sampler.start()
            except BaseException:
                self._finish()
                self._session = None
                raise
            self._sampler = sampler
        if self.profile_memory:
            # Last: aprof's own set-up is not counted.
            memory = MemoryRun(
                recorder if self.scope == "context" else None,
                self.memory_interval,
                max_records(self.max_events, self.max_bytes),
                self.keep,
            )
            try:
                memory.start()
            except BaseException:
                self._finish()
                self._session = None
                raise
            self._memory = memory

    def stop(self) -> profile:
        """Stop recording and consolidate the events.

        May be called from another task or thread than the one that started
        the profile. Ranges still open are closed at the stop time and flagged
        ``unfinished``; events that arrive later are dropped.

        With a schedule, a cycle cut short by stop() is finished as if its
        last step had ended: recorded events become the results and
        ``on_trace_ready`` is called; warmup events are dropped.

        Raises:
            RuntimeError: the profile is not running.
        """
        if not self._active:
            if self._stopping:
                # The last stop() was interrupted (Ctrl-C): finish it.
                self._finish_stops()
                return self
            raise RuntimeError("profile.stop: this profile is not running")
        self._active = False
        try:
            self._finish_stops()
        finally:
            if self._state is not None:
                if self.schedule is not None and self._action is ProfilerAction.WARMUP:
                    self._discard()
                else:
                    # Without a schedule too: torch.profiler calls
                    # on_trace_ready once, at stop.
                    self._finish(notify=True)
        return self

    def _finish(self, *, consolidate: bool = True, notify: bool = False) -> None:
        """End the current recording: detach it, then consolidate it into the session.

        The work is queued in ``_stopping`` first and done from there, so a
        KeyboardInterrupt raised anywhere in it loses nothing: the next
        ``stop()``, ``step()``, ``start()`` or read of the results finishes
        it (SPEC 12).
        """
        self._queue_stop(consolidate, notify)
        self._finish_stops()

    def _queue_stop(self, consolidate: bool, notify: bool) -> None:
        """Move the current recording's state and hooks into a queued :class:`_Stopping`."""
        state, recorder = self._state, self._recorder
        assert state is not None
        assert recorder is not None
        undo = list(self._task_hooks)
        handle = self._global_handle
        if handle is not None:
            undo.append(functools.partial(_callbacks.remove_callback, handle))
        else:
            undo.append(functools.partial(self._restore_context, recorder, self._slot, self._prev_recorder, self._prev_slot))
        self._stopping.append(_Stopping(state, recorder, self._tracer, self._sampler, undo, consolidate, notify, self._memory))
        self._state = self._recorder = self._tracer = self._sampler = None
        self._memory = None
        self._task_hooks = []
        self._global_handle = None
        self._slot = self._prev_recorder = self._prev_slot = None
        _live.pop(id(self), None)

    def _finish_stops(self) -> None:
        """Do what is left of the queued stops, oldest first (see :meth:`_finish`)."""
        while self._stopping:
            stop = self._stopping[0]
            stop.detach()
            if stop.consolidate:
                stop.replay()
                from .._post._session import Session  # post-processing reads, never writes back

                # Re-runnable: it reads the raw lists and empties them last.
                self._session = Session.from_state(stop.state)
                if stop.sampler is not None:
                    stop.sampler.attach(self._session, stop.state.node_id)
                if stop.memory is not None:
                    stop.memory.attach(self._session)
                # Work handed to process pools under this profile (SPEC 11.4).
                self._session = _processes.collect(stop.state, self._session)
            else:
                _processes.discard(stop.state)
            del self._stopping[0]
            if stop.notify:
                self._trace_ready()

    @staticmethod
    def _restore_context(recorder: Recorder, slot: SlotRef | None, prev: Recorder | None, prev_slot: object) -> None:
        # Undo start() field by field in the current context, if it is the
        # starting one (or a copy of it): other changes made since (callbacks
        # registered, guards still open) are kept. From any other context
        # there is nothing to undo: the starting context keeps only the
        # emptied recorder and slot, which record nothing and hold no data.
        if slot is not None:
            slot.value = None
        st = RF_STATE.get()
        if st.recorder is recorder:
            RF_STATE.set(st.replace(recorder=prev))
        k = DebugInfoKind.PROFILER_STATE
        cur = DEBUG_INFO.get()
        if cur[k] is slot:
            DEBUG_INFO.set((*cur[:k], prev_slot, *cur[k + 1 :]))

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._active:
            self.stop()

    async def __aenter__(self) -> profile:
        return self.start()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._active:
            self.stop()

    def __del__(self) -> None:
        # A profile dropped while running: stop recording, quietly keep
        # nothing alive, and say so once (RELIABILITY LC-04).
        self._abandon(_DROPPED_WARNING)

    def _abandon(self, why: str) -> None:
        """Detach a profile nobody will stop, without consolidating, and warn once."""
        stops: list[_Stopping] = getattr(self, "_stopping", [])
        warn = getattr(self, "_recorder", None) is not None
        if warn:
            self._active = False
            self._queue_stop(consolidate=False, notify=False)
        # Finishing the detach only: nobody will read the results. At
        # interpreter exit a module this needs may already be torn down;
        # nothing may print a traceback then (issue 15 item 20).
        while stops:
            stop = stops.pop(0)
            try:
                stop.detach()
                _processes.discard(stop.state)
            except Exception:  # noqa: BLE001 - shutting down: nothing left to tell
                if not sys.is_finalizing():
                    raise
        if warn:
            warnings.warn(why, AprofWarning, stacklevel=2)

    def _forget(self) -> None:
        """Detach this profile without a session or a warning: its hooks go,
        and the interpreter's exit does not call it abandoned. For a forked
        child's copy of a parent's profile (emptied at the fork: RELIABILITY
        LC-01), and a followed process's profile that steps aside."""
        self._active = False
        if self._recorder is not None and self._state is not None:
            self._queue_stop(consolidate=False, notify=False)
        while self._stopping:
            stop = self._stopping.pop(0)
            try:
                stop.detach()
            except Exception:  # noqa: BLE001 - never fail a fork for a copy that records nothing
                pass
        _live.pop(id(self), None)

    # -- results ------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The stopped profile's :class:`aprof.Session`.

        Raises:
            RuntimeError: the profile is running or was never started.
        """
        if self._stopping:
            self._finish_stops()  # a stop() interrupted by Ctrl-C: finish it now
        if self._session is None:
            if self._active:
                raise RuntimeError("profile: results are available after stop(); the profile is still running")
            raise RuntimeError("profile: no results; the profile was never started")
        return self._session

    def events(self) -> list[FunctionEvent]:
        """All recorded events, track by track, in start order (SPEC 6.2)."""
        return self.session.events()

    def key_averages(self, group_by: str = "name") -> EventAverages:
        """Aggregate events by ``"name"``, ``"track"`` or ``"stack"`` (SPEC 6.4)."""
        return self.session.key_averages(group_by)

    def summary(self, limit: int = 5) -> Summary:
        """What was slow, in which task, and why (see :meth:`aprof.Session.summary`)."""
        return self.session.summary(limit)

    def export_chrome_trace(self, path: str | PathLike[str], max_events: int | None = None) -> None:
        """Write a Chrome/Perfetto trace (``.json`` or ``.json.gz``) (SPEC 9.1);
        ``max_events`` caps it to the longest events (see ``Session``)."""
        self.session.export_chrome_trace(path, max_events)

    def export_speedscope(self, path: str | PathLike[str]) -> None:
        """Write a speedscope file (``.speedscope.json``) (SPEC 9.2)."""
        self.session.export_speedscope(path)

    def export_folded(self, path: str | PathLike[str]) -> None:
        """Write folded stacks (``.folded``) for flame graphs (SPEC 9.2)."""
        self.session.export_folded(path)

    def export_html(self, path: str | PathLike[str], budget: int = 1_000_000) -> None:
        """Write a self-contained HTML report (``.html``) (SPEC 9.2); past
        ``budget`` events, at a level of detail (``Session.export_html``)."""
        self.session.export_html(path, budget)

    def export_opentelemetry(
        self, tracer_provider: object = None, *, parent: object = None, python_frames: bool = False
    ) -> int:
        """Emit the events as OpenTelemetry spans; return how many (SPEC 11.5).

        See :meth:`aprof.Session.export_opentelemetry`.
        """
        return self.session.export_opentelemetry(tracer_provider, parent=parent, python_frames=python_frames)

    def save(self, path: str | PathLike[str]) -> None:
        """Write the whole session, for :func:`aprof.load` (SPEC 6.5)."""
        self.session.save(path)

    def __repr__(self) -> str:
        status = "running" if self._active else ("stopped" if self._session is not None else "new")
        return f"<aprof.profile scope={self.scope} {status}>"


class _Stopping:
    """What is left to do of one stop: detach the recording, then consolidate it.

    Each step can be interrupted (Ctrl-C during a long consolidation) and run
    again: a detach action runs at most once (it is taken off the list before
    it runs), the tracer's events are taken once and replayed into the lists
    from the marks taken before the first attempt, and consolidation reads
    the raw lists without changing them.
    """

    __slots__ = ("consolidate", "marks", "memory", "notify", "recorder", "sampler", "state", "taken", "tracer", "undo")

    def __init__(
        self,
        state: ProfilerState,
        recorder: Recorder,
        tracer: TracerRun | None,
        sampler: SamplerRun | None,
        undo: list[Callable[[], None]],
        consolidate: bool,
        notify: bool,
        memory: MemoryRun | None = None,
    ) -> None:
        self.memory = memory
        self.state = state
        self.recorder = recorder
        self.tracer = tracer
        self.sampler = sampler
        self.undo = undo
        self.consolidate = consolidate
        self.notify = notify
        self.marks: dict[Any, int] | None = None
        self.taken: Any = None

    def detach(self) -> None:
        """Stop recording and remove the hooks (the cheap half of a stop)."""
        state, tracer = self.state, self.tracer
        if self.memory is not None:
            self.memory.stop()  # idempotent; first: aprof's stop is not counted
        if tracer is not None:
            tracer.stop()  # idempotent
        if self.sampler is not None:
            self.sampler.stop()  # idempotent
        if state.running:
            state.stop_ns = perf_counter_ns()
            state.running = False
        self.recorder.state = None
        _running.discard(self.recorder)
        undo = self.undo
        while undo:
            undo.pop(0)()  # at most once: an undo action is not always idempotent

    def replay(self) -> None:
        """Put the tracer's events into the raw lists (re-runnable)."""
        tracer, state = self.tracer, self.state
        if tracer is None:
            return
        if self.marks is None:
            self.marks = {lt: len(lst) for lt, lst in state.lists.items()}
        else:  # an earlier attempt was interrupted: drop what it appended
            for lt in list(state.lists):
                n = self.marks.get(lt)
                if n is None:
                    del state.lists[lt]
                else:
                    del state.lists[lt][n:]
        if self.taken is None:
            self.taken = tracer.take(state)
        tracer.replay_taken(self.taken, state)
        self.tracer = self.taken = None


# Running profiles' recorders, so a forked child can switch them off.
_running: weakref.WeakSet[Recorder] = weakref.WeakSet()
# Running profiles by id, so interpreter exit can detach them while the
# modules their hooks need still exist. Weak references in a dict, not a
# WeakSet: a stop removes its profile with a C call, which the Python tracer
# (still recording then) does not see, where WeakSet.discard would show in
# the trace as the program's last call.
_live: dict[int, weakref.ref[profile]] = {}


def live_profiles() -> list[profile]:
    """The profiles running now (started, not stopped)."""
    return [prof for prof in (ref() for ref in list(_live.values())) if prof is not None]


def _live_add(prof: profile) -> None:
    key = id(prof)
    # The callback runs when the profile is freed, before its id can be reused.
    _live[key] = weakref.ref(prof, lambda _, key=key: _live.pop(key, None))  # type: ignore[misc]


_DROPPED_WARNING: Final = "aprof: a running profile was garbage-collected without stop(); it was stopped"
_EXIT_WARNING: Final = (
    "aprof: the interpreter exited while a profile was running (stop() was never called); "
    "it was stopped and its events discarded"
)


@atexit.register
def _stop_at_exit() -> None:
    """Detach profiles still running at interpreter exit, with one warning each.

    atexit runs before modules are torn down; a profile's ``__del__`` at
    teardown would find ``sys.meta_path`` and module globals gone and print
    "Exception ignored" tracebacks (issue 15 item 20).
    """
    for prof in live_profiles():
        prof._abandon(_EXIT_WARNING)


def _after_fork_in_child() -> None:
    """A forked child records nothing into its parent's profiles.

    Its copy of each running profile is emptied and stopped from recording:
    ``stop()`` in the child returns an empty session, and the parent's events
    never appear in the child's exports (RELIABILITY LC-01).
    """
    for recorder in list(_running):
        state = recorder.state
        recorder.state = None
        if state is not None:
            state.running = False
            state.lists = {}
            state.task_records = []
            if state.ring is not None:
                state.ring.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _install_task_hooks(recorder: Recorder, global_scope: bool) -> list[Callable[[], None]]:
    """Hook task creation in the loop or trio run this profile starts in.

    Returns the undo actions, run at stop. asyncio and trio are imported here
    only if the program already runs them.
    """
    undo: list[Callable[[], None]] = []
    if global_scope:
        from .._integrations._tasks import global_task_recorders

        global_task_recorders.append(recorder)
        undo.append(lambda: global_task_recorders.remove(recorder))
    if "asyncio" in sys.modules:
        from .._integrations import _asyncio

        undo.append(_asyncio.install(global_scope))
    if "trio" in sys.modules:
        import trio

        if trio.lowlevel.in_trio_run():
            from .._integrations import _trio

            token = _trio.install_instrument()
            undo.append(lambda: _trio.uninstall_instrument(token))
    if global_scope:
        undo.append(_on_new_trio_runs(_hook_trio_run))
    return undo


def _hook_trio_run() -> Callable[[], None]:
    """Inside a trio run that starts while a global profile runs: record its tasks."""
    from .._integrations import _trio

    token = _trio.install_instrument()
    return lambda: _trio.uninstall_instrument(token)


def _on_new_trio_runs(start: Callable[[], Callable[[], None]]) -> Callable[[], None]:
    """Call ``start()`` inside every trio run from now on; the undo undoes them all."""
    from .._integrations._trio_runs import on_new_trio_runs

    undos: list[Callable[[], None]] = []
    stop_listening = on_new_trio_runs(lambda: undos.append(start()))

    def undo() -> None:
        stop_listening()
        for u in undos:
            u()

    return undo


def _start_loop_watch(state: ProfilerState, threshold: float, global_scope: bool) -> list[Callable[[], None]]:
    """Watch the running asyncio loop or trio run for steps longer than
    ``threshold`` (``aprof._integrations._loop_block``); returns the undo
    actions, the last of which records the blocks before consolidation."""
    from .._integrations import _loop_block

    return _loop_block.start(state, threshold, global_scope)


def _global_callback(recorder: Recorder) -> RecordFunctionCallback:
    def start(rf: RecordFunction) -> Any:
        assert rf._lt is not None
        return recorder.start(rf, rf._lt, 2)

    def end(rf: RecordFunction, rec: Any) -> None:
        if rec is not None and rf._end_lt is not None:
            Recorder.end(rec, rf._end_thread_id_for_record(), rf._exception)

    cb = RecordFunctionCallback(start, end)
    # Alone, it is run inline (_callbacks.global_fast), not through start/end.
    cb._aprof_recorder = recorder
    return cb
