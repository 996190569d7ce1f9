"""Scenario: a heartbeat starved of CPU.

A service sends a heartbeat every 50 ms; a background task computes
statistics in chunks that never yield to the loop, so the heartbeat goes
out late, again and again.

    aprof run examples/starved_heartbeat.py

"What blocked the loop" names ``compute_stats`` in the stats task, and
"Longest waits" shows the heartbeat's wait and how much of it the loop was
blocked by the stats task.
"""

from __future__ import annotations

import asyncio
import time


def compute_stats(samples: list[float]) -> float:
    """The bug: 150 ms of CPU between two awaits."""
    deadline = time.perf_counter() + 0.15
    total = 0.0
    while time.perf_counter() < deadline:
        total += sum(samples)
    return total


async def stats_loop() -> None:
    samples = [float(i) for i in range(100)]
    for _ in range(4):
        compute_stats(samples)
        await asyncio.sleep(0)  # yields, but only between the chunks


async def heartbeat(beats: list[float]) -> None:
    for _ in range(12):
        beats.append(time.perf_counter())
        await asyncio.sleep(0.05)


async def main() -> None:
    beats: list[float] = []
    async with asyncio.TaskGroup() as tg:
        tg.create_task(heartbeat(beats), name="heartbeat")
        tg.create_task(stats_loop(), name="stats")
    late = max(b - a for a, b in zip(beats, beats[1:], strict=False))
    print(f"longest gap between heartbeats: {late * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
