"""Instructions per task of aprof's task recording, under callgrind.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect=builtin_eval \\
        python bench/tasks_callgrind.py aprof 2000

runs the fan-out of ``bench/tasks.py`` (each task: three ``sleep(0)``, one
``sleep(0.001)``, SHA-256 work, one ``run_in_executor``) once, inside
``eval()``, either plain or in the context of a running ``aprof.profile()`` (tasks on),
so that ``--toggle-collect=builtin_eval`` counts the fan-out alone: not the
imports, the loop's set-up, the profile's start, nor its stop and
consolidation. ``python bench/tasks_callgrind.py --report`` runs the four
measurements (plain and aprof, N and N/2 tasks) and prints the marginal
instructions per task: ``((aprof N - aprof N/2) - (plain N - plain N/2)) /
(N/2)``, which cancels what does not grow with the number of tasks.

Callgrind keeps its collection state per thread, so only the loop's thread
(the one inside ``eval()``) is counted: the executor's worker threads, and
what aprof records on them, are not (``bench/ranges_callgrind.py`` says
more, and counts the sampler's engine thread on request).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import callgrind  # noqa: E402


def run(variant: str, n: int) -> None:
    """One fan-out, counted inside ``eval()``: ``bench/ranges_callgrind.py``'s
    ``fan-tasks`` (``aprof``) or ``fan-plain`` (``plain``) case."""
    from ranges_callgrind import run_fan

    run_fan("fan-tasks" if variant == "aprof" else "fan-plain", n)


def count(variant: str, n: int, python: str) -> int:
    """Instructions callgrind counted inside eval() for one run."""
    return callgrind([python, __file__, variant, str(n)])[0]


def report(n: int, python: str) -> dict[str, Any]:
    half = n // 2
    c = {(v, k): count(v, k, python) for v in ("plain", "aprof") for k in (half, n)}
    per_task = ((c["aprof", n] - c["aprof", half]) - (c["plain", n] - c["plain", half])) / (n - half)
    return {"counts": c, "per_task": per_task}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
        r = report(n, sys.executable)
        for (v, k), instr in sorted(r["counts"].items()):
            print(f"{v:6} {k:6} tasks: {instr:>14,} instructions")
        print(f"aprof, marginal instructions per task: {r['per_task']:,.0f}")
    else:
        run(sys.argv[1], int(sys.argv[2]))
