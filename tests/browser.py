"""Headless Chromium driven through the DevTools protocol, for the HTML
report's tests: real input events, screenshots, console errors and timings.

Chromium is started with ``--remote-debugging-pipe``: it reads protocol
messages (JSON, each ended by a NUL byte) on file descriptor 3 and writes
its own on descriptor 4, so no port is opened and nothing else can connect.
Only the standard library is used.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,900",
)


class BrowserError(RuntimeError):
    pass


class Page:
    """One tab of a headless Chromium (use as a context manager)."""

    def __init__(self, chromium: str, profile_dir: Path, width: int = 1280, height: int = 900) -> None:
        self._to_browser_r, self._to_browser_w = os.pipe()
        self._from_browser_r, self._from_browser_w = os.pipe()
        # The child's ends move above 3 and 4 first, so the dup2 calls below
        # cannot overwrite one with the other.
        child_in = fcntl.fcntl(self._to_browser_r, fcntl.F_DUPFD_CLOEXEC, 100)
        child_out = fcntl.fcntl(self._from_browser_w, fcntl.F_DUPFD_CLOEXEC, 100)
        os.close(self._to_browser_r)
        os.close(self._from_browser_w)

        def wire_fds() -> None:  # in the child, before exec: the ends become fds 3 and 4
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self._proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds,  # no threads of ours run between fork and exec
            pass_fds=(3, 4),  # kept open by the close-fds pass that runs after preexec_fn
        )
        os.close(child_in)
        os.close(child_out)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.width, self.height = width, height
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- protocol

    def _send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self._to_browser_w, data)
            data = data[n:]

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_browser_r], [], [], left)
            if ready:
                chunk = os.read(self._from_browser_r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (status {self._proc.poll()})")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30) -> Any:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        return self._call(method, params, self._session, timeout)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)

    # -- what the tests use

    def open(self, url: str, timeout: float = 60) -> None:
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired", timeout)

    def eval(self, expression: str, timeout: float = 30) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, timeout)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wheel(self, x: float, y: float, dy: float = 0, dx: float = 0, ctrl: bool = False) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": dx, "deltaY": dy, "modifiers": 2 if ctrl else 0})

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the page, or of ``clip`` ({x, y, width, height, scale})."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = {"scale": 1, **clip}
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries so far."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(str(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"]))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def close(self) -> None:
        try:
            self._call("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser_w, self._from_browser_r):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes):
    (width, height, rows of RGB bytes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, bits, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (bits, interlace) == (8, 0), f"unsupported PNG: {bits} bits, interlace {interlace}"
            assert color in (2, 6), f"unsupported PNG color type {color}"
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        f = raw[i]
        line = bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line[k] for k in range(stride) if channels == 3 or k % 4 != 3))
    return width, height, rows
