"""Work that leaves the event loop stays in the profile: asyncio.to_thread
copies the context by itself; run_in_executor and a ThreadPoolExecutor need
aprof.wrap or aprof.propagating. Each hand-off is an EXECUTOR range on the
worker's track with an arrow from the submitting task.

    python examples/executor_propagation.py
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor

import aprof


def digest(data: bytes, rounds: int = 2000) -> str:
    with aprof.record_function("digest"):
        for _ in range(rounds):
            data = hashlib.sha256(data).digest()
        return data.hex()[:8]


async def main() -> aprof.profile:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(4) as raw_pool:
        pool = aprof.propagating(raw_pool)
        async with aprof.profile() as prof:
            results = await asyncio.gather(
                asyncio.to_thread(digest, b"to_thread"),
                loop.run_in_executor(raw_pool, aprof.wrap(digest), b"wrap"),
                asyncio.wrap_future(pool.submit(digest, b"propagating")),
                asyncio.wrap_future(aprof.launch(digest, b"launch")),
                # Not propagated: runs, but is not recorded.
                loop.run_in_executor(raw_pool, digest, b"bare"),
            )
    print("results:", results)
    return prof


if __name__ == "__main__":
    prof = asyncio.run(main())
    executors = [e for e in prof.events() if e.scope is aprof.RecordScope.EXECUTOR]
    print(f"{len(executors)} EXECUTOR ranges (the bare submission is not one of them)")
    print(prof.key_averages().table())
