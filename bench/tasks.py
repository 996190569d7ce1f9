"""An asyncio fan-out under aprof and its peers, in one process.

    python bench/tasks.py                      # full run (2,000 tasks, 21 rounds, ~2 minutes)
    python bench/tasks.py --quick              # a smoke test of a few seconds
    python bench/tasks.py --tasks 5000 --rounds 31 --json /tmp/tasks.json

The workload: ``asyncio.gather`` of N tasks (default 2,000), each doing three
``await asyncio.sleep(0)``, one ``await asyncio.sleep(0.001)``, about 40 us of
sync work on the loop (SHA-256 rounds) and one ``loop.run_in_executor`` of the
same sync work on the default executor. The workload code is the same for
every variant; the aprof variant passes the executor callable through
``aprof.wrap`` so the work follows the profile onto the worker thread (the
others pass it as is).

Variants, run round-robin in one process (the order rotating every round),
each timed wall-clock over the whole fan-out only (starting and stopping the
profilers is outside the timing):

* plain
* ``async with aprof.profile():`` (tasks on, the default)
* ``async with aprof.profile(python_tracer=True):`` (every Python call too;
  Python frames only, the default)
* the same with ``c_calls=True`` (C calls too)
* ``async with aprof.profile(sample_interval=0.001):`` (stack samples)
* viztracer: ``VizTracer(log_async=True, verbose=0)``
* pyinstrument: ``Profiler(async_mode="enabled")``
* yappi: ``yappi.set_clock_type("wall"); yappi.start()``

Every profiler is started inside the loop, right before the timed fan-out, and
stopped right after it. A peer that is not installed is reported as missing.
The process's CPU time over the same samples is printed as a second table.

Keeping the variants from disturbing each other in one process:

* before each sample the heap is collected and then frozen (``gc.freeze()``):
  viztracer and yappi keep every run's tasks or coroutines alive after stop,
  and those would otherwise slow every later full collection, whichever
  variant runs then;
* a peer that leaves a profile or trace hook installed after stop (viztracer
  1.1 leaves its ``threading`` hook, so every later executor thread would run
  under it) has it removed; both are reported as notes under the table.

Then, for aprof alone:

* memory: what the profile's raw data holds after the fan-out (measured with
  tracemalloc as the bytes freed when it is dropped), per task, split into
  the event records themselves (the start and end tuples of each TASK and
  EXECUTOR range, with their ints and names) and everything beyond them
  (extra dicts, step arrays, per-track lists, logical-thread objects), plus
  the whole process's growth against the same fan-out unprofiled, as a
  cross-check that nothing else is kept;
* ``stop()`` (of which consolidation) and ``export_chrome_trace()`` for the
  fan-out, medians over a few runs.

Finally the figures are checked against the issue's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Case, aprof_info, dump, header, interleave, median, table  # noqa: E402

try:
    from _common import load_average  # noqa: E402
except ImportError:  # an older _common

    def load_average() -> str:
        try:
            return f"{os.getloadavg()[0]:.2f}"
        except OSError:
            return "?"


PLAIN = "plain"
APROF = "aprof profile (tasks on)"
APROF_TRACER = "aprof profile + python_tracer"
APROF_PY_TRACER = "aprof python_tracer, C calls"
APROF_SAMPLER = "aprof profile + sample 1 ms"
VIZ = "viztracer log_async"
PYINST = "pyinstrument async_mode"
YAPPI = "yappi wall"

#: The issue's targets (Python 3.11, a 2-core machine).
TARGET_RATIO = 1.3
TARGET_TRACER_RATIO = 1.4  # issue #4: the fan-out with the Python tracer on
TARGET_SAMPLER_RATIO = 1.10  # issue #18: the fan-out sampled at 1 ms
TARGET_BYTES_BEYOND = 300
#: What the issue says the peers measure, for reference.
PEER_REFERENCE = {VIZ: 1.65, PYINST: 2.1}

#: SHA-256 rounds per call of sync_work: about 40 us on the project's machine.
WORK_ROUNDS = 40


# -- the workload --------------------------------------------------------------


def sync_work(data: bytes) -> bytes:
    for _ in range(WORK_ROUNDS):
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


#: Process CPU seconds of each sample, by case name (a second view, less
#: sensitive than wall time to other work on the machine).
CPU_SAMPLES: dict[str, list[float]] = collections.defaultdict(list)


async def timed_fan_out(n: int, wrap: Callable[[Any], Any], case: str) -> float:
    c0 = time.process_time()
    t0 = time.perf_counter()
    await fan_out(n, wrap)
    dt = time.perf_counter() - t0
    CPU_SAMPLES[case].append(time.process_time() - c0)
    return dt


# -- variants ------------------------------------------------------------------


def plain_case(n: int) -> Case:
    return Case(PLAIN, lambda: asyncio.run(timed_fan_out(n, identity, PLAIN)))


def aprof_case(n: int, python_tracer: bool = False, c_calls: bool = False, sample: float | None = None) -> Case:
    name = (APROF_PY_TRACER if c_calls else APROF_TRACER) if python_tracer else APROF_SAMPLER if sample else APROF
    try:
        import aprof
    except Exception as exc:  # noqa: BLE001 - reported, like a missing peer
        return Case(name, None, f"aprof not importable ({type(exc).__name__}: {exc})")
    checked = False

    async def main() -> float:
        nonlocal checked
        async with aprof.profile(python_tracer=python_tracer, c_calls=c_calls, sample_interval=sample) as prof:
            dt = await timed_fan_out(n, aprof.wrap, name)
        if not checked:  # once: the profile saw every task and every executor call
            checked = True
            by_scope = collections.Counter(e.scope for e in prof.events())
            got = (by_scope[aprof.RecordScope.TASK], by_scope[aprof.RecordScope.EXECUTOR])
            if got != (n, n):
                raise RuntimeError(f"aprof recorded {got[0]} TASK and {got[1]} EXECUTOR ranges, expected {n} of each")
        return dt

    return Case(name, lambda: asyncio.run(main()))


def aprof_tracer_case(n: int) -> Case:
    return aprof_case(n, python_tracer=True)


def aprof_py_tracer_case(n: int) -> Case:
    return aprof_case(n, python_tracer=True, c_calls=True)


def aprof_sampler_case(n: int) -> Case:
    return aprof_case(n, sample=0.001)


def _peer(name: str, module: str, start: Callable[[], Any], stop: Callable[[Any], None], n: int) -> Case:
    try:
        __import__(module)
    except ImportError:
        return Case(name, None, f"missing (pip install {module})")

    case = Case(name, None)
    notes: dict[str, str] = {}

    def note(key: str, text: str) -> None:
        notes[key] = text
        case.note = "; ".join(notes.values())

    async def main() -> float:
        hooks = _hooks()
        handle = start()
        try:
            return await timed_fan_out(n, identity, name)
        finally:
            stop(handle)
            if _hooks() != hooks:
                # viztracer 1.1 leaves its thread hook installed after stop():
                # every thread started later (the next variant's executor
                # workers) would run under it, whatever the variant.
                _restore_hooks(hooks)
                note("hook", "left a profile/trace hook installed after stop(); the benchmark removes it")

    checked = False

    def run() -> float:
        nonlocal checked
        if checked:
            return asyncio.run(main())
        # Once: does the peer keep objects alive after stop (and clear)?
        checked = True
        gc.collect()
        before = len(gc.get_objects())
        dt = asyncio.run(main())
        gc.collect()
        kept = len(gc.get_objects()) - before
        if kept > n:
            note("kept", f"keeps ~{kept:,} objects alive per run after stop (frozen out of later GC passes)")
        return dt

    case.run = run
    return case


def isolated(case: Case) -> Case:
    """Collect and then freeze the heap before each sample.

    viztracer (log_async) and yappi keep every run's tasks or coroutines alive
    after stop and clear (thousands of objects per run, more every round): left
    in the collected generations, they would slow every later full collection,
    whichever variant runs then, and most the variants that allocate most.
    ``gc.freeze()`` moves them (and everything else alive) out of the
    collector's sight, so each sample starts from the same, empty, generations.
    """
    run = case.run
    if run is None:
        return case

    def sample() -> float:
        gc.collect()
        gc.freeze()
        return run()

    case.run = sample
    return case


def _hooks() -> tuple[Any, ...]:
    return (sys.getprofile(), sys.gettrace(), threading.getprofile(), threading.gettrace())


def _restore_hooks(hooks: tuple[Any, ...]) -> None:
    sys.setprofile(hooks[0])
    sys.settrace(hooks[1])
    threading.setprofile(hooks[2])
    threading.settrace(hooks[3])


def viztracer_case(n: int) -> Case:
    def start() -> Any:
        from viztracer import VizTracer

        tracer = VizTracer(log_async=True, verbose=0)
        tracer.start()
        return tracer

    def stop(tracer: Any) -> None:
        tracer.stop()
        tracer.clear()

    return _peer(VIZ, "viztracer", start, stop, n)


def pyinstrument_case(n: int) -> Case:
    def start() -> Any:
        from pyinstrument import Profiler

        p = Profiler(async_mode="enabled")
        p.start()
        return p

    def stop(p: Any) -> None:
        p.stop()

    return _peer(PYINST, "pyinstrument", start, stop, n)


def yappi_case(n: int) -> Case:
    def start() -> Any:
        import yappi

        yappi.set_clock_type("wall")
        yappi.start()
        return yappi

    def stop(yappi: Any) -> None:
        yappi.stop()
        yappi.clear_stats()

    return _peer(YAPPI, "yappi", start, stop, n)


# -- aprof's memory per task ------------------------------------------------------


def _is_end_record(t: tuple[Any, ...]) -> bool:
    # A start record begins with its name (a str), an end record with its start's index.
    return isinstance(t[0], int)


def _steps_of(extra: Any) -> Any:
    """A TASK record's step array, wherever the raw layout keeps it."""
    if isinstance(extra, dict):
        return extra.get("steps")
    return extra if isinstance(extra, array) else None


def _index_starts(lists: dict[Any, list[tuple[Any, ...]]]) -> dict[tuple[int, int], str]:
    kinds: dict[tuple[int, int], str] = {}
    for lst in lists.values():
        for i, t in enumerate(lst):
            if not _is_end_record(t):
                kinds[(id(lst), i)] = {"task": "TASK", "executor": "EXECUTOR"}.get(t[1], "other")
    return kinds


def raw_containers(state: Any) -> dict[str, Any]:
    """The running profile's raw data: every list or dict its state holds (``lists``, ...)."""
    out: dict[str, Any] = {}
    for name in getattr(type(state), "__slots__", ()):
        value = getattr(state, name, None)
        if isinstance(value, (list, dict)):
            out[name] = value
    return out


def breakdown(containers: dict[str, Any]) -> dict[str, int]:
    """Bytes (``sys.getsizeof``, each object once) held by a profile's raw data, by kind.

    ``lists`` (one raw list per logical thread) is read with the recorder's
    layout: an end record counts with its start's kind; a start record's
    fields are the event's, its extra slot (a dict, a step array or another
    field) is "beyond". Any other container is read generically: its tuples
    (and their scalar fields) are event records, arrays in them step arrays,
    dicts in them extra dicts, logical threads as such. The first holder of a
    shared object gets it; cached objects (small ints, the scope strings,
    names shared by every task) count once in all.
    """
    seen: set[int] = set()
    out: collections.Counter[str] = collections.Counter()

    def add(cat: str, obj: Any) -> None:
        if obj is None or isinstance(obj, bool) or id(obj) in seen:
            return
        seen.add(id(obj))
        out[cat] += sys.getsizeof(obj)

    def add_lt(lt: Any) -> None:
        cat = "beyond: logical threads (object, name, task weakref)"
        add(cat, lt)
        add(cat, getattr(lt, "name", None))
        add(cat, getattr(lt, "_task_ref", None))

    def add_extra(kind: str, extra: Any) -> None:
        if isinstance(extra, dict):
            add(f"beyond: {kind} extra dicts", extra)
            for k, v in extra.items():
                add(f"beyond: {kind} step arrays" if k == "steps" else f"beyond: {kind} extra dicts", v)
        elif isinstance(extra, array):
            add(f"beyond: {kind} step arrays", extra)
        elif extra is not None:
            add(f"beyond: {kind} extra fields", extra)

    for cname, container in containers.items():
        if cname == "lists":
            lists = container
            kinds = _index_starts(lists)
            add("beyond: the dict of lists", lists)
            for lt, lst in lists.items():
                add("beyond: per-track lists", lst)
                add_lt(lt)
                for i, t in enumerate(lst):
                    if _is_end_record(t):
                        cat = f"event: {kinds.get((id(lst), t[0]), 'other')} records"
                        add(cat, t)
                        for x in t:
                            add(cat, x)
                        continue
                    kind = kinds[(id(lst), i)]
                    cat = f"event: {kind} records"
                    add(cat, t)
                    for x in t[:9]:
                        add(cat, x)
                    add_extra(kind, t[9] if len(t) > 9 else None)
            continue
        add(f"beyond: the {cname} container", container)
        items = container.items() if isinstance(container, dict) else ((None, v) for v in container)
        for k, v in items:
            for x in (k, v):
                if isinstance(x, tuple):
                    add(f"event: {cname} records", x)
                    for y in x:
                        if isinstance(y, (int, str, float)):
                            add(f"event: {cname} records", y)
                        else:
                            add_extra(cname, y)
                elif isinstance(x, (int, str)) or x is None:
                    add(f"beyond: the {cname} container", x)
                elif type(x).__name__ == "LogicalThread":
                    add_lt(x)
                else:
                    add_extra(cname, x)
    return dict(out)


def memory_per_task(n: int) -> dict[str, Any]:
    """What aprof keeps per task for the fan-out, measured with tracemalloc.

    ``raw_bytes``: bytes freed when the profile's raw lists are dropped after
    the fan-out (everything only they hold: records, extra dicts, step
    arrays, logical threads). ``process_bytes``: the whole process's growth
    over the fan-out, profiled minus unprofiled (after the tasks are gone),
    a cross-check that nothing else is kept.
    """
    import aprof

    async def run(profiled: bool) -> dict[str, Any]:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            prof = aprof.profile().start() if profiled else None
            await fan_out(n, aprof.wrap if profiled else identity)
            # The loop's handle for this step holds the gather future (and so
            # every task) until the step ends: let it go.
            await asyncio.sleep(0)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            out: dict[str, Any] = {"grown": after - before}
            if prof is not None:
                state = prof._state
                assert state is not None
                containers = raw_containers(state)
                out["breakdown"] = breakdown(containers)
                for name, value in containers.items():
                    setattr(state, name, type(value)())
                gc.collect()
                held = tracemalloc.get_traced_memory()[0]
                del containers, value
                gc.collect()
                out["raw_bytes"] = held - tracemalloc.get_traced_memory()[0]
                prof.stop()
            return out
        finally:
            tracemalloc.stop()

    plain = asyncio.run(run(False))
    prof = asyncio.run(run(True))
    bd: dict[str, int] = prof["breakdown"]
    event_bytes = sum(v for k, v in bd.items() if k.startswith("event:"))
    sized = sum(bd.values())
    raw = prof["raw_bytes"]
    # tracemalloc (actual blocks) and getsizeof differ a little; the part of
    # the freed bytes not in event records is "beyond the events".
    return {
        "tasks": n,
        "raw_bytes_per_task": raw / n,
        "sized_bytes_per_task": sized / n,
        "event_bytes_per_task": event_bytes / n,
        "task_event_bytes_per_task": sum(v for k, v in bd.items() if k.startswith("event:") and "task" in k.lower())
        / n,
        "beyond_bytes_per_task": (raw - event_bytes) / n,
        "process_bytes_per_task": (prof["grown"] - plain["grown"]) / n,
        "breakdown_per_task": {k: v / n for k, v in sorted(bd.items(), key=lambda kv: -kv[1])},
    }


def stop_and_export(n: int, repeats: int) -> dict[str, Any]:
    """Medians of ``stop()`` (and of the consolidation inside it) and of the Chrome export."""
    import aprof
    from aprof._post import _session

    consolidation: list[float] = []
    original = _session.Session.__dict__["from_state"]

    def timed_from_state(cls: Any, state: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original.__func__(cls, state)
        finally:
            consolidation.append(time.perf_counter() - t0)

    stops, exports, sizes = [], [], []
    counts: dict[str, Any] = {}
    _session.Session.from_state = classmethod(timed_from_state)  # type: ignore[method-assign,assignment]
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            for _ in range(repeats):
                gc.collect()

                async def main() -> aprof.profile:
                    prof = aprof.profile().start()
                    await fan_out(n, aprof.wrap)
                    t0 = time.perf_counter()
                    prof.stop()
                    stops.append(time.perf_counter() - t0)
                    return prof

                prof = asyncio.run(main())
                if not counts:
                    events = prof.events()
                    tasks = [e for e in events if e.scope is aprof.RecordScope.TASK]
                    counts["events"] = len(events)
                    counts["task_events"] = len(tasks)
                    counts["steps_per_task"] = sum(len(e.extra["steps"]) // 2 for e in tasks if e.extra) / max(
                        len(tasks), 1
                    )
                    del events, tasks
                t0 = time.perf_counter()
                prof.export_chrome_trace(path)
                exports.append(time.perf_counter() - t0)
                sizes.append(os.path.getsize(path))
                del prof
    finally:
        _session.Session.from_state = original  # type: ignore[method-assign]
    return {
        "repeats": repeats,
        "stop_s": statistics.median(stops),
        "consolidation_s": statistics.median(consolidation) if consolidation else None,
        "export_s": statistics.median(exports),
        "trace_bytes": sizes[-1],
        **counts,
        "stop_samples": stops,
        "export_samples": exports,
    }


def format_memory(mem: dict[str, Any]) -> str:
    lines = [
        f"aprof memory for the {mem['tasks']:,}-task fan-out, bytes per task:",
        f"  held by the raw data (tracemalloc, freed when dropped)   {mem['raw_bytes_per_task']:7.0f}",
        f"    the event records (TASK + EXECUTOR start/end tuples)   {mem['event_bytes_per_task']:7.0f}",
        f"      of which the TASK event's records                    {mem['task_event_bytes_per_task']:7.0f}",
        f"    beyond the events                                      {mem['beyond_bytes_per_task']:7.0f}",
        f"  whole process, profiled minus plain (cross-check)        {mem['process_bytes_per_task']:7.0f}",
        "  by kind (sys.getsizeof, each object once):",
    ]
    for k, v in mem["breakdown_per_task"].items():
        lines.append(f"    {k:<58} {v:7.1f}")
    lines.append(f"    {'total':<58} {mem['sized_bytes_per_task']:7.1f}")
    return "\n".join(lines)


def format_stop(s: dict[str, Any], n: int) -> str:
    cons = f" (consolidation {s['consolidation_s'] * 1e3:.1f} ms)" if s["consolidation_s"] is not None else ""
    return (
        f"aprof stop + export for the {n:,}-task fan-out ({s['events']:,} events, {s['task_events']:,} of them TASK, "
        f"{s['steps_per_task']:.1f} steps a task), median of {s['repeats']}:\n  "
        f"stop {s['stop_s'] * 1e3:.1f} ms{cons}, Chrome export {s['export_s'] * 1e3:.1f} ms "
        f"({s['trace_bytes'] / 1e6:.1f} MB); together {(s['stop_s'] + s['export_s']) * 1e3:.1f} ms"
    )


# -- targets -------------------------------------------------------------------


def targets(cases: dict[str, Case], mem: dict[str, Any] | None) -> list[str]:
    out = ["targets (from the issue; Python 3.11, 2-core machine):"]

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    base, ap = cases[PLAIN], cases[APROF]
    if base.samples and ap.samples:
        ratio = median(ap) / median(base)
        out.append(f"  fan-out, tasks on <= {TARGET_RATIO}x plain: {ratio:.3f}x  {verdict(ratio <= TARGET_RATIO)}")
        for name, ref in PEER_REFERENCE.items():
            c = cases[name]
            got = f"{median(c) / median(base):.2f}x here" if c.samples else (c.missing or "not measured")
            out.append(f"      for reference, {name}: issue says ~{ref}x, {got}")
    else:
        out.append(f"  fan-out, tasks on: not measured ({ap.missing or base.missing})")
    for name, what, target in (
        (APROF_TRACER, "python_tracer on", TARGET_TRACER_RATIO),
        (APROF_PY_TRACER, "python_tracer on, C calls (reported)", TARGET_TRACER_RATIO),
        (APROF_SAMPLER, "sampled at 1 ms", TARGET_SAMPLER_RATIO),
    ):
        tr = cases[name]
        if base.samples and tr.samples:
            ratio = median(tr) / median(base)
            out.append(f"  fan-out, {what} <= {target}x plain: {ratio:.3f}x  {verdict(ratio <= target)}")
        else:
            out.append(f"  fan-out, {what}: not measured ({tr.missing or base.missing})")
    if mem is None:
        out.append("  memory per task: not measured")
    else:
        b = mem["beyond_bytes_per_task"]
        out.append(
            f"  memory per task beyond its events <= {TARGET_BYTES_BEYOND} bytes: {b:.0f} bytes  "
            f"{verdict(b <= TARGET_BYTES_BEYOND)}"
        )
    return out


# -- main ----------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 tasks, 2 rounds: a smoke test of a few seconds")
    ap.add_argument("--tasks", type=int, default=None, metavar="N", help="tasks in the fan-out (default 2,000)")
    ap.add_argument(
        "--rounds", type=int, default=None, metavar="N", help="interleaved rounds (default 21; 2 with --quick)"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="also write all samples and figures here")
    ap.add_argument(
        "--only",
        default=None,
        metavar="WORDS",
        help="comma-separated: only the variants whose name contains one (plain always), e.g. --only aprof",
    )
    ap.add_argument("--no-extras", action="store_true", help="skip the memory and stop/export measurements")
    args = ap.parse_args()
    n = args.tasks or (200 if args.quick else 2000)
    rounds = args.rounds or (2 if args.quick else 21)
    repeats = 2 if args.quick else 5

    makers = (plain_case, aprof_case, aprof_tracer_case, aprof_py_tracer_case, aprof_sampler_case, viztracer_case,
              pyinstrument_case, yappi_case)  # fmt: skip
    cases = [isolated(make(n)) for make in makers]
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        for c in cases:
            if c.name != PLAIN and not any(w in c.name for w in words):
                c.run, c.missing = None, "not selected (--only)"
    print(header())
    print(
        f"fan-out of {n:,} tasks (3x sleep(0), sleep(1 ms), ~{WORK_ROUNDS} SHA-256 rounds on the loop and one "
        f"run_in_executor each), {rounds} interleaved rounds after one warm-up round\n"
    )
    progress = sys.stderr.isatty()
    interleave(cases, 1, collect=True)  # warm-up: imports, thread pools, first-call caches
    for c in cases:
        c.samples.clear()
    interleave(cases, rounds, collect=True, rotate=True, progress=progress)
    for c in cases:
        c.samples = [x * 1e3 for x in c.samples]
    print(table(cases, PLAIN, "ms"))
    # The warm-up round's CPU samples are dropped with its wall samples.
    cpu_cases = [Case(c.name, None, c.missing, [x * 1e3 for x in CPU_SAMPLES[c.name][-len(c.samples) :]] if c.samples else [])
                 for c in cases]  # fmt: skip
    print("\nthe same samples, process CPU time (all threads) during the fan-out:\n")
    print(table(cpu_cases, PLAIN, "ms").split("\n\nnotes:")[0])

    mem = stops = None
    if aprof_info()["importable"] and not args.no_extras:
        print()
        mem = memory_per_task(n)
        print(format_memory(mem))
        print()
        stops = stop_and_export(n, repeats)
        print(format_stop(stops, n))
    print()
    print("\n".join(targets({c.name: c for c in cases}, mem)))
    print(
        f"\nload average at the end: {load_average()} (on 2 cores, much above 0.5 means other work disturbed the figures)"
    )
    dump(
        args.json,
        cases,
        {
            "tasks": n,
            "rounds": rounds,
            "cpu_ms": {c.name: c.samples for c in cpu_cases},
            "memory": mem,
            "stop_export": stops,
        },
    )


if __name__ == "__main__":
    main()
