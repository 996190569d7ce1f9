"""A 2-worker uvicorn app under ``aprof run`` (issue 20 item 4).

    python bench/server_workers.py [--rounds 3] [--requests 2000] [--concurrency 16] [--server uvicorn|gunicorn]

``--server gunicorn`` runs the app as ``gunicorn app:app -w 2 -k
uvicorn.workers.UvicornWorker`` instead (its workers are forks of the
master, followed as forks).

Each round starts the same ASGI app twice, one after the other, on a free
loopback port: plain (``python -m uvicorn app:app --workers 2``) and under
``python -m aprof run -o out.aprof -m uvicorn ...`` (following the
workers, the default). A closed-loop aiohttp client in this process sends
``--requests`` requests (each to its own path) with ``--concurrency``
connections, after a warm-up of 200 requests; requests/s is timed over the
measured requests only, the server's start and the profile's write are
outside it. The server is stopped with SIGINT, as Ctrl-C stops it. For the
profiled server the merged output is read back and its requests counted:
every request exactly once is the target, and throughput at least 0.8x
plain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import header  # noqa: E402

APP = """
import aprof

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    with aprof.record_function("request " + scope["path"]):
        body = b"ok" * 50
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
"""

TARGET = 0.8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def load(port: int, paths: list[str], concurrency: int) -> float:
    """Requests per second over ``paths`` (each once)."""
    import aiohttp

    todo = iter(paths)
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            for path in todo:
                async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                    await r.read()
                    assert r.status == 200

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return len(paths) / (time.perf_counter() - t0)


async def wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start") from None
            await asyncio.sleep(0.1)


def one(cwd: Path, profiled: bool, requests: int, concurrency: int, tag: str, kind: str = "uvicorn") -> float:
    port = free_port()
    if kind == "gunicorn":
        server = ["-m", "gunicorn", "app:app", "-w", "2", "-k", "uvicorn.workers.UvicornWorker", "-b", f"127.0.0.1:{port}", "--log-level", "warning"]
    else:
        server = ["-m", "uvicorn", "app:app", "--workers", "2", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    cmd = [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", *server] if profiled else [sys.executable, *server]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        async def drive() -> float:
            await wait_up(port, proc)
            await load(port, [f"/warm{tag}/{i}" for i in range(200)], concurrency)
            return await load(port, [f"/r{tag}/{i}" for i in range(requests)], concurrency)

        return asyncio.run(drive())
    finally:
        # gunicorn's graceful stop is SIGTERM to the master; a SIGINT to the
        # master alone SIGQUITs the workers, which UvicornWorker does not
        # act on: they are SIGKILLed after the graceful timeout.
        proc.send_signal(signal.SIGTERM if kind == "gunicorn" else signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode not in (0, -signal.SIGINT, -signal.SIGTERM, 130):
            print(err.decode(errors="replace")[-2000:], file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--server", choices=("uvicorn", "gunicorn"), default="uvicorn")
    args = ap.parse_args()
    import aprof

    print(header())
    plain: list[float] = []
    profiled: list[float] = []
    counts: list[tuple[int, int, int]] = []
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "app.py").write_text(APP)
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for prof in order:
                rps = one(cwd, prof, args.requests, args.concurrency, f"{r}{int(prof)}", args.server)
                (profiled if prof else plain).append(rps)
                if prof:
                    s = aprof.load(cwd / "out.aprof")
                    mine = [e for e in s.events() if e.name.startswith(f"request /r{r}1/")]
                    names = {e.name for e in mine}
                    workers = {e.node_id for e in mine}
                    counts.append((len(mine), len(names), len(workers)))
            print(f"round {r + 1}: plain {plain[-1]:,.0f} req/s, profiled {profiled[-1]:,.0f} req/s, "
                  f"recorded {counts[-1][0]:,} requests ({counts[-1][1]:,} distinct) in {counts[-1][2]} workers")  # fmt: skip
    ratio = statistics.median(p / q for p, q in zip(profiled, plain, strict=True))
    exact = all(c[0] == c[1] == args.requests for c in counts)
    print(f"\nmedian plain {statistics.median(plain):,.0f} req/s, profiled {statistics.median(profiled):,.0f} req/s")
    print(f"profiled / plain (median of paired rounds): x{ratio:.3f} (target >= {TARGET}: {'ok' if ratio >= TARGET else 'MISSED'})")
    print(f"every request recorded exactly once: {'yes' if exact else 'NO'} ({counts})")


if __name__ == "__main__":
    main()
