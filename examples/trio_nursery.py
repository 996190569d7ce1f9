"""A trio nursery profiled from inside: each child task gets its own track,
with a spawn arrow from the nursery's owner, and the blocking child shows up
as a loop block.

    python examples/trio_nursery.py          # writes trio_nursery.json
    aprof run -o trace.json examples/trio_nursery.py
"""

from __future__ import annotations

import time

import trio

import aprof


async def polite(i: int) -> None:
    with aprof.record_function("polite"):
        for _ in range(3):
            await trio.sleep(0.002 * (i + 1))


async def rude() -> None:
    with aprof.record_function("rude"):
        await trio.sleep(0.001)
        end = time.perf_counter() + 0.03  # holds the loop: nobody else runs
        while time.perf_counter() < end:
            pass


async def main() -> aprof.profile:
    async with aprof.profile(loop_block_threshold=0.01) as prof:
        with aprof.record_function("fan out"):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(polite, i, name=f"polite-{i}")
                nursery.start_soon(rude, name="rude")
    return prof


if __name__ == "__main__":
    prof = trio.run(main)
    print(prof.key_averages(group_by="track").table(row_limit=10))
    prof.export_chrome_trace("trio_nursery.json")
