"""Profiling work handed to other processes (SPEC 11.4, 15.4; issue 20).

A context cannot cross into another process, but a profile's *options* can,
like a distributed-tracing header. At submit time (in the submitter's
context) :func:`process_call` looks for the running profile; if there is
one, the callable is wrapped in a picklable :class:`ProcessCall` that
carries the profile's options (tracer, stacks, inputs, tasks, event
budget, ``profile_memory``, ``sample_interval``), the link to the submit point (the submitting logical thread, the
submit's sequence number and its time) and the parent's node id.

Two ways, depending on what runs the call:

* **A pool worker keeps one profile** (executors:
  ``propagating(ProcessPoolExecutor)``, the installed
  ``ProcessPoolExecutor.submit``). The first job a worker runs for a
  given parent profile starts a profile there (node id = the worker's
  pid, in a copy of the worker's context that every later job of that
  parent profile runs in), and connects to a Unix socket in the parent
  profile's private directory (``tempfile.mkdtemp``: mode 0700, in the
  system's temp dir, never the working directory). Each job is then one
  ``EXECUTOR`` range in that profile, and its link (the submit's
  sequence number and logical thread) one pair in a list: the result
  goes back as it would without aprof. At the parent's ``stop()`` the
  parent asks every connected worker for its session over the socket (a
  thread of aprof's in the worker answers, even while a job runs: that
  job's range ends at the stop, unfinished, as in one process); a worker
  that exits first (pool shutdown, ``max_tasks_per_child``) leaves its
  session as a file in the directory from a ``multiprocessing``
  finalizer. A job costs a range and a few pickled ints, not a session.
  A worker that dies (SIGKILL, a crash; the pool then terminates its
  other workers) takes its unsent profile with it: the parent names
  each of its jobs in ``session.lost``, and a broken pool's surviving
  workers are asked for theirs before the pool terminates them.
* **A call of its own** (``multiprocessing`` ``Process`` and ``Pool``,
  which give no future to follow, and ``aprof.wrap`` pickled): the call
  runs inside a profile of its own, as an ``EXECUTOR`` range with
  everything it does inside, and its session goes through the private
  directory: the child creates ``<job>-<pid>-<n>.part`` when it starts,
  writes its session into it and renames it ``.aprof`` before the result
  goes back; a ``.part`` alone means the process died mid-job, and names
  its pid.

At the parent's ``stop()``, :func:`collect` merges what came back into the
parent's session (:mod:`aprof._post._merge`: each child process on its own
tracks under its node id, the submit linked to the child's range, its
allocations and stack samples with it) and
removes the directory. A job that did not come back is named in
``session.lost``, with what its future, AsyncResult or Process says (still
running at stop, the pool broke, killed by a signal). The parent's events
are untouched.

Anything that goes wrong on the child's side (aprof cannot start there,
the directory is gone because the parent stopped) runs the job unprofiled;
a real failure says so once per process with a warning. The job itself
never fails because of aprof.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import gc
import itertools
import os
import pickle
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import warnings
from array import array
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import RF_STATE, AprofWarning, start_unrecorded_thread
from .._core._record_function import _sequence_numbers
from .._core._recorder import ProfilerState
from .._core._threads import LogicalThread, current_logical_thread, stepping

__all__ = ["ProcessCall", "collect", "discard", "process_call", "submit_to_pool"]

_get_rf_state = RF_STATE.get

#: The socket pool workers connect to, in the parent profile's directory,
#: and the file that gives them the profile's options and node id.
_SOCKET: Final = "workers"
_OPTIONS: Final = "options"
#: A worker says its pid when it connects; a session is its length, then its bytes.
_U64: Final = struct.Struct("<Q")
#: What the parent sends a worker to ask for its session.
_FLUSH: Final = b"F"
#: How long a stop waits for the workers' sessions, all together (seconds):
#: aprof's thread in each worker answers at once, even while a job runs,
#: so only a stuck process (stopped, swapping) is waited for this long.
FLUSH_TIMEOUT: float = 10.0

#: Options of the parent's profile that the child's profile takes (those
#: this aprof's profile has: the memory budget's max_bytes and keep too).
_FORWARDED: Final = (
    "record_inputs", "with_stack", "python_tracer", "c_calls", "tasks", "max_events", "max_bytes", "keep",
    "loop_block_threshold", "profile_memory", "memory_interval", "sample_interval",
)  # fmt: skip


class _Job:
    """What a child needs to profile one call on its own (picklable): it
    leaves its session in ``dir``."""

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
    """``fn`` handed to another process under a profile, to be profiled on
    its own (multiprocessing): in that process, runs it inside a profile
    and leaves the session for the parent. Pickles as ``fn`` and the job (``fn`` must pickle as it would without aprof,
    and fails the same way if it does not)."""

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


# ---------------------------------------------------------------------------
# A pool worker's side: one profile per parent profile
# ---------------------------------------------------------------------------


class _PyPoolCallCore:
    """A pool job: ``fn``, the parent profile's directory and the link.
    About 100 bytes and 2 us to pickle and unpickle more than ``fn`` alone
    (the options, as a :class:`_Job` carries them, cost 12 us). The
    extension's ``PoolCallCore`` (``aprof/_cranges.c``) is this class in C:
    the same fields, pickle and call."""

    __slots__ = ("dir", "fn", "fwd", "seq", "submit_ns")

    def __init__(self, fn: Callable[..., Any], dir: str, seq: int, fwd: int, submit_ns: int) -> None:
        self.fn = fn
        self.dir = dir
        self.seq = seq
        self.fwd = fwd
        self.submit_ns = submit_ns

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.fn, self.dir, self.seq, self.fwd, self.submit_ns))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # In the worker, per job.
        w = _workers.get(self.dir, _UNJOINED)
        if w is _UNJOINED:
            w = _pool_join(self.dir)
        ctx = w.ctx if w is not None and not w.closed else None
        if ctx is None:  # unprofiled here, or the parent asked for the profile already
            return self.fn(*args, **kwargs)
        seq = self.seq
        w.seqs.append(seq)
        w.fwds.append(self.fwd)
        # fwd 0: the submitter is in another process; the merge points this
        # range at it through the session's parent_link.
        if not w.enter.acquire(False):
            return ctx.copy().run(_run_executor_range, self.fn, args, kwargs, 0, seq, self.submit_ns)
        try:
            return ctx.run(_run_executor_range, self.fn, args, kwargs, 0, seq, self.submit_ns)
        finally:
            w.enter.release()


if TYPE_CHECKING:
    _PoolCallCore = _PyPoolCallCore
else:
    # Per job in the worker (issue 20's pool target): built, pickled and
    # called in C when the extension is active.
    _PoolCallCore = _PyPoolCallCore if _native.extension is None else _native.extension.PoolCallCore


class _PoolCall(_PoolCallCore):
    """A pool job (see _PyPoolCallCore); reads as ``fn``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(self.fn)


def _pool_join(dir: str) -> _WorkerProfile | None:
    """The worker's profile for the parent profile that owns ``dir``, made
    at its first job (None: the jobs run unprofiled)."""
    w = _workers.get(dir, _UNJOINED)
    if w is _UNJOINED:
        w = _workers[dir] = _join(dir)
    return w  # type: ignore[no-any-return]


class _WorkerProfile:
    """This process's profile of the jobs one parent profile sent it."""

    __slots__ = ("closed", "ctx", "dir", "enter", "fwds", "lock", "parent_node", "prof", "seqs", "sock")

    def __init__(self, dir: str, prof: Any, ctx: contextvars.Context, sock: socket.socket, parent_node: int) -> None:
        self.dir = dir
        self.prof: Any = prof
        #: The context every job of this parent profile runs in (a copy of
        #: the worker's, taken at the first job): what a job sets in it, the
        #: next job sees, as in the worker's own context without aprof.
        self.ctx: contextvars.Context | None = ctx
        self.sock = sock
        self.parent_node = parent_node
        #: The sequence number and the submitting logical thread of each job
        #: run: the links the parent's merge draws (columns: no object per job).
        self.seqs = array("q")
        self.fwds = array("q")
        #: Held while a job runs in ``ctx`` (a Context is entered by one
        #: thread at a time; a job that runs another in this process, or one
        #: run from another thread, takes a copy).
        self.enter = threading.Lock()
        self.lock = threading.Lock()
        self.closed = False


def _run_executor_range(fn: Callable[..., Any], args: Any, kwargs: Any, fwd: int, seq: int, submit_ns: int) -> Any:
    """Replaced by :mod:`aprof._core._propagation`'s at the first join (an
    import there, not per job: a relative import costs microseconds)."""
    raise AssertionError("no worker profile was started")  # pragma: no cover


#: The parent profile's directory -> this process's profile for it (None:
#: none can be made, the jobs run unprofiled).
_workers: dict[str, _WorkerProfile | None] = {}
_UNJOINED: Final[Any] = object()
if _native.extension is not None:
    _native.extension._pool_setup(_workers, _pool_join)
_exit_hooked: list[bool] = []


def _join(dir: str) -> _WorkerProfile | None:
    """Start this worker's profile for the parent profile that owns
    ``dir``, and connect to the parent; None if the parent is gone or
    aprof cannot profile here (the jobs then run unprofiled)."""
    try:
        # Through the directory's descriptor: a socket's path is limited to
        # 107 bytes, a temp dir's is not.
        fd = os.open(dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None  # the parent stopped and removed it: nobody would read this profile
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with open(f"/proc/self/fd/{fd}/{_OPTIONS}", "rb") as f:
            header = pickle.load(f)
        sock.connect(f"/proc/self/fd/{fd}/{_SOCKET}")
        sock.sendall(_U64.pack(os.getpid()))
    except OSError:
        sock.close()
        return None  # the parent stopped meanwhile
    finally:
        os.close(fd)
    try:
        from .._core._profiler import profile

        prof = profile(node_id=os.getpid(), **_options_here(header["options"]))
        _step_aside()
        _memory_aside(prof)
        ctx = contextvars.copy_context()
        _start(prof, ctx.run)
    except Exception as exc:  # noqa: BLE001 - the jobs run anyway (issue 20, "Bad input")
        with contextlib.suppress(OSError):
            sock.sendall(_U64.pack(0))  # an empty session: "no profile here", not a crash
        sock.close()
        _warn_once(f"aprof: could not profile work in process {os.getpid()} ({type(exc).__name__}: {exc}); it runs unprofiled")
        return None
    global _run_executor_range
    from .._core._propagation import _run_executor_range

    w = _WorkerProfile(dir, prof, ctx, sock, header["node_id"])
    # A bare thread, as the flight recorder's: invisible to the program's
    # threading.enumerate() (SPEC 15.6), recording nothing of its own. It
    # waits for the parent's request.
    start_unrecorded_thread(_serve, w)
    if not _exit_hooked:
        _exit_hooked.append(True)
        import atexit
        from multiprocessing import util

        # A multiprocessing worker ends with os._exit after its finalizers
        # (atexit never runs there); any other process, the other way round.
        util.Finalize(None, _flush_all_at_exit, exitpriority=100)
        atexit.register(_flush_all_at_exit)
    return w


def _serve(w: _WorkerProfile) -> None:
    """aprof's thread in a worker: wait for the parent's request, answer it.
    The connection closing instead means the parent is gone (or stopped
    without asking): the profile is dropped."""
    try:
        asked = w.sock.recv(1) == _FLUSH
    except OSError:
        asked = False
    _flush(w, "send" if asked else "drop")


def _flush_all_at_exit() -> None:
    for w in list(_workers.values()):
        if w is not None:
            _flush(w, "file")


def _flush(w: _WorkerProfile, how: str) -> None:
    """Stop ``w``'s profile and send its session to the parent (``send``),
    leave it in the parent's directory (``file``: the worker is exiting),
    or drop it (``drop``). Once: the first caller does it."""
    with w.lock:
        if w.closed:
            return
        w.closed = True
    prof, w.prof, w.ctx = w.prof, None, None
    try:
        prof.stop()  # from any thread (SPEC 5.4): a job running now ends unfinished
        if how == "drop":
            return
        session = prof.session
        session.metadata["parent_link"] = {"node_id": w.parent_node, "seqs": w.seqs, "fwds": w.fwds}
        payload = dump_session(session)
        if how == "send":
            w.sock.sendall(_U64.pack(len(payload)))
            w.sock.sendall(payload)
        else:
            # Before the socket closes: the parent reads the directory after
            # every connection has ended.
            part = os.path.join(w.dir, f"{os.getpid()}.session.part")
            with open(part, "wb") as f:
                f.write(payload)
            os.replace(part, part[: -len(".part")])
    except OSError:
        pass  # the parent is gone, or stopped meanwhile: its session names the jobs as lost
    except Exception as exc:  # noqa: BLE001 - never fail the worker for its profile
        with contextlib.suppress(Exception):  # a warning filter set to "error", at exit
            _warn_once(f"aprof: could not send the profile of work in process {os.getpid()} back ({type(exc).__name__}: {exc})")
    finally:
        w.sock.close()


#: The version of :func:`dump_session`'s payload: 3 carries the stack
#: samples (sample_interval), 2 (without them) still loads.
PAYLOAD_VERSION: Final = 3


def dump_session(session: Any) -> bytes:
    """A session as bytes for another process of this aprof (pickled
    columns: far cheaper than the file format, which is for strangers)."""
    tab = session._table
    for t in session._tracks.values():  # a thread only the samples know: a track without rows
        tab.add_track(t)
    tracks = [(t.id, t.name, t.kind, t.os_thread_id, t.node_id, t.steps) for t in tab.tracks]
    cols = [c.tobytes() for c in tab.columns()]
    m = session.memory
    memory = None
    if m is not None:
        # profile_memory: the allocations, charged in the worker (their
        # event rows are the table's, which goes as it is).
        memory = (
            m.interval, [getattr(m, c).tobytes() for c in _MEMORY_COLUMNS], m.threads, m.other_bytes, m.other_count,
            m.dropped, m.nodes,
        )  # fmt: skip
    smp = session.samples
    samples = None
    if smp is not None:
        # sample_interval: the stacks the worker's sampler took, on its tracks.
        samples = (
            smp.frames, smp.parents, smp.frame_ids, [array("q", getattr(smp, c)).tobytes() for c in _SAMPLE_COLUMNS],
            smp.interval_ns, smp.dropped,
        )  # fmt: skip
    return pickle.dumps(
        (PAYLOAD_VERSION, session.metadata, tracks, cols, tab.names, tab.rare, memory, samples), protocol=pickle.HIGHEST_PROTOCOL
    )


#: The per-sample columns of aprof._post._samples.Samples.
_SAMPLE_COLUMNS: Final = ("time_ns", "weight_ns", "thread_id", "node", "idle")


#: profile_memory's columns and their array codes (aprof._post._memory.Memory).
_MEMORY_COLUMNS: Final = ("time", "size", "weight", "freed", "thread_id", "event")


def load_session(payload: bytes) -> Any:
    """:func:`dump_session`'s session back."""
    from .._post._events import EventTable, Track
    from .._post._memory import Memory
    from .._post._samples import Samples
    from .._post._session import Session
    from .._post._table import COLUMNS

    got = pickle.loads(payload)
    version = got[0] if type(got) is tuple and got else None
    if version == 2:  # an aprof of before the samples came along (a worker started before an upgrade)
        (version, metadata, tracks, cols, names, rare, mem), smp = got, None
    elif version == PAYLOAD_VERSION and len(got) == 8:
        version, metadata, tracks, cols, names, rare, mem, smp = got
    else:
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
    memory = None
    if mem is not None:
        interval, mcols, threads, other_bytes, other_count, dropped, nodes = mem
        memory = Memory(interval)
        for c, raw in zip(_MEMORY_COLUMNS, mcols, strict=True):
            getattr(memory, c).frombytes(raw)
        memory.threads = threads
        memory.other_bytes, memory.other_count, memory.dropped = other_bytes, other_count, dropped
        memory.nodes = nodes
    samples = None
    if smp is not None:
        frames, parents, frame_ids, scols, interval_ns, dropped = smp
        lists = []
        for raw in scols:
            col = array("q")
            col.frombytes(raw)
            lists.append(col.tolist())
        time_ns, weight_ns, thread_id, node, idle = lists
        samples = Samples(frames, parents, frame_ids, time_ns, weight_ns, thread_id, node, idle, interval_ns, dropped)
    return Session(tab, by_id, metadata, samples, memory)


_warned: list[bool] = []
_calls = itertools.count(1)  # this process's calls: file names


def _warn_once(message: str) -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn(message, AprofWarning, stacklevel=3)


def _step_aside() -> None:
    """Under ``aprof run``, which profiles this process as a whole: the
    job's profile records the job, the process's own steps aside."""
    follow = sys.modules.get("aprof._integrations._follow")
    if follow is not None:
        follow.step_aside()


def _options_here(options: dict[str, Any]) -> dict[str, Any]:
    """The parent profile's options, as this process can take them: without
    ``profile_memory`` where the allocator cannot be hooked (no C extension
    here), with a warning, rather than the work not profiled at all."""
    if options.get("profile_memory"):
        from .._core import _memory

        why = _memory.unavailable_reason()
        if why is not None:
            _warn_once(f"aprof: process {os.getpid()} cannot track memory ({why}): the allocations of the work sent to it are not tracked")
            return {**options, "profile_memory": False}
    return options


def _memory_aside(prof: Any) -> None:
    """``profile_memory`` in a process where a profile of its own tracks
    memory already (the allocator hooks are one per process): the work is
    profiled without its allocations, with a warning, rather than not at all."""
    if prof.profile_memory:
        from .._core import _memory

        if _memory.running():
            prof.profile_memory = False
            _warn_once(
                f"aprof: process {os.getpid()} tracks memory for a profile of its own: "
                "the allocations of the work sent to it are not tracked"
            )


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def _start(prof: Any, run: Callable[..., Any] = _call) -> None:
    """Start ``prof`` (through ``run``: in the jobs' context). With
    ``sample_interval``, a sampler that cannot start here (no thread for
    it) does not leave the work unprofiled: the profile starts without
    samples, with a warning. Any other failure raises."""
    try:
        run(prof.start)
    except Exception as exc:
        if prof.sample_interval is None:
            raise
        prof.sample_interval = None
        run(prof.start)  # raises if the sampler was not the reason
        _warn_once(
            f"aprof: process {os.getpid()} cannot sample stacks ({type(exc).__name__}: {exc}): "
            "the work sent to it is profiled without its samples"
        )


def _start_in_child(job: _Job) -> tuple[Any, str] | None:
    from .._core._profiler import profile

    prof = profile(node_id=os.getpid(), **_options_here(job.options))
    # One job may run many calls (a multiprocessing.Pool map): each its own file.
    part = os.path.join(job.dir, f"{job.id}-{os.getpid()}-{next(_calls)}.part")
    try:
        # O_EXCL: a job runs once; the file says which process took it.
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileNotFoundError:
        return None  # the parent stopped and removed the directory: nobody will read it
    _step_aside()
    _memory_aside(prof)
    try:
        _start(prof)
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

    __slots__ = (
        "_dir", "asked", "conns", "dead", "gather_lock", "jobs", "listener", "options", "pool_jobs", "rescued",
        "sessions", "silent", "watches",
    )  # fmt: skip

    def __init__(self, options: dict[str, Any]) -> None:
        self._dir: str | None = None
        self.options = options
        #: The socket pool workers connect to (None until the first pool job).
        self.listener: socket.socket | None = None
        self.gather_lock = threading.Lock()
        #: Workers' sessions received, the pids of workers whose connection
        #: ended without one, of those that did not answer in time, and
        #: those asked already (a broken pool's survivors are asked early).
        self.sessions: list[bytes] = []
        self.dead: set[int] = set()
        self.silent: set[int] = set()
        self.asked: set[int] = set()
        self.conns: list[socket.socket] = []
        #: [job id, name, what the submitter got back (a future, an
        #: AsyncResult, a Process; None until known)] of calls profiled on
        #: their own; [fn, future (None until known), seq] of pool jobs,
        #: named only if lost.
        self.jobs: list[list[Any]] = []
        self.pool_jobs: list[list[Any]] = []
        #: id(pool) -> the watch on its futures (for a broken pool), and
        #: the pools whose survivors were asked when they broke.
        self.watches: dict[int, _PoolWatch] = {}
        self.rescued: set[int] = set()

    @property
    def dir(self) -> str:
        """The directory children leave their sessions in, made on first
        use: 0700, in the temp dir."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="aprof-children-")
        return self._dir

    def tell_pool(self, record: list[Any], inner: Any, pool: Any = None) -> Any:
        """Note a pool job's future; return it as it is."""
        record[1] = inner
        if isinstance(inner, Future):
            w = self.watches.get(id(pool)) or self.watch(pool)
            with w.lock:
                w.futs.append(inner)
                idle = w.watched is None
            if idle:  # no future of the pool was pending: watch this one
                w.arm()
        return inner

    def watch(self, pool: Any) -> _PoolWatch:
        """The watch on ``pool``'s futures, made at its first job."""
        with self.gather_lock:
            w = self.watches.get(id(pool))
            if w is None:
                w = self.watches[id(pool)] = _PoolWatch(self, pool)
            return w

    def listen(self, node_id: int) -> bool:
        """Open the socket pool workers connect to (once), with the file of
        the profile's options beside it; False if it cannot be."""
        if self.listener is not None:
            return True
        with _lock:
            return self._listen(node_id)

    def _listen(self, node_id: int) -> bool:
        if self.listener is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with open(os.path.join(self.dir, _OPTIONS), "wb") as f:
                    pickle.dump({"options": self.options, "node_id": node_id}, f)
                fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    sock.bind(f"/proc/self/fd/{fd}/{_SOCKET}")
                finally:
                    os.close(fd)
                sock.listen(socket.SOMAXCONN)
            except OSError:
                sock.close()
                return False
            self.listener = sock
        return True

    def remove(self) -> None:
        if self.listener is not None:
            self.listener.close()
        for c in self.conns:
            c.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


_lock = threading.Lock()
_runs: dict[int, tuple[ProfilerState, _Run]] = {}
_ids = itertools.count(1)


def _after_fork_in_child() -> None:
    # The parent's profiles are not the child's (the profiler empties them),
    # and a thread of the parent may have held the lock at the fork; nor
    # are a parent pool worker's profiles (its thread did not follow).
    global _lock
    _lock = threading.Lock()
    _runs.clear()
    _workers.clear()
    _warned.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _current_state() -> tuple[ProfilerState, Any] | None:
    """The profile recording the current context (or a global one), and its state."""
    from .._core import _profiler

    rec = RF_STATE.get().recorder
    state = rec.state if rec is not None else None
    for prof in _profiler.live_profiles():
        st = prof._state
        if st is None or not st.running:
            continue
        if st is state or (state is None and prof.scope == "global"):
            return st, prof
    return None


def _name_of(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__qualname__


def process_call(
    fn: Callable[..., Any], fwd: int, seq: int, submit_ns: int, pool: bool = False
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """What to hand another process for ``fn``, and what to do with what
    the submit returned: ``tell(handle)`` keeps the handle (a future, an
    AsyncResult, a Process: read at stop to say what became of a job that
    did not come back) and returns it. ``pool`` (an executor's worker):
    the worker keeps one profile for all this profile's jobs; otherwise
    the call is profiled on its own and leaves a file.

    Called in the submitter's context. Without a running profile, ``fn``
    itself: the child runs it as it would without aprof.
    """
    # The common case first, without a lock: a context's profile that has
    # handed work to other processes before.
    rec = RF_STATE.get().recorder
    state = rec.state if rec is not None else None
    entry = _runs.get(id(state)) if state is not None and state.running else None
    if entry is not None and entry[0] is state:
        run = entry[1]
    else:
        found = _current_state()
        if found is None:
            return fn, _no_future
        state, prof = found
        with _lock:
            entry = _runs.get(id(state))
            if entry is None or entry[0] is not state:
                options = {k: getattr(prof, k) for k in _FORWARDED if hasattr(prof, k)}
                entry = _runs[id(state)] = (state, _Run(options))
            run = entry[1]
    if pool and run.listen(state.node_id):  # no socket (no /proc): a session per job instead
        job_record: list[Any] = [fn, None, seq]
        run.pool_jobs.append(job_record)
        return _PoolCall(fn, run.dir, seq, fwd, submit_ns), functools.partial(run.tell_pool, job_record)
    with _lock:
        job_id = next(_ids)
        record: list[Any] = [job_id, _name_of(fn), None]
        run.jobs.append(record)
        job = _Job(job_id, run.dir, run.options, state.node_id, fwd, seq, submit_ns)

    def tell(handle: Any, pool: Any = None) -> Any:
        record[2] = handle
        return handle

    return ProcessCall(fn, job), tell


#: The states of a future that is not done (concurrent.futures._base).
_NOT_DONE: Final = ("PENDING", "RUNNING")


class _PoolWatch:
    """A done callback on one pending future of a pool at a time, not on
    every job's (issue 20: a callback per job cost the submitter about a
    microsecond): a broken pool fails all its pending futures before it
    terminates its workers, so one pending future watched is enough to
    hear of it. The watched future is the newest pending one; when it
    completes, its callback moves the watch to the newest future still
    pending, if any, and a submit that finds none watched watches its own.
    So whenever a future of the pool is pending, one is watched. ``futs``
    keeps the pool's futures that may still be pending: done ones are
    dropped from both ends as they are passed, so each future is looked at
    a bounded number of times."""

    __slots__ = ("futs", "lock", "pool", "run", "watched")

    def __init__(self, run: _Run, pool: Any) -> None:
        self.run = run
        self.pool = pool
        self.futs: collections.deque[Future[Any]] = collections.deque()
        self.watched: Future[Any] | None = None
        self.lock = threading.Lock()

    def arm(self) -> None:
        """Watch the newest pending future of the pool (none if none is)."""
        with self.lock:
            futs = self.futs
            while futs and futs[-1]._state not in _NOT_DONE:
                futs.pop()
            while futs and futs[0]._state not in _NOT_DONE:
                futs.popleft()
            if not futs:
                self.watched = None
                return
            fut = self.watched = futs[-1]
        # Outside the lock: a future completing meanwhile runs the callback now, here.
        fut.add_done_callback(self.done)

    def done(self, fut: Future[Any]) -> None:
        # Runs in the pool's manager thread (or the canceller's). The future
        # is done: its fields are final.
        if isinstance(getattr(fut, "_exception", None), BrokenProcessPool):
            _pool_broken(self.run, self.pool)
        if fut is self.watched:
            self.arm()


def _pool_broken(run: _Run, pool: Any) -> None:
    # A broken pool fails its futures, then terminates its other workers:
    # ask those for their sessions first (this runs in the pool's manager
    # thread, which waits for us).
    with run.gather_lock:
        if id(pool) in run.rescued:
            return  # once per pool: all its pending futures fail together
        run.rescued.add(id(pool))
    with contextlib.suppress(Exception):  # the pool's manager thread must go on
        dead = _dead_workers(pool) if pool is not None else []
        _gather(run, final=False)
        run.dead.update(dead)


def _dead_workers(pool: Any) -> list[int]:
    """The pids of ``pool``'s workers that a signal ended. A worker's pipe
    closes a moment before it can be waited for: look for up to 0.2 s."""
    procs = list(pool._processes.values())
    deadline = time.monotonic() + 0.2
    while True:
        dead = [p.pid for p in procs if p.exitcode is not None and p.exitcode < 0]
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.005)


def _recv(conn: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes from ``conn`` by ``deadline``; None if it closed first."""
    chunks = []
    while n:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _gather(run: _Run, final: bool) -> None:
    """Ask every worker connected so far for its session (``final``: at
    stop; also no more connections after)."""
    with run.gather_lock:
        listener = run.listener
        if listener is None:
            return
        conns: list[tuple[socket.socket, int | None]] = []
        listener.setblocking(False)
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            run.conns.append(conn)
            try:
                head = _recv(conn, _U64.size, deadline)
            except OSError:
                head = None
            conns.append((conn, None if head is None else _U64.unpack(head)[0]))
        if final:
            listener.close()
            run.listener = None
        for conn, _pid in conns:
            with contextlib.suppress(OSError):
                conn.sendall(_FLUSH)  # all first: the workers answer together
        for conn, pid in conns:
            try:
                head = _recv(conn, _U64.size, deadline)
                payload = None if head is None else _recv(conn, _U64.unpack(head)[0], deadline)
            except TimeoutError:
                if pid is not None:
                    run.silent.add(pid)
                payload = None
            except OSError:
                payload = None
            conn.close()
            if pid is not None:
                run.asked.add(pid)
            if payload:
                run.sessions.append(payload)
            elif payload is not None:  # b"": the worker could not profile; its jobs ran unprofiled (it warned)
                continue
            elif pid is not None and pid not in run.silent:
                run.dead.add(pid)  # unless it left a file on its way out: see collect


def _no_future(handle: Any, pool: Any = None) -> Any:
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


def _finished(handle: Any) -> bool:
    """A pool job's future completed with its result or its own exception
    (read without the future's lock: a stop reads thousands)."""
    return getattr(handle, "_state", None) == "FINISHED" and not isinstance(getattr(handle, "_exception", None), BrokenProcessPool)


def _who(pids: list[int]) -> str:
    if len(pids) == 1:
        return f"process {pids[0]}"
    return "a worker" if not pids else f"processes {', '.join(map(str, pids))}"


def collect(state: ProfilerState, session: Any) -> Any:
    """The parent's session with its children's merged in (at stop)."""
    with _lock:
        entry = _runs.pop(id(state), None)
        if entry is None or entry[0] is not state:
            return session
        run = entry[1]
    # Reading and merging the children's sessions makes a few objects per
    # job (rows of rare fields): as consolidation does, keep the cyclic GC
    # from walking the program's heap over and over meanwhile.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _collect(run, session)
    finally:
        if gc_was_enabled:
            gc.enable()


def _collect(run: _Run, session: Any) -> Any:
    from .._post._merge import merge_children
    from .._post._session import load

    _gather(run, final=True)  # no worker joins this profile from now on
    try:
        names = os.listdir(run._dir) if run._dir is not None else []
    except OSError:
        names = []
    # job id -> [(path, pid, finished)]
    files: dict[int, list[tuple[str, int, bool]]] = {}
    payloads = list(run.sessions)
    for n in names:
        if n.endswith(".session") and n[: -len(".session")].isdigit():  # a worker's, on its way out
            try:
                with open(os.path.join(run.dir, n), "rb") as f:
                    payloads.append(f.read())
            except OSError:
                continue
            run.dead.discard(int(n[: -len(".session")]))
            continue
        stem, _, ext = n.rpartition(".")
        parts = stem.split("-")
        if len(parts) != 3 or not all(x.isdigit() for x in parts) or ext not in ("aprof", "part"):
            continue
        files.setdefault(int(parts[0]), []).append((os.path.join(run.dir, n), int(parts[1]), ext == "aprof"))
    children = []
    lost: list[dict[str, Any]] = []
    came_back: set[int] = set()  # the seqs of pool jobs whose range came back
    for payload in payloads:
        try:
            child = load_session(payload)
        except Exception as exc:  # noqa: BLE001 - one bad payload loses one worker's jobs
            lost.append(_lost("?", None, f"a profile could not be read ({type(exc).__name__}: {exc})"))
            continue
        children.append(child)
        link = child.metadata.get("parent_link")
        if type(link) is dict:
            came_back.update(link.get("seqs") or ())
    dead, silent = sorted(run.dead), sorted(run.silent)
    for fn, handle, seq in run.pool_jobs:
        # The common case, without a lock or a call: a job whose range came
        # back, its future completed (see _finished).
        if seq in came_back and getattr(handle, "_state", None) == "FINISHED" and type(getattr(handle, "_exception", None)) is not BrokenProcessPool:
            continue
        status = _status(handle)
        name = _name_of(fn)
        if status == "running":
            why = "still running" if seq in came_back else "still queued or running"
            lost.append(_lost(name, None, f"{why} in another process when the profile stopped"))
        elif status == "broken":
            # Its range, if it came back, ends where its worker was asked.
            pid = dead[0] if len(dead) == 1 else None
            lost.append(_lost(name, pid, f"{_who(dead)} of the process pool died (it crashed or was killed) while the job was queued or running"))
        elif seq in came_back:
            pass
        elif status == "done" and (dead or silent):
            # It ran, in a worker whose profile did not come back.
            pid = dead[0] if len(dead) == 1 and not silent else silent[0] if len(silent) == 1 and not dead else None
            why = (
                f"{_who(dead)} of the process pool died (it crashed or was killed) with the profile of the jobs it ran"
                if dead
                else f"{_who(silent)} did not send its profile within {FLUSH_TIMEOUT:g} s"
            )
            lost.append(_lost(name, pid, why))
        elif status == "unknown":  # aprof.wrap(fn) pickled: no future to ask
            lost.append(_lost(name, None, "no profile came back from the process that ran it (or it never ran)"))
        # "done" otherwise: it failed in the parent (it could not be
        # pickled) or its worker could not profile (it warned);
        # "cancelled": it never ran. Nothing was lost.
    for job_id, name, handle in run.jobs:
        status = _status(handle)
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
        elif status.startswith("killed"):
            lost.append(_lost(name, None, f"its process ended before the job started ({status})"))
        elif status == "unknown":
            lost.append(_lost(name, None, "no profile came back from the process that ran it"))
        # "done" without a file: it failed in the parent (it could not be
        # pickled) or ran no call (an empty map); "never started": it never
        # ran. Nothing was lost.
    run.remove()
    return merge_children(session, children, lost)


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


def _wrapped(fn: Any, pool: bool = False) -> tuple[Any, Callable[..., Any]]:
    """``fn`` made a profiled call if a profile runs here (and it is not one already)."""
    if not callable(fn) or isinstance(fn, (ProcessCall, _PoolCall)) or _current_state() is None:
        return fn, _no_future
    return process_call(fn, *_link(), pool=pool)


def submit_to_pool(submit: Any, pool: Any, fn: Any, args: Any, kwargs: Any) -> Any:
    """``submit(pool, fn, *args, **kwargs)`` for a process pool, under the
    running profile if there is one: ``fn`` goes as a :class:`_PoolCall`
    and the future is noted for the profile, then returned as it is (the
    program's own future).

    One Python call per job in the common case (a context's profile whose
    workers' socket is open): it is most of what a small job costs the
    submitting process (issue 20's pool target)."""
    rec = _get_rf_state().recorder
    state = rec.state if rec is not None else None
    entry = _runs.get(id(state)) if state is not None and state.running else None
    if entry is None or entry[0] is not state or entry[1].listener is None:
        # The first job of this profile, a global profile, no profile, or
        # no socket: the general way.
        if _current_state() is None:
            return submit(pool, fn, *args, **kwargs)
        call, tell = process_call(fn, *_link(), pool=True)
        return tell(submit(pool, call, *args, **kwargs), pool)
    run = entry[1]
    # The link, as _link() makes it.
    fwd = _lt_now().id
    seq = next(_sequence_numbers)
    record: list[Any] = [fn, None, seq]
    run.pool_jobs.append(record)
    fut = submit(pool, _PoolCall(fn, run._dir, seq, fwd, perf_counter_ns()), *args, **kwargs)  # type: ignore[arg-type]
    # run.tell_pool(record, fut, pool), inline: a Python call less per job.
    record[1] = fut
    if isinstance(fut, Future):
        w = run.watches.get(id(pool)) or run.watch(pool)
        with w.lock:
            w.futs.append(fut)
            idle = w.watched is None
        if idle:  # no future of the pool was pending: watch this one
            w.arm()
    return fut


def _lt_now_py() -> LogicalThread:
    return stepping.lt or current_logical_thread()


#: The current logical thread (in C: the ranges' cached lookup).
_lt_now: Callable[[], LogicalThread] = _lt_now_py if _native.extension is None else _native.extension._logical_thread


def _is_machinery(fn: Any) -> bool:
    """The standard library's own worker loops (a pool's workers, a manager's server)."""
    module = getattr(fn, "__module__", None) or ""
    return module.startswith(("multiprocessing", "concurrent.futures"))


def _executor_submit(original: Any) -> Any:
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if not callable(fn) or isinstance(fn, (ProcessCall, _PoolCall)):
            return original(self, fn, *args, **kwargs)
        return submit_to_pool(original, self, fn, args, kwargs)

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
