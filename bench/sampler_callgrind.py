"""Instructions of the 2,000-task fan-out with the sampler on (issue 18), for callgrind.

Wall-clock ratios of the fan-out are noisy (its plain runs alone spread
30-40% on a 2-core machine); this runs one variant once so that
``valgrind --tool=callgrind`` can count what each adds::

    for v in plain wrap sample sample_nowrap; do for n in 200 2200; do
        valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$v.$n python bench/sampler_callgrind.py $v $n
    done; done

and the instructions per task are (count at 2,200 - count at 200) / 2,000.
Variants: ``plain`` (no profile); ``wrap`` (a context profile with
``tasks=False``, the executor job through ``aprof.wrap`` as in
``bench/sampler.py``); ``sample`` (the same, sampling at 1 ms);
``sample_nowrap`` (sampling, the job handed over bare). Valgrind runs one
thread at a time, so the sampler thread's GIL hand-offs cost nothing here:
the counts measure aprof's work, the wall-clock runs the rest.
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks as fanout  # noqa: E402  (the fan-out workload of bench/tasks.py)

import aprof  # noqa: E402

VARIANTS = ("plain", "wrap", "sample", "sample_nowrap")


async def main(variant: str, n: int) -> None:
    if variant == "plain":
        await fanout.fan_out(n, fanout.identity)
        return
    sample = 0.001 if variant.startswith("sample") else None
    wrap = fanout.identity if variant == "sample_nowrap" else aprof.wrap
    async with aprof.profile(tasks=False, sample_interval=sample):
        await fanout.fan_out(n, wrap)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: python bench/sampler_callgrind.py {{{'|'.join(VARIANTS)}}} N")
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
