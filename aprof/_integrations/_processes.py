"""Profiling work handed to other processes (SPEC 11.4, 15.4; issue 20).

A context cannot cross into another process, but a profile's *options* can,
like a distributed-tracing header. At submit time (in the submitter's
context) :func:`process_call` looks for the running profile; if there is
one, the callable is wrapped in a picklable :class:`ProcessCall` that
carries the profile's options (tracer, stacks, inputs, tasks, event
budget), the link to the submit point (the submitting logical thread, the
submit's sequence number and its time) and the parent's node id.

In the child, the call runs inside a profile of its own (node id = the
child's pid), as an ``EXECUTOR`` range with everything it does inside. Its
session goes back one of two ways:

* **In band** (executors: ``propagating(ProcessPoolExecutor)``, the
  installed ``ProcessPoolExecutor.submit``): the session's columns,
  pickled, ride with the result (:class:`InBand`) or on the exception, and
  the future the submitter holds (:class:`_InBandFuture`) takes them off
  before it completes. No file: one per job cost about a millisecond.
* **Through a private directory** (``multiprocessing`` ``Process`` and
  ``Pool``, which give no future to unwrap): the profile's
  ``tempfile.mkdtemp`` directory (mode 0700, in the system's temp dir,
  never the working directory). The child creates
  ``<job>-<pid>-<n>.part`` when it starts, writes its session into it and
  renames it ``.aprof`` before the result goes back; a ``.part`` alone
  means the process died mid-job, and names its pid.

At the parent's ``stop()``, :func:`collect` merges what came back into the
parent's session (:mod:`aprof._post._merge`: each child process on its own
tracks under its node id, the submit linked to the child's range) and
removes the directory. A job that did not come back is named in
``session.lost``, with what its future, AsyncResult or Process says (still
running at stop, the pool broke, killed by a signal). Only that job's work
is lost; the parent's events are untouched.

Anything that goes wrong on the child's side (aprof cannot start there,
the directory is gone because the parent stopped) runs the job unprofiled;
a real failure says so once per process with a warning. The job itself
never fails because of aprof.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pickle
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

from .._core._callbacks import RF_STATE, AprofWarning
from .._core._recorder import ProfilerState

__all__ = ["ProcessCall", "collect", "discard", "process_call"]

#: Options of the parent's profile that the child's profile takes (those
#: this aprof's profile has: the memory budget's max_bytes and keep too).
_FORWARDED: Final = (
    "record_inputs", "with_stack", "python_tracer", "c_calls", "tasks", "max_events", "max_bytes", "keep",
    "loop_block_threshold",
)  # fmt: skip


class _Job:
    """What a child needs to profile one submitted call (picklable)."""

    __slots__ = ("dir", "fwd", "id", "node_id", "options", "seq", "submit_ns")

    def __init__(self, id: int, dir: str, options: dict[str, Any], node_id: int, fwd: int, seq: int, submit_ns: int) -> None:
        self.id = id
        self.dir = dir
        self.options = options
        self.node_id = node_id
        self.fwd = fwd
        self.seq = seq
        self.submit_ns = submit_ns

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.id, self.dir, self.options, self.node_id, self.fwd, self.seq, self.submit_ns)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.id, self.dir, self.options, self.node_id, self.fwd, self.seq, self.submit_ns = state


class ProcessCall:
    """``fn`` submitted to another process under a profile: in that process,
    runs it inside a profile of its own and leaves the session for the
    parent. Pickles as ``fn`` and the job (``fn`` must pickle as it would
    without aprof, and fails the same way if it does not)."""

    __slots__ = ("__wrapped__", "_job")

    def __init__(self, fn: Callable[..., Any], job: _Job) -> None:
        self.__wrapped__ = fn
        self._job = job

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcessCall, (self.__wrapped__, self._job))

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.__wrapped__
        job = self._job
        if not job.dir:
            return _call_in_band(fn, job, args, kwargs)
        try:
            started = _start_in_child(job)
        except Exception as exc:  # noqa: BLE001 - the job runs anyway (issue 20, "Bad input")
            _warn_once(f"aprof: could not profile work in process {os.getpid()} ({type(exc).__name__}: {exc}); it runs unprofiled")
            started = None
        if started is None:
            return fn(*args, **kwargs)
        prof, part = started
        from .._core._propagation import _run_executor_range

        try:
            # fwd 0: the submitter is in another process; the merge points
            # this range at it through the session's parent_link.
            return _run_executor_range(fn, args, kwargs, 0, job.seq, job.submit_ns)
        finally:
            _finish_in_child(prof, part, job)


class InBand:
    """A job's result with its session, on the way back to the submitter
    (the executor path: :class:`_InBandFuture` takes it apart)."""

    __slots__ = ("payload", "result")

    def __init__(self, result: Any, payload: bytes) -> None:
        self.result = result
        self.payload = payload

    def __reduce__(self) -> tuple[Any, ...]:
        return (InBand, (self.result, self.payload))


#: The attribute a job's exception carries its session back in (removed by
#: the submitter's side before anyone sees the exception).
_EXC_ATTR: Final = "_aprof_session"


def _call_in_band(fn: Callable[..., Any], job: _Job, args: Any, kwargs: Any) -> Any:
    """Run one job under a profile of its own and send the session back
    with the result (or on the exception): no file, no directory."""
    from .._core._profiler import profile
    from .._core._propagation import _run_executor_range

    try:
        prof = profile(node_id=os.getpid(), **job.options)
        prof.start()
    except Exception as exc:  # noqa: BLE001 - the job runs anyway (issue 20, "Bad input")
        _warn_once(f"aprof: could not profile work in process {os.getpid()} ({type(exc).__name__}: {exc}); it runs unprofiled")
        return fn(*args, **kwargs)
    try:
        result = _run_executor_range(fn, args, kwargs, 0, job.seq, job.submit_ns)
    except BaseException as exc:
        payload = _payload(prof, job)
        if payload is not None:
            with contextlib.suppress(Exception):  # an exception that takes no attributes goes back without it
                setattr(exc, _EXC_ATTR, payload)
        raise
    payload = _payload(prof, job)
    return result if payload is None else InBand(result, payload)


def _payload(prof: Any, job: _Job) -> bytes | None:
    try:
        prof.stop()
        session = prof.session
        session.metadata["parent_link"] = {"node_id": job.node_id, "fwd": job.fwd, "seq": job.seq}
        return dump_session(session)
    except Exception as exc:  # noqa: BLE001 - never fail the job for its profile
        _warn_once(f"aprof: could not send the profile of work in process {os.getpid()} back ({type(exc).__name__}: {exc})")
        return None


def dump_session(session: Any) -> bytes:
    """A session as bytes for another process of this aprof (pickled
    columns: far cheaper than the file format, which is for strangers)."""
    tab = session._table
    tracks = [(t.id, t.name, t.kind, t.os_thread_id, t.node_id, t.steps) for t in tab.tracks]
    cols = [c.tobytes() for c in tab.columns()]
    return pickle.dumps((1, session.metadata, tracks, cols, tab.names, tab.rare), protocol=pickle.HIGHEST_PROTOCOL)


def load_session(payload: bytes) -> Any:
    """:func:`dump_session`'s session back."""
    from array import array

    from .._post._events import EventTable, Track
    from .._post._session import Session
    from .._post._table import COLUMNS

    version, metadata, tracks, cols, names, rare = pickle.loads(payload)
    if version != 1:
        raise ValueError(f"a session payload of version {version!r}")
    tab = EventTable()
    for (attr, code), raw in zip(COLUMNS, cols, strict=True):
        col = array(code)
        col.frombytes(raw)
        setattr(tab, attr, col)
    for n in names:
        tab.intern(n)
    by_id = {}
    for tid, name, kind, os_tid, node, steps in tracks:
        t = Track(tid, name, kind, os_tid, node)
        t.steps = steps
        tab.add_track(t)
        by_id[tid] = t
    tab.rare = rare
    return Session(tab, by_id, metadata)


_warned: list[bool] = []
_calls = itertools.count(1)  # this process's calls: file names


def _warn_once(message: str) -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn(message, AprofWarning, stacklevel=3)


def _start_in_child(job: _Job) -> tuple[Any, str] | None:
    from .._core._profiler import profile

    prof = profile(node_id=os.getpid(), **job.options)
    # One job may run many calls (a multiprocessing.Pool map): each its own file.
    part = os.path.join(job.dir, f"{job.id}-{os.getpid()}-{next(_calls)}.part")
    try:
        # O_EXCL: a job runs once; the file says which process took it.
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileNotFoundError:
        return None  # the parent stopped and removed the directory: nobody will read it
    try:
        prof.start()
    except BaseException:
        os.unlink(part)
        raise
    return prof, part


def _finish_in_child(prof: Any, part: str, job: _Job) -> None:
    from .._post._binary import write_binary

    try:
        prof.stop()
        session = prof.session
        session.metadata["parent_link"] = {"node_id": job.node_id, "fwd": job.fwd, "seq": job.seq}
        with open(part, "wb") as f:
            f.writelines(write_binary(session))
        os.replace(part, part[: -len(".part")] + ".aprof")
    except FileNotFoundError:
        pass  # the parent stopped meanwhile: its session names this job as lost
    except Exception as exc:  # noqa: BLE001 - never fail the job for its profile
        with contextlib.suppress(OSError):
            os.unlink(part)  # not a crash: the parent says no profile came back
        _warn_once(f"aprof: could not save the profile of work in process {os.getpid()} ({type(exc).__name__}: {exc})")


# ---------------------------------------------------------------------------
# The parent's side
# ---------------------------------------------------------------------------


class _Run:
    """The jobs one profile handed to other processes."""

    __slots__ = ("_dir", "closed", "dead", "jobs", "late", "options", "payloads", "received")

    def __init__(self, options: dict[str, Any]) -> None:
        self._dir: str | None = None
        self.options = options
        #: Sessions sent back with results (the executor path), and whose.
        self.payloads: list[bytes] = []
        self.received: set[int] = set()
        #: Read by stop(): what comes back later is dropped, and its job
        #: noted in ``late`` (before its future completes).
        self.closed = False
        self.late: set[int] = set()
        #: job id -> pids of the pool's workers found dead when it broke.
        self.dead: dict[int, list[int]] = {}
        #: (job id, name, what the submitter got back: a future, an
        #: AsyncResult, a Process; None until known)
        self.jobs: list[tuple[int, str, Any]] = []

    @property
    def dir(self) -> str:
        """The directory children leave their sessions in (the multiprocessing
        path), made on first use: 0700, in the temp dir."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="aprof-children-")
        return self._dir

    def remove(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


_lock = threading.Lock()
_runs: dict[int, tuple[ProfilerState, _Run]] = {}
_ids = itertools.count(1)


def _after_fork_in_child() -> None:
    # The parent's profiles are not the child's (the profiler empties them),
    # and a thread of the parent may have held the lock at the fork.
    global _lock
    _lock = threading.Lock()
    _runs.clear()
    _warned.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _current_state() -> tuple[ProfilerState, dict[str, Any]] | None:
    """The profile recording the current context (or a global one), with its options."""
    from .._core import _profiler

    rec = RF_STATE.get().recorder
    state = rec.state if rec is not None else None
    found = None
    for prof in list(_profiler._live):
        st = prof._state
        if st is None or not st.running:
            continue
        if st is state or (state is None and prof.scope == "global"):
            found = prof
            break
    if found is None or found._state is None:
        return None
    options = {k: getattr(found, k) for k in _FORWARDED if hasattr(found, k)}
    return found._state, options


def _name_of(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__qualname__


def process_call(
    fn: Callable[..., Any], fwd: int, seq: int, submit_ns: int, in_band: bool = False
) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
    """What to hand another process for ``fn``, and what to do with what
    the submit returned: ``tell(handle)`` returns what the caller should
    get back. ``in_band`` (an executor's future): the session comes back
    with the result and ``tell`` returns a future that takes it off;
    otherwise the child leaves a file and ``tell`` keeps the handle (a
    future, an AsyncResult, a Process: read at stop to say what became of
    a job that did not come back).

    Called in the submitter's context. Without a running profile, ``fn``
    itself: the child runs it as it would without aprof.
    """
    found = _current_state()
    if found is None:
        return fn, _no_future
    state, options = found
    with _lock:
        entry = _runs.get(id(state))
        if entry is None or entry[0] is not state:
            entry = _runs[id(state)] = (state, _Run(options))
        run = entry[1]
        job_id = next(_ids)
        record: list[Any] = [job_id, _name_of(fn), None]
        run.jobs.append(record)  # type: ignore[arg-type]
        job = _Job(job_id, "" if in_band else run.dir, run.options, state.node_id, fwd, seq, submit_ns)

    if in_band:

        def tell_in_band(inner: Any) -> Any:
            outer = _InBandFuture(inner, run, job_id)
            record[2] = outer
            return outer

        return ProcessCall(fn, job), tell_in_band

    def tell(handle: Any) -> Any:
        record[2] = handle
        return handle

    return ProcessCall(fn, job), tell


class _InBandFuture(Future):  # type: ignore[type-arg]
    """The future a submitter gets for an in-band job: the inner future's
    outcome with the child's session taken off (SPEC 15.6: the program
    sees its result or exception as without aprof)."""

    def __init__(self, inner: Future[Any], run: _Run, job_id: int) -> None:
        super().__init__()
        self._inner = inner
        pool = _pools.get(id(inner))
        inner.add_done_callback(functools.partial(_in_band_done, self, run, job_id, pool))

    def cancel(self) -> bool:
        return self._inner.cancel() and super().cancel()

    def running(self) -> bool:
        return self._inner.running() and not self.done()


#: id(inner future) -> its executor, while a submit is telling (for the
#: pids of workers that died).
_pools: dict[int, Any] = {}


def _dead_workers(pool: Any) -> list[int]:
    """The pids of ``pool``'s workers that a signal ended. A worker's pipe
    closes a moment before it can be waited for: look for up to 0.2 s."""
    import time

    procs = list(pool._processes.values())
    deadline = time.monotonic() + 0.2
    while True:
        dead = [p.pid for p in procs if p.exitcode is not None and p.exitcode < 0]
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.005)


def _in_band_done(outer: _InBandFuture, run: _Run, job_id: int, pool: Any, inner: Future[Any]) -> None:
    if inner.cancelled():
        super(_InBandFuture, outer).cancel()
        outer.set_running_or_notify_cancel()
        return
    exc = inner.exception()
    payload = None
    if exc is not None:
        payload = exc.__dict__.pop(_EXC_ATTR, None) if hasattr(exc, "__dict__") else None
        if isinstance(exc, BrokenProcessPool) and pool is not None:
            # The futures of a broken pool fail before its other workers
            # are terminated: the dead ones are those with an exit code.
            with contextlib.suppress(Exception):
                run.dead[job_id] = _dead_workers(pool)
    else:
        result = inner.result()
        if isinstance(result, InBand):
            payload = result.payload
            result = result.result
    if payload is not None:
        with _lock:
            if run.closed:
                run.late.add(job_id)
            else:
                run.payloads.append(payload)
                run.received.add(job_id)
    with contextlib.suppress(Exception):  # cancelled meanwhile: nothing to set
        if exc is not None:
            outer.set_exception(exc)
        else:
            outer.set_result(result)


def _no_future(handle: Any) -> Any:
    return handle


def _lost(name: str, pid: int | None, reason: str) -> dict[str, Any]:
    return {"node_id": pid, "pid": pid, "name": name, "reason": reason}


def _status(handle: Any) -> str:
    """What became of a job, from what the submitter got back: a
    ``concurrent.futures.Future``, a ``multiprocessing`` ``AsyncResult`` or
    ``Process``; ``"unknown"`` without one (``aprof.wrap`` pickled)."""
    if handle is None:
        return "unknown"
    try:
        # An in-band job's own future completes only after its session
        # was taken (or, past stop, noted late): its state is the truth.
        if isinstance(handle, Future):
            if not handle.done():
                return "running"
            if handle.cancelled():
                return "cancelled"
            exc = handle.exception()
            if isinstance(exc, BrokenProcessPool):
                return "broken"
            return "done"
        ready = getattr(handle, "ready", None)
        if callable(ready):  # multiprocessing.pool.AsyncResult
            return "done" if ready() else "running"
        exitcode = getattr(handle, "exitcode", 0)  # multiprocessing.Process
        if exitcode is None:
            return "running" if getattr(handle, "_popen", None) is not None else "never started"
        return "done" if exitcode >= 0 else f"killed by signal {-exitcode}"
    except Exception:  # noqa: BLE001 - a handle in a state we cannot read
        return "unknown"


def collect(state: ProfilerState, session: Any) -> Any:
    """The parent's session with its children's merged in (at stop)."""
    with _lock:
        entry = _runs.pop(id(state), None)
        if entry is None or entry[0] is not state:
            return session
        run = entry[1]
        run.closed = True  # a job ending from now on is "still running at stop", consistently
        payloads, received = list(run.payloads), set(run.received)
    from .._post._merge import merge_sessions
    from .._post._session import load

    try:
        names = os.listdir(run._dir) if run._dir is not None else []
    except OSError:
        names = []
    # job id -> [(path, pid, finished)]
    files: dict[int, list[tuple[str, int, bool]]] = {}
    for n in names:
        stem, _, ext = n.rpartition(".")
        parts = stem.split("-")
        if len(parts) != 3 or not all(x.isdigit() for x in parts) or ext not in ("aprof", "part"):
            continue
        files.setdefault(int(parts[0]), []).append((os.path.join(run.dir, n), int(parts[1]), ext == "aprof"))
    children = []
    lost: list[dict[str, Any]] = []
    for payload in payloads:
        try:
            children.append(load_session(payload))
        except Exception as exc:  # noqa: BLE001 - one bad payload loses one job
            lost.append(_lost("?", None, f"its profile could not be read ({type(exc).__name__}: {exc})"))
    for job_id, name, handle in run.jobs:
        if job_id in received:
            continue
        status = "running" if job_id in run.late else _status(handle)
        mine = files.get(job_id, [])
        for path, pid, finished in mine:
            if finished:
                try:
                    children.append(load(path))
                except (OSError, ValueError) as exc:
                    lost.append(_lost(name, pid, f"its profile could not be read ({exc})"))
            elif status == "running":
                lost.append(_lost(name, pid, "still running in another process when the profile stopped"))
            else:
                why = status if status.startswith("killed") else "it crashed or was killed"
                lost.append(_lost(name, pid, f"process {pid} ended before the job finished ({why})"))
        if mine:
            continue
        if status == "running":
            lost.append(_lost(name, None, "still queued or running in another process when the profile stopped"))
        elif status == "broken":
            dead = run.dead.get(job_id) or []
            dead_pid = dead[0] if len(dead) == 1 else None
            who = f"process {dead[0]}" if len(dead) == 1 else "a worker" if not dead else f"processes {', '.join(map(str, dead))}"
            lost.append(_lost(name, dead_pid, f"{who} of the process pool died (it crashed or was killed) while the job was queued or running"))
        elif status.startswith("killed"):
            lost.append(_lost(name, None, f"its process ended before the job started ({status})"))
        elif status == "unknown":
            lost.append(_lost(name, None, "no profile came back from the process that ran it"))
        # "done" without a file: it failed in the parent (it could not be
        # pickled) or ran no call (an empty map); "cancelled", "never
        # started": it never ran. Nothing was lost.
    run.remove()
    if lost:
        session.metadata["lost"] = [*(session.metadata.get("lost") or ()), *lost]
    if not children:
        return session
    children.sort(key=lambda s: s.metadata["start_ns"])
    return merge_sessions([session, *children])


def discard(state: ProfilerState) -> None:
    """Forget a profile's jobs without reading them (warmup, abandoned)."""
    with _lock:
        entry = _runs.pop(id(state), None)
    if entry is not None:
        entry[1].remove()


# ---------------------------------------------------------------------------
# install_propagation(processes=True): ProcessPoolExecutor and multiprocessing
# ---------------------------------------------------------------------------

#: (owner, attribute, original) for each method patched now.
_patched: list[tuple[Any, str, Any]] = []


def _link() -> tuple[int, int, int]:
    """The submit point: logical thread, sequence number, time."""
    from time import perf_counter_ns

    from .._core._record_function import next_sequence_nr
    from .._core._threads import current_logical_thread, stepping

    return (stepping.lt or current_logical_thread()).id, next_sequence_nr(), perf_counter_ns()


def _wrapped(fn: Any, in_band: bool = False) -> tuple[Any, Callable[[Any], Any]]:
    """``fn`` made a profiled call if a profile runs here (and it is not one already)."""
    if not callable(fn) or isinstance(fn, ProcessCall) or _current_state() is None:
        return fn, _no_future
    return process_call(fn, *_link(), in_band=in_band)


def submit_in_band(submit: Any, pool: Any, call: Any, tell: Callable[[Any], Any], args: Any, kwargs: Any) -> Any:
    """``submit(pool, call, ...)`` and the future the submitter gets."""
    inner = submit(pool, call, *args, **kwargs)
    if tell is _no_future:
        return inner
    _pools[id(inner)] = pool
    try:
        return tell(inner)
    finally:
        _pools.pop(id(inner), None)


def _is_machinery(fn: Any) -> bool:
    """The standard library's own worker loops (a pool's workers, a manager's server)."""
    module = getattr(fn, "__module__", None) or ""
    return module.startswith(("multiprocessing", "concurrent.futures"))


def _executor_submit(original: Any) -> Any:
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        call, tell = _wrapped(fn, in_band=True)
        return submit_in_band(original, self, call, tell, args, kwargs)

    return submit


def _process_start(original: Any) -> Any:
    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        if target is not None and not _is_machinery(target):
            call, tell = _wrapped(target)
            if call is not target:
                self._target = call
                tell(self)
        original(self)

    return start


def _pool_method(original: Any) -> Any:
    def method(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        import multiprocessing.pool

        if isinstance(self, multiprocessing.pool.ThreadPool):  # threads: install_propagation's own business
            return original(self, func, *args, **kwargs)
        call, tell = _wrapped(func)
        result = original(self, call, *args, **kwargs)
        if hasattr(result, "ready"):  # AsyncResult / MapResult (imap's iterators say nothing)
            tell(result)
        return result

    return method


def install_process_hooks() -> None:
    """Make ``ProcessPoolExecutor.submit``, ``multiprocessing`` ``Process``
    and ``Pool`` carry a running profile into the child (idempotent)."""
    import concurrent.futures
    import multiprocessing.pool
    import multiprocessing.process

    with _lock:
        if _patched:
            return
        pool_cls = multiprocessing.pool.Pool
        todo = [
            (concurrent.futures.ProcessPoolExecutor, "submit", _executor_submit),
            (multiprocessing.process.BaseProcess, "start", _process_start),
            (pool_cls, "apply_async", _pool_method),
            (pool_cls, "_map_async", _pool_method),
            (pool_cls, "imap", _pool_method),
            (pool_cls, "imap_unordered", _pool_method),
        ]
        for owner, name, make in todo:
            original = owner.__dict__[name]
            replacement = functools.wraps(original)(make(original))
            setattr(owner, name, replacement)
            _patched.append((owner, name, original))


def uninstall_process_hooks() -> None:
    """Restore what :func:`install_process_hooks` replaced (idempotent)."""
    with _lock:
        while _patched:
            owner, name, original = _patched.pop()
            setattr(owner, name, original)


def process_hooks_installed() -> bool:
    return bool(_patched)
