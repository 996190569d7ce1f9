"""Scenario: a trio task blocking the run.

Workers in a nursery process jobs while a config loader parses a large
document synchronously: trio has one thread, so nothing else runs until
it is done.

    aprof run examples/trio_blocking_task.py

"What blocked the loop" names ``parse_config`` in the ``load_config`` task.
"""

from __future__ import annotations

import json
import time

import trio


def parse_config(text: str) -> dict[str, object]:
    """The bug: a long synchronous parse inside a trio task."""
    deadline = time.perf_counter() + 0.2
    doc: dict[str, object] = {}
    while time.perf_counter() < deadline:
        doc = json.loads(text)
    return doc


async def load_config() -> None:
    await trio.sleep(0.01)
    parse_config(json.dumps({"key": list(range(1000))}))


async def worker(n: int) -> None:
    for _ in range(10):
        await trio.sleep(0.01)


async def main() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(load_config)
        for i in range(4):
            nursery.start_soon(worker, i, name=f"worker-{i}")
    print("done")


if __name__ == "__main__":
    trio.run(main)
