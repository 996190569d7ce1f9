"""Cost of one range (enter + exit), aprof against its peers, in one process.

    python bench/ranges.py            # full run
    python bench/ranges.py --quick    # a few seconds, a smoke test

Cases: ``nullcontext()``; aprof with nothing registered; aprof with a profile
running (in a plain thread, in the task that started the profile, and in a
task it spawned); torch's ``record_function`` and ``_RecordFunctionFast`` with
and without torch's profiler; an OpenTelemetry SDK span; viztracer's
``log_event``. Peers that are not installed are reported as missing. Then:
stop (consolidation) and Chrome export time for 1M events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aprof  # noqa: E402
from _common import Case, dump, header, interleave, table  # noqa: E402


def timed_loop(make: Callable[[], object], n: int) -> float:
    """ns per `with make(): pass`, the constructor included."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with make():  # type: ignore[attr-defined]
            pass
    return (time.perf_counter_ns() - t0) / n


def in_profile(n: int, where: str) -> float:
    """A profile running: in a plain thread, the profiling task, or a spawned task."""
    if where == "thread":
        prof = aprof.profile().start()
        try:
            return timed_loop(lambda: aprof.record_function("x"), n)
        finally:
            prof.stop()

    async def main() -> float:
        async with aprof.profile():
            if where == "profiling task":
                return timed_loop(lambda: aprof.record_function("x"), n)

            async def child() -> float:
                return timed_loop(lambda: aprof.record_function("x"), n)

            return await asyncio.create_task(child())

    return asyncio.run(main())


def torch_cases(n: int) -> list[Case]:
    try:
        import torch
        from torch.autograd.profiler import record_function as torch_rf
    except ImportError:
        return [Case(name, None, "missing (pip install torch==2.13.0)") for name in (
            "torch record_function", "torch _RecordFunctionFast", "torch record_function, profiler on",
            "torch _RecordFunctionFast, profiler on")]  # fmt: skip
    fast = torch._C._profiler._RecordFunctionFast

    def with_profiler(make: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                return timed_loop(make, n)

        return run

    return [
        Case("torch record_function", lambda: timed_loop(lambda: torch_rf("x"), n)),
        Case("torch _RecordFunctionFast", lambda: timed_loop(lambda: fast("x"), n)),
        Case("torch record_function, profiler on", with_profiler(lambda: torch_rf("x"))),
        Case("torch _RecordFunctionFast, profiler on", with_profiler(lambda: fast("x"))),
    ]


def otel_case(n: int) -> Case:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return Case("OpenTelemetry SDK span", None, "missing (pip install opentelemetry-sdk)")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")

    def run() -> float:
        exporter.clear()
        return timed_loop(lambda: tracer.start_as_current_span("x"), n)

    return Case("OpenTelemetry SDK span", run)


def viztracer_case(n: int) -> Case:
    try:
        from viztracer import VizTracer
    except ImportError:
        return Case("viztracer log_event", None, "missing (pip install viztracer)")

    def run() -> float:
        tracer = VizTracer(verbose=0, tracer_entries=2 * n + 1000)
        tracer.start()
        try:
            return timed_loop(lambda: tracer.log_event("x"), n)
        finally:
            tracer.stop()
            tracer.clear()

    return Case("viztracer log_event", run)


def consolidation(n_events: int) -> dict[str, float]:
    """Stop + consolidation and Chrome export of n_events ranges (1000 nested per outer)."""
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    prof = aprof.profile().start()
    rf = aprof.record_function
    for _ in range(n_events // 1000):
        with rf("outer"):
            for _ in range(999):
                with rf("inner"):
                    pass
    t0 = time.perf_counter()
    prof.stop()
    stop_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        prof.export_chrome_trace(os.path.join(d, "t.json"))
        export_s = time.perf_counter() - t0
        size = os.path.getsize(os.path.join(d, "t.json"))
    n = len(prof.events())
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"events": n, "stop_s": stop_s, "export_s": export_s, "trace_mb": size / 1e6, "peak_rss_growth_mb": (rss1 - rss0) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke test")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--events", type=int, default=None, help="events for the consolidation run (default 1M)")
    ap.add_argument("--json", default=None, help="also write the samples here")
    args = ap.parse_args()
    n = 5_000 if args.quick else 100_000
    rounds = args.rounds or (2 if args.quick else 7)
    n_events = args.events or (20_000 if args.quick else 1_000_000)

    cases = [
        # Both through a lambda, so the call overhead is the same on each side.
        Case("nullcontext()", lambda: timed_loop(lambda: contextlib.nullcontext(), n)),
        Case("aprof, nothing registered", lambda: timed_loop(lambda: aprof.record_function("x"), n)),
        Case("aprof, profile on (thread)", lambda: in_profile(n, "thread")),
        Case("aprof, profile on (profiling task)", lambda: in_profile(n, "profiling task")),
        Case("aprof, profile on (spawned task)", lambda: in_profile(n, "spawned task")),
        *torch_cases(n),
        otel_case(n),
        viztracer_case(n),
    ]
    print(header())
    print(f"{n:,} ranges per sample, {rounds} interleaved rounds\n")
    interleave(cases, rounds)
    print(table(cases, "nullcontext()", "ns"))
    cons = consolidation(n_events)
    per_m = 1e6 / max(cons["events"], 1)
    print(
        f"\n{cons['events']:,} events: stop+consolidation {cons['stop_s']:.2f} s ({cons['stop_s'] * per_m:.2f} s/M), "
        f"Chrome export {cons['export_s']:.2f} s ({cons['export_s'] * per_m:.2f} s/M, {cons['trace_mb']:.0f} MB), "
        f"peak RSS growth {cons['peak_rss_growth_mb']:.0f} MB"
    )
    dump(args.json, cases, {"consolidation": cons})


if __name__ == "__main__":
    main()
