"""The pure-Python twin of ``aprof._ctracer`` (same interface, same packed format).

Used when the C extension could not be built, and by the tests, which run
every tracer scenario against both. The contract is ``aprof/_ctracer.pyi``;
the comments in ``aprof/_ctracer.c`` explain the format. This twin is slow
(every event is a Python call) but records the same events.
"""

from __future__ import annotations

import sys
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from time import perf_counter_ns
from types import CodeType, FunctionType, MethodType
from typing import Any, Final

__all__ = ["EVENT_BYTES", "Tracer"]

EVENT_BYTES: Final = 16

EV_CALL: Final = 1
EV_RETURN: Final = 2
EV_UNWIND: Final = 3
EV_CCALL: Final = 4
EV_CRETURN: Final = 5
EV_CRAISE: Final = 6
EV_SWITCH: Final = 7
EV_TIME: Final = 8
EV_EXC: Final = 9
EV_RECV: Final = 10

_IGNORED: Final = 1 << 31
_SELF_FLAG: Final = 1 << 30  # a method: first argument `self`
_CLS_FLAG: Final = 1 << 29  # a classmethod: first argument `cls`
_IDX: Final = (1 << 29) - 1
#: 3.13+ reads a frame's first local through its f_locals proxy (PEP 667);
#: before, f_locals makes a snapshot dict on the frame that keeps every
#: local alive with it, so the twin does not name receivers there.
_RECEIVERS: Final = sys.version_info >= (3, 13)
#: sys.monitoring.DISABLE (3.12+; the monitoring callbacks run only there).
_DISABLE: Final = getattr(getattr(sys, "monitoring", None), "DISABLE", None)
_MAX_THREADS: Final = 4096
#: keep_latest: the ring's segments (the one written and the sealed ones),
#: as in C; a segment holds at least this many events.
_RING_SEGS: Final = 8
_MIN_SEGMENT: Final = 4
_MONITORING: Final = sys.version_info >= (3, 12)

_running: list[Tracer] = []  # at most one tracer at a time, as in C


class _Thread:
    __slots__ = ("cur_lt", "ident", "last_lt", "last_val", "own_lt", "tidx")

    def __init__(self, tidx: int, own_lt: int) -> None:
        self.tidx = tidx
        self.ident = threading.get_ident()
        self.own_lt = own_lt
        self.cur_lt = -1
        self.last_val: object = None
        self.last_lt = own_lt


def _cfunc_key(callable: object) -> object | None:
    # C: the PyMethodDef pointer. Here: the function's kind and name, which
    # is as stable (a bound method made per call maps to one entry).
    t = type(callable)
    if t is _BUILTIN or t is _METHOD_DESCR:
        return getattr(callable, "__qualname__", None)
    return None


_BUILTIN: Final = type(len)
_METHOD_DESCR: Final = type(list.append)


def _method_flags(code: CodeType) -> int:
    """``_SELF_FLAG`` for a method (first argument ``self``) defined in a
    class body, ``_CLS_FLAG`` for a classmethod (``cls``), else 0 (as in C)."""
    if code.co_argcount < 1 or not code.co_varnames:
        return 0
    flag = {"self": _SELF_FLAG, "cls": _CLS_FLAG}.get(code.co_varnames[0], 0)
    owner, dot, _ = code.co_qualname.rpartition(".")
    return flag if dot and owner and not owner.endswith("<locals>") else 0


def _is_aprof_method(callable: object) -> bool:
    """A method of one of aprof's own classes (``record_function.__exit__``
    on the C ``RangeCore``): aprof's bookkeeping, not the program's C call."""
    owner = getattr(callable, "__objclass__", None)
    if owner is None:
        receiver = getattr(callable, "__self__", None)
        name = getattr(callable, "__name__", None)
        if receiver is None or name is None:
            return False
        owner = next((c for c in type(receiver).__mro__ if name in vars(c)), None)
    return owner is not None and getattr(owner, "__module__", "").startswith("aprof")


class Tracer:
    """See ``aprof/_ctracer.pyi``."""

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
        evaluator: bool = True,  # noqa: ARG002 - the C tracer's switch: the twin has no frame evaluator
        keep_latest: bool = False,
    ) -> None:
        if max_events < 0:
            raise ValueError("Tracer: max_events must be >= 0")
        if keep_latest and not max_events:
            raise ValueError("Tracer: keep_latest needs max_events > 0")
        self._c_calls = bool(c_calls)
        self._instance_ids = bool(instance_ids)
        self._recv_first: dict[int, int] = {}
        self._instances: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._serials: dict[type, int] = {}
        self._rf = rf_state
        self._recorder = recorder
        self._global = recorder is None
        self._lt_var = lt_var
        self._thread_lt = thread_lt
        self._prefix = ignore_prefix
        self._max = max_events
        self._buf = array("Q")
        # keep_latest (see ring_rotate in C): the sealed segments, oldest
        # first, with the words their rotation header took; a segment's size
        # in words.
        self._ring = bool(keep_latest)
        self._sealed: list[tuple[array[int], int]] = []
        self._head = 0
        self._let_go = False
        self._seg_words = 2 * max(max_events // _RING_SEGS - 1, _MIN_SEGMENT) if keep_latest else 0
        self._objs: list[Any] = []
        self._index: dict[object, int] = {}
        self._threads: dict[int, _Thread] = {}
        self._pos: object = None
        self._neg: object = None
        self._last_ns = 0
        self._start_ns = 0
        self._dropped = 0
        self._active = False
        self._prev_thread_hook: Any = None
        self._installed = False

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def count(self) -> int:
        return (sum(len(b) for b, _ in self._sealed) + len(self._buf)) // 2

    @property
    def active(self) -> bool:
        return self._active

    @property
    def degraded(self) -> bool:
        return False  # the twin never uses a frame evaluator

    @property
    def evaluator(self) -> bool:
        return False

    # -- the per-event path -------------------------------------------------

    def _in_context(self) -> bool:
        # Recording on in this context (SPEC 3.4) and, in context scope, the
        # profile's recorder: both fields of the immutable RFState, cached by
        # its identity as in C.
        v = self._rf.get(None)
        if v is None:
            return self._global
        if v is self._pos:
            return True
        if v is self._neg:
            return False
        ok = bool(getattr(v, "enabled", False)) and (self._global or getattr(v, "recorder", None) is self._recorder)
        if ok:
            self._pos = v
        else:
            self._neg = v
        return ok

    def _add(self, key: object, desc: object, ignored: bool) -> int:
        idx = len(self._objs)
        self._objs.append(desc)
        value = idx | (_IGNORED if ignored else 0)
        self._index[key] = value
        return value

    def _code_index(self, code: CodeType) -> int:
        v = self._index.get(code)
        if v is None:
            if self._prefix and code.co_filename.startswith(self._prefix):
                v = self._add(code, code, True)
            else:
                v = self._add(code, code, False) | _method_flags(code)
                self._index[code] = v
        return v

    def _obj_index(self, obj: object) -> int:
        v = self._index.get(id(obj))
        if v is None:
            v = self._add(id(obj), obj, False)
        return v

    def _thread(self) -> _Thread | None:
        ts = self._threads.get(threading.get_ident())
        if ts is None:
            if len(self._threads) >= _MAX_THREADS:
                return None
            lt = self._thread_lt()
            if lt is None:  # still starting up: not recorded yet
                return None
            ts = self._threads[threading.get_ident()] = _Thread(len(self._threads), self._obj_index(lt))
        return ts

    def _current_lt(self, ts: _Thread) -> int:
        v = self._lt_var.get(None)
        if v is ts.last_val and ts.cur_lt != -1:
            return ts.last_lt
        lt = ts.own_lt
        if type(v) is tuple and len(v) == 2 and v[1] == ts.ident:
            lt = self._obj_index(v[0])
        ts.last_val = v
        ts.last_lt = lt
        return lt

    def _push(self, tag: int, tidx: int, payload: int, now: int) -> None:
        buf = self._buf
        if self._ring:
            if len(buf) >= self._seg_words:
                buf = self._rotate(tidx)
        elif self._max and len(buf) >= 2 * self._max:
            self._dropped += 1
            return
        delta = now - self._last_ns if now > self._last_ns else 0
        if delta >> 32:
            buf.append(EV_TIME)
            buf.append(now)
            delta = 0
        self._last_ns = now
        buf.append(tag | (tidx << 4) | (delta << 32))
        buf.append(payload)

    def _rotate(self, tidx: int) -> array[int]:
        # As ring_rotate in aprof/_ctracer.c: seal the segment, let the
        # oldest go past _RING_SEGS, start the next with its header.
        old = self._buf
        self._sealed.append((old, self._head))
        if len(self._sealed) >= _RING_SEGS:
            gone, head = self._sealed.pop(0)
            self._let_go = True
            self._dropped += sum(1 for w in gone[2 * head :: 2] if w & 15 != EV_TIME)
        buf = self._buf = array("Q", (EV_TIME, self._last_ns))
        for ts in self._threads.values():
            if ts.tidx != tidx:
                ts.cur_lt = -1
            elif ts.cur_lt >= 0:
                buf.extend((EV_SWITCH | tidx << 4, ts.cur_lt))
        if old and old[-2] & 15 in (EV_RECV, EV_EXC):
            buf.extend((old[-2] & 0xFFFFFFFF, old[-1]))
        self._head = len(buf) // 2
        return buf

    def _record(self, tag: int, idx: int, now: int) -> None:
        if idx & _IGNORED:
            return
        ts = self._thread()
        if ts is None:
            return
        lt = self._current_lt(ts)
        if lt != ts.cur_lt:
            ts.cur_lt = lt
            self._push(EV_SWITCH, ts.tidx, lt, now)
        self._push(tag, ts.tidx, idx & _IDX, now)

    def _on_code(self, tag: int, code: CodeType, frame: Any = None) -> bool:
        """Record a frame event; True if the code is aprof's own (not recorded).

        ``frame``: the frame a CALL enters (3.13+), for a method's receiver.
        """
        if not self._active or not self._in_context():
            return False
        now = perf_counter_ns()
        idx = self._code_index(code)
        if idx & (_SELF_FLAG | _CLS_FLAG) and frame is not None and not idx & _IGNORED:
            self._receiver(idx, frame, now)
        self._record(tag, idx, now)
        return bool(idx & _IGNORED)

    def _receiver(self, idx: int, frame: Any, now: int) -> None:
        # As in C (aprof/_ctracer.c, "Method receivers"): a RECV before the
        # CALL, unless it is the code's first receiver again.
        names = frame.f_code.co_varnames
        recv = frame.f_locals.get(names[0]) if names else None
        if recv is None:
            return
        if idx & _CLS_FLAG:
            if not isinstance(recv, type):
                return
            r = self._obj_index(recv)
        elif self._instance_ids:
            r = self._instance_index(recv)
        else:
            r = self._obj_index(type(recv))
        code = idx & _IDX
        first = self._recv_first.get(code)
        if first == r:
            return
        if first is None:
            self._recv_first[code] = r
        self._record(EV_RECV, r, now)

    def _instance_index(self, obj: object) -> int:
        entry = self._instances.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        try:
            wr = weakref.ref(obj)
        except TypeError:  # no weak references to it: described by its class
            return self._obj_index(type(obj))
        cls = type(obj)
        serial = self._serials.get(cls, 0)
        self._serials[cls] = serial + 1
        idx = len(self._objs)
        self._objs.append((cls, serial))
        self._instances[id(obj)] = (wr, idx)
        return idx

    def _on_cfunc(self, tag: int, caller: CodeType, callable: object) -> bool:
        """Record a C call event; True if the caller is aprof's own code (not recorded)."""
        if not self._active:
            return False
        key = _cfunc_key(callable)
        if key is None or not self._in_context():
            return False
        now = perf_counter_ns()
        if self._code_index(caller) & _IGNORED:
            return True
        v = self._index.get(key)
        if v is None:
            v = self._add(key, (key, "<built-in>", 0), _is_aprof_method(callable))
        self._record(tag, v, now)
        return False

    # -- event sources ------------------------------------------------------

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        # sys.setprofile (3.11). A frame left by an exception reports
        # "return" with arg None here, so the twin cannot tell UNWIND apart.
        # Without C calls the C tracer uses a frame evaluator instead (3.11
        # and 3.12); the twin keeps the profile function and drops the C
        # events.
        if event == "call":
            self._on_code(EV_CALL, frame.f_code)
        elif event == "return":
            self._on_code(EV_RETURN, frame.f_code)
        elif not self._c_calls:
            return
        elif event == "c_call":
            self._on_cfunc(EV_CCALL, frame.f_code, arg)
        elif event == "c_return":
            self._on_cfunc(EV_CRETURN, frame.f_code, arg)
        elif event == "c_exception":
            self._on_cfunc(EV_CRAISE, frame.f_code, arg)

    def _thread_hook(self, frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(self._profile if self._active else None)
        if self._active:
            self._profile(frame, event, arg)

    # sys.monitoring (3.12+). The locations of aprof's own code are switched
    # off (DISABLE) where the event allows it, as the C tracer does; PY_THROW,
    # PY_UNWIND, C_RETURN and C_RAISE do not allow it.

    def py_start(self, code: CodeType, offset: int, /) -> Any:
        return _DISABLE if self._on_code(EV_CALL, code, sys._getframe(1) if _RECEIVERS else None) else None

    py_resume = py_start

    def py_throw(self, code: CodeType, offset: int, exc: BaseException, /) -> Any:
        self._on_code(EV_CALL, code, sys._getframe(1) if _RECEIVERS else None)

    def py_return(self, code: CodeType, offset: int, retval: object, /) -> Any:
        return _DISABLE if self._on_code(EV_RETURN, code) else None

    py_yield = py_return

    def py_unwind(self, code: CodeType, offset: int, exc: BaseException, /) -> Any:
        # The exception's type first (an EXC event), as the C tracer does.
        if not self._active or not self._in_context():
            return
        now = perf_counter_ns()
        idx = self._code_index(code)
        if idx & _IGNORED:
            return
        self._record(EV_EXC, self._obj_index(type(exc)), now)
        self._record(EV_UNWIND, idx, now)

    def call(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any:
        if type(callable) is _FUNCTION or type(callable) is _METHOD:
            return _DISABLE
        return _DISABLE if self._on_cfunc(EV_CCALL, code, callable) else None

    def c_return(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any:
        self._on_cfunc(EV_CRETURN, code, callable)

    def c_raise(self, code: CodeType, offset: int, callable: object, arg0: object, /) -> Any:
        self._on_cfunc(EV_CRAISE, code, callable)

    # -- lifecycle ----------------------------------------------------------

    def start(self, initial: Sequence[CodeType]) -> None:
        if self._active or self._start_ns:
            raise RuntimeError("Tracer.start: this tracer was already started")
        if _running:
            raise RuntimeError(
                "aprof: another profile with python_tracer=True is running in this process; "
                "only one Python tracer can run at a time"
            )
        if not _MONITORING:  # the twin's profile function, with or without C calls
            current = sys.getprofile()
            if current is not None:
                raise RuntimeError(
                    "aprof: python_tracer cannot start: another profiler is installed with sys.setprofile "
                    f"({current!r}); stop it first (cProfile, yappi and others use the same hook)"
                )
        self._start_ns = self._last_ns = perf_counter_ns()
        self._active = True
        for code in initial:
            if isinstance(code, CodeType):
                self._record(EV_CALL, self._code_index(code), self._start_ns)
        if not _MONITORING:
            self._prev_thread_hook = getattr(threading, "_profile_hook", None)
            threading.setprofile(self._thread_hook)
            sys.setprofile(self._profile)
            self._installed = True
        _running.append(self)

    def stop(self) -> None:
        self._active = False
        if self._installed:
            self._installed = False
            if sys.getprofile() == self._profile:
                sys.setprofile(None)
            threading.setprofile(self._prev_thread_hook)
            self._prev_thread_hook = None
        if self in _running:
            _running.remove(self)
        self._pos = self._neg = None

    def _packed(self) -> bytes:
        words = array("Q")
        if self._let_go:  # the codes' default receivers (see Tracer_take in C)
            for code, r in sorted(self._recv_first.items()):
                words.extend((EV_RECV, r, EV_CALL, code))
        for seg, _ in self._sealed:
            words.extend(seg)
        words.extend(self._buf)
        return words.tobytes()

    def peek(self) -> tuple[bytes, list[Any], int]:
        if not self._active:
            raise RuntimeError("Tracer.peek: the tracer is not running")
        # An event's two words are appended apart: a copy taken between
        # them (another thread's peek) ends with half an event, cut off.
        data = self._packed()
        return data[: len(data) - len(data) % EVENT_BYTES], list(self._objs), self._start_ns

    def take(self) -> tuple[bytes, list[Any], int]:
        if self._active:
            raise RuntimeError("Tracer.take: stop the tracer first")
        data, objs = self._packed(), self._objs
        self._buf = array("Q")
        self._sealed = []
        self._head = 0
        self._let_go = False
        self._objs = []
        self._index = {}
        self._threads = {}
        self._recv_first = {}
        self._instances = {}
        self._serials = {}
        return data, objs, self._start_ns


_FUNCTION: Final = FunctionType
_METHOD: Final = MethodType
