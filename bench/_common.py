"""Shared helpers for aprof's benchmarks: interleaved timing, tables, memory.

Every benchmark runs aprof and its peers in one process, round-robin over
several rounds, so machine noise hits all cases alike; it reports the median
(and minimum) per case and the ratio to a baseline case.

Used by ``ranges.py`` and ``tasks.py`` (and meant for later ones, such as a
tracer benchmark). Standard library only; aprof itself is imported lazily, so
a benchmark can still report its peers when aprof cannot be imported.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Case:
    """A named measurement; ``run()`` returns one sample (ns per op, or s).

    A case whose ``run`` is None is reported with ``missing`` (a peer that is
    not installed, or that raised: the first error disables the case).
    """

    name: str
    run: Callable[[], float] | None
    missing: str | None = None
    samples: list[float] = field(default_factory=list)
    note: str | None = None


def interleave(
    cases: list[Case],
    rounds: int,
    *,
    collect: bool = False,
    rotate: bool = False,
    progress: bool = False,
) -> None:
    """Run every available case once per round, in turn.

    Args:
        collect: run ``gc.collect()`` before each sample (outside its timing),
            so garbage left by one case is not collected on another's clock.
        rotate: start each round one case further along, so no case always
            runs right after the same neighbour.
        progress: print a dot per sample to stderr.
    """
    for r in range(rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)] if rotate and cases else cases
        for case in order:
            if case.run is None:
                continue
            if collect:
                gc.collect()
            try:
                case.samples.append(case.run())
            except Exception as exc:  # a peer that breaks is reported, not fatal
                case.run = None
                case.missing = f"error: {type(exc).__name__}: {exc}"
            if progress:
                print(".", end="", file=sys.stderr, flush=True)
        if progress:
            print(f" round {r + 1}/{rounds}", file=sys.stderr, flush=True)


def median(case: Case) -> float:
    return statistics.median(case.samples) if case.samples else float("nan")


def table(cases: list[Case], baseline: str, unit: str) -> str:
    """Median, min, spread, the difference to the baseline and the ratio to it.

    Spread is (max - min) / median over the rounds: how noisy the case was.
    """
    base = next(c for c in cases if c.name == baseline)
    base_med = median(base)
    head = ("case", f"median {unit}", f"min {unit}", "spread", f"+{unit} vs base", f"x {baseline}")
    rows = [head]
    for c in cases:
        if not c.samples:
            rows.append((c.name, c.missing or "missing", "", "", "", ""))
            continue
        med = median(c)
        spread = (max(c.samples) - min(c.samples)) / med if med else 0.0
        rows.append(
            (
                c.name,
                f"{med:,.1f}",
                f"{min(c.samples):,.1f}",
                f"{spread:.0%}",
                "" if c is base else f"{med - base_med:+,.1f}",
                f"{med / base_med:.2f}",
            )
        )
    ncol = len(head)
    # A "missing ..." message spans the numeric columns: do not widen them for it.
    widths = [max(len(r[i]) for r in rows if r[2] or i == 0) for i in range(ncol)]
    lines = []
    for r in rows:
        if not r[2] and r is not head:
            lines.append(f"{r[0].ljust(widths[0])}  {r[1]}")
        else:
            lines.append("  ".join(r[0].ljust(widths[0]) if i == 0 else r[i].rjust(widths[i]) for i in range(ncol)))
    lines.insert(1, "-" * len(lines[0]))
    notes = [f"  [{c.name}] {c.note}" for c in cases if c.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def _c_extension() -> str | None:
    """Which of aprof's hot paths run in C: "ranges+tracer", or None (the twins)."""
    try:
        from aprof._core import _native
    except Exception:  # noqa: BLE001 - an older aprof: say nothing
        return None
    return "ranges+tracer" if _native.extension is not None else None


def aprof_info() -> dict[str, Any]:
    """aprof's version and whether its C extension is in use, or why it is missing."""
    try:
        import aprof
    except Exception as exc:  # noqa: BLE001 - any import failure is reported
        return {"importable": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "importable": True,
        "version": getattr(aprof, "__version__", "?"),
        "c_extension": _c_extension(),
        "file": getattr(aprof, "__file__", None),
        "git": _git_describe(os.path.dirname(os.path.abspath(aprof.__file__ or "."))),
    }


def _git_describe(path: str) -> str | None:
    """The commit of a source checkout, with "-dirty" when aprof/ has uncommitted changes."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    return head + ("-dirty" if git("status", "--porcelain", "--", ".") else "")


def load_average() -> str:
    """The 1-minute load average: more than a fraction means the figures are disturbed."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def header() -> str:
    info = aprof_info()
    if info["importable"]:
        git = f", git {info['git']}" if info.get("git") else ""
        ap = f"aprof {info['version']}{git} (C extension: {info['c_extension'] or 'none'})"
    else:
        ap = f"aprof not importable ({info['error']})"
    return (
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}, "
        f"{os.cpu_count()} CPUs (load average {load_average()} at start), {ap}"
    )


def dump(path: str | None, cases: list[Case], extra: dict[str, Any]) -> None:
    if not path:
        return
    data = {
        c.name: {"samples": c.samples, "median": median(c) if c.samples else None, "missing": c.missing, "note": c.note}
        for c in cases
    }
    with open(path, "w") as f:
        json.dump(
            {
                "python": platform.python_version(),
                "executable": sys.executable,
                "argv": sys.argv,
                "load_average_at_end": load_average(),
                "aprof": aprof_info(),
                "cases": data,
                **extra,
            },
            f,
            indent=1,
        )


# -- timing loops -----------------------------------------------------------


def with_loop(expr: str, namespace: dict[str, Any]) -> Callable[[int], float]:
    """A function ``loop(n)`` returning ns per ``with <expr>: pass``.

    The statement is compiled inline, so each iteration costs exactly the
    constructor call, ``__enter__`` and ``__exit__`` (plus the ``for``), with
    no extra Python call around it; names in ``expr`` are looked up in
    ``namespace`` (as globals, once per iteration).
    """
    src = (
        "def _loop(_n, _clock):\n"
        "    _it = range(_n)\n"
        "    _t0 = _clock()\n"
        "    for _ in _it:\n"
        f"        with {expr}:\n"
        "            pass\n"
        "    return (_clock() - _t0) / _n\n"
    )
    ns = dict(namespace)
    exec(compile(src, f"<bench: with {expr}>", "exec"), ns)
    fn = ns["_loop"]
    clock = time.perf_counter_ns

    def loop(n: int) -> float:
        return float(fn(n, clock))

    return loop


def empty_loop_ns(n: int) -> float:
    """ns per iteration of an empty ``for`` loop: included in every with_loop figure."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    return (time.perf_counter_ns() - t0) / n


# -- memory -------------------------------------------------------------------


def rss_bytes() -> int | None:
    """The process's resident set size now (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far.

    On Linux this is VmHWM: getrusage's ru_maxrss survives exec, so a child
    started from a big parent would report the parent's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def callgrind(argv: list[str], toggles: tuple[str, ...] = ("builtin_eval",), nice: bool = False) -> tuple[int, str]:
    """Run ``argv`` under ``valgrind --tool=callgrind``: the instructions it
    counted (inside the ``toggles`` functions; all of the run if none) and
    the program's stdout. Raises with the end of valgrind's output when the
    run fails or has no count."""
    import re

    collect = [f"--toggle-collect={t}" for t in toggles]
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *collect, *argv]
    out = subprocess.run(["nice", *cmd] if nice else cmd, capture_output=True, text=True, check=False)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"{' '.join(argv[1:])}: exit {out.returncode}:\n{out.stderr[-2000:]}")
    return int(m.group(1)), out.stdout
