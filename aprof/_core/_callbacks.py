"""Callbacks and their registries (the seed's record_function.h callback half).

Two registries, as in the seed:

* **global** callbacks see every range in the process. They live in a
  module-level tuple that is replaced, never mutated, so the hot path reads it
  without a lock.
* **context** callbacks (the seed's thread-local callbacks) live in the
  ``_RF_STATE`` context variable, so they follow the tasks and propagated
  submissions spawned from the context that registered them.

``_RF_STATE`` also carries whether recording is enabled and the context's
profile recorder. It holds an immutable :class:`RFState`; every change makes a
new one, so a snapshot (``ContextState.capture()``) can be re-entered anywhere.
To keep the hot path to one lookup, each ``RFState`` precomputes its ``mode``.
"""

from __future__ import annotations

import _thread
import contextvars
import enum
import itertools
import os
import random
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from . import _native

if TYPE_CHECKING:
    from ._record_function import RecordFunction
    from ._recorder import Recorder

__all__ = [
    "AprofWarning",
    "CallbackHandle",
    "RecordFunctionCallback",
    "RecordScope",
    "add_context_callback",
    "add_global_callback",
    "clear_callbacks",
    "clear_context_callbacks",
    "clear_global_callbacks",
    "disable_callback",
    "has_callbacks",
    "has_context_callbacks",
    "has_global_callbacks",
    "reenable_callback",
    "remove_callback",
    "set_record_function_seed_for_testing",
]


class AprofWarning(RuntimeWarning):
    """Something went wrong inside aprof or a callback, and was contained.

    A callback that raises is disabled and reported once with this warning;
    the user's code carries on.
    """


if _native.UNRECOGNISED_SWITCH is not None:
    # Said here, once, at import: _native runs before this class exists.
    warnings.warn(
        f"APROF_PURE_PYTHON={_native.UNRECOGNISED_SWITCH!r} is not a value aprof knows "
        "(1/true/yes/on or 0/false/no/off); using the C extension",
        AprofWarning,
        stacklevel=2,
    )


class RecordScope(enum.Enum):
    """The kinds of range (the seed's ``RecordScope``)."""

    FUNCTION = "function"
    """A function range from a library or framework."""
    USER_SCOPE = "user_scope"
    """A range the user opened with :func:`aprof.record_function`."""
    TASK = "task"
    """The lifetime of an asyncio or trio task."""
    EXECUTOR = "executor"
    """Work handed to another thread (``aprof.wrap``, ``launch``, ...)."""
    PYTHON_FUNCTION = "python_function"
    """A Python call recorded by the Python tracer."""
    LOOP_BLOCK = "loop_block"
    """A stretch in which one step or callback held the event loop."""


CallbackHandle = int
"""The handle returned by ``add_*_callback``: an opaque positive integer."""

StartFn = Callable[["RecordFunction"], Any]
EndFn = Callable[["RecordFunction", Any], Any]
ShouldRunFn = Callable[["RecordFunction"], bool]


class RecordFunctionCallback:
    """A pair of functions called at the start and end of matching ranges.

    ``start(rf)`` may return an observer context object; the same object is
    passed to ``end(rf, ctx)``. Start and end run as a pair: a range whose
    start was sampled out, or whose start raised, gets no end.

    Args:
        start: Called with the :class:`RecordFunction` when a range starts.
        end: Called with the ``RecordFunction`` and ``start``'s return value
            when the range ends. Optional.

    Example:
        >>> import aprof
        >>> seen = []
        >>> cb = aprof.RecordFunctionCallback(lambda rf: seen.append(rf.name))
        >>> h = aprof.add_global_callback(cb.scopes({aprof.RecordScope.USER_SCOPE}))
        >>> with aprof.record_function("load"):
        ...     pass
        >>> aprof.remove_callback(h)
        >>> seen
        ['load']
    """

    __slots__ = (
        "_aprof_recorder", "_end", "_needs_ids", "_needs_inputs", "_needs_outputs", "_prob", "_scopes", "_should_run",
        "_start",
    )  # fmt: skip

    def __init__(self, start: StartFn, end: EndFn | None = None) -> None:
        # A global profile's own callback: its Recorder (see global_fast).
        self._aprof_recorder: Any = None
        if not callable(start):
            raise TypeError(f"RecordFunctionCallback: start must be callable, got {start!r}")
        if end is not None and not callable(end):
            raise TypeError(f"RecordFunctionCallback: end must be callable or None, got {end!r}")
        self._start = start
        self._end = end
        self._needs_inputs = False
        self._needs_outputs = False
        self._needs_ids = False
        self._prob = 1.0
        self._scopes: frozenset[RecordScope] = frozenset()
        self._should_run: ShouldRunFn | None = None

    def needs_inputs(self, value: bool = True) -> RecordFunctionCallback:
        """Ask for ``rf.inputs`` to be filled. Returns self for chaining.

        Raises:
            TypeError: ``value`` is not a bool.
        """
        self._needs_inputs = _check_bool(value, "needs_inputs")
        return self

    def needs_outputs(self, value: bool = True) -> RecordFunctionCallback:
        """Ask for ``rf.outputs`` to be filled. Returns self for chaining.

        Raises:
            TypeError: ``value`` is not a bool.
        """
        self._needs_outputs = _check_bool(value, "needs_outputs")
        return self

    def needs_ids(self, value: bool = True) -> RecordFunctionCallback:
        """Ask for a unique ``rf.handle`` per range. Returns self for chaining.

        Raises:
            TypeError: ``value`` is not a bool.
        """
        self._needs_ids = _check_bool(value, "needs_ids")
        return self

    def sampling_prob(self, p: float) -> RecordFunctionCallback:
        """Run this callback for a random fraction ``p`` of matching ranges.

        Args:
            p: Probability, ``0 <= p <= 1``.

        Raises:
            TypeError: ``p`` is not a real number.
            ValueError: ``p`` is outside ``0..1`` or NaN.
        """
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise TypeError(f"sampling_prob: p must be a number in the range 0..1, got {p!r}")
        if not (0.0 <= p <= 1.0):  # also rejects NaN
            raise ValueError(f"sampling_prob: p must be in the range 0..1, got {p!r}")
        self._prob = float(p)
        return self

    def scopes(self, scopes: Iterable[RecordScope]) -> RecordFunctionCallback:
        """Restrict the callback to these scopes (an empty set means all).

        Args:
            scopes: A set (or any iterable) of :class:`RecordScope` members.

        Raises:
            TypeError: ``scopes`` is not an iterable of :class:`RecordScope`
                members (a lone member or a str included).
        """
        if isinstance(scopes, (str, bytes, RecordScope)) or not isinstance(scopes, Iterable):
            raise TypeError(f"scopes: expected a set of RecordScope members, got {scopes!r}")
        items = frozenset(scopes)
        for s in items:
            if not isinstance(s, RecordScope):
                raise TypeError(f"scopes: expected RecordScope members, got {s!r}")
        self._scopes = items
        return self

    def should_run(self, predicate: ShouldRunFn | None) -> RecordFunctionCallback:
        """Decide per range whether the callback runs (the seed's ``setShouldRun``).

        ``predicate(rf)`` is called just before the callback's start, once
        the range has its name, scope and inputs; when it returns False the
        callback's start and end are both skipped for that range. A
        predicate that raises is treated as a start that raised (the
        callback is reported once and disabled). ``None`` removes it.
        Returns self for chaining.

        Raises:
            TypeError: ``predicate`` is neither callable nor None.

        Example:
            >>> import aprof
            >>> seen = []
            >>> cb = aprof.RecordFunctionCallback(lambda rf: seen.append(rf.name))
            >>> h = aprof.add_global_callback(cb.should_run(lambda rf: rf.name.startswith("db.")))
            >>> for name in ("db.query", "render"):
            ...     with aprof.record_function(name):
            ...         pass
            >>> aprof.remove_callback(h)
            >>> seen
            ['db.query']
        """
        if predicate is not None and not callable(predicate):
            raise TypeError(f"should_run: predicate must be callable or None, got {predicate!r}")
        self._should_run = predicate
        return self

    @property
    def start(self) -> StartFn:
        """The start function."""
        return self._start

    @property
    def end(self) -> EndFn | None:
        """The end function, or ``None``."""
        return self._end

    @property
    def prob(self) -> float:
        """The sampling probability."""
        return self._prob

    def __repr__(self) -> str:
        # Both functions are named, so a warning about a failing end names it.
        name = getattr(self._start, "__qualname__", repr(self._start))
        if self._end is None:
            return f"<RecordFunctionCallback start={name}>"
        end = getattr(self._end, "__qualname__", repr(self._end))
        return f"<RecordFunctionCallback start={name} end={end}>"


def _check_bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: value must be True or False, got {value!r}")
    return value


def _entry_of(handle: object) -> Entry | None:
    # A bool is an int to Python, but never a handle: True is not handle 1.
    if type(handle) is not int:
        return None
    return _registry.get(handle)


_handles = itertools.count(1)


class Entry:
    """One registration of a callback: its handle and its on/off switch.

    The same ``Entry`` object is shared by every context that inherited the
    registration, so ``disable_callback`` from anywhere flips it everywhere.
    """

    __slots__ = ("__weakref__", "callback", "enabled", "handle", "is_global", "removed", "reported")

    def __init__(self, callback: RecordFunctionCallback, is_global: bool) -> None:
        self.callback = callback
        self.handle = next(_handles)
        self.is_global = is_global
        self.enabled = True
        self.removed = False
        self.reported = False

    def live(self) -> bool:
        return not self.removed


# ---------------------------------------------------------------------------
# Context-local state
# ---------------------------------------------------------------------------

MODE_OFF: Final = 0  # recording disabled in this context
MODE_IDLE: Final = 1  # enabled, no context callback: only globals can be active
MODE_FAST: Final = 2  # enabled, only a profile recorder that can take the fast path
MODE_SLOW: Final = 3  # enabled, user callbacks or a recorder needing the full RecordFunction


class RFState:
    """Immutable context-local recording state: callbacks, switch, recorder."""

    __slots__ = ("callbacks", "enabled", "mode", "recorder")

    callbacks: tuple[Entry, ...]
    enabled: bool
    recorder: Recorder | None
    mode: int

    def __init__(self, callbacks: tuple[Entry, ...], enabled: bool, recorder: Recorder | None) -> None:
        self.callbacks = callbacks
        self.enabled = enabled
        self.recorder = recorder
        if not enabled:
            self.mode = MODE_OFF
        elif callbacks:
            self.mode = MODE_SLOW
        elif recorder is None:
            self.mode = MODE_IDLE
        elif recorder.fast:
            self.mode = MODE_FAST
        else:
            self.mode = MODE_SLOW

    def replace(self, **changes: Any) -> RFState:
        return RFState(
            changes.get("callbacks", self.callbacks),
            changes.get("enabled", self.enabled),
            changes.get("recorder", self.recorder),
        )


EMPTY_RF_STATE: Final = RFState((), True, None)
RF_STATE: ContextVar[RFState] = ContextVar("aprof.rf_state", default=EMPTY_RF_STATE)


def start_unrecorded_thread(fn: Callable[..., object], *args: object) -> int:
    """Start one of aprof's own threads (a flight recorder's dumps, the
    loop-block watchdog, the remote control, a pool worker's answer): a bare
    ``_thread``, which ``threading.enumerate()`` does not list (SPEC 15.6),
    run in a context of its own with recording off from its first
    instruction, so a global profile never counts its allocations, samples
    or ranges as the program's. Returns its ident."""
    quiet = contextvars.Context()
    quiet.run(RF_STATE.set, EMPTY_RF_STATE.replace(enabled=False))
    # Context.run is the thread's first call: nothing runs outside `quiet`.
    run: Any = quiet.run
    return _thread.start_new_thread(run, (fn, *args))

# Global registrations, replaced (never mutated) under _global_lock. Only
# enabled entries are here, so the hot path tests `if global_entries`.
global_entries: tuple[Entry, ...] = ()
_global_all: tuple[Entry, ...] = ()
_global_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread may have held the lock when the parent forked; in the
    # child that thread does not exist, so the lock would never be released.
    global _global_lock
    _global_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
_registry: weakref.WeakValueDictionary[int, Entry] = weakref.WeakValueDictionary()


#: The recorder of the one global profile when it is all that listens
#: globally (its callback is marked ``_aprof_recorder``, and it records no
#: inputs): ranges in contexts with no profile of their own take the inline
#: path into it, as a context profile's do, instead of the general one.
global_fast: Any = None


def _publish_globals() -> None:
    global global_entries, global_fast
    global_entries = tuple(e for e in _global_all if e.enabled and not e.removed)
    fast = None
    if len(global_entries) == 1:
        rec = getattr(global_entries[0].callback, "_aprof_recorder", None)
        if rec is not None and rec.fast:
            fast = rec
    global_fast = fast
    if _native.extension is not None:
        _native.extension._set_global_callbacks(bool(global_entries), fast)  # the C range path's copy


def add_global_callback(cb: RecordFunctionCallback) -> CallbackHandle:
    """Register ``cb`` for every range in the process.

    Global callbacks run before context callbacks, in registration order.

    Returns:
        A handle for :func:`remove_callback` and friends.

    Raises:
        TypeError: ``cb`` is not a :class:`RecordFunctionCallback`.
    """
    global _global_all
    _check_callback(cb, "add_global_callback")
    entry = Entry(cb, is_global=True)
    with _global_lock:
        _global_all = (*_global_all, entry)
        _registry[entry.handle] = entry
        _publish_globals()
    return entry.handle


def add_context_callback(cb: RecordFunctionCallback) -> CallbackHandle:
    """Register ``cb`` for ranges in the current context and what it spawns.

    The registration lives in a context variable: tasks, task groups,
    nurseries and propagated submissions spawned afterwards see it; siblings
    and the parent do not.

    Returns:
        A handle for :func:`remove_callback` and friends.

    Raises:
        TypeError: ``cb`` is not a :class:`RecordFunctionCallback`.
    """
    _check_callback(cb, "add_context_callback")
    entry = Entry(cb, is_global=False)
    _registry[entry.handle] = entry
    st = RF_STATE.get()
    RF_STATE.set(st.replace(callbacks=(*_live(st.callbacks), entry)))
    return entry.handle


def _check_callback(cb: object, where: str) -> None:
    if not isinstance(cb, RecordFunctionCallback):
        raise TypeError(f"{where}: expected a RecordFunctionCallback, got {cb!r}")


def _live(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    return tuple(e for e in entries if not e.removed)


def remove_callback(handle: CallbackHandle) -> None:
    """Unregister a callback. A no-op for an unknown handle.

    A range whose start already ran for this callback still gets its end.
    """
    global _global_all
    entry = _entry_of(handle)
    if entry is None:
        return
    _registry.pop(entry.handle, None)
    entry.removed = True
    if entry.is_global:
        with _global_lock:
            _global_all = tuple(e for e in _global_all if e is not entry)
            _publish_globals()
    else:
        st = RF_STATE.get()
        if entry in st.callbacks:
            RF_STATE.set(st.replace(callbacks=_live(st.callbacks)))


def _set_enabled(handle: CallbackHandle, enabled: bool) -> None:
    entry = _entry_of(handle)
    if entry is None:
        return
    entry.enabled = enabled
    if entry.is_global:
        with _global_lock:
            _publish_globals()


def disable_callback(handle: CallbackHandle) -> None:
    """Stop running a callback until re-enabled. A no-op for an unknown handle."""
    _set_enabled(handle, False)


def reenable_callback(handle: CallbackHandle) -> None:
    """Run a disabled callback again. A no-op for an unknown handle."""
    _set_enabled(handle, True)


def has_global_callbacks() -> bool:
    """Whether any global callback is registered (enabled or not)."""
    return bool(_global_all)


def has_context_callbacks() -> bool:
    """Whether the current context has a callback or a running profile."""
    st = RF_STATE.get()
    rec = st.recorder
    return any(not e.removed for e in st.callbacks) or (rec is not None and rec.state is not None)


def has_callbacks() -> bool:
    """Whether any callback could run for a range started here."""
    return has_global_callbacks() or has_context_callbacks()


def clear_global_callbacks() -> None:
    """Remove every global callback."""
    global _global_all
    with _global_lock:
        for e in _global_all:
            e.removed = True
            _registry.pop(e.handle, None)
        _global_all = ()
        _publish_globals()


def clear_context_callbacks() -> None:
    """Remove every context callback from the current context.

    Context callbacks are per context, like any context variable: the
    context that registered them (a parent task) and tasks spawned before
    the clear keep theirs. :func:`remove_callback` removes one everywhere.
    A running profile's recorder is not a user callback: it stays until the
    profile stops.
    """
    st = RF_STATE.get()
    if st.callbacks:
        # Only this context's view changes: the entries are shared with the
        # contexts that inherited them, so they are not marked removed.
        RF_STATE.set(st.replace(callbacks=()))


def clear_callbacks() -> None:
    """Remove every global callback and every callback of this context."""
    clear_global_callbacks()
    clear_context_callbacks()


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------

_rng = random.Random()


def set_record_function_seed_for_testing(seed: int) -> None:
    """Seed the sampling random generator, making sampling deterministic.

    For every range, each matching callback whose probability is below 1
    draws one ``random.Random.random()`` value from this generator, globals
    first, in registration order; it runs when the value is below its
    probability.

    Raises:
        TypeError: ``seed`` is not an int.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"set_record_function_seed_for_testing: seed must be an int, got {seed!r}")
    _rng.seed(seed)


def sampled(prob: float) -> bool:
    """Draw for one callback of probability ``prob`` (the documented rule)."""
    if prob >= 1.0:
        return True
    # Every probability below 1 draws, p=0 included, so the draws a seeded
    # run makes depend only on which callbacks match, never on their values.
    return _rng.random() < prob  # random() is in [0, 1): p=0 (or NaN) never runs


# ---------------------------------------------------------------------------
# Running callbacks safely
# ---------------------------------------------------------------------------


#: Frames of headroom report_failure takes over the recursion limit.
REPORT_HEADROOM: Final = 100
#: The program's recursion limit while report_failure's headroom is in place
#: and could not be taken back yet (see report_failure), else None.
limit_to_restore: int | None = None


def restore_recursion_limit() -> None:
    """Take back report_failure's headroom, if it is still in place and the
    stack is shallow enough to do so (else a later range tries again)."""
    global limit_to_restore
    limit = limit_to_restore
    if limit is None:
        return
    if sys.getrecursionlimit() != limit + REPORT_HEADROOM:
        limit_to_restore = None  # the program set its own limit since: it stays
        return
    try:
        sys.setrecursionlimit(limit)
    except RecursionError:
        return  # deeper than the old limit right here
    limit_to_restore = None


def report_failure(entry: Entry, phase: str, range_name: str, exc: BaseException) -> None:
    """Disable a callback that raised and warn once (trio's Instruments rule).

    A callback that recursed until ``RecursionError`` leaves the stack a
    frame or two short of the limit: publishing the change and formatting
    the warning would hit the limit again, leaving the warning unsaid and a
    new RecursionError in the user's code. So this runs with the recursion
    limit raised by a little headroom (its callers in _record_function take
    it before calling, since at the limit this very call would not fit).
    Lowering it back can fail that close to the limit
    (``sys.setrecursionlimit`` refuses a limit below the current depth);
    then the range's ``before()`` or ``end()``, two frames up, takes it back.
    """
    global limit_to_restore
    entry.enabled = False
    if limit_to_restore is None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + REPORT_HEADROOM)
        limit_to_restore = limit
    try:
        if entry.is_global:
            with _global_lock:
                _publish_globals()
        if entry.reported:
            return
        entry.reported = True
        warnings.warn(
            f"aprof: callback {entry.callback!r} raised {type(exc).__name__}: {exc} in its {phase} "
            f"for range {range_name!r}; the callback is disabled",
            AprofWarning,
            stacklevel=4,
        )
    finally:
        restore_recursion_limit()
