"""What recording one task costs, in instructions (valgrind --tool=callgrind).

    python bench/task_cost.py            # trivial tasks and tasks with a long wait, 1,000 and 2,000 of each
    python bench/task_cost.py --child CASE VARIANT N   # one run (what the driver calls)

A recorded task spawned by a recorded task (as in a server, where the
request's task spawns the rest) runs ``CASE``:

* ``trivial``: one ``await asyncio.sleep(0)``;
* ``wait``: one ``await asyncio.sleep(0.002)``, a long wait (1 ms or more)
  whose await chain aprof describes.

``VARIANT`` is ``plain`` (no profile), ``context`` (``async with
aprof.profile()`` around it), ``global`` (``scope="global"``, what ``aprof
run`` and ``aprof ctl start`` start) or ``nowait`` (``context`` with the
long-wait threshold raised past the wait: the wait's description left
out). Each count is taken inside ``eval()`` on the loop's thread
(``--toggle-collect=builtin_eval``), for N and N/2 tasks; the difference
over N/2 is the cost per task, start-up, imports and the profile's start
and stop left out. The fan-out of ``bench/tasks.py`` (with executor jobs,
whose threads' timing moves its counts by about 2% between runs) is
``bench/always_on.py --callgrind``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import callgrind, header  # noqa: E402

VARIANTS = ("plain", "context", "global", "nowait")


def child(case: str, variant: str, n: int) -> None:
    import aprof

    delay = 0.0 if case == "trivial" else 0.002
    if variant == "nowait":
        from aprof._integrations import _asyncio as hooks

        if hooks._ext is None:
            raise SystemExit("nowait needs the C extension")
        hooks._ext._tasks_setup(
            hooks.TaskThread, hooks._TASK_ATTR, hooks._CTask, hooks._PyTask, hooks._PY_STEP, hooks._PY_WAKEUP,
            hooks._first_scheduled, hooks._first_step, hooks._task_done, hooks._eager_started, hooks._tracer.publishing,
            hooks.note_wait, 10**15,
        )  # fmt: skip

    async def one() -> None:
        await asyncio.sleep(delay)

    async def fan(k: int) -> None:
        await asyncio.gather(*(one() for _ in range(k)))

    loop = asyncio.new_event_loop()
    prof = None
    if variant == "plain":
        ctx = contextvars.copy_context()
    else:
        prof = aprof.profile(tasks=True, scope="global" if variant == "global" else "context")

        async def start() -> contextvars.Context:
            prof.start()
            return contextvars.copy_context()

        ctx = loop.run_until_complete(start())
    eval(  # noqa: S307
        "loop.run_until_complete(loop.create_task(fan(n), context=ctx))", {"loop": loop, "fan": fan, "n": n, "ctx": ctx}
    )
    if prof is not None:

        async def stop() -> None:
            prof.stop()

        loop.run_until_complete(stop())
    loop.close()


def count(case: str, variant: str, n: int) -> int:
    return callgrind([sys.executable, __file__, "--child", case, variant, str(n)])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=3, metavar=("CASE", "VARIANT", "N"))
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    if args.child:
        case, variant, n = args.child
        child(case, variant, int(n))
        return
    print(header())
    half = args.n // 2
    for case, variants in (("trivial", ("plain", "context", "global")), ("wait", ("plain", "context", "nowait"))):
        per = {v: (count(case, v, args.n) - count(case, v, half)) / (args.n - half) for v in variants}
        plain = per["plain"]
        print(f"\n{case} task: instructions per task (loop thread)")
        for v in variants:
            extra = "" if v == "plain" else f"  (+{per[v] - plain:,.0f} over plain)"
            print(f"  {v:<8} {per[v]:>10,.0f}{extra}")
        if "nowait" in per:
            print(f"  the long wait's description: {per['context'] - per['nowait']:,.0f} instructions")


if __name__ == "__main__":
    main()
