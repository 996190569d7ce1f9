"""profile_memory (issue 21) against plain runs and tracemalloc, in one process.

    python bench/memory.py                # 1M dicts, 2,000-task fan-out, 7 rounds
    python bench/memory.py --quick        # 100k dicts, 200 tasks, 3 rounds
    python bench/memory.py --rounds 9 --dicts 1000000 --tasks 2000

Overhead, wall clock, interleaved rounds (rotating order, GC before each
sample), the profiler started before and stopped after the timed region:

* allocation-heavy: build and drop 1M small dicts (``{"a": i, "b": [i]}``)
  in one task: plain; ``profile(profile_memory=True)`` (sampled, the
  default interval); the same in exact mode (``memory_interval=0``);
  ``tracemalloc.start()`` (1 frame).
* the fan-out of ``bench/tasks.py``: plain; aprof with tasks on (the
  default profile, no memory); the same with ``profile_memory=True``;
  tracemalloc.

Accuracy: a task that allocates 10 MB in 64 KB chunks, kept: the range's
allocated bytes in sampled mode (error over 20 seeds: worst and mean) and
exact mode; a task that allocates 10 MB and frees it: its net bytes in
exact mode.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import tracemalloc
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tasks as fanout  # noqa: E402  (the fan-out workload of bench/tasks.py)
from _common import Case, interleave, table  # noqa: E402


def churn(n: int) -> None:
    for i in range(n):
        d = {"a": i, "b": [i]}
        del d


async def _churn_task(n: int) -> float:
    t0 = time.perf_counter()
    churn(n)
    return time.perf_counter() - t0


def dict_cases(n: int) -> list[Case]:
    import aprof

    def profiled(**kw: object) -> Callable[[], float]:
        async def main() -> float:
            async with aprof.profile(**kw):  # type: ignore[arg-type]
                return await asyncio.create_task(_churn_task(n))

        return lambda: asyncio.run(main()) * 1e3

    def traced() -> float:
        async def main() -> float:
            tracemalloc.start()
            try:
                return await asyncio.create_task(_churn_task(n))
            finally:
                tracemalloc.stop()

        return asyncio.run(main()) * 1e3

    return [
        Case("plain", lambda: asyncio.run(_churn_task(n)) * 1e3),
        Case("aprof profile_memory (sampled)", profiled(profile_memory=True)),
        Case("aprof profile_memory exact", profiled(profile_memory=True, memory_interval=0)),
        Case("tracemalloc", traced),
    ]


def fanout_cases(n: int) -> list[Case]:
    import aprof

    def profiled(memory: bool) -> Callable[[], float]:
        async def main() -> float:
            async with aprof.profile(profile_memory=memory):
                return await fanout.timed_fan_out(n, aprof.wrap, "memory")

        return lambda: asyncio.run(main()) * 1e3

    async def traced() -> float:
        tracemalloc.start()
        try:
            return await fanout.timed_fan_out(n, fanout.identity, "tracemalloc")
        finally:
            tracemalloc.stop()

    return [
        Case("plain", lambda: asyncio.run(fanout.timed_fan_out(n, fanout.identity, "plain")) * 1e3),
        Case("aprof tasks (no memory)", profiled(False)),
        Case("aprof tasks + profile_memory", profiled(True)),
        Case("tracemalloc", lambda: asyncio.run(traced()) * 1e3),
    ]


def accuracy(seeds: int) -> str:
    import aprof
    from aprof._core import _memory

    chunk = 64 * 1024
    count = 160  # 10 MB
    want = chunk * count

    async def keep_all(interval: int) -> int:
        keep: list[bytes] = []
        async with aprof.profile(profile_memory=True, memory_interval=interval) as prof:

            async def task() -> None:
                with aprof.record_function("alloc"):
                    for _ in range(count):
                        keep.append(bytes(chunk))

            await asyncio.create_task(task())
        ev = next(e for e in prof.events() if e.name == "alloc")
        assert ev.memory is not None
        return ev.memory.allocated

    async def free_all() -> tuple[int, int]:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:

            async def task() -> None:
                with aprof.record_function("alloc"):
                    keep = [bytes(chunk) for _ in range(count)]
                    del keep

            await asyncio.create_task(task())
        ev = next(e for e in prof.events() if e.name == "alloc")
        assert ev.memory is not None
        return ev.memory.allocated, ev.memory.net

    errors = []
    for s in range(1, seeds + 1):
        _memory.seed = s
        errors.append(abs(asyncio.run(keep_all(_memory.DEFAULT_INTERVAL)) - want) / want)
    _memory.seed = 0
    exact = asyncio.run(keep_all(0))
    alloc, net = asyncio.run(free_all())
    return (
        f"10 MB in 64 KB chunks, sampled every ~{_memory.DEFAULT_INTERVAL} bytes, {seeds} seeds: "
        f"worst error {max(errors) * 100:.2f}%, mean {sum(errors) / len(errors) * 100:.2f}%\n"
        f"exact mode: {exact} bytes for {want} asked ({(exact - want) / want * 100:+.3f}%: object headers)\n"
        f"allocate 10 MB and free it, exact: net {net} bytes of {alloc} ({net / alloc * 100:.3f}%)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dicts", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=2000)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.dicts, args.tasks = 3, 100_000, 200
    print(f"Python {sys.version.split()[0]}; {args.rounds} rounds, interleaved")
    cases = dict_cases(args.dicts)
    interleave(cases, args.rounds, collect=True, rotate=True)
    print(f"\nbuild and drop {args.dicts:,} small dicts (ms)")
    print(table(cases, "plain", "ms"))
    cases = fanout_cases(args.tasks)
    interleave(cases, args.rounds, collect=True, rotate=True)
    print(f"\nfan-out of {args.tasks:,} tasks (ms)")
    print(table(cases, "plain", "ms"))
    print("\naccuracy")
    print(accuracy(5 if args.quick else 20))


if __name__ == "__main__":
    main()
