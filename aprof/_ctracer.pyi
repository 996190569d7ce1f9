"""The contract of the Python tracer's recording half (SPEC 8.1).

Two implementations: the C extension ``aprof._ctracer`` and the pure-Python
twin ``aprof._core._tracer_py``. Both write the same packed format, which
``aprof._post._replay`` reads:

* each raw event is two unsigned 64-bit words (16 bytes, native order):
  ``word`` = tag (bits 0-3) | thread index (bits 4-15) | nanoseconds since the
  previous event (bits 32-63), and ``payload``;
* tags: 1 CALL, 2 RETURN, 3 UNWIND (Python frames: payload = object index of
  the code object), 4 C_CALL, 5 C_RETURN, 6 C_RAISE (payload = object index
  of the C function's ``(name, file, line)``), 7 SWITCH (this thread now runs
  the logical thread at object index ``payload``), 8 TIME (``payload`` is an
  absolute ``perf_counter_ns`` value; written when a gap exceeds 32 bits),
  9 EXC (3.12+: right before an UNWIND, payload = object index of the
  exception's type), 10 RECV (right before the CALL of a method frame:
  payload = object index of the receiver's class, or with ``instance_ids``
  of a ``(class, serial)`` tuple; written only when it differs from the
  first RECV of the same code, which replay applies to the CALLs without
  one).
"""

from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from types import CodeType
from typing import Any, Final

EVENT_BYTES: Final[int]

def foreign_frame_evaluator() -> str | None:
    """A description of another tool's PEP 523 frame evaluator, if one is
    installed (3.11 and 3.12; always None on 3.13+, where the tracer uses
    none)."""

def replay(
    data: bytes,
    names: list[str | None],
    lts: list[tuple[list[Any], int] | None],
    start_ns: int,
    scope: str,
    recv_name: Callable[[int, int], str],
    /,
) -> None:
    """The inner loop of ``aprof._post._replay.replay`` (documented there), in
    C, writing each logical thread's calls into one ``RangeBlock`` appended to
    its list. ``recv_name(code_index, receiver_index)`` names a method frame
    on a receiver (called once per pair)."""

class Tracer:
    """Records Python calls and returns (and C calls) of one profile.

    Args:
        rf_state: The ``RF_STATE`` context variable; an event is recorded
            only when its value's ``recorder`` is ``recorder``.
        recorder: The profile's recorder, or ``None`` to record every context
            (global scope).
        lt_var: A context variable holding ``(LogicalThread, os_thread_ident)``
            for the task that owns the context, or ``None``.
        thread_lt: Returns the calling OS thread's own logical thread, or
            ``None`` while the thread is still starting up (its events are
            then skipped, and it is asked again).
        ignore_prefix: Code whose file name starts with this is not recorded
            (aprof's own frames), nor are the C calls it makes.
        max_events: Keep at most this many raw events (0: no limit); later
            events are counted in :attr:`dropped`.
        c_calls: Record C calls too. Without them, on 3.11 and 3.12 the C
            tracer records frames through a PEP 523 frame evaluator instead
            of the profile function (3.11) or the sys.monitoring callbacks
            (3.12) (the twin keeps those and drops the C events: on 3.11 its
            profile function ignores them, on 3.12+ the driver registers no
            CALL, C_RETURN or C_RAISE callbacks); on 3.13 the C tracer does
            as the twin.
        instance_ids: Describe a method call's receiver by instance
            (class, serial) instead of by class (RECV events). The twin
            reads receivers on 3.13+ only (earlier, reading a frame's
            locals from Python leaves a snapshot of them on the frame).
        evaluator: False keeps the C tracer off the frame evaluator without
            C calls (an internal switch for tests and the bench: it records
            as the twin does); the twin has no evaluator and ignores it.
        keep_latest: A ring (needs ``max_events``): the buffer is eight
            segments of an eighth of ``max_events`` (at least four
            events each; the ring holds at most ``max_events`` from 40 on); when the one being written is full and all are in use,
            the oldest is let go, its events (other than TIME and the
            header below) counted in :attr:`dropped`. Each segment starts
            with a header so that it reads without those before it: a TIME,
            the writing thread's SWITCH (the other threads write theirs
            again before their next event), and the RECV or EXC that ended
            the segment before (it belongs to the next event). When a
            segment was let go, :meth:`take`'s data starts with a prologue
            of ``(RECV, CALL)`` pairs before any SWITCH, one per code with a
            default receiver, in code order: replay takes the defaults from
            them and records no call.
    """

    def __init__(
        self,
        rf_state: ContextVar[Any],
        recorder: object | None,
        lt_var: ContextVar[Any],
        thread_lt: Callable[[], object],
        ignore_prefix: str,
        max_events: int = 0,
        c_calls: bool = True,
        instance_ids: bool = False,
        evaluator: bool = True,
        keep_latest: bool = False,
    ) -> None: ...
    @property
    def dropped(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def active(self) -> bool: ...
    def peek(self) -> tuple[bytes, list[Any], int]:
        """A copy of what :meth:`take` would give, recording on (a flight
        recorder's dump; RuntimeError if not running). Calls still open have
        no return in it, as at a stop."""
    @property
    def degraded(self) -> bool:
        """3.11 and 3.12 without C calls: a recursion ran the C stack low
        under the frame evaluator, and the profile function (3.11) or the
        sys.monitoring callbacks of the tool id the driver holds (3.12)
        recorded the rest."""
    @property
    def evaluator(self) -> bool:
        """Whether this tracer records Python frames through its PEP 523
        frame evaluator (the C tracer on 3.11 and 3.12 without C calls; the
        driver then registers no sys.monitoring callbacks)."""
    def start(self, initial: Sequence[CodeType]) -> None:
        """Start recording. ``initial``: code of the frames already on the
        stack, outermost first; they open at the start time.

        On 3.11 this installs the profile function on every thread and on
        threads started later, or without C calls the frame evaluator.
        Raises RuntimeError if another tracer runs, or (3.11) another
        ``sys.setprofile`` hook is installed here (with C calls) or another
        tool's frame evaluator (without).
        """
    def stop(self) -> None:
        """Stop recording and uninstall (idempotent)."""
    def take(self) -> tuple[bytes, list[Any], int]:
        """Hand over ``(packed events, objects, start_ns)`` once, after stop."""
    # sys.monitoring callbacks (3.12+), registered by aprof._core._tracer. In
    # C each is an attribute giving a new ``Hook`` (a vectorcall object bound
    # to this tracer); called with anything but what sys.monitoring passes it
    # raises TypeError. ``py_start``, ``py_resume``, ``py_return``,
    # ``py_yield`` and ``call`` return ``sys.monitoring.DISABLE`` for aprof's
    # own code (and ``call`` for a Python callee), else None; the others
    # always return None (their events cannot be switched off).
    def py_start(self, code: CodeType, offset: int, /) -> Any: ...
    def py_resume(self, code: CodeType, offset: int, /) -> Any: ...
    def py_throw(self, code: CodeType, offset: int, exc: BaseException, /) -> Any: ...
    def py_return(self, code: CodeType, offset: int, retval: object, /) -> Any: ...
    def py_yield(self, code: CodeType, offset: int, retval: object, /) -> Any: ...
    def py_unwind(self, code: CodeType, offset: int, exc: BaseException, /) -> Any: ...
    def call(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any: ...
    def c_return(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any: ...
    def c_raise(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any: ...

# -- the range fast path (aprof/_cranges.c) ----------------------------------

class Stepping:
    """Per-OS-thread slot (C thread-local storage): the logical thread whose
    step runs on this OS thread, set by aprof's task hooks, or ``None``."""

    lt: Any

#: The one ``Stepping`` object (``aprof._core._threads.stepping``).
stepping: Stepping

class RangeBlock:
    """A run of plain ranges of one scope, packed as 48-byte C structs: the
    raw records of ``record_function``'s C fast path and of the tracer's
    replay (``aprof/_cblocks.c``). It sits in a logical thread's raw list;
    ``consolidate_raw`` reads it, ``_events.unpack_blocks`` spells it out as
    start and end tuples for the tuple-pairing paths."""

    def __init__(self, scope: str, /) -> None: ...
    @property
    def scope(self) -> str: ...
    def open(self, name: str, args: str | None, start: int, /) -> int:
        """A range starts; its slot's index."""
    def close(self, index: int, end: int, end_thread_id: int, exc: str | None, /) -> None:
        """The range at ``index`` ends (a second end is ignored)."""
    def rows(self) -> list[tuple[str, str, int, str | None, int | None, int, str | None]]:
        """``(name, scope, start, args, end or None, end_thread_id, exc)`` per range."""
    def own(self, owner: int, name: str, kind: str, os_thread_id: int, /) -> None:
        """Make it a block of ``TASK_BLOCKS``: the ranges of task ``owner``
        (its logical thread's id), named, kind and OS thread as given."""
    @property
    def owner(self) -> int:
        """The id of the task whose ranges these are (a block of
        ``TASK_BLOCKS``), else 0."""
    @property
    def owner_name(self) -> str | None: ...
    @property
    def owner_kind(self) -> str | None: ...
    @property
    def owner_os_tid(self) -> int | None: ...
    def __len__(self) -> int: ...

class Budget:
    """A profile's memory budget (issue 19, ``aprof/_cblocks.c``): every
    recording path takes room in it; ``on_full`` runs when ``count``
    reaches ``limit``."""

    count: int
    limit: int
    full: bool
    def __init__(self, on_full: Callable[[], object], limit: int) -> None: ...
    def take(self, kind: int, n: int = 1, /) -> bool:
        """Room for ``n`` records of ``kind`` (0 range, 1 instant, 2 task, 3 step)?"""
    @property
    def dropped(self) -> tuple[int, int, int, int]:
        """Dropped while full: (ranges, instants, tasks, steps)."""

def raw_seal(lst: list[Any], /) -> int:
    """The bytes a raw list's records hold, its blocks trimmed to size first."""

def raw_counts(lst: list[Any], /) -> tuple[int, int]:
    """(ranges, instants) a raw list records."""

def ring_seal(lists: list[list[Any]], /) -> int:
    """The bytes raw lists of a ring's sealed generation hold (blocks trimmed, lists untracked)."""

def ring_records(records: list[Any], /) -> tuple[int, int, list[int]]:
    """(bytes, steps of finished tasks, indices of running ones) of a sealed generation's task records."""

def ring_counts(lists: dict[Any, list[Any]], records: list[Any], /) -> tuple[int, int, int, int, list[Any]]:
    """(ranges, instants, tasks, steps, running records) a ring's generation holds."""

def raw_snapshot(lists: list[list[Any]], /) -> list[list[Any]]:
    """Copies of raw lists as they are, blocks copied, in one call."""

class RangeCore:
    """``record_function``'s fields, ``__init__``, ``__enter__`` and
    ``__exit__`` in C; the contract is ``_PyRangeCore`` in
    ``aprof/_core/_record_function.py``. Subclasses provide ``_spill``,
    ``_take_shared``, ``_slow_start`` and ``_end_general``, which every case
    but "nothing listening" and "only the context's profile" calls."""

    name: str
    args: str | None
    _rec: Any
    _lt: Any
    _more: Any
    _idx: int
    def __init__(self, name: str, args: str | None = None) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, et: Any, ev: Any, tb: Any, /) -> None: ...

def _range_setup(
    rf_state: ContextVar[Any],
    callbacks_dict: dict[str, Any],
    current_logical_thread: Callable[[], Any],
    threads_dict: dict[str, Any],
    hint_var: ContextVar[Any] | None,
    classes: tuple[type, type, type, type],
    /,
) -> None:
    """Give the range fast path ``RF_STATE``, ``_callbacks.__dict__``,
    ``current_logical_thread``, ``_threads.__dict__``, (3.11) the
    logical-thread hint variable, and the classes ``(RFState, Recorder,
    ProfilerState, LogicalThread)`` whose ``__slots__`` it reads directly
    (called once, at import)."""

def _range_vectorcall(cls: type[RangeCore], /) -> None:
    """Let calls of ``cls`` (``record_function``) skip ``type.__call__``:
    a positional name and args build the object directly."""

def _set_global_callbacks(on: bool, fast_recorder: Any, /) -> None:
    """Tell the range fast path whether a global callback is registered
    (``_callbacks._publish_globals`` calls it whenever that changes)."""

def _range_slots() -> list[str]:
    """The attributes the range fast path reads as slots, not through getattr."""

def _executor_range(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], fwd: int, seq: int, submit_ns: int, /) -> Any:
    """``fn(*args, **kwargs)`` as an ``EXECUTOR`` range: the C twin of
    ``_propagation._run_executor_range_py`` (the same records; every case
    but "only this context's profile listens" calls that function)."""

def _executor_setup(general: Callable[..., Any], name_of: Callable[[Any], str], /) -> None:
    """Give ``_executor_range`` the Python function for the other cases and
    ``_name_of`` (called once, at import)."""

class PoolCallCore:
    """A process pool's job under a profile (``_processes._PyPoolCallCore``
    in C): built from its five fields, pickled as ``(type(self), (fn, dir,
    seq, fwd, submit_ns))``, called in the worker as an ``EXECUTOR`` range
    in the worker profile's context."""

    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def dir(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def fwd(self) -> int: ...
    @property
    def submit_ns(self) -> int: ...
    def __init__(self, fn: Callable[..., Any], dir: str, seq: int, fwd: int, submit_ns: int) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def _logical_thread() -> Any:
    """The current logical thread (``stepping.lt or current_logical_thread()``),
    through the ranges' per-thread cache."""

def _pool_setup(workers: dict[str, Any], pool_join: Callable[[str], Any], /) -> None:
    """Give ``PoolCallCore`` the worker profiles (``_processes._workers``)
    and the function that joins a parent profile (called once, at import)."""

def _forget_logical_threads() -> None:
    """Drop every OS thread's cached logical thread (the fork handler calls it)."""

def stack_here(skip: int, prefix: str, /) -> tuple[tuple[CodeType, ...], bytes]:
    """``with_stack``'s raw stack of the caller: its frames' code objects,
    innermost first, and their last instruction offsets as native uint32s
    (0xFFFFFFFF: not started); ``skip`` frames and then aprof's own leading
    frames (files under ``prefix``) left out. ``_recorder._stack_here_py``
    is the twin; ``_events.name_stacks`` names it at stop."""

def _set_stack_prefix(prefix: str, /) -> None:
    """The prefix of aprof's own files, for the range fast path's stacks."""

# The asyncio task hooks (aprof/_ctasks.c); the contract is the pure-Python
# twins in aprof/_integrations/_asyncio.py (_PyCallSoonHook, _PyStepCall).

class StepLog:
    """A task's step times (start, end, ...) as unsigned 64-bit ints. Supports
    ``append``, ``len``, indexing and iteration, and exports its times as a
    read-only buffer (format ``'Q'``; plain bytes to a consumer that asks
    for no format). It cannot change while a buffer is exported. A finished
    task's record holds it as it is, fitted (``fit``)."""

    def append(self, t: int, /) -> None: ...
    def fit(self) -> StepLog: ...
    def __sizeof__(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> int: ...

class TaskRecord:
    """A finished task's record: the fields of ``TASK_RECORD_FIELDS``
    (``aprof/_integrations/_tasks.py``), read by index or unpacking, equal
    to the tuple of them. In a tuple's layout but no GC container: it holds
    plain data, and a record per request does not count towards the
    collector's next collection."""

    def __init__(self, *fields: Any) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...

class StepCall:
    """A recorded task's step or wakeup, timed: calling it stamps the step
    in the task's ``StepLog`` and publishes the task as stepping on this
    thread (with its context). Its attributes and repr are the callback's."""

    def __call__(self, *args: Any) -> Any: ...

class CallSoonHook:
    """Set as ``loop.call_soon``: hands the steps and wakeups of recorded
    tasks on wrapped in a ``StepCall``, everything else unchanged. Its
    attributes and repr are the loop's own ``call_soon``'s."""

    _aprof_call_soon: Callable[..., Any]
    def __init__(self, call_soon: Callable[..., Any], /) -> None: ...
    def __call__(self, callback: Any, *args: Any, context: Any = None) -> Any: ...

class AddHook:
    """Set as ``add`` on asyncio's set of tasks: adds, then calls
    ``task_created(task)`` for a task aprof has not decided about."""

    def __init__(self, add: Callable[[Any], None], task_created: Callable[[Any], None], /) -> None: ...
    def __call__(self, item: Any, /) -> None: ...

def _tasks_setup(
    task_thread: type, attr: str, task: type, py_task: type | None, py_step: Any, py_wakeup: Any,
    first_scheduled: Callable[[Any, Any], Any], first_step: Callable[[Any], None],
    task_done: Callable[[Any, Any], None], eager_started: Callable[[Any, Any], Any], tracer_running: list[Any],
    note_wait: Callable[[Any, Any, int, int], None], long_wait_ns: int, /,
) -> None:
    """Give the task hooks ``TaskThread`` (whose ``steps`` and ``_state``
    slots they read), the task attribute name, the C and Python
    Task classes, the Python Task's step and wakeup functions, the Python
    callbacks, the tracer's list of running tracers, and ``note_wait``,
    called before a step that starts ``long_wait_ns`` or more after the
    task's last one ended (called once, at import)."""

def _task_finish_setup(*args: Any) -> None:
    """``(NO_RECORDS, DISCARD_STEPS)``: record the end
    of a C Task that one profile records in C (``_asyncio._task_done`` and
    ``TaskThread.finished`` are its twins, and do every other case);
    ``(None)``: leave every end to them. After ``_tasks_setup``."""

def _task_create_setup(*args: Any) -> None:
    """``(states_in, ids, seqs, ProfilerState, user_site, site_cache,
    is_library, coro_qualname, budget_task)``: record a new C Task spawned
    inside a recorded task's step, for one profile, in C
    (``_asyncio._record`` and ``TaskThread.__init__`` are its twins, and do
    every other case); ``(None)``: leave every creation to them. After
    ``_task_finish_setup``."""

def _watch_eager(table: dict[Any, Any] | None, /) -> bool:
    """Watch asyncio's current-task table for eager first steps (3.12+;
    ``None``: stop). Returns whether it is watched."""

def user_site(cache: dict[str, bool], is_library: Callable[[str], bool], /) -> tuple[str, int, str] | None:
    """``aprof._frames.user_site()`` from the calling frame out, in C
    (aprof/_csampler.c: it reads the interpreter's frames, making no frame
    objects): ``cache`` holds each file name's verdict, ``is_library``
    decides (and caches) a name not in it."""

def await_key(coro: Any, /) -> tuple[tuple[int, ...], Any] | None:
    """The key of a suspended coroutine's await chain (each coroutine's or
    generator's code address and instruction offset, outermost first) and
    the awaitable at its bottom; None for a chain it leaves to the Python
    walk (the twin is ``_await_chain._await_key_py``)."""

def _states_setup(*args: Any) -> None:
    """``(RF_STATE, EMPTY_RF_STATE, RFState, Recorder,
    global_task_recorders)``: find the one profile that records a new C
    Task in C (``_tasks.states_in``'s common cases; several profiles are
    the twin's); ``(None)``: in Python. After ``_task_create_setup``."""

def _states_in(context: Any, /) -> Any:
    """The C path of ``_tasks.states_in`` alone: the profile's state, None,
    or NotImplemented when it is the twin's."""

def _waits_setup(*args: Any) -> None:
    """``(WaitLog, sites, wait_at, Future)``: describe a C Task's long wait
    at a call site already described (``_await_chain._sites``) in C, into
    the C ``WaitLog`` (keeping the twin ``WaitLog``'s ``max_runs``): the
    common paths of ``_tasks.note_wait`` and ``_await_chain.wait_at``,
    whose twins do the rest; ``(None)``: all in Python. After
    ``_tasks_setup``."""

def _note_wait(tt: Any, task: Any, start_ns: int, end_ns: int, /) -> bool:
    """The C path of a long wait alone: True if it logged the wait, False
    if it left it to the twin (``_tasks.note_wait``), changing nothing."""

class WaitLog:
    """A task's long waits, as runs (``_await_chain.WaitLog``, its twin, has
    the contract): the runs as C structs, no GC container. ``runs`` and
    iteration give them as the twin's lists."""

    def __init__(self) -> None: ...
    def add(self, start_ns: int, end_ns: int, wait: tuple[str, str, str, str], /) -> None: ...
    @property
    def runs(self) -> list[list[Any]]: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[list[Any]]: ...
    def __sizeof__(self) -> int: ...

def _task_layout() -> tuple[int, int, int, bool]:
    """What the C paths learnt of where a C Task keeps its waiter,
    coroutine, name and context: (the coroutine's offset, or 0 before the
    first task; name checks left; waiter checks left; whether a check
    disagreed, which leaves them to the methods for good)."""

def group_owned(chunks: list[Any] | tuple[list[Any], ...], /) -> dict[int, list[RangeBlock]]:
    """The blocks of ``TASK_BLOCKS`` (a list, or a tuple of generations'
    lists, oldest first) by the task they name, each task's in order."""

def _task_blocks_setup(key: Any, /) -> None:
    """Put tasks' plain ranges in the raw list under ``key``
    (``TASK_BLOCKS``), in blocks naming their task; ``None``: in each
    task's own list."""

# Consolidation and Chrome export (aprof/_cevents.c); the contract is the
# pure-Python twins in aprof/_post/_events.py and aprof/_export/_chrome.py.

class EventView:
    """``FunctionEvent``'s fields in C (the twin is ``_PyEventView``): its
    table and row, set by the ``ViewCache`` that made it."""

    _tab: Any
    _i: int

class ViewCache:
    """The views of one ``EventTable`` (the twin is ``_table._PyViews``):
    one per row while anything holds it."""

    def __init__(self, cls: type[EventView], /) -> None: ...
    def get(self, tab: Any, i: int, /) -> Any:
        """The view of row ``i`` of ``tab``."""

def _events_setup(
    function_event: type[EventView], scope_list: tuple[Any, ...], scopes: dict[str, Any],
    start_key: Callable[[Any], int], layout: tuple[int, ...], /,
) -> None:
    """Give consolidation ``FunctionEvent``, the scope column's scopes, the
    scopes by value, the sort key and the record layout, which must match
    C's (ValueError otherwise; called once, at import)."""

def records_of(raw: list[tuple[Any, ...]], tid: int, /) -> list[list[Any]]:
    """``_events._records_of``: pair one logical thread's start and end tuples."""

def sort_by_start(records: list[list[Any]], /) -> None:
    """``_events._sort_by_start``: sort by start time unless already in order."""

def nest(records: list[list[Any]], track: int, stop_ns: int, tab: Any, linked: list[int], /) -> None:
    """``_events._nest``: add one track's events, nested, to the table
    ``tab`` (and the indexes of the top-level ones with a forward thread to
    ``linked``)."""

class ColumnStage:
    """Rows consolidated into C buffers (``consolidate_raw``'s ``stage``),
    added to an EventTable's columns at once by ``flush(tab)``."""

    def flush(self, tab: Any, /) -> None: ...
    def __len__(self) -> int: ...

def consolidate_raw(
    raw: list[Any] | tuple[list[Any], ...], tid: int, lead: list[list[Any]], track: int, stop_ns: int, tab: Any,
    linked: list[int], stage: ColumnStage | None = None, /,
) -> None:
    """``nest(sort_by_start(lead + records_of(raw, tid)))`` into the table in
    one pass over C arrays, with no record per range (not for raw stacks that
    need naming)."""

def raw_first_start(raw: list[Any] | tuple[list[Any], ...], /) -> int | None:
    """The earliest start among ``raw``'s start tuples and blocks, or None."""

def children_index(parent: Any, track: Any, kind: Any, /) -> tuple[bytes, bytes]:
    """``_table._py_children_index``: (offsets, children) as int32 bytes."""

def chrome_plain(
    tab: Any, i: int, base: int, wheres: list[str], json_names: dict[int, str], cats: tuple[str, ...],
    dumps: Callable[[Any], str], limit: int, rare: Any, steps: list[list[int] | None], /,
) -> tuple[str, int]:
    """The Chrome ``X`` lines, joined by ``",\\n"``, of the run of plain ranges
    starting at row ``i`` of ``tab`` (at most ``limit``), and the index after
    it; on a task's track (``steps[track]``) with their running and waiting
    time."""

def chrome_rows(
    tab: Any, i: int, base: int, wheres: list[str], json_names: dict[int, str], cats: tuple[str, ...],
    dumps: Callable[[Any], str], limit: int, rare: Any, steps: list[list[int] | None],
    rare_map: dict[int, list[Any]], pid_of: list[Any], tid_of: list[int], track_pids: dict[int, Any],
    track_names: dict[int, str], run_base: int, task_scope: int, flow_id: int, /,
) -> tuple[str, int, int]:
    """``chrome_plain``, and tasks' rows too, as the exporter's Python loop
    writes them (the ``X`` line with args, the spawn slice and flow arrow,
    the steps on the running row ``run_base`` + id); also the last flow
    arrow's id (``flow_id`` in: the one before)."""

def encode_column(col: Any, c: int, starts: Any, /) -> bytes:
    """``_binary._encode``: column ``c`` as the file stores it."""

def decode_column(data: bytes, c: int, out: Any, starts: Any, /) -> None:
    """``_binary._decode``, into the array ``out`` (of the event count's length)."""

def check_table(tab: Any, profile_start: int, max_thread_id: int, /) -> None:
    """``_validate._check_table``: the column checks of a table read from a file."""

def lod_keep(tab: Any, always: bytes, budget: int, /) -> tuple[bytes, bytes, int]:
    """``_lod.keep_rows``: (a byte per event, the kept indexes as int32
    bytes, the shortest duration kept by length)."""

def lod_merge(tab: Any, keep: bytes, base: int, resolution: int, remap: Any, /) -> tuple[bytes, bytes, bytes]:
    """``_lod.merge_rows``: (blocks, events per track, kept per track) as
    int64 bytes."""

def lod_flame(tab: Any, label: Any, /) -> tuple[bytes, bytes, bytes]:
    """``_lod.range_flame``: (parent int32, label int32, total int64) bytes
    per node."""

def stitch_segments(
    tab: Any, rows: Any, a: int, b: int, labels: dict[int, str], relabelled: bytes, max_frames: int,
    per_path: dict[Any, int] | None = ..., /,
) -> Any:
    """``_stitch._range_segments`` over the rows ``rows`` (a list, or an
    int32 buffer) of ``tab``; the rows whose scope is nonzero in
    ``relabelled`` are named by ``labels``. One tuple per call path. With
    ``per_path``, the segments' time is added into it as ``path_totals``
    adds it, and the result is their summed duration, not the segments."""

def stitch_setup(
    tab: Any, linked: bytes, known: Any, /
) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], list[tuple[int, bytes]], list[tuple[int, bytes]]]:
    """``_stitch.setup_rows``: (nested, tops, roots) as (track index, int32
    rows) pairs and links as (spawner id, int32 rows) pairs, each in order
    of the key's first use; ``known`` the session's track ids (int64,
    ascending)."""

def path_totals(per_path: dict[Any, int], segs: list[Any], /) -> int:
    """``per_path[frames] += s1 - s0`` for each segment, in the Python
    loop's order; the segments' summed duration."""

def take_columns(tab: Any, keep: Any, /) -> tuple[bytes, ...]:
    """``EventTable.take``'s ten columns (COLUMNS order) of the rows ``keep``
    (int32, strictly ascending, else ValueError), parents renumbered."""

def many_children(off: Any, k: int, /) -> bytes:
    """The rows (int32) with at least ``k`` children, from
    ``children_index``'s offsets."""

def compact_detail_rows(tab: Any, own: Any, /) -> bytes:
    """``_compact._detail_rows``' pass over the columns: the rows (int32,
    ascending) with a sequence number, a spawner, or an end on another
    logical thread than ``own[track]``."""

def compact_events(tab: Any, base: int, remap: Any, flags: bytes, detail_rows: Any, /) -> str:
    """``json.dumps(_compact._flat_events(tab, remap, base, detail_rows),
    separators=(",", ":"))``, printed from the columns."""

def first_starts(tab: Any, n_tracks: int, /) -> bytes:
    """``_session._first_start``'s pass: per track index (int64), the
    earliest start among the first events of its runs of rows, or
    ``2**63 - 1``."""

def trim_heap() -> bool:
    """Give the C heap's free memory back to the system (glibc's
    ``malloc_trim``); False where there is no such call."""

def name_totals(
    tab: Any, apart: bytes, plain_tracks: bytes, extra: Any, /
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
    """``_analysis._by_name``'s pass over the plain ranges: per name id in
    order of first use, (first event, count, total, self, min, max), and
    the indexes of the other ranges."""

# The sampler (aprof/_csampler.c); the twin is aprof/_core/_sampler_py.py,
# the driver aprof/_core/_sampler.py.

class Sampler:
    """Task-aware stack samples of the profiled threads, every ``interval``
    seconds (SPEC 8.4), taken by one engine thread shared by every running
    sampler (see the comments in ``aprof/_csampler.c``).

    Args:
        rf_state: The ``RF_STATE`` context variable: a thread is sampled when
            its current context has recording on and, unless ``recorder`` is
            None (global scope), ``recorder`` as its recorder.
        recorder: The profile's recorder, or None for every context.
        lt_var: The context variable a task publishes ``(LogicalThread,
            os_thread_ident)`` in; otherwise a sample is the OS thread's own.
        ignore_prefix: Frames of code whose file starts with this (aprof's)
            are left out of stacks.
        interval: Seconds between samples, 1e-5 to 60 (ValueError otherwise).
        waits: ``(file suffix, qualname)`` of frames where a loop or a pool
            waits: a thread outside any task with one on top is idle.
        max_samples: Keep at most this many samples (0: no limit); later
            ones are counted in :attr:`dropped`.
        keep_latest: Past ``max_samples`` each sample takes the oldest's
            slot (a ring; the one it replaces is counted in :attr:`dropped`);
            :meth:`take` and :meth:`peek` give them oldest first.

    Raw format (:meth:`take`): each sample is three unsigned 64-bit words:
    the time (``perf_counter_ns``); the stack node (bits 0-31) and the time
    since the sampler's previous tick (bits 32-63); the logical thread
    (bits 0-31: an object index, or ``1 << 31 | slot`` for the OS thread
    in that slot's own), the slot (bits 32-47) and flags (bits 48-63: 1
    idle). Nodes are pairs of unsigned 32-bit words (parent node, object
    index of the code, or of None for frames left out past 1,024); node 0
    is the empty stack.
    """

    def __init__(
        self,
        rf_state: ContextVar[Any],
        recorder: object | None,
        lt_var: ContextVar[Any],
        ignore_prefix: str,
        interval: float,
        waits: tuple[tuple[str, str], ...],
        max_samples: int = 0,
        keep_latest: bool = False,
    ) -> None: ...
    @property
    def count(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def idle(self) -> int: ...
    @property
    def active(self) -> bool: ...
    @property
    def start_ns(self) -> int: ...
    def start(self) -> None:
        """Start sampling (RuntimeError if started before)."""
    def stop(self) -> None:
        """Stop sampling (idempotent); the last sampler stops the engine thread."""
    def take(self) -> tuple[bytes, bytes, list[Any], list[int]]:
        """Hand over ``(samples, nodes, objects, thread idents by slot)`` once, after stop."""
    def peek(self) -> tuple[bytes, bytes, list[Any], list[int]]:
        """A copy of what :meth:`take` would give, the sampler running on
        (a flight recorder's dump)."""

def _sampler_after_fork() -> None:
    """In a forked child: reset the engine; the child's samplers sample nothing."""

def _sampler_stats() -> tuple[int, int, int, int, int]:
    """``(ticks, ticks sampled by the main thread, by the engine thread, ns
    spent sampling, ns the engine waited for the GIL)`` since the process
    started (the bench reads it)."""

def _noop_profile(on: bool, /) -> None:
    """3.11, for the bench's floor: install (or remove) a C profile function
    that does nothing on this thread. On 3.12+ it raises RuntimeError."""

def _noop_evaluator(on: bool, /) -> None:
    """3.11 and 3.12, for the bench's floor: install (or remove) a PEP 523
    frame evaluator that runs every frame with the default one and records
    nothing (RuntimeError if another evaluator is installed; on 3.13+
    always)."""

# -- profile_memory's allocator hooks (aprof/_cmemory.c, issue 21) -------------

#: Bytes of one sampled-allocation record: (time, size, weight, lt, freed), uint64 each.
MEMORY_RECORD_BYTES: int

def _memory_start(
    rf_var: ContextVar[Any], recorder: Any, lt_var: ContextVar[Any], interval: int, max_records: int, seed: int, /
) -> None:
    """Hook the MEM and OBJ allocator domains (wrapping what is installed) and
    record sampled allocations: one every ``interval`` bytes on average (0:
    every allocation), at most ``max_records`` (0: no limit); ``seed`` 0
    seeds from the clock. Raises RuntimeError if a memory profile runs, or
    if aprof's earlier hooks sit under another hook."""

def _memory_stop() -> tuple[bytes, list[int], dict[int, Any], int, int, int]:
    """Stop recording; put the allocators back if aprof's hooks are on top.
    Returns (records, OS thread idents, {id: LogicalThread}, other bytes,
    other count, dropped)."""

def _memory_peek() -> tuple[bytes, list[int], dict[int, Any], int, int, int]:
    """What :func:`_memory_stop` returns, recording on (a flight recorder's
    dump): copies, made with the hooks' own allocations passing unrecorded.
    Raises RuntimeError if no memory profile runs."""

def track_rows(
    lists: Any, task_tracks: dict[int, Any], task_recs: dict[int, list[Any]], make_track: Any, firsts: list[int],
    row_tracks: list[Any], raws: list[Any], leads: list[Any], /,
) -> None:
    """_events.consolidate's first loop over the raw lists (one-pass
    path): each logical thread's track and first start, appended."""

def consolidate_tracks(
    order: list[int], row_tracks: list[Any], raws: list[Any], leads: list[Any], node_id: int, stop_ns: int, tab: Any,
    linked: list[int], stage: ColumnStage, tracks: dict[int, Any], spans: dict[int, tuple[int, int]], /,
) -> None:
    """_events.consolidate's loop over the tracks on the one-pass path, in
    one call: each track in ``order`` consolidated into ``stage``."""

def task_coroutines(tab: Any, task_scope: int, /) -> dict[int, str] | None:
    """Each task track's coroutine, by track id (_chrome._task_coroutines);
    None when a TASK row's extra is not a dict (left to Python)."""

def chrome_tracks(tracks: list[Any], pids: dict[int, Any], coros: dict[int, str], run_base: int, dumps: Any, /) -> str | None:
    """The Chrome trace's metadata lines of every track, joined by ",\\n";
    None (nothing written) when a track's fields are not plain."""

def task_events(
    records: list[Any], i: int, stop_ns: int, tracks: dict[int, Any], recs: dict[int, list[Any]], track_type: type,
    task_scope: Any, kind_range: int, /,
) -> int:
    """_events._task_events for the finished tasks' records (14-field
    tuples) from ``records[i]`` on, into ``tracks`` and ``recs``; the index
    of the first record not done (a running task's, for the Python loop)."""

def untrack_acyclic(*objs: object) -> None:
    """Take each object off the cyclic GC's lists when nothing it refers to
    is on them (leaves first); for finished plain data only."""

def untrack_exempt(objs: Any) -> None:
    """The module-level constants (RecordScope members) untrack_acyclic may
    find in plain data."""

def charge_allocations(
    track: Any, kind: Any, start: Any, end: Any, track_ids: Any, skip: int, alloc_tid: Any, alloc_time: Any
) -> bytes:
    """For each allocation (``alloc_tid``, ``alloc_time``: int64 columns),
    the row (int32) of the innermost range open on its track at its time,
    -1 if none: what ``aprof._post._memory._charge`` computes. ``track_ids``
    holds each track index's id; rows whose kind has a ``skip`` bit are not
    ranges."""

def _memory_hooked() -> tuple[int, int]:
    """(installed, on top of both domains): the state of aprof's hooks."""
