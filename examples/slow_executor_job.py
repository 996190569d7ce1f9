"""Scenario: a slow job in a thread pool.

Requests hand image resizing to a two-worker thread pool with
``run_in_executor``. One request also renders a PDF report in the same pool:
it holds a worker for half a second, and the resize jobs queue behind it.

    aprof run examples/slow_executor_job.py

The summary's "Executor queueing" shows the resize jobs waiting for a
worker, and "Longest waits" names the request task that waited on
``render_report``.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor


def resize(image_id: int) -> int:
    time.sleep(0.02)  # a C library releasing the GIL
    return image_id


def render_report(order_id: int) -> bytes:
    """The bug: a slow job in the pool the fast jobs share."""
    time.sleep(0.5)
    return f"report {order_id}".encode()


async def handle(request_id: int, pool: ThreadPoolExecutor) -> None:
    loop = asyncio.get_running_loop()
    if request_id == 3:
        await loop.run_in_executor(pool, render_report, request_id)
    await loop.run_in_executor(pool, resize, request_id)


async def main() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        async with asyncio.TaskGroup() as tg:
            for i in range(12):
                tg.create_task(handle(i, pool), name=f"request-{i}")
                await asyncio.sleep(0.005)
    print("done")


if __name__ == "__main__":
    asyncio.run(main())
