"""Profile one request inside a running aiohttp server.

A small aiohttp middleware wraps the handler in ``async with aprof.profile()``
when the request asks for it (``?aprof=1``). The profile follows only that
request's context: the tasks it spawns and the thread work it hands off,
and none of the other requests the server handles at the same time.

    python examples/aiohttp_request.py      # writes request.trace.json

(For any ASGI server, ``aprof.ProfilerMiddleware`` does this for you.)
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

from aiohttp import ClientSession, web

import aprof

TRACE = Path("request.trace.json")


@web.middleware
async def profile_on_request(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
    if request.query.get("aprof") != "1":
        return await handler(request)
    async with aprof.profile() as prof:
        response = await handler(request)
    prof.export_chrome_trace(TRACE)
    response.headers["x-aprof-events"] = str(len(prof.events()))
    return response


def checksum(data: bytes) -> str:
    with aprof.record_function("checksum"):
        for _ in range(500):
            data = hashlib.sha256(data).digest()
        return data.hex()[:12]


async def lookup(key: str) -> str:
    with aprof.record_function("lookup", args=key):
        await asyncio.sleep(0.005)
        return key.upper()


async def handle(request: web.Request) -> web.Response:
    user = request.match_info["user"]
    with aprof.record_function("handle"):
        async with asyncio.TaskGroup() as tg:
            profile = tg.create_task(lookup(f"profile:{user}"))
            orders = tg.create_task(lookup(f"orders:{user}"))
        digest = await asyncio.to_thread(checksum, f"{profile.result()}{orders.result()}".encode())
    return web.json_response({"user": user, "digest": digest})


async def main() -> int:
    app = web.Application(middlewares=[profile_on_request])
    app.router.add_get("/users/{user}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with ClientSession(f"http://127.0.0.1:{port}") as client:

            async def get(path: str) -> tuple[int, str]:
                async with client.get(path) as resp:
                    await resp.json()
                    return resp.status, resp.headers.get("x-aprof-events", "")

            # Nine ordinary requests, and one profiled, all at once.
            results = await asyncio.gather(*(get(f"/users/u{i}") for i in range(9)), get("/users/traced?aprof=1"))
    finally:
        await runner.cleanup()
    print(f"{len(results)} requests, statuses {sorted({s for s, _ in results})}")
    print(f"profiled request: {results[-1][1]} events in {TRACE}")
    return 0 if all(s == 200 for s, _ in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
