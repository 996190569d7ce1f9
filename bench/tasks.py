"""An asyncio fan-out under aprof and its peers, in one process.

    python bench/tasks.py            # full run
    python bench/tasks.py --quick    # a smoke test

2,000 tasks, each with a few awaits, a little sync work and one executor
call; the same workload for every variant (aprof hands the executor call over
with aprof.wrap so it follows the profile). Variants: plain; aprof with task
tracking (the default); viztracer with log_async; pyinstrument with
async_mode="enabled"; yappi wall clock. Reports wall time, the ratio to plain,
and aprof's memory per task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aprof  # noqa: E402
from _common import Case, dump, header, interleave, table  # noqa: E402


def sync_work(data: bytes) -> bytes:
    for _ in range(40):
        data = hashlib.sha256(data).digest()
    return data


async def one_task(i: int, wrap: Callable[[Any], Any]) -> bytes:
    for _ in range(3):
        await asyncio.sleep(0)
    await asyncio.sleep(0.001)
    data = sync_work(str(i).encode())
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, wrap(sync_work), data)


async def fan_out(n: int, wrap: Callable[[Any], Any]) -> None:
    await asyncio.gather(*(one_task(i, wrap) for i in range(n)))


def identity(fn: Any) -> Any:
    return fn


def run_variant(n: int, around: Callable[[], contextlib.AbstractContextManager[Any]] | None, wrap: Callable[[Any], Any] = identity, inside: bool = False) -> float:
    """Seconds for one fan-out; ``around`` profiles it (inside the loop if ``inside``)."""

    async def main() -> float:
        # Only the fan-out is timed, for every variant: starting and stopping
        # the profilers (and aprof's consolidation) are measured separately.
        if inside and around is not None:
            async with around():  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                await fan_out(n, wrap)
                return time.perf_counter() - t0
        t0 = time.perf_counter()
        await fan_out(n, wrap)
        return time.perf_counter() - t0

    if around is None or inside:
        return asyncio.run(main())
    with around():
        return asyncio.run(main())


@contextlib.contextmanager
def viztracer_ctx() -> Iterator[None]:
    from viztracer import VizTracer

    tracer = VizTracer(log_async=True, verbose=0)
    tracer.start()
    try:
        yield
    finally:
        tracer.stop()
        tracer.clear()


@contextlib.contextmanager
def pyinstrument_ctx() -> Iterator[None]:
    from pyinstrument import Profiler

    p = Profiler(async_mode="enabled")
    p.start()
    try:
        yield
    finally:
        p.stop()


@contextlib.contextmanager
def yappi_ctx() -> Iterator[None]:
    import yappi

    yappi.set_clock_type("wall")
    yappi.start()
    try:
        yield
    finally:
        yappi.stop()
        yappi.clear_stats()


def peer(name: str, module: str, ctx: Callable[[], Any], n: int) -> Case:
    try:
        __import__(module)
    except ImportError:
        return Case(name, None, f"missing (pip install {module})")
    return Case(name, lambda: run_variant(n, ctx))


def memory_per_task(n: int) -> dict[str, float]:
    """Bytes aprof keeps per task while profiling, and the cost of stop + export.

    The same fan-out runs once plain and once profiled under tracemalloc; the
    difference in what is still allocated at the end, divided by the task
    count, is what aprof keeps per task (its events included). The events'
    own share is estimated from the sizes of their raw tuples.
    """

    async def run(profiled: bool) -> tuple[int, aprof.profile | None, float]:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        prof = aprof.profile().start() if profiled else None
        await fan_out(n, aprof.wrap if profiled else identity)
        gc.collect()
        during = tracemalloc.get_traced_memory()[0]
        raw = 0
        if prof is not None:
            state = prof._state
            assert state is not None
            raw = sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t if isinstance(x, (dict, tuple)) and x is not t)
                      for lst in state.lists.values() for t in lst)  # fmt: skip
        t0 = time.perf_counter()
        if prof is not None:
            prof.stop()
        stop_s = time.perf_counter() - t0
        tracemalloc.stop()
        return during - before, prof, stop_s if prof is not None else 0.0, raw  # type: ignore[return-value]

    plain_grown, _, _, _ = asyncio.run(run(False))  # type: ignore[misc]
    grown, prof, stop_s, raw = asyncio.run(run(True))  # type: ignore[misc]
    assert prof is not None
    events = prof.events()
    tasks = sum(1 for e in events if e.scope is aprof.RecordScope.TASK)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        prof.export_chrome_trace(os.path.join(d, "t.json"))
        export_s = time.perf_counter() - t0
    per_task = (grown - plain_grown) / max(tasks, 1)
    return {
        "tasks": tasks,
        "events": len(events),
        "bytes_per_task": per_task,
        "event_bytes_per_task": raw / max(tasks, 1),
        "stop_s": stop_s,
        "export_s": export_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.tasks or (200 if args.quick else 2000)
    rounds = args.rounds or (2 if args.quick else 9)
    cases = [
        Case("plain", lambda: run_variant(n, None)),
        Case("aprof profile (tasks on)", lambda: run_variant(n, aprof.profile, aprof.wrap, inside=True)),
        peer("viztracer log_async", "viztracer", viztracer_ctx, n),
        peer("pyinstrument async_mode", "pyinstrument", pyinstrument_ctx, n),
        peer("yappi wall", "yappi", yappi_ctx, n),
    ]
    print(header())
    print(f"fan-out of {n:,} tasks, {rounds} interleaved rounds\n")
    interleave(cases, rounds)
    for c in cases:
        c.samples = [x * 1e3 for x in c.samples]
    print(table(cases, "plain", "ms"))
    mem = memory_per_task(n)
    print(
        f"\naprof: {mem['tasks']:,} tasks, {mem['events']:,} events; kept per task while profiling: "
        f"{mem['bytes_per_task']:.0f} bytes, of which its events' raw records {mem['event_bytes_per_task']:.0f} bytes "
        f"(beyond its events: {mem['bytes_per_task'] - mem['event_bytes_per_task']:.0f} bytes); "
        f"stop {mem['stop_s'] * 1e3:.0f} ms, Chrome export {mem['export_s'] * 1e3:.0f} ms"
    )
    dump(args.json, cases, {"memory": mem})


if __name__ == "__main__":
    main()
