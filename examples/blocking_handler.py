"""Scenario: a blocking call in one handler among many.

A small asyncio service answers 12 concurrent requests. Most handlers await
their I/O politely, but the login handler checks the password with a
synchronous key derivation (PBKDF2) that holds the event loop for a fifth of
a second or so each time, and every other request waits behind it.

    aprof run examples/blocking_handler.py

The summary's "What blocked the loop" names ``verify_password`` and the
login requests' tasks.
"""

from __future__ import annotations

import asyncio
import hashlib

SALT = b"aprof-example"
USERS = {"ada": hashlib.pbkdf2_hmac("sha256", b"lovelace", SALT, 1)}


def verify_password(user: str, password: str) -> bool:
    """The bug: a slow, CPU-bound check run right on the event loop."""
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), SALT, 250_000)
    return USERS.get(user) is not None and len(digest) == 32


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
    paths = ["/orders", "/users", "/login"] * 4
    async with asyncio.TaskGroup() as tg:
        for i, path in enumerate(paths):
            tg.create_task(handle(path), name=f"GET {path} #{i}")
            await asyncio.sleep(0.002)
    print(f"served {len(paths)} requests")


if __name__ == "__main__":
    asyncio.run(main())
