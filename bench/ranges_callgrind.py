"""Instructions per range and per task of aprof, under callgrind.

    nice valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect=builtin_eval \\
        python bench/ranges_callgrind.py CASE N
    python bench/ranges_callgrind.py --report                  # every case: ~7 minutes
    python bench/ranges_callgrind.py --report --only null,idle,thread --ranges 20000

runs one case once, its measured part inside ``eval()``, so that
``--toggle-collect=builtin_eval`` counts that part alone: not the imports,
the set-up, a profile's start, nor its stop and consolidation. Cases:

- ranges (N iterations of ``with <cm>: pass``, the loop compiled inline as in
  ``bench/_common.with_loop``, without the clock):
  ``null`` (``contextlib.nullcontext()``), ``idle`` (``aprof.record_function("x")``,
  nothing registered), ``thread`` (a profile started in the main thread with
  ``prof.start()``), ``task`` (``async with aprof.profile()``, the loop in the
  same coroutine), ``spawned`` (the loop in a task created with
  ``asyncio.create_task`` inside the profiled context). The profiled cases
  check, outside the count, that the profile recorded N ranges.
- the fan-out of ``bench/tasks.py`` (N tasks: three ``sleep(0)``, one
  ``sleep(0.001)``, SHA-256 work, one ``run_in_executor``), as in
  ``bench/tasks_callgrind.py``: ``fan-plain`` (no profile, the executor job
  bare), ``fan-notasks`` (``aprof.profile(tasks=False)``), ``fan-sample``
  (``aprof.profile(tasks=False, sample_interval=0.001)``), ``fan-tasks``
  (``aprof.profile()``, tasks on); the profiled variants pass the job through
  ``aprof.wrap``, as ``bench/tasks.py`` does; ``fan-sample-engine`` is
  ``fan-sample`` counted with the sampler's engine thread too (below).

``python bench/ranges_callgrind.py --report [--ranges N] [--tasks N] [--only
CASES]`` runs every case (or those named) at two sizes (N/2 and N: 10,000 and 20,000 ranges, 1,000 and
2,000 tasks by default), one valgrind at a time under ``nice``, and prints the
marginal instructions per iteration, ``(count N - count N/2) / (N/2)``, which
cancels what does not grow with N; for ranges also the ratio to ``null``,
for the fan-out the instructions per task above ``fan-plain``. Each run's
two counts (and, when sampling, the samples taken) go to stderr. The
fan-out's counts vary by up to ~15,000 instructions per task from run to
run (how often the loop polls and wakes depends on timing): repeat it and
take medians. The ranges' counts are steady.

Callgrind keeps the collection state per thread: only a thread inside
``eval()`` is counted. The executor's worker threads and the sampler's
engine thread (a C thread) are not counted; what their hand-offs cost the
loop's thread is (the sampler's pending call samples on the loop's thread,
inside ``eval()``). ``fan-sample-engine`` is ``fan-sample`` counted with
``--toggle-collect=engine_main`` as well: the engine thread too, from the
profile's start to its stop (the part outside the fan-out mostly cancels).
Under valgrind the program runs some 30x slower and its threads take turns,
so the samples a 1 ms sampler takes per task vary widely from run to run
(0.03 to 1.1 in the runs of the issue notes; about 0.05 natively).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import callgrind  # noqa: E402

RANGE_CASES = {
    "null": "nullcontext(), no profile",
    "idle": "aprof range, nothing registered",
    "thread": "aprof range, profile running (plain thread)",
    "task": "aprof range, profile running (profiling task)",
    "spawned": "aprof range, profile running (spawned task)",
}
FAN_CASES = {
    "fan-plain": "plain",
    "fan-notasks": "profile(tasks=False)",
    "fan-sample": "profile(tasks=False, sample_interval=0.001)",
    "fan-sample-engine": "  the same, + the engine thread's ticks",
    "fan-tasks": "profile() (tasks on)",
}


def range_loop(expr: str, namespace: dict[str, Any]) -> Any:
    """``loop(n)``: n times ``with <expr>: pass``, compiled inline."""
    src = f"def _loop(_n):\n    for _ in range(_n):\n        with {expr}:\n            pass\n"
    ns = dict(namespace)
    exec(compile(src, f"<callgrind: with {expr}>", "exec"), ns)  # noqa: S102
    return ns["_loop"]


def counted(loop: Any, n: int) -> None:
    # Only this call is counted (--toggle-collect=builtin_eval).
    eval("loop(n)", {"loop": loop, "n": n})  # noqa: S307


def check(prof: Any, n: int) -> None:
    got = sum(1 for e in prof.events() if e.name == "x")
    if got != n:
        raise RuntimeError(f"the profile recorded {got:,} of {n:,} ranges")


def run_range(case: str, n: int) -> None:
    if case == "null":
        loop = range_loop("nullcontext()", {"nullcontext": contextlib.nullcontext})
        counted(loop, 2)  # warm-up, as for the aprof cases
        counted(loop, n)
        return
    import aprof

    loop = range_loop('record_function("x")', {"record_function": aprof.record_function})
    counted(loop, 2)  # warm-up: first calls, caches (not profiled, so not checked)
    if case == "idle":
        if aprof.has_callbacks():
            raise RuntimeError("a callback is registered: 'nothing registered' would be wrong")
        counted(loop, n)
        return
    if case == "thread":
        prof = aprof.profile()
        prof.start()
        counted(loop, n)
        prof.stop()
        check(prof, n)
        return

    async def main() -> Any:
        async with aprof.profile() as prof:
            if case == "task":
                counted(loop, n)
            else:

                async def child() -> None:
                    counted(loop, n)

                await asyncio.create_task(child())
        return prof

    check(asyncio.run(main()), n)


def run_fan(case: str, n: int) -> None:
    import tasks as bench  # bench/tasks.py: the same workload

    loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.run_in_executor(None, bench.sync_work, b"warm"))  # the pool starts outside the count
    wrap: Any = bench.identity
    prof: Any = None
    if case != "fan-plain":
        import aprof

        options: dict[str, Any] = {"tasks": case == "fan-tasks"}
        if case.startswith("fan-sample"):
            options["sample_interval"] = 0.001
        prof = aprof.profile(**options)
        wrap = aprof.wrap

        async def start() -> contextvars.Context:
            prof.start()
            return contextvars.copy_context()  # carries the profile

        ctx = loop.run_until_complete(start())
    else:
        ctx = contextvars.copy_context()
    # Only this line is counted (--toggle-collect=builtin_eval).
    eval(  # noqa: S307
        "loop.run_until_complete(loop.create_task(bench.fan_out(n, wrap), context=ctx))",
        {"loop": loop, "bench": bench, "n": n, "wrap": wrap, "ctx": ctx},
    )
    if prof is not None:

        async def stop() -> None:
            prof.stop()

        loop.run_until_complete(stop())
        scopes = [e.scope.name for e in prof.events()]
        want = {"EXECUTOR": n, "TASK": n + 1 if case == "fan-tasks" else 0}  # + the fan_out task
        got = {k: scopes.count(k) for k in want}
        if got != want:
            raise RuntimeError(f"the profile recorded {got}, expected {want}")
        if prof.sample_interval is not None:
            print(f"samples: {len(prof.session.samples.time_ns)}")
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def count(case: str, n: int, python: str) -> tuple[int, int | None]:
    """Instructions callgrind counted inside eval() for one run (with
    ``-engine``, in the sampler's engine thread too), and the samples taken."""
    toggles = ("builtin_eval",)
    if case.endswith("-engine"):
        toggles += ("engine_main",)  # the engine thread, from its start to its end
    count, stdout = callgrind([python, __file__, case, str(n)], toggles, nice=True)
    s = re.search(r"samples: (\d+)", stdout)
    return count, int(s.group(1)) if s else None


def marginal(case: str, n: int, python: str) -> float:
    half = n // 2
    (lo, s_lo), (hi, s_hi) = count(case, half, python), count(case, n, python)
    samples = f"   samples {s_lo:,} / {s_hi:,}" if s_lo is not None and s_hi is not None else ""
    print(f"  {case:17} {half:>7,}: {lo:>15,}   {n:>7,}: {hi:>15,}{samples}", file=sys.stderr, flush=True)
    return (hi - lo) / (n - half)


def report(python: str, n_ranges: int, n_tasks: int, cases: list[str]) -> None:
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"Python {version} ({python}); instructions counted inside eval(), marginal per iteration")
    ranges = [c for c in RANGE_CASES if c in cases]
    if ranges:
        per = {c: marginal(c, n_ranges, python) for c in ranges}
        print(f"\nranges ({n_ranges // 2:,} and {n_ranges:,} iterations):")
        print(f"  {'case':48} {'instr/iter':>11} {'x null':>7}")
        for c in ranges:
            ratio = f"{per[c] / per['null']:6.2f}x" if "null" in per else "      -"
            print(f"  {RANGE_CASES[c]:48} {per[c]:11,.0f} {ratio}")
    fans = [c for c in FAN_CASES if c in cases]
    if fans:
        per = {c: marginal(c, n_tasks, python) for c in fans}
        print(f"\nfan-out ({n_tasks // 2:,} and {n_tasks:,} tasks):")
        print(f"  {'case':48} {'instr/task':>11} {'above plain':>12}")
        for c in fans:
            above = f"{per[c] - per['fan-plain']:12,.0f}" if "fan-plain" in per else "           -"
            print(f"  {FAN_CASES[c]:48} {per[c]:11,.0f} {above}")


def main() -> None:
    every = [*RANGE_CASES, *FAN_CASES]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", choices=every, help="run one case once (under valgrind)")
    ap.add_argument("n", nargs="?", type=int, help="ranges or tasks")
    ap.add_argument("--report", action="store_true", help="run every case under callgrind at N/2 and N")
    ap.add_argument("--ranges", type=int, default=20_000, help="N for the range cases (default 20,000)")
    ap.add_argument("--tasks", type=int, default=2_000, help="N for the fan-out (default 2,000)")
    ap.add_argument("--only", default=None, metavar="CASES", help="comma-separated cases for --report")
    ap.add_argument("--python", default=sys.executable, help="interpreter to measure (default: this one)")
    args = ap.parse_args()
    if args.report:
        cases = args.only.split(",") if args.only else every
        report(args.python, args.ranges, args.tasks, cases)
    elif args.case is None or args.n is None:
        ap.error("give CASE N, or --report")
    elif args.case in RANGE_CASES:
        run_range(args.case, args.n)
    else:
        run_fan(args.case, args.n)


if __name__ == "__main__":
    main()
