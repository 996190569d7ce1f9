"""The sampler (SPEC 8.4, issue 18) against plain runs and pyinstrument, in one process.

    python bench/sampler.py                  # full run (fib(30), 2,000 tasks, 5 s accuracy; ~3 minutes)
    python bench/sampler.py --quick          # a smoke test (fib(24), 200 tasks, 1 s)
    python bench/sampler.py --rounds 9 --json /tmp/sampler.json

Overhead, wall clock, interleaved rounds (rotating order, GC before each
sample), the profiler started before and stopped after the timed region:

* ``fib(N)``: plain; ``aprof.profile(sample_interval=0.001, tasks=False)``;
  pyinstrument ``Profiler()`` at its default interval (1 ms).
* the fan-out of ``bench/tasks.py`` (N tasks, each three ``sleep(0)``, one
  ``sleep(0.001)``, ~40 us of SHA-256 on the loop and one
  ``run_in_executor``): plain; aprof sampling at 1 ms with ``tasks=False``
  (samples still land on each task's track) and with tasks on (the
  default, whose own cost ``bench/tasks.py`` reports); pyinstrument
  ``Profiler(async_mode="enabled")``.

What the GIL costs at 1 ms: the C engine's statistics over the fib runs
(ticks; how many the main thread served between two bytecodes and how many
the engine thread served itself, taking the GIL; mean time spent taking the
samples of one tick; mean time the engine waited for the GIL).

Accuracy (issue 18's program), sampled at 1 ms for ``--seconds`` (default
5): three tasks burning CPU in steps of 5, 3 and 2 ms between ``sleep(0)``
(so 50/30/20 of the loop's busy time), one task blocking in
``time.sleep`` (a blocking call, GIL released) and one executor job
burning on a worker thread. Checked: the three burners' sampled shares
within 3 points of 50/30/20; the blocking task's samples have ``blocking``
on top; the executor job is sampled on a thread track.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, dump, header, interleave, median, table  # noqa: E402

import tasks as fanout  # noqa: E402  (the fan-out workload of bench/tasks.py)

INTERVAL = 0.001
TARGET_FIB = 1.05
TARGET_FANOUT = 1.10
TARGET_POINTS = 3.0


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


# -- fib -----------------------------------------------------------------------


def _timed(start: Callable[[], Callable[[], Any]] | None, work: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        stop = start() if start is not None else None
        try:
            t0 = time.perf_counter()
            work()
            return (time.perf_counter() - t0) * 1e3
        finally:
            if stop is not None:
                stop()

    return run


def _aprof_sampler() -> Callable[[], Any]:
    import aprof

    prof = aprof.profile(sample_interval=INTERVAL, tasks=False)
    prof.start()
    return prof.stop


def _pyinstrument() -> Callable[[], Any]:
    from pyinstrument import Profiler

    p = Profiler()  # its default interval, 1 ms
    p.start()
    return p.stop


def fib_cases(n: int) -> list[Case]:
    cases = [Case("plain", _timed(None, lambda: fib(n)))]
    cases.append(Case("aprof sample 1 ms", _timed(_aprof_sampler, lambda: fib(n))))
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        cases.append(Case("pyinstrument (1 ms)", None, "missing (pip install pyinstrument)"))
    else:
        cases.append(Case("pyinstrument (1 ms)", _timed(_pyinstrument, lambda: fib(n))))
    return cases


# -- the fan-out ---------------------------------------------------------------


def fanout_cases(n: int) -> list[Case]:
    import aprof

    def sampled(tasks_on: bool) -> Callable[[], float]:
        async def main() -> float:
            async with aprof.profile(sample_interval=INTERVAL, tasks=tasks_on):
                return await fanout.timed_fan_out(n, aprof.wrap, "sampled")

        return lambda: asyncio.run(main()) * 1e3

    async def pyinst() -> float:
        from pyinstrument import Profiler

        p = Profiler(async_mode="enabled")
        p.start()
        try:
            return await fanout.timed_fan_out(n, fanout.identity, "pyinstrument")
        finally:
            p.stop()

    cases = [
        Case("plain", lambda: asyncio.run(fanout.timed_fan_out(n, fanout.identity, "plain")) * 1e3),
        Case("aprof sample 1 ms, tasks=False", sampled(False)),
        Case("aprof sample 1 ms, tasks on", sampled(True)),
    ]
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        cases.append(Case("pyinstrument async_mode", None, "missing (pip install pyinstrument)"))
    else:
        cases.append(Case("pyinstrument async_mode", lambda: asyncio.run(pyinst()) * 1e3))
    return cases


# -- accuracy ------------------------------------------------------------------


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def burn_fifty(s: float) -> None:
    burn(s)


def burn_thirty(s: float) -> None:
    burn(s)


def burn_twenty(s: float) -> None:
    burn(s)


def blocking(s: float) -> None:
    time.sleep(s)


def executor_job(s: float) -> None:
    burn(s)


def accuracy(seconds: float) -> dict[str, Any]:
    import aprof

    async def burner(fn: Callable[[float], None], ms: float, until: float) -> None:
        while time.perf_counter() < until:
            fn(ms / 1e3)
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        until = time.perf_counter() + seconds
        async with aprof.profile(sample_interval=INTERVAL) as prof:
            loop = asyncio.get_running_loop()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(burner(burn_fifty, 5, until), name="fifty")
                tg.create_task(burner(burn_thirty, 3, until), name="thirty")
                tg.create_task(burner(burn_twenty, 2, until), name="twenty")
                tg.create_task(asyncio.to_thread(blocking, 0.0), name="warm")  # the pool exists before timing
                tg.create_task(_block_once(), name="blocker")
                tg.create_task(_in_executor(loop, seconds / 5), name="submitter")
        return prof

    async def _block_once() -> None:
        await asyncio.sleep(seconds / 2)
        blocking(0.2)

    async def _in_executor(loop: asyncio.AbstractEventLoop, s: float) -> None:
        await loop.run_in_executor(None, aprof.wrap(executor_job), s)

    session = asyncio.run(main()).session
    samples = session.samples
    assert samples is not None
    tracks = {t.id: t for t in session.tracks()}
    weight: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    tops: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    on_stack: dict[str, int] = defaultdict(int)
    for i in range(len(samples)):
        if samples.idle[i]:
            continue
        track = tracks[samples.thread_id[i]]
        key = track.name if track.kind != "thread" else f"thread {track.name}"
        stack = samples.stack(i)
        top = stack[-1].rsplit(": ", 1)[-1] if stack else "<empty>"
        weight[key] += samples.weight_ns[i]
        count[key] += 1
        tops[key][top] += samples.weight_ns[i]
        if any(f.endswith(": executor_job") for f in stack):
            on_stack[key] += samples.weight_ns[i]
    burners = {k: weight[k] for k in ("fifty", "thirty", "twenty")}
    total = sum(burners.values()) or 1
    shares = {k: 100 * v / total for k, v in burners.items()}
    n_total = sum(count[k] for k in burners) or 1
    count_shares = {k: 100 * count[k] / n_total for k in burners}
    expected = {"fifty": 50.0, "thirty": 30.0, "twenty": 20.0}
    blocker_top = max(tops["blocker"].items(), key=lambda kv: kv[1])[0] if tops["blocker"] else None
    executor_tracks = [k for k in on_stack if k.startswith("thread ")]
    return {
        "samples": len(samples),
        "idle": samples.idle_count,
        "shares": shares,
        "count_shares": count_shares,
        "worst_points": max(abs(shares[k] - expected[k]) for k in expected),
        "blocker_top": blocker_top,
        "executor_tracks": executor_tracks,
    }


# -- main ----------------------------------------------------------------------


def _stats() -> tuple[int, int, int, int, int] | None:
    try:
        from aprof._ctracer import _sampler_stats
    except ImportError:
        return None
    return _sampler_stats()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="fib(N) (default 30)")
    ap.add_argument("--tasks", type=int, default=2000, help="tasks in the fan-out (default 2,000)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the accuracy run (default 5)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.n, args.tasks, args.rounds, args.seconds = 24, 200, 2, 1.0
    from aprof._core._sampler import implementation

    print(header())
    print(f"aprof sampler implementation: {implementation().__name__}\n")

    before = _stats()
    fibs = fib_cases(args.n)
    interleave(fibs, args.rounds, collect=True, rotate=True, progress=True)
    after = _stats()
    print(f"\nfib({args.n}), milliseconds\n" + table(fibs, "plain", "ms"))
    gil: dict[str, float] = {}
    if before is not None and after is not None:
        ticks, pended, direct, sample_ns, wait_ns = (a - b for a, b in zip(after, before, strict=True))
        if ticks:
            gil = {
                "ticks": ticks,
                "by_main_thread": pended,
                "by_engine": direct,
                "us_sampling_per_tick": sample_ns / ticks / 1e3,
                "us_gil_wait_per_engine_tick": wait_ns / max(direct, 1) / 1e3,
            }
            print(
                f"\nat 1 ms over the fib runs: {ticks:,} ticks, {pended:,} sampled by the main thread between two "
                f"bytecodes, {direct:,} by the engine thread holding the GIL; {gil['us_sampling_per_tick']:.1f} us "
                f"taking the samples per tick ({gil['us_sampling_per_tick'] / 10:.2f}% of a 1 ms interval); "
                f"the engine waited {gil['us_gil_wait_per_engine_tick']:.1f} us for the GIL per tick it served"
            )

    fans = fanout_cases(args.tasks)
    interleave(fans, 1, collect=True)  # warm-up: the pool, first-call caches
    for c in fans:
        c.samples.clear()
    interleave(fans, args.rounds, collect=True, rotate=True, progress=True)
    print(f"\nfan-out of {args.tasks:,} tasks, milliseconds\n" + table(fans, "plain", "ms"))

    acc = accuracy(args.seconds)
    print(
        f"\naccuracy, {args.seconds:g} s at 1 ms: {acc['samples']:,} samples ({acc['idle']:,} idle); "
        + ", ".join(f"{k} {v:.1f}%" for k, v in acc["shares"].items())
        + " by sampled time ("
        + ", ".join(f"{k} {v:.1f}%" for k, v in acc["count_shares"].items())
        + " by count)"
        + f"; blocking task's top frame: {acc['blocker_top']}; executor job sampled on {acc['executor_tracks']}"
    )

    def ratio(cases: list[Case], name: str) -> float:
        by = {c.name: c for c in cases}
        return median(by[name]) / median(by["plain"]) if by[name].samples else float("nan")

    r_fib, r_pyi = ratio(fibs, "aprof sample 1 ms"), ratio(fibs, "pyinstrument (1 ms)")
    r_fan, r_fan_pyi = ratio(fans, "aprof sample 1 ms, tasks=False"), ratio(fans, "pyinstrument async_mode")
    checks = [
        (f"fib({args.n}) sampled at 1 ms <= {TARGET_FIB}x plain", r_fib <= TARGET_FIB, f"{r_fib:.3f}x"),
        ("... below pyinstrument at its default", not r_fib >= r_pyi, f"pyinstrument {r_pyi:.3f}x"),
        (f"fan-out sampled at 1 ms <= {TARGET_FANOUT}x plain", r_fan <= TARGET_FANOUT, f"{r_fan:.3f}x"),
        ("... below pyinstrument async_mode", not r_fan >= r_fan_pyi, f"pyinstrument {r_fan_pyi:.3f}x"),
        (f"shares within {TARGET_POINTS:g} points of 50/30/20", acc["worst_points"] <= TARGET_POINTS,
         f"worst {acc['worst_points']:.1f} points"),
        ("the blocking call's function on top of its task", acc["blocker_top"] == "blocking", str(acc["blocker_top"])),
        ("the executor job sampled on a worker thread's track", bool(acc["executor_tracks"]), str(acc["executor_tracks"])),
    ]  # fmt: skip
    print("\ntargets (from the issue):")
    for what, ok, value in checks:
        print(f"  {'ok    ' if ok else 'MISSED'} {what}: {value}")
    dump(args.json, fibs + fans, {"gil": gil, "accuracy": acc})


if __name__ == "__main__":
    main()
