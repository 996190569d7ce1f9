"""Work in other processes (issue 20): process-pool overhead and merge speed.

1. ``pool``: submit ``--jobs`` small jobs (a range and a short sum) to a
   2-worker ``ProcessPoolExecutor`` and wait for them all: plain, against
   ``aprof.propagating(pool)`` under a profile. The pool is started once
   per start method (its start, and aprof's import in spawned workers,
   are not timed); rounds interleave the two cases. Each aprof round is
   timed in parts, reported apart:

   * ``start``: ``profile.start()``;
   * ``jobs``: the first submit to the last result, the profile running
     (the per-job cost: the submit's wrapper in the parent; in each worker
     its unpickling, the ``EXECUTOR`` range and the job's own range; and,
     once per worker per profile, joining the profile: about 0.3 ms,
     inside the first job);
   * ``stop``: ``profile.stop()``, a one-off per profile: each worker
     stops its profile and sends its session, the parent merges them.

   Target: aprof at most 1.2x plain, whole (start + jobs + stop), judged on
   the median of each round's aprof/plain ratio; the ``jobs`` ratio is the
   per-job cost alone. On Linux it also reports the CPU time of a round,
   the parent's and the workers' (``/proc/<pid>/task/*/schedstat``): the
   wall-clock overhead is that CPU, not waiting.
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
from typing import Any

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


def run_aprof(pool: concurrent.futures.Executor, jobs: int, check: bool = True) -> tuple[float, float, float]:
    """One aprof round: (start, jobs, stop) in seconds."""
    ppool = aprof.propagating(pool)
    t0 = time.perf_counter()
    prof = aprof.profile().start()
    t1 = time.perf_counter()
    futs = [ppool.submit(job, 100) for _ in range(jobs)]
    for f in futs:
        f.result()
    t2 = time.perf_counter()
    prof.stop()
    t3 = time.perf_counter()
    if check:  # --callgrind: the count below is not the workload's
        n = sum(1 for e in prof.events() if e.name == "job")
        assert n == jobs, n
        assert not prof.session.lost, prof.session.lost
    return t1 - t0, t2 - t1, t3 - t2


def bench_pool(jobs: int, rounds: int, methods: list[str]) -> None:
    for method in methods:
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method))
        run_plain(pool, 50)  # workers started
        run_aprof(pool, 50)
        plain: list[float] = []
        prof: list[tuple[float, float, float]] = []
        workers = list(pool._processes)  # type: ignore[attr-defined]
        cpu: dict[str, list[tuple[float, float]]] = {"plain": [], "aprof": []}
        for r in range(rounds):
            if r % 2:
                prof.append(_timed(run_aprof, pool, jobs, workers, cpu["aprof"]))
                plain.append(_timed(run_plain, pool, jobs, workers, cpu["plain"]))
            else:
                plain.append(_timed(run_plain, pool, jobs, workers, cpu["plain"]))
                prof.append(_timed(run_aprof, pool, jobs, workers, cpu["aprof"]))
        pool.shutdown()
        whole = [sum(p) for p in prof]
        mp, ma = statistics.median(plain), statistics.median(whole)
        med = statistics.median
        # Each round's two runs are adjacent: their ratio is the least
        # disturbed by a shared machine's load, which drifts between rounds.
        paired = med(a / p for a, p in zip(whole, plain, strict=True))
        paired_jobs = med(a[1] / p for a, p in zip(prof, plain, strict=True))
        print(  # noqa: T201 - a benchmark's report
            f"pool[{method}] {jobs} jobs, 2 workers: plain median {mp * 1e3:.1f} ms (min {min(plain) * 1e3:.1f}); "
            f"aprof median {ma * 1e3:.1f} ms (min {min(whole) * 1e3:.1f}) = start {med(p[0] for p in prof) * 1e3:.2f} "
            f"+ jobs {med(p[1] for p in prof) * 1e3:.1f} + stop {med(p[2] for p in prof) * 1e3:.2f} ms (one-off: "
            f"{med(p[2] / p[1] for p in prof) * 100:.1f}% of the jobs' time)\n"
            f"  median of paired rounds: whole {paired:.3f}x  [target <= 1.2x: {'ok' if paired <= 1.2 else 'MISSED'}]; "
            f"jobs alone (the per-job cost) {paired_jobs:.3f}x",
            flush=True,
        )
        if all(c for c in cpu["plain"]):  # Linux: CPU time per round, of the parent and of the two workers
            (pp, pw), (ap, aw) = ((med(c[0] for c in cpu[k]), med(c[1] for c in cpu[k])) for k in ("plain", "aprof"))
            print(  # noqa: T201 - a benchmark's report
                f"  CPU per round (median): parent {pp:.1f} -> {ap:.1f} ms ({ap / pp:.2f}x), "
                f"workers {pw:.1f} -> {aw:.1f} ms ({aw / pw:.2f}x), both {(pp + pw):.1f} -> {(ap + aw):.1f} ms "
                f"({(ap + aw) / (pp + pw):.2f}x)",
                flush=True,
            )


def _timed(fn: Any, pool: Any, jobs: int, workers: list[int], cpu: list[tuple[float, float]]) -> Any:
    """``fn(pool, jobs)``, noting the CPU time it took the parent and the workers."""
    c0 = _cpu_ms([os.getpid()]), _cpu_ms(workers)
    out = fn(pool, jobs)
    cpu.append((_cpu_ms([os.getpid()]) - c0[0], _cpu_ms(workers) - c0[1]))
    return out


def _cpu_ms(pids: list[int]) -> float:
    """The CPU time the processes' threads have used (ms), from
    /proc/<pid>/task/<tid>/schedstat (Linux; 0 elsewhere)."""
    ns = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns += int(f.read().split()[0])
        except OSError:
            continue
    return ns / 1e6


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
