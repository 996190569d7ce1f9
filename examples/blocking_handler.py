"""Scenario: a blocking call in one handler among many.

A small asyncio service answers 30 concurrent requests. Most handlers await
their I/O politely, but the login handler checks the password with a
synchronous key-derivation call that holds the event loop for a tenth of a
second each time, and every other request waits behind it.

    aprof run examples/blocking_handler.py

The summary's "What blocked the loop" names ``verify_password`` and the
login requests' tasks.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

USERS = {"ada": hashlib.sha256(b"lovelace").hexdigest()}


def verify_password(user: str, password: str) -> bool:
    """The bug: a slow, CPU-bound check run right on the event loop."""
    deadline = time.perf_counter() + 0.1  # ~ pbkdf2_hmac with a high iteration count
    digest = password.encode()
    while time.perf_counter() < deadline:
        digest = hashlib.sha256(digest).digest()
    return USERS.get(user) is not None


async def query(table: str) -> list[str]:
    await asyncio.sleep(0.01)  # a database round trip
    return [table]


async def handle(path: str) -> str:
    if path == "/login":
        verify_password("ada", "lovelace")
        return "welcome"
    rows = await query(path.strip("/"))
    return f"{len(rows)} rows"


async def main() -> None:
    paths = ["/orders", "/users", "/login"] * 10
    async with asyncio.TaskGroup() as tg:
        for i, path in enumerate(paths):
            tg.create_task(handle(path), name=f"GET {path} #{i}")
            await asyncio.sleep(0.002)
    print(f"served {len(paths)} requests")


if __name__ == "__main__":
    asyncio.run(main())
