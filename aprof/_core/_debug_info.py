"""Context-local debug info and state snapshots.

The seed keeps ``ThreadLocalDebugInfo`` (a stack of typed slots) and
``ThreadLocalState`` (a snapshot of everything thread-local, re-applied in
``at::launch`` jobs). aprof keeps both in context variables holding immutable
values, changed through guards, so asyncio and trio copy them into every task
they spawn for free.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Final

from ._callbacks import RF_STATE, RFState

__all__ = ["ContextState", "DebugInfoGuard", "DebugInfoKind", "get_debug_info"]


class DebugInfoKind(enum.IntEnum):
    """The slots of context-local debug info (the seed's ``DebugInfoKind``)."""

    PRODUCER_INFO = 0
    PROFILER_STATE = 1
    """Holds the running profile's state; set by :class:`aprof.profile`."""
    TEST_INFO = 2
    """Free for tests."""
    TEST_INFO_2 = 3
    """Free for tests."""


_N_KINDS: Final = len(DebugInfoKind)
_EMPTY: Final[tuple[Any, ...]] = (None,) * _N_KINDS
DEBUG_INFO: ContextVar[tuple[Any, ...]] = ContextVar("aprof.debug_info", default=_EMPTY)


class SlotRef:
    """A slot value that can be emptied from any context.

    A profile pushes one of these rather than its state, so that stopping it
    from another task or thread empties the slot everywhere at once, and the
    starting context keeps no reference to the profile's data.
    """

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value: object = value


def _check_kind(kind: object, where: str) -> DebugInfoKind:
    if isinstance(kind, DebugInfoKind):
        return kind
    raise TypeError(f"{where}: expected a DebugInfoKind, got {kind!r}")


def get_debug_info(kind: DebugInfoKind) -> Any:
    """The innermost info pushed into ``kind``'s slot in this context, or None.

    Raises:
        TypeError: ``kind`` is not a :class:`DebugInfoKind`.
    """
    value = DEBUG_INFO.get()[_check_kind(kind, "get_debug_info")]
    if type(value) is SlotRef:
        return value.value
    return value


def set_slot(kind: DebugInfoKind, value: object) -> tuple[Any, ...]:
    """Replace one slot in this context; returns the new tuple."""
    cur = DEBUG_INFO.get()
    new = (*cur[:kind], value, *cur[kind + 1 :])
    DEBUG_INFO.set(new)
    return new


# ---------------------------------------------------------------------------
# Guards: a stack of open guards per context, so any exit order restores well
# ---------------------------------------------------------------------------
#
# A guard changes some *fields* of aprof's context state: the recording
# switch ("enabled"), the context callbacks ("callbacks"), the profile's
# recorder ("recorder"), all in RF_STATE, or a debug-info slot (its int
# index in DEBUG_INFO). RecordFunctionGuard changes "enabled";
# DebugInfoGuard(kind) changes slot ``kind``; ContextState.applied()
# changes them all.
#
# Restoring with ContextVar.reset is right only for exits in reverse order:
# enter A, enter B, exit A, exit B would leave A's value in place for good
# (reset(B) puts back what was there when B entered, A's value). Instead,
# each context keeps the stack of its open guards, each with the values its
# fields had when it entered. Exiting the innermost guard of a field puts
# that field's value back. Exiting a guard that has a later guard open on
# the same field changes nothing visible now; the later guard inherits its
# "value before", so when it exits, the field goes back to what it was
# before both. Whatever the order, once every guard has exited, each field
# holds what it held before the first one entered, and while some are
# open, a field holds the value of its innermost open guard (or of a direct
# change made since, such as ``enable_record_function``, as in the seed).

_RF_FIELDS: Final = ("callbacks", "enabled", "recorder")
ALL_FIELDS: Final[tuple[str | int, ...]] = (*_RF_FIELDS, *range(_N_KINDS))


class _Open:
    """One open guard in a context's stack: the guard, and its fields' values before it.

    Never changed once built: a spawned task's context shares its parent's stack.
    """

    __slots__ = ("guard", "prev")

    def __init__(self, guard: object, prev: dict[str | int, Any]) -> None:
        self.guard = guard
        self.prev = prev


_OPEN_GUARDS: ContextVar[tuple[_Open, ...]] = ContextVar("aprof.open_guards", default=())


def _read(fields: Iterable[str | int]) -> dict[str | int, Any]:
    rf, debug = RF_STATE.get(), DEBUG_INFO.get()
    return {f: debug[f] if isinstance(f, int) else getattr(rf, f) for f in fields}


def _write(values: dict[str | int, Any]) -> None:
    rf_changes = {f: v for f, v in values.items() if isinstance(f, str)}
    if rf_changes:
        RF_STATE.set(RF_STATE.get().replace(**rf_changes))
    if len(rf_changes) < len(values):
        debug = list(DEBUG_INFO.get())
        for f, v in values.items():
            if isinstance(f, int):
                debug[f] = v
        DEBUG_INFO.set(tuple(debug))


def enter_guard(guard: object, values: dict[str | int, Any]) -> Token[tuple[_Open, ...]]:
    """Push ``guard`` on this context's stack and set its fields to ``values``.

    Returns:
        The token that :func:`exit_guard` needs.
    """
    token = _OPEN_GUARDS.set((*_OPEN_GUARDS.get(), _Open(guard, _read(values))))
    _write(values)
    return token


def exit_guard(guard: object, token: Token[tuple[_Open, ...]], what: str) -> None:
    """Take ``guard`` off the stack and restore its fields (see above).

    Raises:
        RuntimeError: the guard is exited in another context than the one it
            was entered in (SPEC 2.3). If this context inherited the guard
            (a task spawned inside it), the guard's fields are undone here
            too; the entering context keeps the values the guard set.
    """
    stack = _OPEN_GUARDS.get()
    try:
        # Succeeds only in the context the guard was entered in: the
        # context check that SPEC 2.3 needs. The stack is set just below.
        _OPEN_GUARDS.reset(token)
        here = True
    except ValueError:
        here = False
    at = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].guard is guard), None)
    if at is None:
        if here:
            _OPEN_GUARDS.set(stack)
    else:
        rec = stack[at]
        above = list(stack[at + 1 :])
        restore: dict[str | int, Any] = {}
        for field, before in rec.prev.items():
            for j, upper in enumerate(above):
                if field in upper.prev:
                    # A later guard on this field is still open: it keeps the
                    # field's value now, and puts back this one's at its exit.
                    above[j] = _Open(upper.guard, {**upper.prev, field: before})
                    break
            else:
                restore[field] = before
        _OPEN_GUARDS.set((*stack[:at], *above))
        if restore:
            _write(restore)
    if not here:
        raise RuntimeError(
            f"{what} was exited in a different context from the one it was entered in; "
            "the entering context keeps the value it set"
        )


class DebugInfoGuard:
    """Push ``info`` into ``kind``'s slot for the body of a ``with`` block.

    Works in sync code and across ``await``: the slot lives in a context
    variable, so tasks spawned inside see it, and nothing the body's tasks push
    leaks back. Guards may exit in any order: once all have exited, the slot
    holds what it held before them.

    Args:
        kind: The slot.
        info: Any object; ``get_debug_info(kind)`` returns it inside the body.

    Raises:
        TypeError: ``kind`` is not a :class:`DebugInfoKind`.
        RuntimeError: the guard is entered while already entered; or, on
            exit, it is exited in another context than the one it was
            entered in (the slot there stays as it was set).

    Example:
        >>> import aprof
        >>> with aprof.DebugInfoGuard(aprof.DebugInfoKind.TEST_INFO, "req-42"):
        ...     aprof.get_debug_info(aprof.DebugInfoKind.TEST_INFO)
        'req-42'
    """

    __slots__ = ("_info", "_kind", "_token")

    def __init__(self, kind: DebugInfoKind, info: object) -> None:
        self._kind = _check_kind(kind, "DebugInfoGuard")
        self._info = info
        self._token: Token[tuple[_Open, ...]] | None = None

    def __enter__(self) -> DebugInfoGuard:
        if self._token is not None:
            raise RuntimeError(f"{self!r} is already entered")
        self._token = enter_guard(self, {int(self._kind): self._info})
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        token = self._token
        if token is None:
            return
        self._token = None
        exit_guard(self, token, repr(self))

    def __repr__(self) -> str:
        return f"DebugInfoGuard({self._kind.name}, {self._info!r})"


class ContextState:
    """A snapshot of aprof's context-local state (the seed's ThreadLocalState).

    Holds the debug info slots, the context callbacks, the running profile's
    recorder and whether recording is enabled. Re-enter it anywhere with
    :meth:`applied`.

    Example:
        >>> import aprof, threading
        >>> state = aprof.ContextState.capture()
        >>> def work():
        ...     with state.applied():
        ...         ...  # ranges here reach the capturing context's profile
        >>> t = threading.Thread(target=work); t.start(); t.join()
    """

    __slots__ = ("_debug", "_rf")

    def __init__(self, debug: tuple[Any, ...], rf: RFState) -> None:
        self._debug = debug
        self._rf = rf

    @classmethod
    def capture(cls) -> ContextState:
        """Snapshot the current context's aprof state."""
        return cls(DEBUG_INFO.get(), RF_STATE.get())

    def applied(self) -> _Applied:
        """Install this snapshot for the body; restore what was there after.

        A guard like the others: guards and ``applied()`` blocks may exit in
        any order (see :class:`DebugInfoGuard`).

        Raises:
            RuntimeError: (on exit) it is exited in another context than the
                one it was entered in; or it is entered while already entered.
        """
        return _Applied(self)

    def __repr__(self) -> str:
        return f"<ContextState recording={'on' if self._rf.enabled else 'off'} callbacks={len(self._rf.callbacks)}>"


class _Applied:
    """The context manager returned by :meth:`ContextState.applied`."""

    __slots__ = ("_state", "_token")

    def __init__(self, state: ContextState) -> None:
        self._state = state
        self._token: Token[tuple[_Open, ...]] | None = None

    def __enter__(self) -> ContextState:
        if self._token is not None:
            raise RuntimeError(f"{self!r} is already entered")
        state = self._state
        rf, debug = state._rf, state._debug
        values: dict[str | int, Any] = {f: getattr(rf, f) for f in _RF_FIELDS}
        values.update(enumerate(debug))
        self._token = enter_guard(self, values)
        return state

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        token = self._token
        if token is None:
            return
        self._token = None
        exit_guard(self, token, f"{self._state!r}.applied()")

    def __repr__(self) -> str:
        return f"{self._state!r}.applied()"
