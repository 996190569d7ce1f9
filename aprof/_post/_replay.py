"""Replay the Python tracer's packed events into range records (SPEC 8.1, 8.2).

The tracer (``aprof/_ctracer.c`` or its twin) writes two 64-bit words per
event; see ``aprof/_ctracer.pyi`` for the format. Replay walks them once, in
order, keeping one call stack per logical thread:

* a CALL (a frame starting or resuming, or a C call) opens a record on the
  logical thread the event ran in, so a coroutine's frames land on its
  task's track;
* a RETURN (a return, a yield, an exception leaving the frame) closes the
  innermost open record of the same code; records opened above it (a frame
  whose return was not seen) are closed at the same time. A return with no
  matching call (a frame that was on the stack when a task started, say) is
  skipped;
* records still open at the end are left open: consolidation closes them at
  the stop time and flags them ``unfinished``;
* a RECV names the receiver of the method CALL right after it: its class, or
  with ``instance_ids`` the instance (class and serial). The first RECV of a
  code is its default: a later CALL of that code without a RECV had the
  same receiver (the tracer writes only the changes).

The records are appended to the profile's per-logical-thread lists in the
recorder's own tuple format, so consolidation nests Python calls and ranges
together, and tracks, exports and analysis treat them like any range.
"""

from __future__ import annotations

import os
import sysconfig
from types import CodeType
from typing import TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope
from .._core._threads import LogicalThread
from .._core._tracer_py import (  # the packed format's tags, one definition (the C file mirrors it)
    EV_CALL,
    EV_CCALL,
    EV_EXC,
    EV_RECV,
    EV_SWITCH,
    EV_TIME,
    EV_UNWIND,
)

if TYPE_CHECKING:
    from .._core._recorder import ProfilerState

__all__ = ["prune_filename", "replay"]

_SCOPE: Final = RecordScope.PYTHON_FUNCTION.value
_SEARCH: Final = 32  # how deep a return looks for its call before it is skipped


def _prefixes() -> list[str]:
    out = []
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.append(os.path.join(p, ""))
    try:
        out.append(os.path.join(os.getcwd(), ""))
    except OSError:
        pass
    # Longest first: site-packages lives inside the stdlib directory.
    return sorted(set(out), key=len, reverse=True)


def prune_filename(path: str, prefixes: list[str] | None = None) -> str:
    """Shorten a file name for display (SPEC 8.2).

    Everything up to ``site-packages/`` (or ``dist-packages/``) goes, as do
    the standard library's directory and the working directory.

    Example:
        >>> prune_filename("/usr/lib/python3.11/site-packages/anyio/_core/_tasks.py")
        'anyio/_core/_tasks.py'
    """
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker) :]
    for p in prefixes if prefixes is not None else _prefixes():
        if path.startswith(p):
            return path[len(p) :]
    return path


def _describe(obj: Any, prefixes: list[str]) -> str:
    if isinstance(obj, CodeType):
        return f"{prune_filename(obj.co_filename, prefixes)}({obj.co_firstlineno}): {obj.co_qualname}"
    if isinstance(obj, tuple):
        return f"<built-in method {obj[0]}>"
    if isinstance(obj, type):  # an exception type (EXC events)
        return obj.__name__
    return repr(obj)


def _class_name(cls: Any) -> str:
    name = getattr(cls, "__qualname__", None)
    return name if isinstance(name, str) else getattr(cls, "__name__", "?")


def describe_receiver(code: CodeType, recv: Any, prefixes: list[str]) -> str:
    """The name of a method frame of ``code`` called on ``recv`` (issue 15 item 8).

    ``recv`` is the receiver's class, or with ``instance_ids`` a ``(class,
    serial)`` pair. A method called on the class that defines it keeps its
    plain name; on another class (a subclass inheriting it) the class is
    added; an instance gets its class and serial:

    * ``mod.py(3): Module.__call__`` (a ``Module``),
    * ``mod.py(3): Module.__call__ [Linear]`` (a ``Linear(Module)``),
    * ``mod.py(3): Module.__call__ [Linear#1]`` (the second ``Linear`` seen).
    """
    base = _describe(code, prefixes)
    owner = code.co_qualname.rpartition(".")[0]
    # A class defined in the same function as the method's class is named
    # without that function's "f.<locals>." prefix, which the frame shows.
    scope = owner[: owner.rfind("<locals>.") + len("<locals>.")] if "<locals>." in owner else ""
    cls = _class_name(recv[0] if isinstance(recv, tuple) else recv)
    if scope and cls.startswith(scope):
        cls = cls[len(scope) :]
    if isinstance(recv, tuple):
        return f"{base} [{cls}#{recv[1]}]"
    return base if cls == owner[len(scope) :] else f"{base} [{cls}]"


def replay(data: bytes, objs: list[Any], start_ns: int, state: ProfilerState, fast: Any = None) -> None:
    """Append the tracer's calls to ``state``'s per-logical-thread lists.

    Args:
        data: The packed events (16 bytes each).
        objs: The object table: code objects, ``(name, file, line)`` of C
            functions, and logical threads, by index.
        start_ns: The clock value the first event's delta counts from.
        state: The stopped profile's state.
        fast: ``aprof._ctracer.replay`` (the loop below, in C), or None.
    """
    if fast is not None and data:
        prefixes = _prefixes()
        names: list[str | None] = [None] * len(objs)
        lts: list[tuple[list[Any], int] | None] = [None] * len(objs)
        for i, obj in enumerate(objs):
            if isinstance(obj, LogicalThread):
                lts[i] = (state.list_for(obj), obj.id)
            else:  # exact strs (str.__str__ copies a subclass): the C replay packs them in RangeBlocks
                names[i] = str.__str__(_describe(obj, prefixes))

        def recv_name(code: int, recv: int) -> str:
            return str.__str__(describe_receiver(objs[code], objs[recv], prefixes))

        fast(data, names, lts, start_ns, _SCOPE, recv_name)
        return
    _replay_py(data, objs, start_ns, state)


def _replay_py(data: bytes, objs: list[Any], start_ns: int, state: ProfilerState) -> None:
    words = memoryview(data).cast("Q")
    if not len(words):
        return
    prefixes = _prefixes()
    cache: list[str | None] = [None] * len(objs)
    # Per logical thread (by object index): [its list, open calls' keys,
    # open calls' record indexes, its id]; two flat stacks, no tuple a call.
    per_lt: dict[int, tuple[list[Any], list[int], list[int], int]] = {}
    # Per OS thread index: the logical thread it runs now.
    cur: list[tuple[list[Any], list[int], list[int], int] | None] = [None] * 4096
    scope = _SCOPE
    pending_exc: str | None = None  # from an EXC event, for the UNWIND right after it
    pending_recv = -1  # from a RECV event, for the CALL right after it
    recv_default: dict[int, int] = {}  # code index -> its first receiver (see above)
    recv_names: dict[tuple[int, int], str] = {}
    t = start_ns
    it = iter(words)
    for w, p in zip(it, it, strict=True):
        t += w >> 32
        tag = w & 15
        if tag == EV_CALL or tag == EV_CCALL:  # noqa: SIM109 - two compares beat a tuple here
            # A CALL's receiver: the RECV right before it, else its code's
            # default (its first RECV, as the tracer wrote it).
            recv, pending_recv = pending_recv, -1
            if tag == EV_CALL:
                if recv < 0:
                    recv = recv_default.get(p, -1)
                else:
                    recv_default.setdefault(p, recv)
            ctx = cur[(w >> 4) & 0xFFF]
            if ctx is None:
                continue
            lst = ctx[0]
            if recv >= 0:
                name = recv_names.get((p, recv))
                if name is None:
                    name = recv_names[p, recv] = describe_receiver(objs[p], objs[recv], prefixes)
            else:
                name = cache[p]
                if name is None:
                    name = cache[p] = _describe(objs[p], prefixes)
            ctx[1].append(p)
            ctx[2].append(len(lst))
            lst.append((name, scope, t, None))
        elif tag == EV_SWITCH:
            c = per_lt.get(p)
            if c is None:
                lt = objs[p]
                if not isinstance(lt, LogicalThread):
                    continue
                c = per_lt[p] = (state.list_for(lt), [], [], lt.id)
            cur[(w >> 4) & 0xFFF] = c
        elif tag == EV_TIME:
            t = p
        elif tag == EV_EXC:
            pending_exc = _describe(objs[p], prefixes)
        elif tag == EV_RECV:
            pending_recv = p
        else:  # a return of some kind (an UNWIND names its exception)
            exc = pending_exc if tag == EV_UNWIND else None
            pending_exc = None
            ctx = cur[(w >> 4) & 0xFFF]
            if ctx is None:
                continue
            keys = ctx[1]
            if not keys:
                continue
            if keys[-1] == p:
                keys.pop()
                ctx[0].append((ctx[2].pop(), t, ctx[3], exc))
                continue
            # A missed return (or one whose call was not seen): find the
            # call within a bounded depth, closing what was opened above it.
            depth = len(keys)
            for j in range(depth - 1, max(-1, depth - 1 - _SEARCH), -1):
                if keys[j] == p:
                    lst, idxs, tid = ctx[0], ctx[2], ctx[3]
                    for k in range(depth - 1, j - 1, -1):
                        lst.append((idxs[k], t, tid, exc if k == j else None))
                    del keys[j:]
                    del idxs[j:]
                    break
