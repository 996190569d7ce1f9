"""What one ring rotation costs the recording thread (issue 19: the
always-on server's p99).

    python bench/ring_rotation.py [--ring-mb 50] [--requests 300000] [--json out.json]
    python bench/ring_rotation.py --callgrind [--ring-mb 8] [--requests 60000]

A server-like load runs through a global ``aprof.profile(tasks=True,
max_bytes=ring, keep="latest")``, the always-on configuration: requests as
tasks (``asyncio.gather`` of 1,000 at a time), each with a ``handle`` range
around an ``await asyncio.sleep(0)``. The run is long enough for the ring
to rotate many times (300,000 requests through 50 MB: about 25 rotations).

Reported:

- every call of the budget's ``on_full`` (the ring's rotation and, if it
  does its work in pieces, each piece), timed: the largest, the p99, and
  the total per rotation. The ring's ``on_full`` is wrapped for this (the
  budget is swapped for one calling the wrapper; nothing else changes);
- the time each request's range takes to open and close, and each task's
  creation, measured around them in the program (the stall as a request
  sees it): p50, p99, p99.9, max, and how many took over 1 ms;
- ``--callgrind``: the instructions of the ``on_full`` calls alone, per
  rotation (the wrapper runs them inside ``eval()``, and callgrind counts
  ``builtin_eval`` only; a smaller ring and run by default, valgrind runs
  some 30x slower).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from array import array
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import callgrind, dump, header  # noqa: E402


def pct(values: Any, q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))]) if s else 0.0


def run(ring_bytes: int, requests: int, in_eval: bool) -> dict[str, Any]:
    import aprof
    from aprof._core._ring import Budget

    calls = array("q")  # ns per on_full call
    cpu = array("q")  # the same, in the thread's CPU time (not the time another process had the core)
    own = array("q")  # the same, less the cyclic GC's collections that ran inside it
    gc_ns = [0, 0, 0, 0]  # total, start of the one running; the same in thread CPU time
    own_cpu = array("q")  # CPU time per on_full call, less the GC's inside it
    pauses = array("q")

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        now, cpu_now = time.perf_counter_ns(), time.thread_time_ns()
        if phase == "start":
            gc_ns[1], gc_ns[3] = now, cpu_now
        else:
            gc_ns[0] += now - gc_ns[1]
            gc_ns[2] += cpu_now - gc_ns[3]
            pauses.append(now - gc_ns[1])
    request_ns = array("q")
    create_ns = array("q")
    rotations = [0]

    async def request() -> None:
        t = time.perf_counter_ns()
        with aprof.record_function("handle"):
            t1 = time.perf_counter_ns()
            await asyncio.sleep(0)
            t2 = time.perf_counter_ns()
        request_ns.append(t1 - t + time.perf_counter_ns() - t2)

    async def main() -> None:
        prof = aprof.profile(tasks=True, max_bytes=ring_bytes, keep="latest")
        prof.start()
        try:
            state = prof._state
            ring = state.ring
            inner = ring.on_full
            code = compile("inner()", "<on_full>", "eval")
            ns = {"inner": inner}

            def on_full() -> None:
                before = state.lists
                g, gcpu = gc_ns[0], gc_ns[2]
                c = time.thread_time_ns()
                t = time.perf_counter_ns()
                if in_eval:
                    eval(code, ns)
                else:
                    inner()
                dt = time.perf_counter_ns() - t
                cpu.append(time.thread_time_ns() - c)
                own_cpu.append(cpu[-1] - (gc_ns[2] - gcpu))
                calls.append(dt)
                own.append(dt - (gc_ns[0] - g))
                if state.lists is not before:  # a new generation began
                    rotations[0] += 1

            old = ring.budget
            new = Budget(on_full, old.limit)
            new.count = old.count
            ring.budget = state.budget = new
            left = requests
            while left > 0:
                n = min(1_000, left)
                left -= n
                tasks = []
                for _ in range(n):
                    t = time.perf_counter_ns()
                    tasks.append(asyncio.ensure_future(request()))
                    create_ns.append(time.perf_counter_ns() - t)
                await asyncio.gather(*tasks)
            dropped = ring.dropped()
        finally:
            prof.stop()
        out["dropped"] = dropped

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    gc.callbacks.append(on_gc)
    try:
        asyncio.run(main())
    finally:
        gc.callbacks.remove(on_gc)
    out["elapsed"] = time.perf_counter() - t0
    out["calls"] = calls
    out["own"] = own
    out["cpu"] = cpu
    out["own_cpu"] = own_cpu
    out["gc_pauses"] = pauses
    out["request_ns"] = request_ns
    out["create_ns"] = create_ns
    out["rotations"] = rotations[0]
    return out


def report(res: dict[str, Any]) -> dict[str, Any]:
    calls, own, req, cre = res["calls"], res["own"], res["request_ns"], res["create_ns"]
    pauses = res["gc_pauses"]
    rot = max(res["rotations"], 1)
    both = list(req) + list(cre)
    summary = {
        "rotations": res["rotations"],
        "on_full_calls": len(calls),
        "on_full_max_ms": max(calls) / 1e6,
        "on_full_p99_ms": pct(calls, 0.99) / 1e6,
        "on_full_median_ms": statistics.median(calls) / 1e6,
        "on_full_total_per_rotation_ms": sum(calls) / rot / 1e6,
        "on_full_cpu_max_ms": max(res["cpu"]) / 1e6,
        "on_full_cpu_p99_ms": pct(res["cpu"], 0.99) / 1e6,
        "on_full_cpu_total_per_rotation_ms": sum(res["cpu"]) / rot / 1e6,
        "on_full_cpu_less_gc_max_ms": max(res["own_cpu"]) / 1e6,
        "on_full_cpu_less_gc_p99_ms": pct(res["own_cpu"], 0.99) / 1e6,
        "on_full_less_gc_max_ms": max(own) / 1e6,
        "on_full_less_gc_p99_ms": pct(own, 0.99) / 1e6,
        "on_full_less_gc_total_per_rotation_ms": sum(own) / rot / 1e6,
        "gc_collections": len(pauses),
        "gc_over_1ms": sum(1 for v in pauses if v > 1_000_000),
        "gc_max_ms": max(pauses, default=0) / 1e6,
        "record_p50_us": pct(both, 0.5) / 1e3,
        "record_p99_us": pct(both, 0.99) / 1e3,
        "record_p999_us": pct(both, 0.999) / 1e3,
        "record_max_ms": max(both) / 1e6,
        "records_over_1ms": sum(1 for v in both if v > 1_000_000),
        "elapsed_s": res["elapsed"],
        "dropped": res["dropped"],
    }
    print(f"{res['rotations']} rotations, {len(calls)} on_full calls, {res['elapsed']:.1f} s; dropped {res['dropped']}")
    print(
        f"on_full: max {summary['on_full_max_ms']:.2f} ms, p99 {summary['on_full_p99_ms']:.3f} ms, "
        f"median {summary['on_full_median_ms']:.3f} ms, total per rotation {summary['on_full_total_per_rotation_ms']:.2f} ms"
    )
    print(
        f"on_full in thread CPU time: max {summary['on_full_cpu_max_ms']:.2f} ms, p99 {summary['on_full_cpu_p99_ms']:.3f} ms, "
        f"total per rotation {summary['on_full_cpu_total_per_rotation_ms']:.2f} ms"
    )
    print(
        f"on_full in thread CPU time, less the GC collections inside it: max {summary['on_full_cpu_less_gc_max_ms']:.2f} ms, "
        f"p99 {summary['on_full_cpu_less_gc_p99_ms']:.3f} ms"
    )
    print(
        f"on_full less the GC collections inside it: max {summary['on_full_less_gc_max_ms']:.2f} ms, "
        f"p99 {summary['on_full_less_gc_p99_ms']:.3f} ms, total per rotation {summary['on_full_less_gc_total_per_rotation_ms']:.2f} ms"
    )
    print(
        f"the cyclic GC: {len(pauses)} collections, {summary['gc_over_1ms']} over 1 ms, the longest {summary['gc_max_ms']:.1f} ms"
    )
    print(
        f"a request's range open+close and a task's creation ({len(both):,}): p50 {summary['record_p50_us']:.1f} us, "
        f"p99 {summary['record_p99_us']:.1f} us, p99.9 {summary['record_p999_us']:.1f} us, "
        f"max {summary['record_max_ms']:.2f} ms, {summary['records_over_1ms']} over 1 ms"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ring-mb", type=int)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--callgrind", action="store_true", help="instructions per rotation, under valgrind")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    ring_mb = args.ring_mb or (8 if args.callgrind else 50)
    requests = args.requests or (60_000 if args.callgrind else 300_000)
    if args.child:
        res = run(ring_mb * 1_000_000, requests, in_eval=True)
        print(res["rotations"], len(res["calls"]))
        return
    print(header())
    print(f"ring {ring_mb} MB, {requests:,} requests (a task and a range each)\n")
    if args.callgrind:
        argv = [sys.executable, os.path.abspath(__file__), "--child", "--ring-mb", str(ring_mb), "--requests", str(requests)]
        count, out = callgrind(argv)
        rotations, ncalls = map(int, out.split()[-2:])
        per = count / max(rotations, 1)
        print(f"{rotations} rotations, {ncalls} on_full calls: {count:,} instructions, {per:,.0f} per rotation")
        summary: dict[str, Any] = {"instructions": count, "rotations": rotations, "per_rotation": per}
    else:
        summary = report(run(ring_mb * 1_000_000, requests, in_eval=False))
    if args.json:
        dump(args.json, [], summary)


if __name__ == "__main__":
    main()
