"""Work in other processes (issue 20): process-pool overhead and merge speed.

1. ``pool``: submit ``--jobs`` small jobs (a range and a short sum) to a
   2-worker ``ProcessPoolExecutor`` and wait for them all: plain, against
   ``aprof.propagating(pool)`` under a profile, the profile's ``stop()``
   (which asks the workers for their sessions and merges them) included.
   The pool is started once per start method; rounds interleave the two
   cases. Target: aprof at most 1.2x plain (judged on the median of each
   round's aprof/plain ratio).
2. ``merge``: ``--sessions`` sessions of ``--events`` events each (one
   recorded session, given as many processes), merged with
   ``aprof.merge``. Target: at most 2 s per million events.

Run from the repository root::

    .venv/bin/python bench/processes.py [--jobs 1000] [--rounds 7] [--events 1000000] [--sessions 8]

For instruction counts of one pool round (the parent's side only: the
workers are spawned, so valgrind does not follow them)::

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.plain .venv/bin/python bench/processes.py --callgrind plain --jobs 200
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.aprof .venv/bin/python bench/processes.py --callgrind aprof --jobs 200
    callgrind_annotate /tmp/cg.plain | head -3; callgrind_annotate /tmp/cg.aprof | head -3
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aprof  # noqa: E402


def job(n: int) -> int:
    with aprof.record_function("job inner"):
        return sum(range(n))


def run_plain(pool: concurrent.futures.Executor, jobs: int) -> float:
    t0 = time.perf_counter()
    futs = [pool.submit(job, 100) for _ in range(jobs)]
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def run_aprof(pool: concurrent.futures.Executor, jobs: int, check: bool = True) -> float:
    ppool = aprof.propagating(pool)
    t0 = time.perf_counter()
    with aprof.profile() as prof:
        futs = [ppool.submit(job, 100) for _ in range(jobs)]
        for f in futs:
            f.result()
    dt = time.perf_counter() - t0
    if not check:  # --callgrind: the count below is not the workload's
        return dt
    n = sum(1 for e in prof.events() if e.name == "job")
    assert n == jobs, n
    assert not prof.session.lost, prof.session.lost
    return dt


def bench_pool(jobs: int, rounds: int, methods: list[str]) -> None:
    for method in methods:
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method))
        run_plain(pool, 50)  # workers started
        run_aprof(pool, 50)
        plain: list[float] = []
        prof: list[float] = []
        for r in range(rounds):
            order = [(run_plain, plain), (run_aprof, prof)]
            if r % 2:
                order.reverse()
            for fn, out in order:
                out.append(fn(pool, jobs))
        pool.shutdown()
        mp, ma = statistics.median(plain), statistics.median(prof)
        # Each round's two runs are adjacent: their ratio is the least
        # disturbed by a shared machine's load, which drifts between rounds.
        paired = statistics.median(a / p for a, p in zip(prof, plain, strict=True))
        print(  # noqa: T201 - a benchmark's report
            f"pool[{method}] {jobs} jobs, 2 workers: plain median {mp * 1e3:.1f} ms (min {min(plain) * 1e3:.1f}); "
            f"aprof median {ma * 1e3:.1f} ms (min {min(prof) * 1e3:.1f}); ratio median {ma / mp:.2f}x, "
            f"min {min(prof) / min(plain):.2f}x, median of paired rounds {paired:.2f}x  "
            f"[target <= 1.2x: {'ok' if paired <= 1.2 else 'MISSED'}]",
            flush=True,
        )


def bench_merge(events: int, sessions: int, rounds: int) -> None:
    from aprof._post._merge import merge_sessions

    with aprof.profile(tasks=False) as prof:
        rf = aprof.record_function
        for _ in range(events // 2):
            with rf("outer"), rf("inner"):
                pass
    base = prof.session
    inputs = []
    for k in range(sessions):
        s = aprof.Session(base._table, dict(base._tracks), copy.deepcopy(base.metadata))
        s.metadata["session_id"] = f"bench{k}"
        s.metadata["pids"] = {"0": 10_000 + k}
        inputs.append(s)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        merged = merge_sessions(inputs)
        times.append(time.perf_counter() - t0)
        assert len(merged._table) == events * sessions
        del merged
    per_m = statistics.median(times) / (events * sessions / 1e6)
    print(  # noqa: T201 - a benchmark's report
        f"merge {sessions} x {events:,} events: median {statistics.median(times):.2f} s (min {min(times):.2f}), "
        f"{per_m:.2f} s per million events  [target <= 2 s: {'ok' if per_m <= 2 else 'MISSED'}]",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--methods", default="fork,spawn")
    p.add_argument("--merge-rounds", type=int, default=3)
    p.add_argument("--skip-merge", action="store_true")
    p.add_argument("--callgrind", choices=("plain", "aprof"))
    a = p.parse_args()
    if a.callgrind:
        # spawn: the workers are new programs, not traced (valgrind's
        # --trace-children=no); a fork would run them under valgrind too.
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
        run_plain(pool, 20)
        if a.callgrind == "plain":
            run_plain(pool, a.jobs)
        else:
            run_aprof(pool, a.jobs, check=False)
        pool.shutdown()
        return
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}", flush=True)  # noqa: T201
    bench_pool(a.jobs, a.rounds, a.methods.split(","))
    if not a.skip_merge:
        bench_merge(a.events, a.sessions, a.merge_rounds)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")  # noqa: T201


if __name__ == "__main__":
    main()
