"""RecordFunction, user ranges and the recording switch (SPEC 3, 4).

Two paths, one meaning:

* the **general path** builds a :class:`RecordFunction`, decides which
  callbacks are active (scope, sampling) when it is constructed, as the seed
  does, runs their starts in ``before()`` and their ends in ``end()``;
* the **fast path**, taken by :class:`record_function` when the only listener
  is the context's profile recorder, appends the raw record inline. It writes
  exactly the record the general path's recorder writes.

With nothing listening, a range costs one context-variable read and a tuple
test (the seed's ``isActive``), which is close to a ``nullcontext()``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Mapping
from contextvars import Token
from sys import getrecursionlimit, setrecursionlimit
from sys import is_finalizing as _is_finalizing
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar, cast

from . import _callbacks, _native, _threads
from ._callbacks import (
    MODE_FAST,
    MODE_OFF,
    MODE_SLOW,
    RF_STATE,
    Entry,
    RecordScope,
    report_failure,
    sampled,
)
from ._debug_info import enter_guard, exit_guard
from ._recorder import ASYNC_SAME_THREAD, TASK_BLOCKS, ProfilerState, Recorder, capture_stack, index_of
from ._threads import LogicalThread, current_logical_thread, stepping

__all__ = [
    "DisableRecordFunctionGuard",
    "RecordFunction",
    "RecordFunctionGuard",
    "enable_record_function",
    "get_default_node_id",
    "is_record_function_enabled",
    "mark",
    "record_function",
    "set_default_node_id",
]

F = TypeVar("F", bound=Callable[..., Any])

_get_rf_state = RF_STATE.get
_range_handles = itertools.count(1)
_sequence_numbers = itertools.count(1)
_default_node_id = 0


def next_sequence_nr() -> int:
    """A process-wide increasing number, for linking spawns and submissions."""
    return next(_sequence_numbers)


def set_default_node_id(node_id: int) -> None:
    """Tag events of profiles started from now on with ``node_id``.

    Used to merge profiles of several processes (SPEC 3.5, 11.4).

    Raises:
        TypeError: ``node_id`` is not an int.
        ValueError: ``node_id`` is negative.
    """
    global _default_node_id
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise TypeError(f"set_default_node_id: node_id must be an int, got {node_id!r}")
    if node_id < 0:
        raise ValueError(f"set_default_node_id: node_id must be >= 0, got {node_id}")
    _default_node_id = node_id


def get_default_node_id() -> int:
    """The node id that new profiles tag their events with (0 by default)."""
    return _default_node_id


#: A shared empty mapping: most ranges have no keyword inputs (never mutated).
_NO_KWINPUTS: Final[dict[str, Any]] = {}


def _check_scope(scope: object) -> RecordScope:
    if not isinstance(scope, RecordScope):
        raise TypeError(f"RecordFunction: scope must be a RecordScope, got {scope!r}")
    return scope


def _exc_name(et: type[BaseException] | None) -> str | None:
    return None if et is None else et.__name__


class RecordFunction:
    """The low-level range guard (the seed's ``at::RecordFunction``).

    Which callbacks are active is decided when it is constructed (scopes,
    on/off switches, sampling); ``before()`` runs their starts and ``end()``
    their ends, each exactly once.

    Args:
        scope: The kind of range.

    Raises:
        TypeError: ``scope`` is not a :class:`RecordScope`.

    It is also a context manager: ``with`` ends the range at the block's
    end, recording the exception that left it, if any. ``RecordFunction.range``
    opens a named range of any scope in one step. A range that is never
    ended is ended when the object is garbage-collected: its end callbacks
    run, with ``unfinished`` true, and a profile closes it at stop, flagged
    ``unfinished``.

    Example:
        >>> import aprof
        >>> rf = aprof.RecordFunction(aprof.RecordScope.FUNCTION)
        >>> if rf.is_active:
        ...     rf.before("matmul", (3, 4))
        >>> rf.end()
        >>> with aprof.RecordFunction.range("conv2d", ("3x3",)):
        ...     pass
    """

    __slots__ = (
        "_active",
        "_args",
        "_ended",
        "_end_lt",
        "_exception",
        "_extra",
        "_forced_async",
        "_inputs",
        "_instant",
        "_kwinputs",
        "_lt",
        "_needs_outputs",
        "_outputs",
        "_rec",
        "_recorder",
        "_started",
        "_todo",
        "_unfinished",
        "forward_thread_id",
        "handle",
        "name",
        "scope",
        "seq_nr",
    )

    def __init__(self, scope: RecordScope = RecordScope.FUNCTION) -> None:
        self._started = False  # first: __del__ reads it even if the scope is refused
        self.scope = _check_scope(scope)
        self.name = ""
        self.seq_nr = -1
        self.handle = 0
        self.forward_thread_id = 0
        self._args: str | None = None
        self._inputs: tuple[Any, ...] = ()
        self._kwinputs: dict[str, Any] = _NO_KWINPUTS
        self._outputs: tuple[Any, ...] = ()
        self._needs_outputs = False
        self._lt: LogicalThread | None = None
        self._end_lt: LogicalThread | None = None
        self._active: list[tuple[Entry, Any]] = []
        self._rec: tuple[list[Any], int] | None = None
        self._exception: str | None = None
        self._extra: dict[str, Any] | None = None
        self._started = False
        self._ended = False
        self._forced_async = False
        self._instant = False
        self._unfinished = False
        self._todo, self._recorder = self._select(scope)

    @classmethod
    def range(
        cls,
        name: str,
        args: Iterable[Any] = (),
        *,
        scope: RecordScope = RecordScope.FUNCTION,
        sequence_nr: int = -1,
    ) -> RecordFunction:
        """Open a named range of any scope, for ``with``: the seed's ``RECORD_FUNCTION``.

        ``with aprof.RecordFunction.range("conv2d", inputs):`` is
        ``RecordFunction(scope)`` followed by ``before(name, args,
        sequence_nr)`` when it is active; the block's end ends it. Libraries
        use it for ``FUNCTION``-scope ranges (``record_function`` is
        ``USER_SCOPE``).

        Args:
            name: The range's name.
            args: The inputs, kept only if a callback needs them.
            scope: The kind of range (``FUNCTION`` by default).
            sequence_nr: A sequence number linking this range to another.

        Raises:
            TypeError: as :class:`RecordFunction` and :meth:`before`.
        """
        rf = cls(scope)
        if rf.is_active:
            rf.before(name, args, sequence_nr)
        else:
            rf.before(name, (), sequence_nr)  # checks the arguments; runs nothing
        return rf

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None and self._exception is None and not self._ended:
            self._exception = et.__name__
        self.end()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, ev, tb)

    def __del__(self) -> None:
        # Started and never ended (RELIABILITY LC-03): the callbacks that
        # started get their end now, so their own bookkeeping balances. The
        # profile's record stays open: consolidation closes it at the stop
        # time, flagged unfinished. Nothing is run while the interpreter
        # shuts down.
        if not self._started or self._ended or _is_finalizing():
            return
        self._ended = True
        self._unfinished = True
        self._rec = None
        if self._active:
            self._run_ends(None)

    @staticmethod
    def _select(scope: RecordScope) -> tuple[list[Entry], Recorder | None]:
        st = RF_STATE.get()
        if st.mode == MODE_OFF:
            return [], None
        todo: list[Entry] = []
        for entries in (_callbacks.global_entries, st.callbacks):
            for e in entries:
                if not e.enabled or e.removed:
                    continue
                cb = e.callback
                if cb._scopes and scope not in cb._scopes:
                    continue
                if cb._prob < 1.0 and not sampled(cb._prob):
                    continue
                todo.append(e)
        rec = st.recorder
        if rec is not None and rec.state is None:
            rec = None
        return todo, rec

    # -- accessors --------------------------------------------------------

    @property
    def is_active(self) -> bool:
        """Whether some callback (or a profile) will see this range."""
        return bool(self._todo) or self._recorder is not None

    @property
    def inputs(self) -> tuple[Any, ...]:
        """The range's positional inputs, filled only when :attr:`needs_inputs`."""
        return self._inputs

    @property
    def kwinputs(self) -> dict[str, Any]:
        """The range's keyword inputs (the seed's ``kwinputs``), filled only
        when :attr:`needs_inputs`; empty otherwise."""
        return self._kwinputs

    @property
    def needs_inputs(self) -> bool:
        """Whether a selected callback (or the profile, with ``record_inputs``)
        will read the inputs: build them for :meth:`before` only then.

        The seed's ``RecordFunction::needsInputs``; it is decided with the
        callbacks, when the object is constructed::

            rf = aprof.RecordFunction(aprof.RecordScope.FUNCTION)
            if rf.is_active:
                rf.before("op", expensive_inputs() if rf.needs_inputs else ())
        """
        rec = self._recorder
        if rec is not None:
            st = rec.state
            if st is not None and st.record_inputs:
                return True
        return any(e.callback._needs_inputs for e in self._todo)

    @property
    def outputs(self) -> tuple[Any, ...]:
        """The range's outputs, set by :meth:`set_outputs`."""
        return self._outputs

    def set_outputs(self, values: Iterable[Any]) -> None:
        """Record outputs, kept only when a callback needs them."""
        if self._needs_outputs:
            self._outputs = tuple(values)

    @property
    def needs_outputs(self) -> bool:
        """Whether an active callback asked for outputs."""
        return self._needs_outputs

    @property
    def thread_id(self) -> int:
        """The logical thread that ran the start callbacks (0 before start)."""
        return self._lt.id if self._lt is not None else 0

    @property
    def end_thread_id(self) -> int:
        """The logical thread that ran the end callbacks (0 before end)."""
        return self._end_lt.id if self._end_lt is not None else 0

    @property
    def is_async(self) -> bool:
        """Whether the range ended in another logical thread, or was marked async."""
        if self._forced_async:
            return True
        return self._end_lt is not None and self._end_lt is not self._lt

    @property
    def exception(self) -> str | None:
        """The type name of the exception that ended the range, if any."""
        return self._exception

    @property
    def unfinished(self) -> bool:
        """Whether the range was never ended: it was garbage-collected open."""
        return self._unfinished

    def _set_async(self) -> None:
        """Mark the range async: it may end in another logical thread."""
        self._forced_async = True

    @staticmethod
    def current_thread_id() -> int:
        """The current logical thread id (same as :func:`aprof.current_thread_id`)."""
        return current_logical_thread().id

    # -- lifecycle --------------------------------------------------------

    def before(
        self, name: str, args: Iterable[Any] = (), sequence_nr: int = -1, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        """Start the range: run the active start callbacks.

        Args:
            name: The range's name.
            args: The positional inputs, kept only if a callback needs them
                (``rf.inputs``).
            sequence_nr: A sequence number linking this range to another.
            kwargs: The keyword inputs, kept the same way (``rf.kwinputs``).

        Raises:
            TypeError: ``name`` is not a str, or ``sequence_nr`` not an int.
            RuntimeError: ``before()`` was already called.
        """
        if not isinstance(name, str):
            raise TypeError(f"RecordFunction.before: name must be a str, got {type(name).__name__}")
        if isinstance(sequence_nr, bool) or not isinstance(sequence_nr, int):
            raise TypeError(f"RecordFunction.before: sequence_nr must be an int, got {sequence_nr!r}")
        if self._started:
            raise RuntimeError(f"RecordFunction.before: range {self.name!r} was already started")
        self._started = True
        self.name = name
        self.seq_nr = sequence_nr
        todo = self._todo
        recorder = self._recorder
        if not todo and recorder is None:
            return
        for e in todo:
            cb = e.callback
            self._needs_outputs = self._needs_outputs or cb._needs_outputs
            if cb._needs_ids and not self.handle:
                self.handle = next(_range_handles)
        if self.needs_inputs:
            self._inputs = tuple(args)
            if kwargs:
                self._kwinputs = dict(kwargs)
        lt = self._lt = current_logical_thread()
        if todo:
            try:
                self._run_starts(todo, name)
            except BaseException:
                # KeyboardInterrupt and friends propagate, but the callbacks that
                # did start still get their end, so their stacks stay balanced.
                self._exception = "start interrupted"
                self._run_ends(None)
                self._ended = True
                raise
            limit = _callbacks.limit_to_restore
            if limit is not None:
                # A callback failed at the recursion limit and _run_starts
                # took headroom. Give it back here, inline: two frames above
                # report_failure, this frame's C call fits under the old
                # limit (a helper's frame might not).
                try:
                    if getrecursionlimit() == limit + _callbacks.REPORT_HEADROOM:
                        setrecursionlimit(limit)
                    _callbacks.limit_to_restore = None  # or the program set its own limit since
                except RecursionError:
                    pass  # still too deep: a later range gives it back
        if recorder is not None:
            # The recorder starts last and ends first, so the recorded span
            # measures the user's code, not the other callbacks.
            self._rec = recorder.start(self, lt, 1)

    def _run_starts(self, todo: list[Entry], name: str) -> None:
        active = self._active
        for e in todo:
            cb = e.callback
            phase = "start"
            try:
                if cb._should_run is not None:
                    phase = "should_run predicate"
                    if not cb._should_run(self):
                        continue  # skipped for this range: no start, no end
                    phase = "start"
                ctx = cb._start(self)
            except Exception as exc:
                # A callback that recursed until RecursionError leaves this
                # frame right at the recursion limit, where one C call still
                # fits and a Python call does not: take report_failure's
                # headroom here, with C calls alone (it gives it back).
                if _callbacks.limit_to_restore is None:
                    _callbacks.limit_to_restore = limit = getrecursionlimit()
                    setrecursionlimit(limit + _callbacks.REPORT_HEADROOM)
                report_failure(e, phase, name, exc)
                continue
            active.append((e, ctx))

    def end(self) -> None:
        """End the range: run the end callbacks of the starts that ran.

        Idempotent: a second call does nothing.
        """
        if self._ended or not self._started:
            return
        self._ended = True
        end_lt = self._end_lt = current_logical_thread()
        rec = self._rec
        if rec is not None:
            self._rec = None
            Recorder.end(rec, self._end_thread_id_for_record(), self._exception)
        if self._active:
            try:
                self._run_ends(end_lt)
            finally:
                limit = _callbacks.limit_to_restore
                if limit is not None:  # as in before()
                    try:
                        if getrecursionlimit() == limit + _callbacks.REPORT_HEADROOM:
                            setrecursionlimit(limit)
                        _callbacks.limit_to_restore = None
                    except RecursionError:
                        pass

    def _end_thread_id_for_record(self) -> int:
        end_lt = self._end_lt
        assert end_lt is not None
        if self._forced_async and end_lt is self._lt:
            return ASYNC_SAME_THREAD
        return end_lt.id

    def _run_ends(self, end_lt: LogicalThread | None) -> None:
        pending: BaseException | None = None
        for e, ctx in self._active:
            end = e.callback._end
            if end is None or not e.enabled and e.reported:
                continue
            try:
                end(self, ctx)
            except Exception as exc:
                if _callbacks.limit_to_restore is None:  # as in _run_starts
                    _callbacks.limit_to_restore = limit = getrecursionlimit()
                    setrecursionlimit(limit + _callbacks.REPORT_HEADROOM)
                report_failure(e, "end", self.name, exc)
            except BaseException as exc:
                if pending is None:
                    pending = exc
        self._active = []
        if pending is not None:
            raise pending

    def __repr__(self) -> str:
        return f"<RecordFunction {self.name!r} scope={self.scope.name}>"


# ---------------------------------------------------------------------------
# record_function: the user's range
# ---------------------------------------------------------------------------


class _PyRangeCore:
    """The pure-Python range core: fields, ``__init__``, ``__enter__``, ``__exit__``.

    The C extension's ``RangeCore`` (aprof/_cranges.c) is the same in C and
    is the base of :class:`record_function` when it is built; both call the
    same Python methods of :class:`record_function` for every case but the
    two they handle inline (nothing listening, only the profile listening).
    """

    __slots__ = ("_idx", "_lt", "_more", "_rec", "args", "name")

    _idx: int
    _lt: LogicalThread

    def __init__(self, name: str, args: str | None = None) -> None:
        # issubclass(type(x), ...), not isinstance: a spoofed __class__ is
        # not a str (the C core checks the real type too).
        if type(name) is not str and not issubclass(type(name), str):
            raise TypeError(f"record_function: name must be a str, got {type(name).__name__}")
        if args is not None and type(args) is not str and not issubclass(type(args), str):
            raise TypeError(f"record_function: args must be a str or None, got {type(args).__name__}")
        self.name = name
        self.args = args
        # The open range: the starting thread's raw list (fast path, with the
        # start's index in _idx) or a RecordFunction (general path).
        self._rec: list[Any] | RecordFunction | None = None
        # Further ranges open on this same instance (one object entered by
        # several tasks at once, or recursively): (rec, idx, lt) entries.
        self._more: list[tuple[Any, int, LogicalThread | None]] | None = None

    def __enter__(self) -> Self:
        # The hot path: with nothing listening, one context-variable read and
        # two tests. Modes are literal ints here (see _callbacks.MODE_*).
        if self._rec is not None:
            self._spill()
        st = _get_rf_state()
        mode = st.mode
        if mode == 1:  # MODE_IDLE
            if _callbacks.global_entries:
                glob = _callbacks.global_fast
                if glob is None:
                    self._slow_start()
                else:  # only a global profile listens: its recorder, inline
                    self._fast_start(glob)
        elif mode == 2:  # MODE_FAST: only this context's profile is listening
            if _callbacks.global_entries:
                self._slow_start()
                return self
            self._fast_start(st.recorder)  # type: ignore[arg-type]
        elif mode == 3:  # MODE_SLOW
            self._slow_start()
        return self

    def _fast_start(self, recorder: Recorder) -> None:
        """The inline path: a plain range in ``recorder``'s raw list (the C core's fast_start)."""
        ps = recorder.state
        # None once the profile stopped; a full budget drops the range.
        if ps is not None and (ps.budget is None or ps.budget.take(0)):
            lt = current_logical_thread()
            lst = ps.lists.get(lt)
            if lst is None:
                lst = ps.list_for(lt)
            # Append, then find the index: a signal handler may open
            # ranges of its own on this list between any two bytecodes
            # (list.append itself is atomic), so len() taken before the
            # append could name the handler's record (the C core has no
            # such gap).
            t: tuple[Any, ...]
            if ps.with_stack:  # the raw stack, named at stop (taken before the clock read)
                stack = capture_stack(0)
                t = (self.name, "user_scope", perf_counter_ns(), self.args, stack)
            else:
                t = (self.name, "user_scope", perf_counter_ns(), self.args)
            lst.append(t)
            idx = len(lst) - 1
            if lst[idx] is not t:
                idx = index_of(lst, t, idx)
            self._idx = idx
            self._rec = lst
            self._lt = lt

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._more is not None:
            self._take_shared()
        rec = self._rec
        if rec is None:
            return
        self._rec = None
        if type(rec) is list:
            # The end tuple goes to the starting thread's list, naming the
            # start's index. After stop nobody reads that list: a late end is
            # dropped for free.
            now = perf_counter_ns()
            lt = stepping.lt  # set inside recorded task steps: skips the lookup
            if lt is None:
                lt = current_logical_thread()
            rec.append((self._idx, now, lt.id, None if et is None else et.__name__))
        else:
            self._end_general(rec, et)

    # Implemented by record_function; called from both cores.
    def _spill(self) -> None:
        raise NotImplementedError

    def _take_shared(self) -> None:
        raise NotImplementedError

    def _slow_start(self) -> None:
        raise NotImplementedError

    def _end_general(self, rec: Any, et: type[BaseException] | None) -> None:
        raise NotImplementedError


if TYPE_CHECKING:
    _RangeCore = _PyRangeCore
else:
    _RangeCore = _PyRangeCore if _native.extension is None else _native.extension.RangeCore
    if _native.extension is not None:
        _native.extension._range_setup(
            RF_STATE,
            vars(_callbacks),
            current_logical_thread,
            vars(_threads),
            _threads._hint if _threads._HINTS else None,
            (_callbacks.RFState, Recorder, ProfilerState, LogicalThread),  # their slots are read in C
        )
        _native.extension._task_blocks_setup(TASK_BLOCKS)

#: Whether record_function's enter/exit run in C (the extension is built and
#: ``APROF_PURE_PYTHON`` is not set).
C_RANGES: Final = _RangeCore is not _PyRangeCore


class record_function(_RangeCore):
    """A named range around a block of code or a function call.

    Usable as ``with``, ``async with``, a decorator (functions, coroutine
    functions, generators, async generators), or explicitly with
    :meth:`start` and :meth:`end`, which may run in different tasks. An
    exception or cancellation inside the range ends it, records the
    exception's type name, and propagates unchanged.

    Args:
        name: The range's name (any str, including empty).
        args: An optional string kept with the event (e.g. "batch=32").

    Raises:
        TypeError: ``name`` is not a str, or ``args`` is neither a str nor None.

    Example:
        >>> import aprof
        >>> @aprof.record_function("fetch")
        ... async def fetch(url): ...
        >>> with aprof.record_function("parse", args="size=4k"):
        ...     pass
    """

    __slots__ = ()

    async def __aenter__(self) -> record_function:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, ev, tb)

    def _spill(self) -> None:
        """Another range opens on this instance while one is open: park the open one."""
        rec = self._rec
        lt = rec._lt if type(rec) is RecordFunction else self._lt
        if self._more is None:
            self._more = []
        self._more.append((rec, -1 if type(rec) is RecordFunction else self._idx, lt))
        self._rec = None

    def _take_shared(self) -> None:
        """Put the range to end now in ``_rec``: the latest one the current
        logical thread opened, else (an explicit end elsewhere) the latest."""
        more = self._more
        assert more is not None
        rec = self._rec
        if rec is not None:
            if isinstance(rec, RecordFunction):  # the general path's
                more.append((rec, -1, rec._lt))
            else:  # the fast path's block (C) or list (Python)
                more.append((rec, self._idx, self._lt))
        if not more:
            self._more = None
            return
        me = stepping.lt or current_logical_thread()
        pick = len(more) - 1
        for i in range(len(more) - 1, -1, -1):
            if more[i][2] is me:
                pick = i
                break
        rec, idx, lt = more.pop(pick)
        self._rec = rec
        if type(rec) is not RecordFunction:  # the fast path's block (C) or list (Python)
            self._idx = idx
            assert lt is not None
            self._lt = lt
        if not more:
            self._more = None

    def _end_general(self, rec: Any, et: type[BaseException] | None) -> None:
        """End a range the general path opened (a RecordFunction)."""
        assert isinstance(rec, RecordFunction)
        if et is not None:
            rec._exception = et.__name__
        rec.end()

    def _slow_start(self) -> None:
        rf = RecordFunction(RecordScope.USER_SCOPE)
        if rf.is_active:
            rf._args = self.args
            rf.before(self.name, () if self.args is None else (self.args,))
            self._rec = rf

    def _start_call(self, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        """Open the range of one call of a decorated function, the call's
        arguments as its inputs (kept only if something needs them)."""
        if self._rec is not None:
            self._spill()
        rf = RecordFunction(RecordScope.USER_SCOPE)
        if rf.is_active:
            rf._args = self.args
            rf.before(self.name, a, kwargs=k)
            self._rec = rf

    def start(self) -> record_function:
        """Open the range now; :meth:`end` may be called from another task."""
        return self.__enter__()

    def end(self) -> None:
        """Close the range. Idempotent. Ending in another logical thread than
        the one that started it marks the event ``is_async``."""
        self.__exit__(None, None, None)

    def _set_outputs(self, value: object) -> None:
        rf = self._rec
        if type(rf) is RecordFunction and rf._needs_outputs:
            rf._outputs = (value,)

    # -- decorator --------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Decorate a function so each call is one range.

        For coroutine functions, generators and async generators the range
        covers the whole run, from first entry to final return, raise or
        close, never mere construction: an un-awaited coroutine records
        nothing.
        """
        if isinstance(fn, classmethod):
            return cast(F, classmethod(self(fn.__func__)))
        if isinstance(fn, staticmethod):
            return cast(F, staticmethod(self(fn.__func__)))
        if not callable(fn):
            raise TypeError(f"record_function: cannot decorate {fn!r}, it is not callable")
        return cast(F, _decorate(fn, self.name, self.args))


if C_RANGES:
    _native.extension._range_vectorcall(record_function)  # type: ignore[union-attr]


def _kind_probe(fn: Callable[..., Any]) -> Any:
    """What says whether calling ``fn`` makes a coroutine or a generator.

    A function, method or partial says it itself; an object with ``__call__``
    (an ASGI app, say) says it through its class's ``__call__``, which the
    ``inspect`` predicates do not look at.
    """
    if inspect.isroutine(fn) or isinstance(fn, (functools.partial, type)):
        return fn
    return type(fn).__call__  # callable(fn) was checked: its class has __call__


class _CallRange:
    """The range of one decorated call when a callback or the profile may
    want its inputs: started with the call's arguments, ended as
    ``record_function`` ends."""

    __slots__ = ("_a", "_k", "r")

    def __init__(self, r: record_function, a: tuple[Any, ...], k: dict[str, Any]) -> None:
        self.r = r
        self._a: tuple[Any, ...] | None = a
        self._k: dict[str, Any] | None = k

    def __enter__(self) -> record_function:
        a, k = self._a, self._k
        self._a = self._k = None  # held no longer than the start needs them
        assert a is not None
        assert k is not None
        self.r._start_call(a, k)
        return self.r

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.r.__exit__(et, ev, tb)


def _wants_call_inputs() -> bool:
    """Whether a decorated call must take the general path, with its
    arguments: some context callback, a profile with ``record_inputs`` or
    ``with_stack``, or a global callback may listen. Otherwise (nothing, or
    only a plain profile, listening) the call is a plain range: no inputs
    and no outputs are needed, and none are built."""
    return _get_rf_state().mode == MODE_SLOW or bool(_callbacks.global_entries)


def _decorate(fn: Callable[..., Any], name: str, args: str | None) -> Callable[..., Any]:
    probe = _kind_probe(fn)
    if inspect.isasyncgenfunction(probe):
        return _async_gen_wrapper(fn, name, args)

    # Each wrapper tests, when the range would start, whether anything may
    # want the call's inputs or result (_wants_call_inputs, inlined: a
    # context-variable read and a module attribute). If not, the call is a
    # plain `with record_function(...)`, as cheap as one.
    if inspect.iscoroutinefunction(probe):

        @functools.wraps(fn)
        async def coro_wrapper(*a: Any, **k: Any) -> Any:
            if _get_rf_state().mode != MODE_SLOW and not _callbacks.global_entries:
                with record_function(name, args):
                    return await fn(*a, **k)
            r = record_function(name, args)
            with _CallRange(r, a, k):
                result = await fn(*a, **k)
                r._set_outputs(result)
            return result

        return coro_wrapper

    if inspect.isgeneratorfunction(probe):

        @functools.wraps(fn)
        def gen_wrapper(*a: Any, **k: Any) -> Generator[Any, Any, Any]:
            if _get_rf_state().mode != MODE_SLOW and not _callbacks.global_entries:
                with record_function(name, args):
                    return (yield from fn(*a, **k))
            r = record_function(name, args)
            with _CallRange(r, a, k):
                result = yield from fn(*a, **k)
                r._set_outputs(result)
            return result

        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if _get_rf_state().mode != MODE_SLOW and not _callbacks.global_entries:
            with record_function(name, args):
                return fn(*a, **k)
        r = record_function(name, args)
        with _CallRange(r, a, k):
            result = fn(*a, **k)
            r._set_outputs(result)
        return result

    return wrapper


def _async_gen_wrapper(fn: Callable[..., Any], name: str, args: str | None) -> Callable[..., Any]:
    # An async generator cannot `yield from`, so forward asend/athrow/aclose
    # by hand (the shape of async_generator's yield_from_). The range is a
    # plain `with`: it spans the generator's whole life across its yields,
    # and needs no context variable, so finalizing the generator in another
    # task or by GC cannot trip contextvars (RELIABILITY CP-12).
    @functools.wraps(fn)
    async def agen_wrapper(*a: Any, **k: Any) -> AsyncGenerator[Any, Any]:
        r = record_function(name, args)
        with _CallRange(r, a, k) if _wants_call_inputs() else r:
            agen = fn(*a, **k)
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                return
            while True:
                try:
                    sent = yield item
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as exc:
                    try:
                        item = await agen.athrow(exc)
                    except StopAsyncIteration:
                        return
                else:
                    try:
                        item = await (agen.__anext__() if sent is None else agen.asend(sent))
                    except StopAsyncIteration:
                        return

    return agen_wrapper


# ---------------------------------------------------------------------------
# mark and the recording switch
# ---------------------------------------------------------------------------


def mark(name: str, args: str | None = None) -> None:
    """Record an instant event named ``name`` (SPEC 4.4).

    Callbacks see it as a range that starts and ends at once.

    Args:
        name: The instant's name.
        args: An optional string kept with the event, as for
            :class:`record_function`.

    Raises:
        TypeError: ``name`` is not a str, or ``args`` is neither a str nor
            None (an object would be kept alive past stop and break save()).
    """
    if not isinstance(name, str):
        raise TypeError(f"mark: name must be a str, got {type(name).__name__}")
    if args is not None and not isinstance(args, str):
        raise TypeError(f"mark: args must be a str or None, got {type(args).__name__}")
    st = RF_STATE.get()
    mode = st.mode
    if mode == MODE_OFF:
        return
    if mode == MODE_SLOW or _callbacks.global_entries:
        rf = RecordFunction(RecordScope.USER_SCOPE)
        if rf.is_active:
            rf._instant = True
            rf._args = args
            rf.before(name, () if args is None else (args,))
            rf.end()
    elif mode == MODE_FAST and st.recorder is not None:
        st.recorder.instant(name, RecordScope.USER_SCOPE, current_logical_thread(), args)


def _check_enabled(value: object, where: str) -> bool:
    # bool only: "no" or 0.0 would otherwise switch recording on or off by
    # their truth value (issue 22).
    if not isinstance(value, bool):
        raise TypeError(f"{where}: enabled must be True or False, got {value!r}")
    return value


def enable_record_function(enabled: bool = True) -> None:
    """Switch recording on or off for the current context (SPEC 3.4).

    Tasks and propagated work spawned while it is off inherit "off".
    Inside a :class:`RecordFunctionGuard`, the change lasts until the
    guard exits, as in the seed.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    enabled = _check_enabled(enabled, "enable_record_function")
    st = RF_STATE.get()
    if st.enabled != enabled:
        RF_STATE.set(st.replace(enabled=enabled))


def is_record_function_enabled() -> bool:
    """Whether recording is on in the current context."""
    return RF_STATE.get().enabled


class RecordFunctionGuard:
    """Switch recording on (or off) for the body of a ``with`` block.

    Guards may exit in any order: once every guard has exited, recording is
    as it was before the first one entered (see :class:`DebugInfoGuard`).

    Args:
        enabled: The state inside the block.

    Raises:
        TypeError: ``enabled`` is not a bool.
        RuntimeError: the guard is entered while already entered, or exited
            in another context than the one it was entered in.

    Example:
        >>> import aprof
        >>> with aprof.RecordFunctionGuard(enabled=False):
        ...     aprof.is_record_function_enabled()
        False
    """

    __slots__ = ("_enabled", "_token")

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = _check_enabled(enabled, type(self).__name__)
        self._token: Token[Any] | None = None

    def __enter__(self) -> RecordFunctionGuard:
        if self._token is not None:
            raise RuntimeError(f"{self!r} is already entered")
        self._token = enter_guard(self, {"enabled": self._enabled})
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        token = self._token
        if token is None:
            return
        self._token = None
        exit_guard(self, token, repr(self))

    async def __aenter__(self) -> RecordFunctionGuard:
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.__exit__(et, ev, tb)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(enabled={self._enabled})"


class DisableRecordFunctionGuard(RecordFunctionGuard):
    """Switch recording off for the body of a ``with`` block."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(enabled=False)

    def __repr__(self) -> str:
        return "DisableRecordFunctionGuard()"
