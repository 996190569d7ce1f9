"""Remote control of a running process (SPEC 15.3): ``aprof ctl PID ...``.

``enable_remote_control()`` opens a Unix domain socket that only the
process's user can reach: ``<dir>/<pid>.sock``, mode 0600, in a directory of
mode 0700 owned by the user (``$XDG_RUNTIME_DIR/aprof``, else
``<tempdir>/aprof-<uid>``). A server on a bare thread (invisible to the
program, SPEC 15.6) answers one request per connection.

The protocol is a line of JSON each way, never pickle::

    -> {"aprof_control": 1, "command": "start", "options": {"tasks": true}}
    <- {"aprof_control": 1, "ok": true, "pid": 1234, ...}
    <- {"aprof_control": 1, "ok": false, "pid": 1234, "error": "..."}

:func:`handle` maps a request object to a reply object and knows nothing of
sockets: a second transport (Python 3.14's ``sys.remote_exec`` running a
small script that calls it) needs no change here. Commands that start or
stop a profile run on the program's event loop (asyncio) or trio run, the
one running where remote control was enabled or the last one started since,
so that a global profile started remotely hooks that loop as one started in
it would; with no loop they run on the server thread.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import errno
import json
import os
import select
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from .._core._callbacks import start_unrecorded_thread

__all__ = ["PROTOCOL_VERSION", "control_dirs", "disable_remote_control", "enable_remote_control", "handle", "socket_path"]

#: The protocol's version: in every request and reply, under :data:`VERSION_KEY`.
PROTOCOL_VERSION: Final = 1
VERSION_KEY: Final = "aprof_control"

#: The longest request line accepted, in bytes.
MAX_REQUEST: Final = 64 * 1024

#: How long the server waits for a client's request line (seconds).
READ_TIMEOUT: Final = 5.0

#: How long a command waits for the program's event loop to run it (seconds).
LOOP_TIMEOUT: Final = 10.0

#: The options of ``aprof.profile`` a remote ``start`` may set; the profile is
#: always global (the whole process). ``max_bytes``/``keep`` pass through to
#: ``profile()``, which says so if this aprof does not have them.
START_OPTIONS: Final = frozenset(
    {
        "tasks",
        "python_tracer",
        "c_calls",
        "sample_interval",
        "loop_block_threshold",
        "with_stack",
        "record_inputs",
        "instance_ids",
        "max_events",
        "max_bytes",
        "keep",
    }
)

COMMANDS: Final = ("status", "start", "stop", "dump")


class ControlError(Exception):
    """A request that cannot be done: its message is the error reply."""


# -- where the socket lives ----------------------------------------------------


def control_dirs() -> list[Path]:
    """The directories a control socket of this user may be in, preferred first."""
    dirs = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        dirs.append(Path(runtime) / "aprof")
    dirs.append(Path(tempfile.gettempdir()) / f"aprof-{os.getuid()}")
    return dirs


def socket_path(pid: int, directory: Path | None = None) -> Path:
    """The control socket of process ``pid`` in ``directory`` (default: the preferred one)."""
    return (directory or control_dirs()[0]) / f"{pid}.sock"


def check_private_dir(path: Path) -> None:
    """Raise PermissionError unless ``path`` is a real directory of this user that nobody else can enter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symlink or a file is never trusted)")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}; aprof needs 0700)")


def _private_dir() -> Path:
    path = control_dirs()[0]
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


# -- the commands ----------------------------------------------------------------


class _Controller:
    """What the remote commands act on: at most one profile started remotely."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.profile: Any = None  # the running aprof.profile started by `start`
        self.options: dict[str, Any] = {}
        self.started_at: float | None = None
        self.unsaved: Any = None  # a stopped profile's Session whose write failed
        self.home: Callable[[Callable[[], Any]], Any] = _here
        self.home_kind = "the control thread"

    # Run on the program's loop, or here.

    def on_home(self, fn: Callable[[], Any]) -> Any:
        return self.home(fn)

    def status(self) -> dict[str, Any]:
        from .. import _version

        reply: dict[str, Any] = {
            "running": self.profile is not None,
            "aprof": _version.__version__,
            "python": sys.version.split()[0],
            "runs_commands_on": self.home_kind,
            "flight_recorder": _flight_recorder() is not None,
            "unsaved": self.unsaved is not None,
        }
        if self.profile is not None:
            reply["options"] = self.options
            reply["seconds"] = round(time.time() - (self.started_at or time.time()), 3)
        return reply

    def start(self, options: Any) -> dict[str, Any]:
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ControlError(f"start: 'options' must be an object, got {type(options).__name__}")
        unknown = sorted(k for k in options if k not in START_OPTIONS)
        if unknown:
            raise ControlError(f"start: unknown option {unknown[0]!r}; a remote profile takes {', '.join(sorted(START_OPTIONS))}")
        if self.profile is not None:
            raise ControlError("start: a profile started by aprof ctl is already running; stop it first (aprof ctl PID stop OUT)")
        from .._core._profiler import profile

        try:
            prof = profile(scope="global", **options)
        except (TypeError, ValueError) as exc:
            raise ControlError(f"start: {exc}") from None

        def begin() -> None:
            if "asyncio" not in sys.modules:
                # As aprof run does: the global profile hooks the loops the
                # program makes later only if asyncio is there to hook.
                import asyncio  # noqa: F401
            prof.start()

        try:
            self.on_home(begin)
        except RuntimeError as exc:
            raise ControlError(f"start: {exc}") from None
        self.profile, self.options, self.started_at = prof, dict(options), time.time()
        return {"started": self.options, "runs_commands_on": self.home_kind}

    def stop(self, output: Any) -> dict[str, Any]:
        out = _output_arg("stop", output)
        if self.profile is None and self.unsaved is None:
            raise ControlError("stop: no profile is running (start one with aprof ctl PID start)")
        if self.profile is not None:
            prof = self.profile
            self.on_home(prof.stop)
            self.profile = None
            self.unsaved = prof.session
        session = self.unsaved
        try:
            _write(session, out)
        except (OSError, ValueError, TypeError) as exc:
            raise ControlError(f"stop: the profile is stopped, but writing {out} failed: {exc}; it is kept: run stop OUT again") from None
        self.unsaved = None
        return {"output": str(out), "events": len(session._table), "tracks": len(session.tracks()), "dropped": session.dropped}

    def dump(self, output: Any) -> dict[str, Any]:
        out = _output_arg("dump", output)
        recorder = _flight_recorder()
        if recorder is None:
            raise ControlError(f"dump: no flight recorder running in {os.getpid()} (start one with aprof.flight_recorder())")
        try:
            written = recorder.dump(out)
        except (OSError, ValueError, TypeError, RuntimeError) as exc:
            raise ControlError(f"dump: {exc}") from None
        return {"output": str(written)}

    def close(self) -> Any:
        """Stop a profile still running (at exit); returns it, or None."""
        prof, self.profile = self.profile, None
        if prof is not None and prof.running:
            prof.stop()
            return prof
        return None


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


def _flight_recorder() -> Any:
    from .._core import _flight  # the flight recorder (issue 19 item 2)

    return _flight.active()


def _output_arg(command: str, output: Any) -> Path:
    if not isinstance(output, str) or not output:
        raise ControlError(f"{command}: 'output' must be the path of the file to write, got {output!r}")
    if not os.path.isabs(output):
        raise ControlError(f"{command}: 'output' must be an absolute path (the process's working directory is not yours), got {output!r}")
    from .._cli._main import _checked_output, _UsageError

    try:
        return _checked_output(output)
    except _UsageError as exc:
        raise ControlError(f"{command}: {exc}") from None


def _write(session: Any, out: Path) -> None:
    from .._export._files import write_by_suffix

    write_by_suffix(session, out)


def handle(request: Any, controller: _Controller | None = None) -> dict[str, Any]:
    """Answer one request object with one reply object (any transport).

    Never raises: a malformed request gets an error reply and changes nothing.
    """
    ctl = controller or _server_controller()
    reply: dict[str, Any] = {VERSION_KEY: PROTOCOL_VERSION, "pid": os.getpid()}
    try:
        if not isinstance(request, dict):
            raise ControlError(f"malformed request: expected a JSON object, got {type(request).__name__}")
        version = request.get(VERSION_KEY)
        if version != PROTOCOL_VERSION:
            raise ControlError(f"unsupported protocol version {version!r} (field {VERSION_KEY!r}); this process speaks {PROTOCOL_VERSION}")
        command = request.get("command")
        if command not in COMMANDS:
            raise ControlError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
        with ctl.lock:
            if command == "status":
                reply.update(ctl.status())
            elif command == "start":
                reply.update(ctl.start(request.get("options")))
            elif command == "stop":
                reply.update(ctl.stop(request.get("output")))
            else:
                reply.update(ctl.dump(request.get("output")))
    except ControlError as exc:
        return {**reply, "ok": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - never into the program: the client is told
        return {**reply, "ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
    reply["ok"] = True
    return reply


# -- running commands on the program's loop ----------------------------------------


class _LoopCall:
    """``fn`` run once on a loop thread, waited for; never run after a timeout."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.state = "pending"  # -> "running" -> "done", or "abandoned"
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> None:
        with self.lock:
            if self.state != "pending":
                return
            self.state = "running"
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, never raised on the loop
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> Any:
        if not self.done.wait(LOOP_TIMEOUT):
            with self.lock:
                if self.state == "pending":
                    self.state = "abandoned"
                    raise ControlError(f"the program's event loop did not run the command within {LOOP_TIMEOUT:g} s (is it blocked?); nothing was done")
            self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


def _asyncio_home(loop: Any) -> Callable[[Callable[[], Any]], Any]:
    def run(fn: Callable[[], Any]) -> Any:
        if loop.is_closed() or not loop.is_running():
            return fn()
        call = _LoopCall(fn)
        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # closed in between
            return fn()
        return call.wait()

    return run


def _trio_home(token: Any) -> Callable[[Callable[[], Any]], Any]:
    def run(fn: Callable[[], Any]) -> Any:
        import trio

        call = _LoopCall(fn)
        try:
            token.run_sync_soon(call)
        except (trio.RunFinishedError, OSError):
            return fn()
        return call.wait()

    return run


def _current_home() -> tuple[Callable[[Callable[[], Any]], Any], str] | None:
    """The asyncio loop or trio run in this thread, as a place to run commands."""
    if "asyncio" in sys.modules:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            return _asyncio_home(loop), "the program's asyncio loop"
    if "trio" in sys.modules:
        import trio

        if trio.lowlevel.in_trio_run():
            return _trio_home(trio.lowlevel.current_trio_token()), "the program's trio run"
    return None


# -- the server ------------------------------------------------------------------


class _Server:
    def __init__(self, path: Path, sock: socket.socket) -> None:
        self.path = path
        self.sock = sock
        self.pid = os.getpid()
        self.controller = _Controller()
        self.wake_r, self.wake_w = os.pipe()
        self.stopping = False
        self.done = threading.Event()
        self.undo_watch: list[Callable[[], None]] = []
        self._ident: int | None = None

    def start(self) -> None:
        # A bare thread: not in threading.enumerate() (SPEC 15.6), its own
        # work never recorded (a profile it starts is global).
        start_unrecorded_thread(self._main)

    def _main(self) -> None:
        self._ident = _thread.get_ident()
        try:
            while not self.stopping:
                try:
                    ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
                except InterruptedError:
                    continue
                if self.stopping or self.wake_r in ready:
                    break
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    continue
                with conn:
                    self._serve(conn)
        except BaseException:  # noqa: BLE001 - the program must never see it
            pass
        finally:
            self.done.set()

    def _serve(self, conn: socket.socket) -> None:
        try:
            peer_uid = _peer_uid(conn)
            line = _read_line(conn)
            if line is None:
                return  # the client went away before a whole request: nothing done
            if peer_uid is not None and peer_uid != os.getuid():
                _send(conn, {VERSION_KEY: PROTOCOL_VERSION, "pid": self.pid, "ok": False, "error": f"refused: uid {peer_uid} is not the owner of process {self.pid}"})
                return
            try:
                request = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                reply: dict[str, Any] = {VERSION_KEY: PROTOCOL_VERSION, "pid": self.pid, "ok": False, "error": f"malformed request: not JSON ({exc})"}
            else:
                reply = handle(request, self.controller)
            _send(conn, reply)
        except (OSError, ControlError):
            pass  # the client disconnected or timed out; whatever it asked for is done or was never started

    def close(self) -> Any:
        """Stop serving and remove the socket; returns a remotely started profile that was still running (stopped)."""
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")
        if _thread.get_ident() != self._ident:
            self.done.wait(timeout=5.0)
        for undo in self.undo_watch:
            with contextlib.suppress(Exception):
                undo()
        self.undo_watch = []
        with contextlib.suppress(OSError):
            self.sock.close()
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if os.getpid() == self.pid:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        # A command may still wait on a loop that is gone (at most
        # LOOP_TIMEOUT): exit does not wait for it.
        if not self.controller.lock.acquire(timeout=1.0):
            return None
        try:
            return self.controller.close()
        finally:
            self.controller.lock.release()


def _peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid, where the system tells it (Linux: SO_PEERCRED)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None  # the 0700 directory is the guard there
    creds = conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _read_line(conn: socket.socket) -> bytes | None:
    conn.settimeout(READ_TIMEOUT)
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST and b"\n" not in data[:MAX_REQUEST]:
            _send(conn, {VERSION_KEY: PROTOCOL_VERSION, "pid": os.getpid(), "ok": False, "error": f"malformed request: longer than {MAX_REQUEST} bytes"})
            # Read what the client still sends (a while, at most), so that
            # closing does not reset the connection before it reads the reply.
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                for _ in range(64):
                    if not conn.recv(65536):
                        break
            raise ControlError("too long")
    return data.split(b"\n", 1)[0]


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    data = (json.dumps(reply, default=str) + "\n").encode()
    flags = getattr(socket, "MSG_NOSIGNAL", 0)  # a vanished client is an error here, never a SIGPIPE
    conn.settimeout(READ_TIMEOUT)
    while data:
        sent = conn.send(data, flags)
        data = data[sent:]


_server: _Server | None = None
_server_lock = threading.Lock()
_announced = False


def _server_controller() -> _Controller:
    server = _server
    return server.controller if server is not None else _Controller()


def enable_remote_control(*, announce: bool = True) -> Path:
    """Let ``aprof ctl PID ...`` start, stop and dump profiles in this process (SPEC 15.3).

    Opens a Unix domain socket only this user can reach (mode 0600 in a
    private 0700 directory, named by the pid; no network port) and serves it
    from a thread the program does not see. Call it from inside the
    program's event loop (asyncio, uvloop, trio, anyio) so that a remote
    ``start`` hooks that loop's tasks as a profile started there would;
    called outside any loop, commands run on the control thread and a
    remote profile hooks the loops started after it. The socket is removed
    at exit, and by :func:`disable_remote_control`. Calling it again returns
    the same path.

    Args:
        announce: Print the socket's path (and how to use it) to stderr,
            once per process.

    Returns:
        The socket's path.

    Raises:
        PermissionError: the control directory exists but is not this
            user's alone (mode 0700, owned by the user).
        OSError: the socket cannot be created.

    Example:
        >>> import aprof
        >>> import aprof, os
        >>> path = aprof.enable_remote_control(announce=False)
        >>> path.name == f"{os.getpid()}.sock"
        True
        >>> aprof.disable_remote_control()
        >>> path.exists()
        False
    """
    global _server, _announced
    with _server_lock:
        server = _server
        if server is not None and server.pid == os.getpid() and not server.stopping:
            _update_home(server)
            return server.path
        directory = _private_dir()
        path = socket_path(os.getpid(), directory)
        if len(os.fsencode(path)) >= 104:
            raise OSError(errno.ENAMETOOLONG, f"enable_remote_control: socket path too long for a Unix socket: {path}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale socket of a dead process that had this pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(path))
            os.chmod(path, 0o600)
            sock.listen(8)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        server = _Server(path, sock)
        _update_home(server)
        server.start()
        _server = server
    if announce and not _announced and sys.stderr is not None:
        _announced = True
        sys.stderr.write(f"aprof: remote control on {path} (aprof ctl {os.getpid()} status|start|stop OUT|dump OUT)\n")
    return path


def _update_home(server: _Server) -> None:
    """Run commands on the loop running here; with none, on each loop started from now on."""
    ctl = server.controller
    home = _current_home()
    if home is not None:
        ctl.home, ctl.home_kind = home
        return
    if server.undo_watch:
        return

    def new_asyncio_loop(loop: Any) -> None:
        ctl.home, ctl.home_kind = _asyncio_home(loop), "the program's asyncio loop"

    def new_trio_run() -> None:
        import trio

        ctl.home, ctl.home_kind = _trio_home(trio.lowlevel.current_trio_token()), "the program's trio run"

    import asyncio  # noqa: F401  (the loops the program makes are asyncio.Runner's)

    from . import _asyncio, _trio_runs

    server.undo_watch.append(_asyncio.on_new_loops(new_asyncio_loop))
    server.undo_watch.append(_trio_runs.on_new_trio_runs(new_trio_run))


def disable_remote_control() -> None:
    """Close the control socket opened by :func:`enable_remote_control`, and remove it.

    Runs at interpreter exit too. A profile started remotely and still
    running is stopped and its results dropped, which is said on stderr
    (``aprof run --control`` writes it instead). No-op when remote control
    is off.
    """
    prof = _close()
    if prof is not None and sys.stderr is not None:
        sys.stderr.write(f"aprof: a profile started by aprof ctl was still running in {os.getpid()}: stopped, not written\n")


def _close() -> Any:
    """Close the server; returns a remotely started profile that was running (now stopped), or None."""
    global _server
    with _server_lock:
        server, _server = _server, None
    if server is None or server.pid != os.getpid():
        return None
    return server.close()


def remote_control_running() -> bool:
    """Whether this process serves a control socket now (the tests' leak check)."""
    server = _server
    return server is not None and not server.done.is_set()


@atexit.register
def _at_exit() -> None:
    with contextlib.suppress(Exception):
        disable_remote_control()


def _after_fork_in_child() -> None:
    # The server thread did not come along: forget the server, close the
    # inherited socket, and leave the file to the parent.
    global _server, _server_lock
    _server_lock = threading.Lock()
    server, _server = _server, None
    if server is not None:
        for closer in (server.sock.close, lambda: os.close(server.wake_r), lambda: os.close(server.wake_w)):
            with contextlib.suppress(OSError):
                closer()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
