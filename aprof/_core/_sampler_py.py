"""The pure-Python twin of ``aprof._ctracer.Sampler`` (same interface, same raw format).

Used when the C extension could not be built, and by the tests. A Python
thread wakes every interval and reads ``sys._current_frames()``. Python
cannot read another thread's current context, so the twin finds the
profiled work from the outside:

* a task is recognised by its coroutine's frame on a thread's stack: every
  task that publishes itself (``aprof._core._tracer.publish_task``) in a
  context this profile records is remembered, with the task that started
  the profile;
* in global scope every other thread's stack is the thread's own logical
  thread; in context scope, so is the thread that started the profile when
  it started outside any task. Work the profile hands to other threads
  (executor jobs) is not sampled by the twin: only the C sampler reads a
  thread's context.

The rest (idle waits, the stack cut at the task's coroutine, aprof's own
frames left out, the raw format) follows ``aprof/_csampler.c``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from array import array
from collections.abc import Sequence
from contextvars import ContextVar
from time import perf_counter_ns
from types import CodeType, FrameType
from typing import Any, Final

from . import _tracer

__all__ = ["Sampler", "after_fork_in_child"]

OWN_LT: Final = 1 << 31
SAMPLE_IDLE: Final = 1
MAX_DEPTH: Final = 1024
_CORO: Final = 0x80 | 0x100 | 0x200  # CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR


class Sampler:
    """See ``aprof/_ctracer.pyi``."""

    def __init__(
        self,
        rf_state: ContextVar[Any],
        recorder: object | None,
        lt_var: ContextVar[Any],
        ignore_prefix: str,
        interval: float,
        waits: Sequence[tuple[str, str]],
        max_samples: int = 0,
        keep_latest: bool = False,
    ) -> None:
        if not 1e-5 <= interval <= 60:
            raise ValueError("Sampler: interval must be between 10 microseconds and 60 seconds")
        if max_samples < 0:
            raise ValueError("Sampler: max_samples must be >= 0")
        if keep_latest and not max_samples:
            raise ValueError("Sampler: keep_latest needs max_samples > 0")
        self._rf = rf_state
        self._recorder = recorder
        self._global = recorder is None
        self._prefix = ignore_prefix
        self._interval = interval
        self._waits = tuple(waits)
        self._max = max_samples
        self._ring = bool(keep_latest)
        self._head = 0  # keep_latest: the oldest sample's slot, once full
        self._buf = array("Q")
        self._nodes = array("I", [0, 0])  # node 0: the empty stack
        self._node_of: dict[tuple[int, int], int] = {}
        self._objs: list[Any] = []
        self._index: dict[object, int] = {}
        self._flags: dict[CodeType, tuple[int, bool, bool, bool, bool]] = {}  # index, ignored, wait, coro, threading
        self._slots: dict[int, int] = {}  # thread ident -> slot
        self._idents: list[int] = []
        self._tasks: list[Any] = []  # published logical threads of this profile's tasks
        self._starter: int | None = None  # the starting OS thread, if it started outside a task
        self._dropped = 0
        self._idle = 0
        self._start_ns = 0
        self._last_ns = 0
        self._active = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    count = property(lambda self: len(self._buf) // 3)
    dropped = property(lambda self: self._dropped)
    idle = property(lambda self: self._idle)
    active = property(lambda self: self._active)
    start_ns = property(lambda self: self._start_ns)

    # -- which tasks are this profile's -------------------------------------

    def add_task(self, lt: object) -> None:
        """Remember a task to sample (the one that starts the profile)."""
        if getattr(lt, "kind", "thread") == "thread":
            self._starter = threading.get_ident()
        else:
            self._tasks.append(lt)

    def _published(self, lt: object) -> None:
        # Called in the task's own context at its first step.
        # No state in the context: recording is on, no context profile (as
        # the C sampler's s_classify): a global sampler's task.
        state = self._rf.get(None)
        if state is None:
            if self._global:
                self._tasks.append(lt)
        elif getattr(state, "enabled", True) and (self._global or state.recorder is self._recorder):
            self._tasks.append(lt)

    def _task_frames(self) -> dict[int, object]:
        frames: dict[int, object] = {}
        live = []
        for lt in self._tasks:
            frame = getattr(_coroutine_of(lt), "cr_frame", None)
            if frame is None:  # finished
                continue
            live.append(lt)
            frames[id(frame)] = lt
        self._tasks = live
        return frames

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._active or self._start_ns:
            raise RuntimeError("Sampler.start: this sampler was already started")
        self._start_ns = self._last_ns = perf_counter_ns()
        self._active = True
        _tracer.publish_hooks.append(self._published)
        _running.add(self)
        t = threading.Thread(target=self._run, name="aprof sampler", daemon=True)
        t._aprof_owned = True  # type: ignore[attr-defined]
        self._thread = t
        t.start()

    def stop(self) -> None:
        if not self._active:
            return
        self._active = False
        self._stop.set()
        if self._published in _tracer.publish_hooks:
            _tracer.publish_hooks.remove(self._published)
        _running.discard(self)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        self._thread = None

    def _data(self, objs: list[Any]) -> tuple[bytes, bytes, list[Any], list[int]]:
        h = 3 * self._head  # a ring's samples, oldest first
        return (self._buf[h:] + self._buf[:h]).tobytes(), self._nodes.tobytes(), objs, list(self._idents)

    def peek(self) -> tuple[bytes, bytes, list[Any], list[int]]:
        # The sampling thread appends a sample's three words between two
        # bytecodes of its own: copied at once (one C call each), whole.
        return self._data(list(self._objs))

    def take(self) -> tuple[bytes, bytes, list[Any], list[int]]:
        if self._active:
            raise RuntimeError("Sampler.take: stop the sampler first")
        out = self._data(self._objs)
        self._buf = array("Q")
        self._head = 0
        self._nodes = array("I", [0, 0])
        self._node_of = {}
        self._objs = []
        self._index = {}
        self._flags = {}
        self._tasks = []
        return out

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self._active:
                break
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - a sampler never breaks the program; the tick is lost
                self._dropped += 1

    # -- one tick ------------------------------------------------------------

    def _code(self, code: CodeType) -> tuple[int, bool, bool, bool, bool]:
        info = self._flags.get(code)
        if info is None:
            idx = self._obj_index(code)
            wait = any(code.co_filename.endswith(f) and code.co_qualname == q for f, q in self._waits)
            ignored = bool(self._prefix) and code.co_filename.startswith(self._prefix)
            boot = code.co_filename.endswith("threading.py")
            info = self._flags[code] = (idx, ignored, wait, bool(code.co_flags & _CORO), boot)
        return info

    def _obj_index(self, obj: object) -> int:
        key = id(obj)
        v = self._index.get(key)
        if v is None:
            v = self._index[key] = len(self._objs)
            self._objs.append(obj)
        return v

    def _slot(self, ident: int) -> int:
        slot = self._slots.get(ident)
        if slot is None:
            slot = self._slots[ident] = len(self._idents)
            self._idents.append(ident)
        return slot

    def _tick(self) -> None:
        now = perf_counter_ns()
        dt = now - self._last_ns
        self._last_ns = now
        tasks = self._task_frames()
        me = threading.get_ident()
        for ident, top in sys._current_frames().items():
            if ident == me:
                continue
            self._sample(ident, top, tasks, now, dt)

    def _sample(self, ident: int, top: FrameType, tasks: dict[int, object], now: int, dt: int) -> None:
        frames: list[tuple[int, bool, bool, bool, bool]] = []
        lt: object = None
        f: FrameType | None = top
        while f is not None and len(frames) < MAX_DEPTH:
            frames.append(self._code(f.f_code))
            owner = tasks.get(id(f))
            if owner is not None:
                lt = owner  # the task's coroutine: the stack starts here
                break
            f = f.f_back
        if lt is None and not (self._global or ident == self._starter):
            return
        slot = self._slot(ident)
        lt_word = self._obj_index(lt) if lt is not None else OWN_LT | slot
        kept = [info for info in frames if not info[1]]
        if lt is None and kept and kept[0][2]:
            self._idle += 1
            self._append(now, dt, 0, lt_word, slot, SAMPLE_IDLE)
            return
        if lt is None and len(kept) < len(frames) and all(info[4] for info in kept):
            return  # aprof's own frames on threading's bootstrap: one of aprof's threads
        node = 0
        for info in reversed(kept):
            key = (node, info[0])
            nxt = self._node_of.get(key)
            if nxt is None:
                nxt = self._node_of[key] = len(self._nodes) // 2
                self._nodes.append(node)
                self._nodes.append(info[0])
            node = nxt
        self._append(now, dt, node, lt_word, slot, 0)

    def _append(self, now: int, dt: int, node: int, lt: int, slot: int, flags: int) -> None:
        buf = self._buf
        # One C call writes the sample's three words: a peek from another
        # thread sees whole samples.
        sample = array("Q", (now, node | (min(dt, 0xFFFFFFFF) << 32), lt | (slot << 32) | (flags << 48)))
        if self._max and len(buf) >= 3 * self._max:
            self._dropped += 1
            if self._ring:  # the oldest sample's slot takes this one
                h = 3 * self._head
                buf[h : h + 3] = sample
                self._head = (self._head + 1) % self._max
            return
        buf.extend(sample)


def _coroutine_of(lt: object) -> Any:
    """The coroutine a task's logical thread runs: through the task it is
    bound to, or the coroutine it wraps (aprof's asyncio step timer)."""
    ref = getattr(lt, "_task_ref", None)
    task = ref() if ref is not None else None
    if task is not None:
        get_coro = getattr(task, "get_coro", None)
        return get_coro() if get_coro is not None else getattr(task, "coro", None)
    return getattr(lt, "_coro", None)


_running: weakref.WeakSet[Sampler] = weakref.WeakSet()


def after_fork_in_child() -> None:
    """A forked child's samplers sample nothing (their thread did not survive)."""
    for s in list(_running):
        s._active = False
        s._thread = None
