"""Context-local debug info and state snapshots.

The seed keeps ``ThreadLocalDebugInfo`` (a stack of typed slots) and
``ThreadLocalState`` (a snapshot of everything thread-local, re-applied in
``at::launch`` jobs). aprof keeps both in context variables holding immutable
values, changed through guards, so asyncio and trio copy them into every task
they spawn for free.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
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


class DebugInfoGuard:
    """Push ``info`` into ``kind``'s slot for the body of a ``with`` block.

    Works in sync code and across ``await``: the slot lives in a context
    variable, so tasks spawned inside see it, and nothing the body's tasks push
    leaks back.

    Args:
        kind: The slot.
        info: Any object; ``get_debug_info(kind)`` returns it inside the body.

    Raises:
        TypeError: ``kind`` is not a :class:`DebugInfoKind`.
        RuntimeError: on exit, if the guard is exited in another context than
            the one it was entered in (the slot there stays as it was set).

    Example:
        >>> import aprof
        >>> with aprof.DebugInfoGuard(aprof.DebugInfoKind.TEST_INFO, "req-42"):
        ...     aprof.get_debug_info(aprof.DebugInfoKind.TEST_INFO)
        'req-42'
    """

    __slots__ = ("_info", "_kind", "_prev", "_set", "_token")

    def __init__(self, kind: DebugInfoKind, info: object) -> None:
        self._kind = _check_kind(kind, "DebugInfoGuard")
        self._info = info
        self._token: Token[tuple[Any, ...]] | None = None
        self._set: tuple[Any, ...] | None = None
        self._prev: object = None

    def __enter__(self) -> DebugInfoGuard:
        if self._token is not None:
            raise RuntimeError(f"{self!r} is already entered")
        cur = DEBUG_INFO.get()
        self._prev = cur[self._kind]
        new = (*cur[: self._kind], self._info, *cur[self._kind + 1 :])
        self._token = DEBUG_INFO.set(new)
        self._set = new
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        token, mine = self._token, self._set
        if token is None:
            return
        self._token = self._set = None
        restore_slot(DEBUG_INFO, token, mine, lambda cur: _with_slot(cur, self._kind, self._prev), self)

    def __repr__(self) -> str:
        return f"DebugInfoGuard({self._kind.name}, {self._info!r})"


def _with_slot(cur: tuple[Any, ...], kind: int, value: object) -> tuple[Any, ...]:
    return (*cur[:kind], value, *cur[kind + 1 :])


def restore_slot(var: ContextVar[Any], token: Token[Any], mine: object, fieldwise: Any, guard: object) -> None:
    """Undo a guard's change to ``var``.

    If nothing else changed the variable since, the token restores it exactly.
    If something did (an inner guard still open, a callback registered in the
    body), only the guard's own field is put back. A token from another
    context cannot be used: that is a guard handed between tasks, which we
    report clearly instead of letting contextvars raise its ValueError.
    """
    cur = var.get()
    try:
        # Succeeds only in the context the guard was entered in, whatever
        # changed the variable since; a sibling context must not pass
        # silently (SPEC 2.3), so the token is tried even when cur is not mine.
        var.reset(token)
    except ValueError:
        # Entered in one context, exited in another. Undo the guard's field
        # here only if this context inherited the guard's value.
        if cur is mine:
            var.set(fieldwise(cur))
        raise RuntimeError(
            f"{guard!r} was exited in a different context from the one it was entered in; "
            "the entering context keeps the value it set"
        ) from None
    if cur is not mine:
        var.set(fieldwise(cur))


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

    @contextmanager
    def applied(self) -> Iterator[ContextState]:
        """Install this snapshot for the body; restore what was there after."""
        t1 = DEBUG_INFO.set(self._debug)
        t2 = RF_STATE.set(self._rf)
        try:
            yield self
        finally:
            try:
                RF_STATE.reset(t2)
                DEBUG_INFO.reset(t1)
            except ValueError:
                # Exited in another context than it was entered in (e.g. a
                # generator closed elsewhere): say so clearly (SPEC 2.3).
                raise RuntimeError(
                    f"{self!r}.applied() was exited in a different context from the one it was entered in"
                ) from None

    def __repr__(self) -> str:
        return f"<ContextState recording={'on' if self._rf.enabled else 'off'} callbacks={len(self._rf.callbacks)}>"
