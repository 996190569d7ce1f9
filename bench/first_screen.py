"""What `aprof run`'s new defaults cost: loop-block watching, followed executor
jobs, and the summary sections, in one process.

    python bench/first_screen.py                   # full run (2,000 tasks, 21 rounds)
    python bench/first_screen.py --quick           # a smoke test
    python bench/first_screen.py --variant follow --tasks 300 --once   # one variant once (for callgrind)

The workload: ``asyncio.gather`` of N tasks, each doing two
``await asyncio.sleep(0)``, one ``await asyncio.sleep(0.001)``, about 20 us of
sync work on the loop and one *bare* ``loop.run_in_executor`` on the default
executor (no ``aprof.wrap``: the case ``aprof run`` now follows by default).

Variants, round-robin in one process (rotating), each a global profile (what
``aprof run`` starts) around the timed ``asyncio.run`` of the fan-out:

* plain: no profile;
* global: the global profile as ``aprof run`` ran it before (tasks only);
* +loop-block: with ``loop_block_threshold=0.05`` (the new default);
* +follow: with bare executor jobs followed (the new default);
* run default: both, as ``aprof run`` now does.

Then, on one profiled fan-out: ``key_averages().table()`` and
``summary().render()`` times, medians of a few runs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, header, interleave, table  # noqa: E402

VARIANTS = ("plain", "global", "+loop-block", "+follow", "run default")


def _work(data: bytes) -> bytes:
    for _ in range(20):
        data = hashlib.sha256(data).digest()
    return data


async def _one(i: int) -> None:
    await asyncio.sleep(0)
    _work(b"%d" % i)
    await asyncio.sleep(0.001)
    await asyncio.get_running_loop().run_in_executor(None, _work, b"x")
    await asyncio.sleep(0)


async def _fanout(n: int) -> None:
    await asyncio.gather(*(_one(i) for i in range(n)))


def run_variant(variant: str, n: int) -> tuple[float, Any]:
    """One timed fan-out under ``variant``; (seconds, the stopped profile or None)."""
    import aprof
    from aprof._integrations._executors import follow_executors

    prof = None
    undo = None
    if variant != "plain":
        threshold = 0.05 if variant in ("+loop-block", "run default") else None
        prof = aprof.profile(scope="global", loop_block_threshold=threshold)
        if variant in ("+follow", "run default"):
            undo = follow_executors()
        prof.start()
    t0 = time.perf_counter()
    try:
        asyncio.run(_fanout(n))
    finally:
        elapsed = time.perf_counter() - t0
        if prof is not None:
            prof.stop()
        if undo is not None:
            undo()
    return elapsed, prof


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--variant", choices=VARIANTS, help="with --once: run this variant only")
    p.add_argument("--once", action="store_true", help="run one fan-out of --variant and exit (for callgrind)")
    args = p.parse_args()
    if args.once:
        run_variant(args.variant or "plain", args.tasks)
        return
    n, rounds = (300, 5) if args.quick else (args.tasks, args.rounds)
    print(header())
    print(f"workload: {n} tasks, each 3 sleeps, ~20 us on the loop, one bare run_in_executor; {rounds} rounds\n")
    cases = [Case(v, lambda v=v: run_variant(v, n)[0] * 1e3) for v in VARIANTS]
    interleave(cases, rounds, collect=True, rotate=True)
    print(table(cases, "plain", "ms"))
    print()
    _, prof = run_variant("run default", n)
    assert prof is not None
    session = prof.session
    t_table, t_summary = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        session.key_averages().table()
        t_table.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        session.summary().render()
        t_summary.append(time.perf_counter() - t0)
    events = len(session.events())
    print(f"on the 'run default' session ({events} events):")
    print(f"  key_averages().table(): median {statistics.median(t_table) * 1e3:.2f} ms, min {min(t_table) * 1e3:.2f} ms")
    print(f"  summary().render():     median {statistics.median(t_summary) * 1e3:.2f} ms, min {min(t_summary) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
