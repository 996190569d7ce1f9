"""Instructions per Python call of the Python tracer, under callgrind.

    nice valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect=builtin_eval \\
        python bench/tracer_callgrind.py MODE N
    python bench/tracer_callgrind.py --report            # every mode, fib(22): ~5 minutes
    python bench/tracer_callgrind.py --report --n 20 --only plain,default

runs ``fib(N)`` once inside ``eval()``, so that ``--toggle-collect=builtin_eval``
counts it alone (not the imports, the profile's start, nor its stop), after
warming ``fib`` outside the count. Modes:

- ``plain``: no profile;
- ``default``: ``aprof.profile(python_tracer=True, tasks=False)`` (Python
  frames only: the PEP 523 frame evaluator on 3.11 and 3.12);
- ``no-evaluator``: the same with the C tracer's internal switch off
  (``aprof._core._tracer._evaluator = False``): the profile function on
  3.11, ``sys.monitoring`` callbacks on 3.12;
- ``c-calls``: ``c_calls=True``;
- ``frames-floor`` (3.12+): ``sys.monitoring`` PY_START, PY_RESUME,
  PY_RETURN and PY_YIELD callbacks that are C callables doing nothing (the
  hooks of an aprof tracer that never started);
- ``evaluator-floor`` (3.11 and 3.12): a PEP 523 frame evaluator that runs
  every frame with the default one and records nothing
  (``aprof._ctracer._noop_evaluator``): what the interpreter's generic call
  path costs ``default`` before aprof does anything;
- ``viztracer``: viztracer's default tracer (``VizTracer(verbose=0)``, built
  and started outside the count, its fairest configuration, as in
  ``bench/tracer.py``), when it is installed (the ``bench`` extra).

``--report`` runs each mode once (one valgrind at a time, under ``nice``,
``PYTHONHASHSEED=0``) and prints the instructions per fib call on top of
``plain``: ``(count(mode) - count(plain)) / calls``. The counts include
the compilation of the one-line ``eval`` string, the same in every mode.
With ``viztracer`` in the report, it also prints each mode's slowdown in
instructions (``count(mode) / count(plain)``) and its share of viztracer's,
the instruction form of ``bench/tracer.py``'s "<= 0.65x viztracer's
slowdown" (neither counts the stop: aprof's replay, viztracer's save).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODES = ("plain", "default", "no-evaluator", "c-calls", "frames-floor", "evaluator-floor", "viztracer")


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def calls(n: int) -> int:
    """Calls fib(n) makes, itself included."""
    a, b = 0, 1  # fib(0), fib(1)
    for _ in range(n + 1):
        a, b = b, a + b
    return 2 * a - 1  # 2 * fib(n + 1) - 1


def run(mode: str, n: int) -> None:
    fib(15)  # specialised and warm, outside the count
    if mode == "frames-floor":
        from tracer import _frames_floor  # bench/tracer.py

        _frames_floor()
    elif mode == "evaluator-floor":
        from aprof._ctracer import _noop_evaluator

        _noop_evaluator(True)
    elif mode == "viztracer":
        from viztracer import VizTracer

        viz = VizTracer(verbose=0)
        viz.start()
    elif mode != "plain":
        import aprof
        from aprof._core import _tracer

        _tracer._evaluator = mode != "no-evaluator"
        prof: Any = aprof.profile(python_tracer=True, tasks=False, c_calls=mode == "c-calls")
        prof.start()
    eval(f"fib({n})")  # noqa: S307 - only this is counted
    os._exit(0)  # no stop, no replay


def count(mode: str, n: int) -> int:
    cmd = [
        "nice", "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--toggle-collect=builtin_eval",
        sys.executable, __file__, mode, str(n),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONHASHSEED": "0"})
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"{mode} {n}: exit {out.returncode}:\n{out.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", choices=MODES)
    ap.add_argument("n", nargs="?", type=int, default=22)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--n", dest="size", type=int, default=None, help="fib(N) for --report (default 22)")
    ap.add_argument("--only", default=None, help="comma-separated modes for --report (plain is always run)")
    args = ap.parse_args()
    if not args.report:
        if args.mode is None:
            ap.error("a mode, or --report")
        run(args.mode, args.n)
        return
    n = args.size or 22
    modes = [m for m in MODES if args.only is None or m in args.only.split(",") or m == "plain"]
    if sys.version_info < (3, 12) and "frames-floor" in modes:
        modes.remove("frames-floor")
    if sys.version_info >= (3, 13) and "evaluator-floor" in modes:
        modes.remove("evaluator-floor")
    if "viztracer" in modes and importlib.util.find_spec("viztracer") is None:
        print("viztracer is not installed (the bench extra): left out", file=sys.stderr)
        modes.remove("viztracer")
    counts = {}
    for mode in modes:
        counts[mode] = count(mode, n)
        print(f"{mode:14} {counts[mode]:>14,} instructions", file=sys.stderr, flush=True)
    k = calls(n)
    print(f"Python {sys.version.split()[0]}, fib({n}): {k:,} calls; instructions per call on top of plain")
    for mode in modes[1:]:
        print(f"  {mode:14} {(counts[mode] - counts['plain']) / k:8.0f}")
    if "viztracer" in counts:
        viz = counts["viztracer"] / counts["plain"]
        print("slowdown in instructions (mode / plain), and its share of viztracer's")
        for mode in modes[1:]:
            slow = counts[mode] / counts["plain"]
            print(f"  {mode:14} {slow:6.2f}x  {slow / viz:5.2f}")


if __name__ == "__main__":
    main()
