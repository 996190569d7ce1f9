"""The Python tracer against its peers, in one process.

    python bench/tracer.py                 # full run (fib(30), ~2-3 minutes)
    python bench/tracer.py --quick         # a smoke test (fib(22), 2 rounds)
    python bench/tracer.py --n 30 --rounds 7 --json /tmp/tracer.json

Workloads, each timed wall-clock with the profiler started before and stopped
after the timing (start/stop are outside it):

* ``fib(N)``: pure Python calls (N=30: 1.6M calls);
* mixed: Python calls, method calls, a generator, C calls (``len``,
  ``str.split``, ``dict.setdefault``, ``math.sqrt``).

Variants, round-robin (rotating order, GC before each sample): plain,
cProfile, yappi (wall clock), viztracer (default; one ``VizTracer`` built
once, before any timing, then only started, stopped and cleared: its
fairest configuration), pyinstrument,
``aprof.profile(python_tracer=True, tasks=False)`` (Python frames only, the
default: through the C tracer's PEP 523 frame evaluator on 3.11 and 3.12),
the same without the evaluator (its internal switch: the profile function on
3.11, sys.monitoring callbacks on 3.12; what 3.12 used before the
evaluator) and with ``c_calls=True``, and two floors: of a tracer that sees
C calls (on 3.11 a C profile function that does nothing,
``aprof._ctracer._noop_profile``; on 3.12+ a ``sys.monitoring`` tool whose
PY_START, PY_RESUME, PY_RETURN, PY_YIELD, CALL, C_RETURN and C_RAISE
callbacks are Python functions that do nothing), and on 3.12+ of one that
sees Python frames through sys.monitoring (PY_START, PY_RESUME, PY_RETURN
and PY_YIELD callbacks that are C callables doing nothing: the hooks of an
aprof tracer that never started), and on 3.11 and 3.12 of the frame
evaluator (``aprof._ctracer._noop_evaluator``: a PEP 523 evaluator that runs
every frame with the default one and records nothing). Then, for aprof alone:
bytes per raw event (resident memory and tracemalloc over the recording, and
the packed size),
and stop (replay + consolidation) plus Chrome export per million raw events.
Finally the figures are checked against the issue's targets.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, dump, header, interleave, median, table  # noqa: E402


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x = x
        self.y = y

    def norm(self) -> float:
        return math.sqrt(self.x * self.x + self.y * self.y)


def numbers(n: int) -> Any:
    yield from range(n)


def mixed(n: int) -> float:
    total = 0.0
    d: dict[str, int] = {}
    for i in range(n):
        p = Point(i, i + 1)
        total += p.norm()
        total += sum(numbers(4))
        s = str(i)
        total += len(s.split("1"))
        d.setdefault(s, 0)
    return total


# -- profilers: start() -> stop() ---------------------------------------------


def _aprof(c_calls: bool = False) -> Callable[[], Any]:
    import aprof

    prof = aprof.profile(python_tracer=True, tasks=False, c_calls=c_calls)
    prof.start()
    return prof.stop


def _aprof_c_calls() -> Callable[[], Any]:
    return _aprof(c_calls=True)


def _aprof_no_evaluator() -> Callable[[], Any]:
    from aprof._core import _tracer

    _tracer._evaluator = False  # read when the profile's tracer is made, at start
    try:
        return _aprof()
    finally:
        _tracer._evaluator = True


def _idle_hooks() -> Any:
    """An aprof C tracer that never starts: its sys.monitoring hooks return
    None at once (C callables doing nothing)."""
    from aprof._core import _tracer
    from aprof._core._callbacks import RF_STATE
    from aprof._ctracer import Tracer

    return Tracer(RF_STATE, None, _tracer.TRACER_LT, _tracer._starting_thread_lt, _tracer.APROF_DIR)


def _monitoring_floor(frames_only: bool) -> Callable[[], Any]:
    mon = sys.monitoring  # type: ignore[attr-defined]
    tool = 4  # a free tool id (aprof's tracer uses PROFILER_ID, 2)
    mon.use_tool_id(tool, "bench floor")
    ev = mon.events
    bits = [ev.PY_START, ev.PY_RESUME, ev.PY_RETURN, ev.PY_YIELD]
    if not frames_only:
        bits += [ev.CALL, ev.C_RETURN, ev.C_RAISE]
    idle = _idle_hooks() if frames_only else None
    for bit, name in zip(bits, ["py_start", "py_resume", "py_return", "py_yield", "", "", ""], strict=False):
        mon.register_callback(tool, bit, getattr(idle, name) if idle is not None else lambda *a: None)
    mon.set_events(tool, sum(bits))

    def stop() -> None:
        mon.set_events(tool, 0)
        for bit in bits:
            mon.register_callback(tool, bit, None)
        mon.free_tool_id(tool)

    return stop


def _floor() -> Callable[[], Any]:
    """The floor of any tracer that sees C calls (see the module docstring)."""
    if sys.version_info < (3, 12):
        from aprof._ctracer import _noop_profile

        _noop_profile(True)
        return lambda: _noop_profile(False)
    return _monitoring_floor(frames_only=False)


def _frames_floor() -> Callable[[], Any]:
    """3.12+: the floor of a tracer of Python frames through sys.monitoring."""
    if sys.version_info < (3, 12):
        raise RuntimeError("3.12+ only (sys.monitoring)")
    return _monitoring_floor(frames_only=True)


def _evaluator_floor() -> Callable[[], Any]:
    """3.11 and 3.12: a PEP 523 frame evaluator that runs every frame with the
    default one and records nothing: the interpreter's side of the default
    tracer, before aprof does anything."""
    from aprof._ctracer import _noop_evaluator

    _noop_evaluator(True)
    return lambda: _noop_evaluator(False)


def _cprofile() -> Callable[[], Any]:
    import cProfile

    pr = cProfile.Profile()
    pr.enable()
    return pr.disable


def _yappi() -> Callable[[], Any]:
    import yappi

    yappi.set_clock_type("wall")
    yappi.start()

    def stop() -> None:
        yappi.stop()
        yappi.clear_stats()

    return stop


_VIZ: list[Any] = []


def _viztracer() -> Callable[[], Any]:
    if not _VIZ:  # built once: the first (untimed) start builds it
        from viztracer import VizTracer

        _VIZ.append(VizTracer(verbose=0))
    tracer = _VIZ[0]
    tracer.start()

    def stop() -> None:
        tracer.stop()
        tracer.clear()

    return stop


def _pyinstrument() -> Callable[[], Any]:
    from pyinstrument import Profiler

    p = Profiler()
    p.start()
    return p.stop


PEERS: dict[str, Callable[[], Callable[[], Any]] | None] = {
    "plain": None,
    "cProfile": _cprofile,
    "yappi wall": _yappi,
    "viztracer": _viztracer,
    "pyinstrument": _pyinstrument,
    "aprof tracer": _aprof,
    "aprof, no evaluator": _aprof_no_evaluator,
    "aprof, C calls": _aprof_c_calls,
    "floor (C calls)": _floor,
    "floor (frames, monitoring)": _frames_floor,
    "floor (frame evaluator)": _evaluator_floor,
}


def make_case(name: str, start: Callable[[], Callable[[], Any]] | None, work: Callable[[], Any]) -> Case:
    def run() -> float:
        stop = start() if start is not None else None
        try:
            t0 = time.perf_counter()
            work()
            return (time.perf_counter() - t0) * 1e3
        finally:
            if stop is not None:
                stop()

    case = Case(name, run)
    if start is not None:
        try:  # a peer that is not installed is reported, not fatal
            start()()
        except Exception as exc:  # noqa: BLE001
            case.run = None
            case.missing = f"missing ({type(exc).__name__}: {exc})"
    return case


# -- aprof alone -----------------------------------------------------------------


def _resident() -> int:
    """This process's resident bytes (Linux: /proc/self/statm), else 0."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def aprof_memory(n: int) -> dict[str, float]:
    """Bytes the tracer holds per raw event while recording fib(n): the
    growth of resident memory (the C tracer's buffer of 1 MiB or more is a
    mapping of its own, which tracemalloc does not see), and tracemalloc's
    count of what Python's allocators hold."""
    import aprof

    fib(n)  # every code object and cache warm, outside the measurement
    gc.collect()
    tracemalloc.start()
    prof = aprof.profile(python_tracer=True, tasks=False)
    before, rss0 = tracemalloc.get_traced_memory()[0], _resident()
    prof.start()
    fib(n)
    after, rss1 = tracemalloc.get_traced_memory()[0], _resident()
    tracer = prof._tracer
    count = tracer.tracer.count if tracer is not None else 0
    event_bytes = getattr(tracer.impl, "EVENT_BYTES", 0) if tracer is not None else 0
    tracemalloc.stop()
    prof.stop()
    return {
        "events": count,
        "bytes_per_event_traced": (after - before) / max(count, 1),
        "bytes_per_event_resident": (rss1 - rss0) / max(count, 1),
        "packed_bytes": event_bytes,
    }


def aprof_post(n: int, rounds: int) -> dict[str, float]:
    """stop() (replay + consolidation) and Chrome export, per million raw events."""
    import aprof

    stops, exports, counts = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            gc.collect()
            prof = aprof.profile(python_tracer=True, tasks=False)
            prof.start()
            fib(n)
            tracer = prof._tracer
            count = tracer.tracer.count if tracer is not None else 0
            t0 = time.perf_counter()
            prof.stop()
            t1 = time.perf_counter()
            prof.export_chrome_trace(os.path.join(tmp, "t.json"))
            t2 = time.perf_counter()
            stops.append(t1 - t0)
            exports.append(t2 - t1)
            counts.append(count)
            del prof
    per = 1e6 / (sum(counts) / len(counts))
    stops.sort()
    exports.sort()
    s, e = stops[len(stops) // 2], exports[len(exports) // 2]
    return {"events": counts[0], "stop_s": s, "export_s": e, "stop_per_M": s * per, "export_per_M": e * per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="fib(N) (default 30)")
    ap.add_argument("--mixed", type=int, default=100_000, help="iterations of the mixed workload")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.n, args.mixed, args.rounds = 22, 5_000, 2
    from aprof._core._tracer import implementation

    print(header())
    print(f"aprof tracer implementation: {implementation().__name__}\n")

    fib_cases = [make_case(name, start, lambda: fib(args.n)) for name, start in PEERS.items()]
    interleave(fib_cases, args.rounds, collect=True, rotate=True, progress=True)
    print(f"\nfib({args.n}), milliseconds\n" + table(fib_cases, "plain", "ms"))

    mixed_cases = [make_case(name, start, lambda: mixed(args.mixed)) for name, start in PEERS.items()]
    interleave(mixed_cases, args.rounds, collect=True, rotate=True, progress=True)
    print(f"\nmixed({args.mixed}), milliseconds\n" + table(mixed_cases, "plain", "ms"))

    mem = aprof_memory(min(args.n, 25))
    print(
        f"\nraw events: {mem['packed_bytes']} bytes packed; held while recording {mem['events']:,} events "
        f"(the buffer grown by doubling): {mem['bytes_per_event_resident']:.1f} bytes per event resident, "
        f"{mem['bytes_per_event_traced']:.1f} in Python's allocators (tracemalloc)"
    )
    post = aprof_post(min(args.n, 27), 3)
    print(
        f"stop (replay + consolidation): {post['stop_s']:.2f} s for {post['events']:,} raw events "
        f"= {post['stop_per_M']:.2f} s per 1M; Chrome export {post['export_s']:.2f} s = {post['export_per_M']:.2f} s per 1M; "
        f"together {post['stop_per_M'] + post['export_per_M']:.2f} s per 1M"
    )

    def ratio(cases: list[Case], name: str) -> float:
        by = {c.name: c for c in cases}
        return median(by[name]) / median(by["plain"]) if by[name].samples else float("nan")

    r_aprof, r_viz = ratio(fib_cases, "aprof tracer"), ratio(fib_cases, "viztracer")
    r_c, r_floor = ratio(fib_cases, "aprof, C calls"), ratio(fib_cases, "floor (C calls)")
    r_noeval, r_ffloor = ratio(fib_cases, "aprof, no evaluator"), ratio(fib_cases, "floor (frames, monitoring)")
    r_efloor = ratio(fib_cases, "floor (frame evaluator)")
    checks = [
        (f"fib({args.n}) under the aprof tracer (default) <= 3.0x plain", r_aprof <= 3.0, f"{r_aprof:.2f}x"),
        ("... and <= 0.65x viztracer's slowdown (by the clock; in instructions: tracer_callgrind.py --report)",
         r_aprof <= 0.65 * r_viz, f"{r_aprof / r_viz:.2f} of viztracer's {r_viz:.2f}x"),
        (f"fib({args.n}) with C calls (reported, no target)", True,
         f"{r_c:.2f}x plain, {r_c / r_viz:.2f} of viztracer's; the floor (do-nothing hooks) {r_floor:.2f}x"),
        (f"fib({args.n}) without the frame evaluator (reported, no target)", True,
         f"{r_noeval:.2f}x plain, {r_noeval / r_viz:.2f} of viztracer's; 3.12+: do-nothing frame callbacks "
         f"{r_ffloor:.2f}x"),
        (f"fib({args.n}) under a do-nothing frame evaluator (the default's floor; reported, no target)", True,
         f"{r_efloor:.2f}x plain"),
        ("<= 16 bytes per raw event (packed)", mem["packed_bytes"] <= 16, f"{mem['packed_bytes']} B"),
        ("stop + replay + Chrome export of 1M events <= 2 s", post["stop_per_M"] + post["export_per_M"] <= 2.0,
         f"{post['stop_per_M'] + post['export_per_M']:.2f} s"),
    ]  # fmt: skip
    print("\ntargets (from the issue):")
    for what, ok, value in checks:
        print(f"  {'ok    ' if ok else 'MISSED'} {what}: {value}")
    dump(args.json, fib_cases + mixed_cases, {"memory": mem, "post": post})


if __name__ == "__main__":
    main()
