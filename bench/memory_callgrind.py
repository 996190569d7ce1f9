"""profile_memory's cost in instructions (valgrind --tool=callgrind), per unit of work.

    python bench/memory_callgrind.py              # fan-out 20/600 tasks, dicts 1k/201k
    python bench/memory_callgrind.py --case dict-sampled --n 1000   # one run (what the driver calls)

Each case runs twice, small and large; the difference divided by the
difference in work is the cost per task (per dict), start-up, imports and
the profile's start and stop left out:

* ``fan-plain``, ``fan-tasks`` (a default profile), ``fan-memory``
  (``profile_memory=True``): the fan-out of ``bench/tasks.py``;
* ``dict-plain``, ``dict-sampled``, ``dict-exact``: building and dropping
  small dicts (``{"a": i, "b": [i]}``) inside a memory profile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import callgrind  # noqa: E402

CASES = {
    "fan": (("fan-plain", "fan-tasks", "fan-memory"), (20, 600), "task"),
    "dict": (("dict-plain", "dict-sampled", "dict-exact"), (1000, 201000), "dict"),
}


def churn(k: int) -> None:
    for i in range(k):
        d = {"a": i, "b": [i]}
        del d


async def one(case: str, n: int) -> None:
    import aprof
    import tasks as fanout  # bench/tasks.py

    if case == "fan-plain":
        await fanout.timed_fan_out(n, fanout.identity, "plain")
    elif case.startswith("fan"):
        async with aprof.profile(profile_memory=case == "fan-memory"):
            await fanout.timed_fan_out(n, aprof.wrap, case)
    elif case == "dict-plain":
        churn(n)
    else:
        async with aprof.profile(profile_memory=True, memory_interval=0 if case == "dict-exact" else 16384):
            churn(n)


def instructions(case: str, n: int) -> int:
    return callgrind([sys.executable, __file__, "--case", case, "--n", str(n)], toggles=())[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case")
    ap.add_argument("--n", type=int)
    args = ap.parse_args()
    if args.case:
        asyncio.run(one(args.case, args.n))
        return
    print(f"Python {sys.version.split()[0]}; instructions per unit (large run - small run) / (n_large - n_small)")
    for cases, (small, large), unit in CASES.values():
        base = None
        per_case = {}
        for case in cases:
            per = per_case[case] = (instructions(case, large) - instructions(case, small)) / (large - small)
            base = base or per
            print(f"  {case:<14} {per:>12,.0f} instructions per {unit}  x{per / base:.3f}")
        if "fan-memory" in per_case:  # issue 21's fan-out target: memory's cost over the profile it is part of
            print(f"  profile_memory over the default profile: x{per_case['fan-memory'] / per_case['fan-tasks']:.3f}")


if __name__ == "__main__":
    main()
