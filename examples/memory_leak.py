"""Scenario: a memory leak in a request handler.

A small server handles requests, each in a task of its own. The handler
renders a page and, by mistake, remembers every page in a module-level
cache that nothing ever trims: the process grows with every request.

    aprof run --memory examples/memory_leak.py

"Memory kept at stop" names the range ``handle_request`` and the tasks
of ``handle_request`` that kept the bytes; ``--sort cpu_memory_usage``
puts the handler first in the table.
"""

from __future__ import annotations

import asyncio

import aprof

#: The bug: a cache keyed by request id, never trimmed.
RENDERED: dict[int, bytes] = {}


def render(request_id: int) -> bytes:
    parts = [f"<p>row {i} of request {request_id}</p>" for i in range(200)]  # freed after the join
    return "".join(parts).encode() * 4


async def handle_request(request_id: int) -> int:
    with aprof.record_function("handle_request"):
        page = render(request_id)
        RENDERED[request_id] = page  # kept forever
        await asyncio.sleep(0)  # the response goes out
        return len(page)


async def main(requests: int = 200) -> None:
    sent = 0
    for batch in range(0, requests, 50):
        sizes = await asyncio.gather(*(handle_request(i) for i in range(batch, batch + 50)))
        sent += sum(sizes)
    print(f"served {requests} requests, {sent:,} bytes; cache holds {len(RENDERED)} pages")


if __name__ == "__main__":
    asyncio.run(main())
