"""Scenario: a fan-out with one slow child.

A request fans out to ten shards with ``asyncio.gather`` and waits for all
of them; shard 7 is slow, so the whole request takes as long as shard 7.

    aprof run examples/fanout_slow_child.py

"Slowest tasks" puts ``shard-7`` first after the request, and "Longest
waits" says the request waited on it.
"""

from __future__ import annotations

import asyncio


async def fetch_shard(shard: int) -> int:
    # The bug: one shard is ten times slower than the rest.
    await asyncio.sleep(0.4 if shard == 7 else 0.03)
    return shard


async def search(query: str) -> list[int]:
    tasks = [asyncio.create_task(fetch_shard(i), name=f"shard-{i}") for i in range(10)]
    return list(await asyncio.gather(*tasks))


async def main() -> None:
    results = await asyncio.create_task(search("aprof"), name="search")
    print(f"{len(results)} shards answered")


if __name__ == "__main__":
    asyncio.run(main())
