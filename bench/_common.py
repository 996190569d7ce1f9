"""Shared helpers for aprof's benchmarks: interleaved timing and tables.

Every benchmark runs aprof and its peers in one process, round-robin over
several rounds, so machine noise hits all cases alike; it reports the median
(and minimum) per case and the ratio to a baseline case.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Case:
    """A named measurement; ``run()`` returns one sample (ns per op, or s)."""

    name: str
    run: Callable[[], float] | None
    missing: str | None = None
    samples: list[float] = field(default_factory=list)


def interleave(cases: list[Case], rounds: int) -> None:
    """Run every available case once per round, in turn."""
    for _ in range(rounds):
        for case in cases:
            if case.run is None:
                continue
            try:
                case.samples.append(case.run())
            except Exception as exc:  # a peer that breaks is reported, not fatal
                case.run = None
                case.missing = f"error: {type(exc).__name__}: {exc}"


def table(cases: list[Case], baseline: str, unit: str) -> str:
    """Median, min and ratio to the baseline case's median."""
    base = next(c for c in cases if c.name == baseline)
    base_med = statistics.median(base.samples) if base.samples else float("nan")
    rows = [("case", f"median {unit}", f"min {unit}", f"x {baseline}")]
    for c in cases:
        if not c.samples:
            rows.append((c.name, c.missing or "missing", "", ""))
            continue
        med = statistics.median(c.samples)
        rows.append((c.name, f"{med:,.1f}", f"{min(c.samples):,.1f}", f"{med / base_med:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[0].ljust(widths[0]) if i == 0 else r[i].rjust(widths[i]) for i in range(4)) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def header() -> str:
    import aprof

    return (
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}, "
        f"aprof {aprof.__version__} (C extension: {getattr(aprof, '_C_EXTENSION', None) or 'none'})"
    )


def dump(path: str | None, cases: list[Case], extra: dict[str, Any]) -> None:
    if not path:
        return
    data = {c.name: {"samples": c.samples, "missing": c.missing} for c in cases}
    with open(path, "w") as f:
        json.dump({"python": platform.python_version(), "cases": data, **extra}, f, indent=1)
