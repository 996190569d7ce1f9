"""The memory budget and the flight recorder (issue 19): bytes held per range
in the ring, RSS over a run ten times the ring, and the time to dump a full
ring.

    python bench/flight.py [--ring-mb 50] [--ranges-only] [--open N] [--json out.json]
    python bench/flight.py --callgrind [--ring-mb 50] [--open N]

A server-like load runs through ``aprof.flight_recorder(max_bytes=ring)``:
requests as tasks (``asyncio.gather`` of 1,000 at a time), each with a
``handle`` range and nine nested ``step`` ranges (``--ranges-only``: the
same number of ranges in one thread, no tasks). Reported:

- bytes per range the ring holds once full (the sealed generations are
  measured exactly; the target is at most 48);
- RSS every tenth of the run, and the spread after the ring is full (the
  target: within 10%);
- the dump of the full ring to a Chrome trace (``.json``), to a gzipped
  one and to a session (``.aprof``), each the median of three (the target
  for the Chrome trace: at most 1 s), with the system time and the minor
  page faults of each (the process's, all threads).

``--open N``: N tasks (a server's keep-alive connections) wait inside a
``connection`` range while the ring is dumped, so the dump leaves out
their open events, as a server's does; by default every task has ended.

``--callgrind``: the instructions of one Chrome dump of the full ring
(a ring filled about 1.25 times, then ``rec.dump(path)`` run inside
``eval()``, which callgrind's ``--toggle-collect=builtin_eval`` counts
alone), under valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import callgrind, dump, header, rss_bytes  # noqa: E402


async def _request() -> None:
    import aprof

    with aprof.record_function("handle"):
        for _ in range(9):
            with aprof.record_function("step"):
                pass


async def _connection(done: asyncio.Event) -> None:
    """A keep-alive connection's task: inside its range until ``done``."""
    import aprof

    with aprof.record_function("connection"):
        await done.wait()


def _open(n: int) -> tuple[asyncio.Event, list[asyncio.Task[None]]]:
    """``n`` connection tasks, started (their first step run by the caller's next await)."""
    done = asyncio.Event()
    return done, [asyncio.ensure_future(_connection(done)) for _ in range(n)]


def _one_dump(ring_mb: int, n_open: int) -> None:
    """(under valgrind) Fill a ring about 1.25 times, then dump it once inside eval()."""
    import aprof

    ring_bytes = ring_mb * 1_000_000
    batches = max(2, ring_bytes * 5 // 4 // (1_000 * 11 * 79))  # a request: 11 events of ~79 B

    async def run() -> None:
        rec = aprof.flight_recorder(window=3600.0, max_bytes=ring_bytes, signal=None)
        rec.start()
        for _ in range(batches):
            await asyncio.gather(*(_request() for _ in range(1_000)))
        done, conns = _open(n_open)
        await asyncio.sleep(0)
        gc.collect()
        with tempfile.TemporaryDirectory() as tmp:
            eval("rec.dump(path)", {"rec": rec, "path": Path(tmp) / "d.json"})
            print(f"{len(rec.snapshot().events())} events")
        done.set()
        await asyncio.gather(*conns)
        rec.stop()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ring-mb", type=int, default=50)
    parser.add_argument("--ranges-only", action="store_true", help="plain ranges in one thread, no tasks")
    parser.add_argument("--open", type=int, default=0, metavar="N", help="tasks still running (in a range) at the dumps")
    parser.add_argument("--json")
    parser.add_argument("--callgrind", action="store_true", help="instructions of one Chrome dump, under valgrind")
    parser.add_argument("--one-dump", action="store_true", help=argparse.SUPPRESS)  # the run under valgrind
    args = parser.parse_args()
    if args.one_dump:
        _one_dump(args.ring_mb, args.open)
        return
    if args.callgrind:
        print(header())
        argv = [sys.executable, __file__, "--one-dump", "--ring-mb", str(args.ring_mb), "--open", str(args.open)]
        count, out = callgrind(argv)
        open_tasks = f", {args.open} tasks open" if args.open else ""
        print(f"one Chrome dump of a full {args.ring_mb} MB ring ({out.strip()}{open_tasks}): {count:,} instructions")
        return
    import aprof

    ring_bytes = args.ring_mb * 1_000_000
    # about 10x the ring: a request is ~10 ranges of 48 B and a task record
    batches = max(10, ring_bytes * 10 // (1_000 * (480 if args.ranges_only else 700)))
    print(header())
    print(f"ring {args.ring_mb} MB, {batches} batches of 1,000 requests (10 ranges each)\n")
    rss: list[int] = []
    dumps: dict[str, list[float]] = {"chrome .json": [], "chrome .json.gz": [], "session .aprof": []}
    kernel: dict[str, list[tuple[float, int]]] = {name: [] for name in dumps}  # (system time, minor faults)

    async def run() -> aprof.flight_recorder:
        rec = aprof.flight_recorder(window=3600.0, max_bytes=ring_bytes, signal=None)
        rec.start()
        t0 = time.perf_counter()
        for b in range(batches):
            if args.ranges_only:
                for _ in range(10_000):
                    with aprof.record_function("step"):
                        pass
            else:
                await asyncio.gather(*(_request() for _ in range(1_000)))
            if b % (batches // 10) == batches // 10 - 1:
                gc.collect()
                rss.append(rss_bytes() or 0)
        elapsed = time.perf_counter() - t0
        tasks = 0 if args.ranges_only else batches * 1_000
        print(f"recorded {batches * 10_000:,} ranges and {tasks:,} tasks in {elapsed:.1f} s")
        ring = rec.profile._state.ring
        held, events = ring._held_bytes, ring._held_events
        print(f"ring: {ring.held_bytes() / 1e6:.1f} MB held, sealed generations {held / max(events, 1):.1f} bytes/event")
        done, conns = _open(args.open)
        await asyncio.sleep(0)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(3):
                for name, suffix in (("chrome .json", "json"), ("chrome .json.gz", "json.gz"), ("session .aprof", "aprof")):
                    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                    out = rec.dump(Path(tmp) / f"d.{suffix}")
                    dumps[name].append(time.perf_counter() - t)
                    r1 = resource.getrusage(resource.RUSAGE_SELF)
                    kernel[name].append((r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt))
                    size = out.stat().st_size
            snap = rec.snapshot()
            open_tasks = f"; {args.open} tasks open, their events left out" if args.open else ""
            print(f"a dump holds {len(snap.events()):,} events (last file {size / 1e6:.1f} MB{open_tasks})")
        done.set()
        await asyncio.gather(*conns)
        rec.stop()
        return rec

    asyncio.run(run())
    settled = rss[len(rss) // 2 :]
    print("\nRSS (MB) every tenth of the run:", " ".join(f"{r / 1e6:.0f}" for r in rss))
    spread = max(settled) / min(settled) - 1
    print(f"after the ring is full: {min(settled) / 1e6:.0f}..{max(settled) / 1e6:.0f} MB, spread {spread:.1%}")
    print("\ndump of the full ring (median of 3, min):")
    for name, ts in dumps.items():
        sys_s = statistics.median(k[0] for k in kernel[name])
        faults = statistics.median(k[1] for k in kernel[name])
        print(f"  {name:<16} {statistics.median(ts):6.2f} s  (min {min(ts):.2f}; of it {sys_s:.2f} s in the kernel, "
              f"{faults:,.0f} page faults)")
    if args.json:
        dump(args.json, [], {"rss": rss, "dumps": dumps, "spread": spread})


if __name__ == "__main__":
    main()
