"""Scenario: a lock held across a slow await.

Every request reads a cache guarded by an ``asyncio.Lock``. The refresher
takes the lock and, while holding it, awaits a slow remote call, so every
request queues on the lock for as long as the remote call takes.

    aprof run examples/lock_held_across_await.py

"Longest waits" shows the requests waiting and the task (``refresh``,
``update_cache``) they were waiting for.
"""

from __future__ import annotations

import asyncio

cache: dict[str, str] = {}


async def fetch_remote() -> str:
    await asyncio.sleep(0.3)  # a slow upstream
    return "fresh"


async def update_cache(lock: asyncio.Lock) -> None:
    async with lock:
        # The bug: the lock is held across the slow await.
        cache["value"] = await fetch_remote()


async def read(lock: asyncio.Lock) -> str:
    async with lock:
        return cache.get("value", "stale")


async def main() -> None:
    lock = asyncio.Lock()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(update_cache(lock), name="refresh")
        await asyncio.sleep(0.01)
        readers = [tg.create_task(read(lock), name=f"reader-{i}") for i in range(5)]
    print("read", [r.result() for r in readers])


if __name__ == "__main__":
    asyncio.run(main())
