"""What a suspended task is waiting on: its await chain, in a few words.

A suspended coroutine points down its chain of awaits: ``cr_await`` (or a
generator's ``gi_yieldfrom``) names the coroutine, generator or awaitable
it is suspended in, and so on down to the leaf: an asyncio ``Future`` (or
the iterator of one), a task, or trio's trap. :func:`describe_wait` walks
that chain and says, in the user's terms, what the task waits on:

* the *entry point*: the first library call below the user's own frames
  (``asyncio.sleep``, ``asyncio.Lock.acquire``, ``trio.Event.wait``,
  ``trio.MemoryReceiveChannel.receive``, a driver's ``fetch``), so the
  name is what the user called, not the runtime's trap underneath;
* a *kind* for grouping (``sleep``, ``lock``, ``event``, ``queue``,
  ``io``, ``executor``, ``task``, ``children``, ``future``, ``other``);
* *where*: the innermost user frame on the chain, ``file:line function``,
  and *caller*, the user frame above it (where a loop of awaits usually is).

When the user's code awaits a future directly (``await task``,
``await loop.run_in_executor(...)``, ``await asyncio.gather(...)``), the
leaf future says it: a task is named with its coroutine, an executor job
is recognised by the callback asyncio chains to the pool's future.

It reads attributes only: no frame's ``f_locals`` (that would store a
snapshot on the frame and keep its locals alive, visible to the program),
no call into the user's objects except ``Task.get_name``. It is meant to
be called when a task's step starts after a long wait (the coroutine is
still suspended then) and at stop for tasks still pending; walking a chain
of a dozen awaits costs a few microseconds.

Per-wait records (what the summary reads): a ``TASK`` event's
``extra["waits"]`` is a list of runs of consecutive waits with the same
``(what, where)``, each ``[first_start_ns, last_end_ns, count, total_ns,
max_ns, what, kind, where, caller, max_end_ns]`` (``max_end_ns``: when the
longest of them ended; see :class:`WaitLog`);
``extra["waiting_on"]`` is ``[what, kind, where, caller]`` for a task still
pending at stop.
"""

from __future__ import annotations

import gc
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush
from types import CoroutineType, GeneratorType
from typing import Any, Final

from .._core import _native
from .._frames import is_library_cached, short_path

__all__ = ["Wait", "WaitLog", "describe_task", "describe_wait", "new_wait_log"]

_MAX_DEPTH: Final = 64
_KINDS: Final = (
    # (words in the entry point's qualified name, kind), first match wins
    (("sleep", "sleep_until", "sleep_forever"), "sleep"),
    (("to_thread", "run_in_executor", "run_sync"), "executor"),
    (("Semaphore", "Lock", "Condition", "CapacityLimiter", "ParkingLot"), "lock"),
    (("Event.wait", "EventAdapter.wait"), "event"),
    (("Queue", "Channel", "MemoryObject", "receive", "send"), "queue"),
    (("TaskGroup", "Nursery", "gather", "wait_for", "as_completed", "asyncio.wait"), "children"),
    (("sock_", "Stream", "Socket", "wait_readable", "wait_writable", "read", "recv", "connect", "accept", "_SocketType"), "io"),
)

#: A wait: (what, kind, where, caller); ``where`` and ``caller`` may be "".
Wait = tuple[str, str, str, str]


#: Public submodules whose name says what the call is (anyio.to_thread.run_sync).
_NAMED_SUBMODULES: Final = frozenset({"to_thread", "from_thread"})


def _package(filename: str) -> str:
    """The top-level package (or module) a library file belongs to."""
    parts = short_path(filename).split(os.sep)
    head = parts[0]
    if head.endswith(".py"):
        head = head[:-3]
    if head.startswith("_"):  # _asyncio, _collections_abc ...
        head = head[1:]
    if len(parts) == 2 and parts[1].endswith(".py") and parts[1][:-3] in _NAMED_SUBMODULES:
        head = f"{head}.{parts[1][:-3]}"
    return head or filename


def _frame_of(obj: Any) -> tuple[Any, Any]:
    """(code, frame) of a coroutine, generator or async generator; (None, None) otherwise."""
    t = type(obj)
    if t is CoroutineType:  # the common case, without the attribute probing
        return obj.cr_code, obj.cr_frame
    if t is GeneratorType:
        return obj.gi_code, obj.gi_frame
    for code_attr, frame_attr in (("cr_code", "cr_frame"), ("gi_code", "gi_frame"), ("ag_code", "ag_frame")):
        code = getattr(obj, code_attr, None)
        if code is not None:
            return code, getattr(obj, frame_attr, None)
    return None, None


def _next_in_chain(obj: Any) -> Any:
    if type(obj) is CoroutineType:
        nxt = obj.cr_await
        if type(nxt).__name__ not in _AGEN_AWAITABLES:
            return nxt
    for attr in ("cr_await", "gi_yieldfrom", "ag_await"):
        if hasattr(obj, attr):
            nxt = getattr(obj, attr)
            if type(nxt).__name__ in _AGEN_AWAITABLES:
                # `await agen.asend(...)` (what contextlib's
                # asynccontextmanager does): the generator behind it.
                return _agen_of(nxt) or nxt
            return nxt
    return None


#: What ``anext()``/``asend()``/``athrow()`` of an async generator return.
_AGEN_AWAITABLES: Final = frozenset({"async_generator_asend", "async_generator_athrow"})


def _agen_of(awaitable: Any) -> Any:
    """The async generator behind an ``asend``/``athrow`` awaitable (C
    objects that expose it only to the GC's traversal)."""
    for ref in gc.get_referents(awaitable):
        if hasattr(ref, "ag_code"):
            return ref
    return None


def _future_of(leaf: Any) -> Any:
    """The asyncio future behind ``leaf``: the leaf itself, or the future a
    ``FutureIter`` (what ``Future.__await__`` returns in C) iterates."""
    if leaf is None:
        return None
    if hasattr(leaf, "add_done_callback") and hasattr(leaf, "done"):
        return leaf
    if type(leaf).__name__ == "FutureIter":
        # The C iterator exposes its future only to the GC's traversal.
        for ref in gc.get_referents(leaf):
            if hasattr(ref, "add_done_callback") and hasattr(ref, "done"):
                return ref
    return None


def _describe_future(fut: Any) -> tuple[str, str] | None:
    """(what, kind) for a future the user's code awaits directly."""
    if fut is None:
        return None
    get_coro = getattr(fut, "get_coro", None)
    if get_coro is not None:  # a Task
        try:
            name = str(fut.get_name())
        except Exception:
            name = "?"
        c = get_coro()
        code = c.cr_code if type(c) is CoroutineType else _frame_of(c)[0]
        coro = code.co_qualname if code is not None else type(c).__qualname__
        return f"task {name!r} ({coro})", "task"
    children = getattr(fut, "_children", None)
    if isinstance(children, list):  # asyncio.gather's _GatheringFuture
        return f"asyncio.gather of {len(children)}", "children"
    callbacks = getattr(fut, "_callbacks", None) or ()
    for cb in callbacks:
        fn = cb[0] if isinstance(cb, tuple) else cb
        qualname = getattr(fn, "__qualname__", "")
        if "_chain_future" in qualname:  # asyncio.wrap_future: loop.run_in_executor's future
            return "an executor job (run_in_executor)", "executor"
    return "a future", "future"


def _kind_of(what: str) -> str:
    for words, kind in _KINDS:
        if any(w in what for w in words):
            return kind
    return "other"


def describe_wait(coro: Any, task: Any = None) -> Wait | None:
    """What a suspended coroutine (a task's) is waiting on.

    Args:
        coro: The task's coroutine (``task.get_coro()``, trio's
            ``task.coro``), suspended.
        task: The asyncio task, if known: its ``_fut_waiter`` is the future
            it waits on, which names a child task or an executor job.

    Returns:
        ``(what, kind, where, caller)``, or None when ``coro`` is not a
        suspended coroutine. ``where`` is the innermost user frame on the
        chain as ``file:line function``, ``caller`` the user frame above it
        ("" if none).
    """
    keyed = _await_key(coro)
    if keyed is None:  # a chain the C walk leaves to Python (or none at all)
        keyed = _await_key_py(coro)
        if keyed is None:
            return None
    key, leaf = keyed
    site = _sites.get(key)
    if site is None:
        frames, codes, _ = _walk(coro)
        if not frames:
            return None
        if len(_sites) >= _MAX_CACHED:
            _sites.clear()
        entry, where, caller = _sites_of(codes, frames)
        decided = None
        if entry is not None and entry[1] not in ("other", "children", "future"):
            decided = (entry[0], entry[1], where, caller)
        site = _sites[key] = (decided, entry, where, caller, tuple(codes))
    return wait_at(site, task, leaf)


def wait_at(site: _Site, task: Any, leaf: Any) -> Wait:
    """The wait at a cached call site: the site's own if its frames decide
    it, else what the future the task waits on says (the part of
    :func:`describe_wait` that runs at every wait; its common cases are in
    C, ``note_wait`` in ``_ctasks.c``)."""
    if site[0] is not None:
        return site[0]
    _, entry_name, where, caller, _ = site
    # The user's code awaits a future itself (or a call whose kind says
    # little): the future it waits on names a child task or an executor job.
    fut = getattr(task, "_fut_waiter", None) if task is not None else None
    if fut is None:
        fut = _future_of(leaf)
    described = _describe_future(fut)
    if entry_name is None:
        if described is None:
            return "an awaitable", "other", where, caller
        return described[0], described[1], where, caller
    if described is not None and described[1] in ("task", "executor"):
        return described[0], described[1], where, caller
    return entry_name[0], entry_name[1], where, caller


def _walk(coro: Any) -> tuple[list[Any], list[Any], Any]:
    """(frames, codes, leaf) of a suspended coroutine's await chain,
    outermost first; ``leaf`` is the awaitable at the bottom (None if the
    chain ends in a bare ``yield``)."""
    frames: list[Any] = []
    codes: list[Any] = []
    obj = coro
    leaf: Any = None
    for _ in range(_MAX_DEPTH):
        code, frame = _frame_of(obj)
        if code is None:
            leaf = obj
            break
        frames.append(frame)
        codes.append(code)
        nxt = _next_in_chain(obj)
        if nxt is None:
            break
        obj = nxt
    return frames, codes, leaf


def _await_key_py(coro: Any) -> tuple[tuple[int, ...], Any] | None:
    """The twin of the C ``await_key``: the chain's key (each code's address
    and instruction offset, outermost first) and its leaf; None when there
    is no chain. The same few call sites wait over and over: the key says
    which one without reading a line number or a file name."""
    frames, codes, leaf = _walk(coro)
    if not frames:
        return None
    key: list[int] = []
    for code, frame in zip(codes, frames, strict=True):
        key.append(id(code))
        key.append(frame.f_lasti if frame is not None else -1)
    return tuple(key), leaf


def _sites_of(codes: list[Any], frames: list[Any]) -> tuple[tuple[str, str] | None, str, str]:
    """((what, kind) of the entry point or None, where, caller) of a chain
    of frames, outermost first (the part of a wait its frames decide)."""
    chain = [
        (code.co_filename, (frame.f_lineno if frame is not None else code.co_firstlineno) or 0, code.co_qualname)
        for code, frame in zip(codes, frames, strict=True)
    ]
    users = [i for i, (filename, _, _) in enumerate(chain) if not is_library_cached(filename)]
    last_user = users[-1] if users else -1
    where = _label(chain[last_user]) if users else ""
    caller = _label(chain[users[-2]]) if len(users) > 1 else ""
    below = chain[last_user + 1 :]
    for i, (filename, _, qualname) in enumerate(below):
        if i + 1 < len(below) and (qualname.endswith("__aenter__") or _is_contextlib(filename)):
            continue  # `async with lock:` -> the lock's acquire below; contextlib's wrappers -> what they wrap
        return _entry_name((filename, qualname)), where, caller
    return None, where, caller


def describe_task(task: Any) -> Wait | None:
    """What a pending asyncio or trio task waits on (for ``waiting_on`` at stop)."""
    get_coro = getattr(task, "get_coro", None)
    coro = get_coro() if get_coro is not None else getattr(task, "coro", None)
    if coro is None or getattr(coro, "cr_running", False):
        return None  # gone, or running now (the task that stops the profile): not waiting
    return describe_wait(coro, task if get_coro is not None else None)


def _is_contextlib(filename: str) -> bool:
    return filename.endswith(f"{os.sep}contextlib.py")


# The names are formatted once per call site (a wait is described on every
# long wait of every task: the same few sites, over and over).
_labels: dict[tuple[str, int, str], str] = {}
#: chain key -> (the Wait if the frames decide it, else None; the entry
#: point's (what, kind) or None; where; caller; the codes, kept alive so
#: that no other code takes their addresses while the key is cached).
_Site = tuple[Wait | None, tuple[str, str] | None, str, str, tuple[Any, ...]]
_sites: dict[tuple[int, ...], _Site] = {}
_entries: dict[tuple[str, str], tuple[str, str]] = {}
_MAX_CACHED: Final = 4096


def _label(frame: tuple[str, int, str]) -> str:
    label = _labels.get(frame)
    if label is None:
        if len(_labels) >= _MAX_CACHED:
            _labels.clear()
        label = _labels[frame] = f"{short_path(frame[0])}:{frame[1]} {frame[2]}"
    return label


def _entry_name(entry: tuple[str, str]) -> tuple[str, str]:
    """(what, kind) of the entry point at ``(filename, qualname)``."""
    named = _entries.get(entry)
    if named is None:
        if len(_entries) >= _MAX_CACHED:
            _entries.clear()
        what = f"{_package(entry[0])}.{entry[1]}"
        named = _entries[entry] = (what, _kind_of(what))
    return named


class WaitLog:
    """A task's long waits, as runs of consecutive waits on the same thing.

    A loop that awaits the same call 360 times is one run of count 360 (the
    N+1 pattern), so the log stays small however long the task lives.
    :meth:`add` is called when a step starts after a wait of at least
    ``min_ns``; ``runs`` is the ``extra["waits"]`` list; iterating the log
    gives its runs too (a finished task's record holds the log itself).

    Past ``max_runs``, each new run drops the closed run whose longest wait
    is shortest (the first of equals; never the open run, which may still
    grow). A long-lived task, such as a keep-alive connection's, gets there
    at every wait, so once the log is full it keeps a heap of its closed
    runs, each as one int, ``longest << 64 | arrival`` (ordered as the pair,
    compared as cheaply as an int), and each run's arrival number, beside
    ``runs``: a drop is a heap pop and a bisection, not a scan of the runs.
    A closed run never changes (only the open one, the last, grows).

    This class is the pure-Python twin: with the extension, tasks keep the C
    ``WaitLog`` (:data:`new_wait_log`), the same runs as structs, with no
    int or list made per wait and no GC container.
    """

    __slots__ = ("runs", "_closed", "_arrivals")

    #: Waits shorter than this are not described (the chain is not walked).
    min_ns: Final = 1_000_000
    #: Runs kept per task: the longest, once there are more.
    max_runs: Final = 64

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []
        #: Once the log is full: a heap of the closed runs' longest << 64 | arrival.
        self._closed: list[int] | None = None
        #: Once the log is full: each run's arrival number, in runs' order.
        self._arrivals: list[int] | None = None

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self.runs)

    def add(self, start_ns: int, end_ns: int, wait: Wait) -> None:
        what, kind, where, caller = wait
        waited = end_ns - start_ns
        runs = self.runs
        if runs:
            last = runs[-1]
            if last[5] == what and last[7] == where:
                last[1] = end_ns
                last[2] += 1
                last[3] += waited
                if waited > last[4]:
                    last[4] = waited
                    last[9] = end_ns
                return
        runs.append([start_ns, end_ns, 1, waited, waited, what, kind, where, caller, end_ns])
        if len(runs) > self.max_runs:
            self._drop()

    def _drop(self) -> None:
        """Drop the closed run with the shortest longest wait, the first of
        equals (a run was just added past ``max_runs``)."""
        runs = self.runs
        closed = self._closed
        arrivals = self._arrivals
        if closed is None or arrivals is None:
            # The first drop: every run but the new one is closed, numbered
            # in order (the numbers only order them).
            arrivals = self._arrivals = list(range(len(runs)))
            closed = self._closed = [run[4] << 64 | k for k, run in enumerate(runs[:-1])]
            heapify(closed)
        else:  # the new run closed the one before it
            arrival = arrivals[-1]
            arrivals.append(arrival + 1)
            heappush(closed, runs[-2][4] << 64 | arrival)
        i = bisect_left(arrivals, heappop(closed) & _ARRIVAL)
        del runs[i], arrivals[i]


#: The arrival number's bits in a WaitLog's heap entries.
_ARRIVAL: Final = (1 << 64) - 1

#: Makes a task's wait log: the extension's (runs as C structs), else the twin.
new_wait_log: Final[Callable[[], Any]] = getattr(_native.extension, "WaitLog", None) or WaitLog


#: The chain's key: the C walk when the extension is on, else the twin.
_await_key: Any = getattr(_native.extension, "await_key", None) or _await_key_py
