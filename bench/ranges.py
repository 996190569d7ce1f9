"""Cost of one range (enter + exit), aprof against its peers, in one process.

    python bench/ranges.py                # full run (a few minutes)
    python bench/ranges.py --quick        # a few seconds: a smoke test
    python bench/ranges.py --json out.json

Each case is ``with <constructor>("x"): pass`` in a tight loop, the
constructor call included, compiled inline (no extra call per iteration).
Cases run round-robin over several rounds, so machine noise hits them all
alike; the table gives the median and minimum ns per range and the ratio to
``nullcontext()``.

Cases: ``nullcontext()``; aprof with nothing registered; aprof with a profile
running (in a plain thread, in the task that started the profile, and in a
task it spawned; the profile is restarted every round); torch's
``record_function`` and ``_RecordFunctionFast``, each without and with torch's
profiler (CPU); an OpenTelemetry SDK span (``SimpleSpanProcessor`` into an
in-memory exporter, cleared every round); viztracer's ``log_event`` (with
viztracer tracing, as it must be for log_event to record). Peers that are not
installed are reported as missing.

Then, in a fresh child process: record 1M ranges under one profile and time
``stop()`` (consolidation) and ``export_chrome_trace()``, with memory. In
this process, time ``export_opentelemetry()`` of 20,000 ranges into an SDK
provider that drops the spans (per span; skipped without the SDK).
Finally the figures are checked against the issue's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Case,
    aprof_info,
    dump,
    empty_loop_ns,
    header,
    interleave,
    load_average,
    median,
    peak_rss_bytes,
    rss_bytes,
    table,
    with_loop,
)

BASELINE = "nullcontext()"
APROF_IDLE = "aprof, nothing registered"
APROF_ON = {
    "thread": "aprof, profile running (plain thread)",
    "profiling task": "aprof, profile running (profiling task)",
    "spawned task": "aprof, profile running (spawned task)",
}
#: Stack depth of the with_stack cases (the issue's figure: ~16 us a range at depth 23).
STACK_DEPTH = 23
APROF_STACK = {
    "off": f"aprof, profile running, depth {STACK_DEPTH} (plain thread)",
    "on": f"aprof, profile with_stack, depth {STACK_DEPTH} (plain thread)",
}
APROF_DECORATED = {
    "plain": "plain function call (no decorator)",
    "idle": "aprof @record_function call, nothing registered",
    "on": "aprof @record_function call, profile running",
}
TORCH = {
    "rf": "torch record_function",
    "fast": "torch _RecordFunctionFast",
    "rf on": "torch record_function, torch profiler on",
    "fast on": "torch _RecordFunctionFast, torch profiler on",
}
OTEL = "OpenTelemetry SDK span"
VIZ = "viztracer log_event (tracing on)"

#: The issue's targets (Python 3.11, a 2-core machine).
TARGET_IDLE_RATIO = 1.3
TARGET_ON_NS = 1000.0
TARGET_ON_RATIO = 1.3  # issue 18: a range with a profile running, against nullcontext(), by wall clock
TARGET_STACK_NS = 2000.0  # issue 15 item 7: with_stack at depth 23
TARGET_STOP_S_PER_M = 1.0


class Sizer:
    """Iterations per sample for each case: about ``target_s`` of work, within [lo, hi].

    A slow peer (an OpenTelemetry span costs tens of microseconds) would
    otherwise take most of the run; a fast case still gets ``hi`` iterations.
    The first call of each case is a small warm-up whose result is discarded.
    """

    def __init__(self, hi: int, lo: int, target_s: float) -> None:
        self.hi, self.lo, self.target_s = hi, lo, target_s

    def sized(self, body: Callable[[int], float]) -> Callable[[], float]:
        n: list[int] = []

        def run() -> float:
            if not n:
                cost = body(min(2_000, self.hi))  # warm-up: imports, caches, first allocations
                n.append(max(self.lo, min(self.hi, int(self.target_s * 1e9 / max(cost, 1.0)))))
            return body(n[0])

        return run


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence fd 2 (torch's profiler prints USDT lines there at start and stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# -- aprof --------------------------------------------------------------------


def aprof_cases(sizer: Sizer) -> list[Case]:
    info = aprof_info()
    if not info["importable"]:
        why = f"missing (import aprof failed: {info['error']})"
        return [
        Case(APROF_IDLE, None, why),
        *(Case(name, None, why) for name in (*APROF_ON.values(), *APROF_STACK.values(), *APROF_DECORATED.values()))
    ]
    import aprof

    rf_loop = with_loop('record_function("x")', {"record_function": aprof.record_function})
    checked: set[str] = set()

    def check(case_name: str, prof: Any, n: int) -> None:
        """Once per case: the profile did record every range (a fast but broken path would look good)."""
        if case_name in checked:
            return
        checked.add(case_name)
        got = sum(1 for e in prof.events() if e.name == "x")
        if got != n:
            raise RuntimeError(f"the profile recorded {got:,} of {n:,} ranges")

    def idle(n: int) -> float:
        if aprof.has_callbacks():
            raise RuntimeError("a callback is registered: 'nothing registered' would be wrong")
        return rf_loop(n)

    def on_thread(n: int) -> float:
        prof = aprof.profile()
        prof.start()
        try:
            ns = rf_loop(n)
        finally:
            prof.stop()
        check(APROF_ON["thread"], prof, n)
        return ns

    def on_task(where: str) -> Callable[[int], float]:
        def run(n: int) -> float:
            async def main() -> tuple[float, Any]:
                prof = aprof.profile()
                async with prof:
                    if where == "profiling task":
                        ns = rf_loop(n)
                    else:

                        async def child() -> float:
                            return rf_loop(n)

                        ns = await asyncio.create_task(child())
                return ns, prof

            ns, prof = asyncio.run(main())
            check(APROF_ON[where], prof, n)
            return ns

        return run

    def at_depth(fn: Callable[[int], float], n: int) -> float:
        """``fn(n)`` called so that a range opened in ``fn``'s loop has STACK_DEPTH frames."""
        below, f = 0, sys._getframe()
        while f is not None:
            below += 1
            f = f.f_back  # type: ignore[assignment]

        def deeper(k: int) -> float:
            return deeper(k - 1) if k > 0 else fn(n)

        # The compiled loop's frame and with_loop's wrapper, deeper(k)..deeper(0),
        # then at_depth and what is below it.
        return deeper(max(0, STACK_DEPTH - below - 3))

    def stack_case(with_stack: bool) -> Callable[[int], float]:
        name = APROF_STACK["on" if with_stack else "off"]

        def run(n: int) -> float:
            prof = aprof.profile(with_stack=with_stack)
            prof.start()
            try:
                ns = at_depth(rf_loop, n)
            finally:
                prof.stop()
            check(name, prof, n)
            if with_stack:
                depth = len(next(e for e in prof.events() if e.name == "x").stack or ())
                if depth != STACK_DEPTH:
                    raise RuntimeError(f"with_stack case at depth {depth}, not {STACK_DEPTH}")
            return ns

        return run

    @aprof.record_function("x")
    def decorated() -> None:
        pass

    def undecorated() -> None:
        pass

    call_decorated = call_loop(decorated)
    call_plain = call_loop(undecorated)

    def decorated_on(n: int) -> float:
        prof = aprof.profile()
        prof.start()
        try:
            ns = call_decorated(n)
        finally:
            prof.stop()
        check(APROF_DECORATED["on"], prof, n)
        return ns

    return [
        Case(APROF_IDLE, sizer.sized(idle)),
        Case(APROF_ON["thread"], sizer.sized(on_thread)),
        Case(APROF_ON["profiling task"], sizer.sized(on_task("profiling task"))),
        Case(APROF_ON["spawned task"], sizer.sized(on_task("spawned task"))),
        Case(APROF_STACK["off"], sizer.sized(stack_case(False))),
        Case(APROF_STACK["on"], sizer.sized(stack_case(True))),
        Case(APROF_DECORATED["plain"], sizer.sized(call_plain)),
        Case(APROF_DECORATED["idle"], sizer.sized(call_decorated)),
        Case(APROF_DECORATED["on"], sizer.sized(decorated_on)),
    ]


def call_loop(fn: Callable[[], Any]) -> Callable[[int], float]:
    """``loop(n)``: ns per ``fn()`` call, the loop compiled inline as in ``with_loop``."""
    src = (
        "def _loop(_n, _clock):\n"
        "    _it = range(_n)\n"
        "    _t0 = _clock()\n"
        "    for _ in _it:\n"
        "        _fn()\n"
        "    return (_clock() - _t0) / _n\n"
    )
    ns: dict[str, Any] = {"_fn": fn}
    exec(compile(src, "<bench: call>", "exec"), ns)
    loop = ns["_loop"]
    clock = time.perf_counter_ns

    def run(n: int) -> float:
        return float(loop(n, clock))

    return run


# -- peers ---------------------------------------------------------------------


def torch_cases(sizer: Sizer) -> list[Case]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Failed to initialize NumPy" when numpy is absent
            import torch
            from torch.autograd.profiler import record_function as torch_record_function

        fast = torch._C._profiler._RecordFunctionFast
    except ImportError:
        return [Case(name, None, "missing (pip install torch==2.13.0)") for name in TORCH.values()]
    except AttributeError as exc:
        return [Case(name, None, f"missing ({exc})") for name in TORCH.values()]

    rf_loop = with_loop('record_function("x")', {"record_function": torch_record_function})
    fast_loop = with_loop('RecordFunctionFast("x")', {"RecordFunctionFast": fast})

    def with_profiler(loop: Callable[[int], float]) -> Callable[[int], float]:
        def run(n: int) -> float:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with quiet_stderr():
                prof.__enter__()  # type: ignore[no-untyped-call]
            try:
                return loop(n)
            finally:
                with quiet_stderr():
                    prof.__exit__(None, None, None)  # type: ignore[no-untyped-call]

        return run

    return [
        Case(TORCH["rf"], sizer.sized(rf_loop)),
        Case(TORCH["fast"], sizer.sized(fast_loop)),
        Case(TORCH["rf on"], sizer.sized(with_profiler(rf_loop))),
        Case(TORCH["fast on"], sizer.sized(with_profiler(fast_loop))),
    ]


def otel_case(sizer: Sizer) -> Case:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return Case(OTEL, None, "missing (pip install opentelemetry-sdk)")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("aprof-bench")
    loop = with_loop('tracer.start_as_current_span("x")', {"tracer": tracer})

    def run(n: int) -> float:
        exporter.clear()
        try:
            return loop(n)
        finally:
            exporter.clear()

    return Case(OTEL, sizer.sized(run), note="SDK TracerProvider, SimpleSpanProcessor into an InMemorySpanExporter")


def otel_export(n_ranges: int) -> dict[str, Any]:
    """Record ``n_ranges`` ranges, then time ``export_opentelemetry`` into an
    SDK provider whose exporter drops the spans: the cost of sending a
    profile to a tracing backend afterwards, per span (mostly the SDK's)."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return {"error": "missing (pip install opentelemetry-sdk)"}
    import aprof

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    with aprof.profile() as prof:
        for _ in range(n_ranges):
            with aprof.record_function("r"):
                pass
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        spans = prof.export_opentelemetry(provider)
        times.append(time.perf_counter() - t0)
    provider.shutdown()
    return {"spans": spans, "seconds": times, "ns_per_span": min(times) * 1e9 / spans}


def viztracer_case(sizer: Sizer) -> Case:
    try:
        from viztracer import VizTracer  # type: ignore[import-untyped]
    except ImportError:
        return Case(VIZ, None, "missing (pip install viztracer)")

    def run(n: int) -> float:
        # log_event records only while the tracer runs, and the tracer then
        # also logs log_event's own Python calls (about 4 entries per range).
        tracer = VizTracer(verbose=0, tracer_entries=max(8 * n, 100_000))
        loop = with_loop('tracer.log_event("x")', {"tracer": tracer})
        tracer.start()
        try:
            return loop(n)
        finally:
            tracer.stop()
            tracer.clear()

    return Case(VIZ, sizer.sized(run), note="viztracer tracing (as log_event requires); its own calls are traced too")


# -- consolidation and export ---------------------------------------------------


def consolidation(n_events: int, inner: int = 999) -> dict[str, Any]:
    """Record n_events ranges (outer ranges of ``inner`` nested ones), stop, export.

    Runs in a fresh process (see ``main``), so its memory figures start clean.
    """
    import gc

    import aprof

    outer = max(1, n_events // (inner + 1))
    expected = outer * (inner + 1)
    rf = aprof.record_function
    gc.collect()
    rss0 = rss_bytes()
    prof = aprof.profile()
    prof.start()
    t0 = time.perf_counter()
    for _ in range(outer):
        with rf("outer"):
            for _ in range(inner):
                with rf("inner"):
                    pass
    record_s = time.perf_counter() - t0
    rss_raw = rss_bytes()
    t0 = time.perf_counter()
    prof.stop()
    stop_s = time.perf_counter() - t0
    rss_stopped = rss_bytes()
    events = prof.events()
    n = len(events)
    nested_ok = sum(1 for e in events if e.name == "inner" and e.parent is not None and e.parent.name == "outer")
    del events
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        t0 = time.perf_counter()
        prof.export_chrome_trace(path)
        export_s = time.perf_counter() - t0
        size = os.path.getsize(path)
    rss_export = rss_bytes()
    peak = peak_rss_bytes()
    out: dict[str, Any] = {
        "outer": outer,
        "inner": inner,
        "expected": expected,
        "events": n,
        "nested_ok": nested_ok,
        "record_s": record_s,
        "stop_s": stop_s,
        "export_s": export_s,
        "trace_bytes": size,
        "peak_rss_bytes": peak,
    }
    if rss0 is not None and rss_raw is not None and rss_stopped is not None and rss_export is not None:
        out |= {
            "rss_start_bytes": rss0,
            "raw_bytes_per_range": (rss_raw - rss0) / max(expected, 1),
            "rss_after_stop_bytes": rss_stopped,
            "rss_after_export_bytes": rss_export,
            "peak_growth_bytes": peak - rss0,
        }
    return out


def run_consolidation_child(n_events: int) -> dict[str, Any]:
    """Run ``consolidation`` in a fresh interpreter and return its figures."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--consolidation-child", "--events", str(n_events)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"child exited {proc.returncode}: " + " | ".join(tail)}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def format_consolidation(c: dict[str, Any]) -> str:
    if "error" in c:
        return f"consolidation: {c['error']}"
    per_m = 1e6 / max(c["events"], 1)
    mb = 1e6
    lines = [
        f"{c['events']:,} events recorded under one profile ({c['outer']:,} outer ranges of {c['inner']:,} nested "
        f"ones; expected {c['expected']:,}; inner ranges nested in their outer one: "
        f"{c['nested_ok']:,} of {c['outer'] * c['inner']:,}):",
        f"  recording          {c['record_s']:6.2f} s  "
        f"({c['record_s'] * 1e9 / max(c['events'], 1):,.0f} ns per range, including the loop)",
        f"  stop+consolidation {c['stop_s']:6.2f} s  ({c['stop_s'] * per_m:.2f} s per million events)",
        f"  Chrome export      {c['export_s']:6.2f} s  ({c['export_s'] * per_m:.2f} s per million events, "
        f"{c['trace_bytes'] / mb:,.0f} MB of JSON)",
    ]
    if "raw_bytes_per_range" in c:
        lines.append(
            f"  memory: raw records {c['raw_bytes_per_range']:,.0f} bytes per range while recording; RSS "
            f"{c['rss_start_bytes'] / mb:,.0f} MB at start, {c['rss_after_stop_bytes'] / mb:,.0f} MB after stop, "
            f"{c['rss_after_export_bytes'] / mb:,.0f} MB after export, peak {c['peak_rss_bytes'] / mb:,.0f} MB "
            f"(+{c['peak_growth_bytes'] / mb:,.0f} MB)"
        )
    return "\n".join(lines)


# -- targets ---------------------------------------------------------------------


def targets(cases: dict[str, Case], cons: dict[str, Any] | None) -> list[str]:
    """The issue's targets, each with the measured figure and ok / MISSED."""
    out = ["targets (from the issue; Python 3.11, 2-core machine):"]

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    base, idle = cases[BASELINE], cases[APROF_IDLE]
    if base.samples and idle.samples:
        ratio = median(idle) / median(base)
        out.append(
            f"  aprof, nothing registered <= {TARGET_IDLE_RATIO}x nullcontext(): {ratio:.2f}x  "
            f"{verdict(ratio <= TARGET_IDLE_RATIO)}"
        )
    else:
        out.append("  aprof, nothing registered: not measured")
    peers = [(cases[name], label) for name, label in ((VIZ, "viztracer log_event"), (OTEL, "an OTel SDK span"))]
    for name in APROF_ON.values():
        c = cases[name]
        if not c.samples:
            out.append(f"  {name}: not measured ({c.missing})")
            continue
        m = median(c)
        out.append(f"  {name} <= {TARGET_ON_NS:,.0f} ns: {m:,.0f} ns  {verdict(m <= TARGET_ON_NS)}")
        if base.samples:
            ratio = m / median(base)
            out.append(
                f"      and <= {TARGET_ON_RATIO}x nullcontext(): {ratio:.2f}x  {verdict(ratio <= TARGET_ON_RATIO)}"
            )
        for peer, label in peers:
            if peer.samples:
                pm = median(peer)
                out.append(f"      and < {label} ({pm:,.0f} ns): {m / pm:.2f}x of it  {verdict(m < pm)}")
            else:
                out.append(f"      and < {label}: {label} not measured")
    stack = cases.get(APROF_STACK["on"])
    if stack is not None and stack.samples:
        m = median(stack)
        out.append(
            f"  {APROF_STACK['on']} <= {TARGET_STACK_NS:,.0f} ns: {m:,.0f} ns  {verdict(m <= TARGET_STACK_NS)}"
        )
    if cons is None:
        out.append("  stop+consolidation: not run")
    elif "error" in cons:
        out.append(f"  stop+consolidation: {cons['error']}")
    else:
        per_m = cons["stop_s"] * 1e6 / max(cons["events"], 1)
        out.append(
            f"  stop+consolidation <= {TARGET_STOP_S_PER_M} s per million events: {per_m:.2f} s  "
            f"{verdict(per_m <= TARGET_STOP_S_PER_M)}"
        )
    return out


# -- main -----------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke test of a few seconds")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; 2 with --quick)")
    ap.add_argument("-n", "--iterations", type=int, default=None, help="max ranges per sample (default 200,000)")
    ap.add_argument("--events", type=int, default=None, help="events for the consolidation run (default 1,000,000)")
    ap.add_argument("--no-consolidation", action="store_true", help="skip the 1M-event stop/export run")
    ap.add_argument("--no-ranges", action="store_true", help="skip the range-cost table")
    ap.add_argument(
        "--only",
        default=None,
        metavar="WORDS",
        help="comma-separated words: run only the cases whose name contains one (nullcontext() always runs)",
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="also write all samples and figures here")
    ap.add_argument("--consolidation-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    n_events = args.events or (20_000 if args.quick else 1_000_000)
    if args.consolidation_child:
        print(json.dumps(consolidation(n_events)))
        return

    hi = args.iterations or (5_000 if args.quick else 200_000)
    lo = min(hi, 1_000 if args.quick else 20_000)
    rounds = args.rounds or (2 if args.quick else 7)
    sizer = Sizer(hi, lo, target_s=0.02 if args.quick else 0.5)

    print(header())
    cases: list[Case] = []
    if not args.no_ranges:
        cases = [
            Case(BASELINE, sizer.sized(with_loop("nullcontext()", {"nullcontext": contextlib.nullcontext}))),
            *aprof_cases(sizer),
            *torch_cases(sizer),
            otel_case(sizer),
            viztracer_case(sizer),
        ]
        if args.only:
            words = [w.strip().lower() for w in args.only.split(",") if w.strip()]
            cases = [c for c in cases if c.name == BASELINE or any(w in c.name.lower() for w in words)]
        loop_ns = min(empty_loop_ns(hi) for _ in range(3))
        print(
            f"up to {hi:,} ranges per sample (at least {lo:,}; ~{sizer.target_s:g} s per sample), "
            f"{rounds} interleaved rounds; an empty loop iteration costs {loop_ns:.1f} ns (included in every row)\n"
        )
        interleave(cases, rounds, collect=True, rotate=True, progress=sys.stderr.isatty())
        print(table(cases, BASELINE, "ns"))

    cons: dict[str, Any] | None = None
    if not args.no_consolidation:
        if aprof_info()["importable"]:
            print()
            cons = run_consolidation_child(n_events)
            print(format_consolidation(cons))
        else:
            cons = {"error": "aprof not importable"}

    otel: dict[str, Any] | None = None
    if not args.no_consolidation and aprof_info()["importable"]:
        otel = otel_export(2_000 if args.quick else 20_000)
        if "error" in otel:
            print(f"\nexport_opentelemetry: {otel['error']}")
        else:
            print(
                f"\nexport_opentelemetry of {otel['spans']:,} spans into an SDK provider (exporter drops them): "
                f"{otel['ns_per_span']:,.0f} ns per span (best of 3)"
            )

    if cases:
        print()
        every = {c.name: c for c in cases}
        for name in (APROF_IDLE, *APROF_ON.values(), OTEL, VIZ):
            every.setdefault(name, Case(name, None, "not run (--only)"))
        print("\n".join(targets(every, cons)))
    print(
        f"\nload average at the end: {load_average()} "
        "(on 2 cores, well above 0.5 means other work disturbed the figures)"
    )
    dump(args.json, cases, {"consolidation": cons, "otel_export": otel, "rounds": rounds, "max_iterations": hi})


if __name__ == "__main__":
    main()
