"""Instructions per event of stop, save, load, the summary table and the HTML report, under callgrind (issue 17).

    python bench/scale_callgrind.py --report                 # 50k and 100k events: ~3 minutes
    python bench/scale_callgrind.py --report --events 200000 --only stop,load
    nice valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect=builtin_eval \\
        python bench/scale_callgrind.py STEP N

runs one step once on a session of N ranges recorded as ``bench/scale.py``
records them (nested three deep, four names, every 100th with args), the
step inside ``eval()`` so that ``--toggle-collect=builtin_eval`` counts it
alone: ``stop`` (consolidation), ``save`` (the binary format), ``load``
(of a file saved outside the count), ``table`` (``key_averages().table()``),
``html`` (``export_html``: the report's document, to a temporary file).
``--report`` runs each step at N/2 and N, one valgrind at a time under
``nice``, and prints the marginal instructions per event, ``(count N -
count N/2) / (N/2)``, which cancels what does not grow with N. To compare
two versions, run it twice with ``PYTHONPATH`` pointing at each checkout
(with its extension built in place).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import callgrind  # noqa: E402

STEPS = ("stop", "save", "load", "table", "html")


def run_step(step: str, n: int) -> None:
    from scale import record

    import aprof

    prof = record(n)
    if step == "stop":
        eval("prof.stop()", {"prof": prof})
        return
    prof.stop()
    session = prof.session
    path = os.path.join(tempfile.mkdtemp(), "s.aprof")
    if step == "save":
        eval("session.save(path)", {"session": session, "path": path})
    elif step == "load":
        session.save(path)
        eval("aprof.load(path)", {"aprof": aprof, "path": path})
    elif step == "html":
        out = os.path.join(os.path.dirname(path), "r.html")
        eval("session.export_html(out)", {"session": session, "out": out})
    else:
        eval("session.key_averages().table()", {"session": session})


def count(step: str, n: int, python: str) -> int:
    """Instructions callgrind counted inside eval() for one run."""
    return callgrind([python, __file__, step, str(n)], nice=True)[0]


def report(python: str, n: int, steps: list[str]) -> None:
    half = n // 2
    print(f"instructions per event, marginal between {half:,} and {n:,} ranges ({python})")
    for step in steps:
        lo, hi = count(step, half, python), count(step, n, python)
        print(f"  {step:6} {(hi - lo) / (n - half):10,.0f}   ({half:,}: {lo:,}; {n:,}: {hi:,})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", nargs="?", choices=STEPS, help="run one step once (under valgrind)")
    ap.add_argument("n", nargs="?", type=int, help="ranges to record")
    ap.add_argument("--report", action="store_true", help="run every step under callgrind at N/2 and N")
    ap.add_argument("--events", type=int, default=100_000, help="N for --report (default 100,000)")
    ap.add_argument("--only", default=None, metavar="STEPS", help="comma-separated steps for --report")
    ap.add_argument("--python", default=sys.executable, help="interpreter to measure (default: this one)")
    args = ap.parse_args()
    if args.report:
        report(args.python, args.events, args.only.split(",") if args.only else list(STEPS))
    elif args.step is None or args.n is None:
        ap.error("give STEP N, or --report")
    else:
        run_step(args.step, args.n)


if __name__ == "__main__":
    main()
