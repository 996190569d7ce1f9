"""A web-like fan-out: each request fans out to a cache, a database and a
thread-pool render, concurrently. Run it under aprof:

    aprof run -o trace.json examples/fanout.py

or profile just one request from inside the program (see ``main``).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

import aprof


def render(payload: bytes) -> str:
    """CPU work that would block the loop, so it goes to a thread."""
    with aprof.record_function("render"):
        digest = payload
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()
        return digest.hex()


async def fetch(source: str, delay: float) -> bytes:
    with aprof.record_function(f"fetch {source}"):
        await asyncio.sleep(delay)
        return source.encode()


async def handle(request_id: int) -> str:
    with aprof.record_function("handle", args=f"request={request_id}"):
        async with asyncio.TaskGroup() as tg:
            cache = tg.create_task(fetch("cache", 0.001), name=f"cache-{request_id}")
            db = tg.create_task(fetch("db", 0.005), name=f"db-{request_id}")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, aprof.wrap(render), cache.result() + db.result())


async def main(requests: int = 20) -> None:
    results = await asyncio.gather(*(handle(i) for i in range(requests)))
    print(f"handled {len(results)} requests")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
