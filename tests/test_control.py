"""Remote control: ``aprof.enable_remote_control()`` and ``aprof ctl PID ...`` (SPEC 15.3, 15.6).

End to end, a real child process serving TCP on each backend is driven with
the ``aprof ctl`` command; the protocol's faults are sent to an in-process
server by hand.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._cli._main import main
from aprof._integrations import _control
from aprof._post._readers import read_profile

from .conftest import BACKENDS, Backend
from .tracecheck import validate_trace

CHILD_TIMEOUT = 60


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private XDG_RUNTIME_DIR: the sockets of this test live in it."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


@pytest.fixture
def server(runtime_dir: Path) -> Iterator[Path]:
    """Remote control enabled in this process (outside any loop)."""
    path = aprof.enable_remote_control(announce=False)
    try:
        yield path
    finally:
        aprof.disable_remote_control()


def raw(path: Path, data: bytes, *, read: bool = True) -> dict[str, Any] | None:
    """Send ``data`` as is; the reply object, or None if the server closed without one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(os.fspath(path))
        s.sendall(data)
        if not read:
            return None
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return json.loads(buf) if buf else None


def ask(path: Path, command: str, **fields: Any) -> dict[str, Any]:
    reply = raw(path, (json.dumps({"aprof_control": 1, "command": command, **fields}) + "\n").encode())
    assert reply is not None
    return reply


def not_running(path: Path) -> None:
    status = ask(path, "status")
    assert status["ok"] is True
    assert status["running"] is False
    assert status["pid"] == os.getpid()


# -- the socket ----------------------------------------------------------------------------


def test_socket_is_private_named_by_pid_and_removed(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SPEC 15.3: only the user reaches it; the path is printed once.
    monkey_announced = _control._announced
    _control._announced = False
    try:
        path = aprof.enable_remote_control()
        assert aprof.enable_remote_control() == path  # idempotent
    finally:
        announced = capsys.readouterr().err
        _control._announced = monkey_announced
    try:
        assert path == runtime_dir / "aprof" / f"{os.getpid()}.sock"
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700
        assert announced.count(str(path)) == 1
        assert f"aprof ctl {os.getpid()}" in announced
        assert ask(path, "status")["ok"] is True
    finally:
        aprof.disable_remote_control()
    assert not path.exists()
    assert not _control.remote_control_running()
    aprof.disable_remote_control()  # again: a no-op


def test_a_directory_open_to_others_is_refused(runtime_dir: Path) -> None:
    # SPEC 15.3: a control directory another user could enter is never used.
    (runtime_dir / "aprof").mkdir(mode=0o755)
    os.chmod(runtime_dir / "aprof", 0o755)
    with pytest.raises(PermissionError, match="open to other users"):
        aprof.enable_remote_control(announce=False)
    assert not _control.remote_control_running()


def test_server_is_invisible_to_the_program(server: Path) -> None:
    # SPEC 15.6: no thread in threading.enumerate(), nothing in the program's context.
    import threading

    assert all("aprof" not in t.name for t in threading.enumerate())
    assert _control.remote_control_running()


# -- protocol faults: an error reply, and nothing changes ------------------------------------


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json\n", "malformed request: not JSON"),
        (b"[1, 2]\n", "expected a JSON object, got list"),
        (b'{"command": "status"}\n', "unsupported protocol version None"),
        (b'{"aprof_control": 2, "command": "status"}\n', "unsupported protocol version 2"),
        (b'{"aprof_control": 1, "command": "explode"}\n', "unknown command 'explode'"),
        (b'{"aprof_control": 1, "command": "start", "options": {"scope": "context"}}\n', "unknown option 'scope'"),
        (b'{"aprof_control": 1, "command": "start", "options": {"sample_interval": -1}}\n', "sample_interval"),
        (b'{"aprof_control": 1, "command": "start", "options": {"tasks": "yes"}}\n', "'tasks' must be True or False"),
        (b'{"aprof_control": 1, "command": "start", "options": [1]}\n', "'options' must be an object"),
        (b'{"aprof_control": 1, "command": "stop", "output": "relative.json"}\n', "absolute path"),
        (b'{"aprof_control": 1, "command": "stop"}\n', "'output' must be the path"),
        (b"\xff\xfe\n", "malformed request"),
    ],
)
def test_malformed_request_gets_an_error_reply_and_changes_nothing(server: Path, data: bytes, error: str) -> None:
    # SPEC 15.3, 12: a bad message is answered, never acted on.
    reply = raw(server, data)
    assert reply is not None
    assert reply["ok"] is False
    assert error in reply["error"]
    assert reply["aprof_control"] == 1
    not_running(server)


def test_request_too_long_is_refused(server: Path) -> None:
    reply = raw(server, b"x" * (_control.MAX_REQUEST + 10))
    assert reply is not None
    assert reply["ok"] is False
    assert "longer than" in reply["error"]
    not_running(server)


def test_client_gone_mid_request_changes_nothing(server: Path) -> None:
    # SPEC 15.3: half a request, then the client disconnects: nothing is done.
    raw(server, b'{"aprof_control": 1, "command": "sta', read=False)
    not_running(server)


def test_client_gone_mid_command_the_command_still_completes(server: Path, tmp_path: Path) -> None:
    # SPEC 15.3: a client that sends stop and leaves before the reply: the
    # profile is stopped and written, and the server serves the next client.
    assert ask(server, "start", options={"tasks": True})["ok"] is True
    with aprof.record_function("while remote"):
        pass
    out = tmp_path / "left.json"
    raw(server, (json.dumps({"aprof_control": 1, "command": "stop", "output": str(out)}) + "\n").encode(), read=False)
    deadline = time.monotonic() + 30
    while ask(server, "status")["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    not_running(server)
    assert "while remote" in {e.name for e in read_profile(out).events()}


def test_start_twice_and_stop_without_a_profile(server: Path, tmp_path: Path) -> None:
    # SPEC 15.3: clear errors; the running profile is untouched.
    reply = ask(server, "stop", output=str(tmp_path / "x.json"))
    assert reply["ok"] is False
    assert "no profile is running" in reply["error"]
    assert ask(server, "start")["ok"] is True
    try:
        again = ask(server, "start", options={"python_tracer": True})
        assert again["ok"] is False
        assert "already running" in again["error"]
        status = ask(server, "status")
        assert status["running"] is True
        assert status["options"] == {}
    finally:
        assert ask(server, "stop", output=str(tmp_path / "x.aprof"))["ok"] is True
    assert read_profile(tmp_path / "x.aprof") is not None
    not_running(server)


def test_failed_write_keeps_the_stopped_profile_for_a_retry(server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 12: a failed write loses nothing recorded.
    assert ask(server, "start")["ok"] is True
    with aprof.record_function("kept"):
        pass
    from aprof._post._session import Session

    real = Session.export_chrome_trace

    def full_disk(self: Session, *a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "export_chrome_trace", full_disk)
    reply = ask(server, "stop", output=str(tmp_path / "a.json"))
    assert reply["ok"] is False
    assert "No space left" in reply["error"]
    assert ask(server, "status")["unsaved"] is True
    monkeypatch.setattr(Session, "export_chrome_trace", real)
    assert ask(server, "stop", output=str(tmp_path / "a.json"))["ok"] is True
    assert "kept" in {e.name for e in read_profile(tmp_path / "a.json").events()}
    assert ask(server, "status")["unsaved"] is False


def test_another_users_connection_is_refused(server: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.3: the peer's uid is checked (SO_PEERCRED) besides the 0700 directory.
    monkeypatch.setattr(_control, "_peer_uid", lambda conn: os.getuid() + 1)
    reply = ask(server, "start")
    assert reply["ok"] is False
    assert "refused" in reply["error"]
    monkeypatch.undo()
    not_running(server)


def test_dump_without_a_flight_recorder(server: Path, tmp_path: Path) -> None:
    # SPEC 15.2, 15.3
    reply = ask(server, "dump", output=str(tmp_path / "d.json"))
    assert reply["ok"] is False
    assert f"no flight recorder running in {os.getpid()}" in reply["error"]
    assert not (tmp_path / "d.json").exists()


def test_dump_writes_the_flight_recorders_window(server: Path, tmp_path: Path) -> None:
    # SPEC 15.2, 15.3; issue 19 items 2 and 3: the running flight
    # recorder's window, written where the client asks, recording on.
    out = tmp_path / "window.json"
    with aprof.flight_recorder(signal=None) as recorder:
        with aprof.record_function("before the dump"):
            pass
        reply = ask(server, "dump", output=str(out))
        assert reply["ok"] is True
        assert reply["output"] == str(out)
        assert ask(server, "status")["flight_recorder"] is True
        assert recorder.running
    names = {e["name"] for e in validate_trace(out)["traceEvents"] if e.get("ph") == "X"}
    assert "before the dump" in names
    assert ask(server, "status")["flight_recorder"] is False


# -- on every backend, in process: commands run on the program's loop ------------------------


def test_remote_profile_records_the_running_loops_tasks(backend: Backend, runtime_dir: Path, tmp_path: Path) -> None:
    # SPEC 15.3, 5.3, 7.5: a global profile started remotely while the loop
    # runs records that loop's tasks and watches it for blocks, as one
    # started in it would (the commands run on the loop, not the control thread).
    out = tmp_path / "remote.json"

    async def worker(i: int) -> None:
        with aprof.record_function(f"job {i}"):
            await backend.sleep(0.001)
            if i == 0:
                time.sleep(0.05)  # blocks the loop

    async def program() -> None:
        path = aprof.enable_remote_control(announce=False)
        try:
            status = await backend.to_thread(ask, path, "status")
            assert ("trio run" if backend.is_trio else "asyncio loop") in status["runs_commands_on"]
            options = {"tasks": True, "loop_block_threshold": 0.02}
            started = await backend.to_thread(lambda: ask(path, "start", options=options))
            assert started["ok"] is True, started
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(worker, i)
            await backend.sleep(0.03)  # a beat after the block
            stopped = await backend.to_thread(lambda: ask(path, "stop", output=str(out)))
            assert stopped["ok"] is True, stopped
        finally:
            aprof.disable_remote_control()

    backend.run(program)
    events = read_profile(out).events()
    jobs = [e for e in events if e.name.startswith("job")]
    assert sorted(e.name for e in jobs) == ["job 0", "job 1", "job 2"]
    tasks = {e.thread_id: e for e in events if e.scope is aprof.RecordScope.TASK}
    assert all(e.thread_id in tasks for e in jobs)  # each job inside its task's TASK range
    assert len({e.thread_id for e in jobs}) == 3
    assert any(e.scope is aprof.RecordScope.LOOP_BLOCK for e in events)


def test_command_for_a_blocked_loop_fails_and_never_runs_late(backend: Backend, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.3, 15.6: the loop is blocked past the wait: the client gets an
    # error, and the start is not carried out when the loop runs again.
    import threading

    monkeypatch.setattr(_control, "LOOP_TIMEOUT", 0.2)
    replies: list[dict[str, Any]] = []

    async def program() -> None:
        path = aprof.enable_remote_control(announce=False)
        try:
            client = threading.Thread(target=lambda: replies.append(ask(path, "start")))
            client.start()
            time.sleep(0.6)  # blocks the loop past LOOP_TIMEOUT
            await backend.to_thread(client.join)
            await backend.sleep(0.05)  # the loop runs its queue: the abandoned start is skipped
            status = await backend.to_thread(ask, path, "status")
            assert status["running"] is False
        finally:
            aprof.disable_remote_control()

    backend.run(program)
    assert replies[0]["ok"] is False
    assert "did not run the command within 0.2 s" in replies[0]["error"]


# -- the command line, against a real child process ------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import aprof

    backend, flag = sys.argv[1], sys.argv[2]
    flight = sys.argv[3:] == ["flight"]  # an always-on flight recorder too

    def ready(port):
        print(os.getpid(), port, flush=True)

    def done():
        return os.path.exists(flag)

    if backend.startswith("anyio") or backend == "trio":
        import anyio

        async def handle(stream):
            async with stream:
                data = await stream.receive()
                with aprof.record_function("request"):
                    await anyio.sleep(0.001)
                await stream.send(data)

        async def main():
            aprof.enable_remote_control()
            if flight:
                aprof.flight_recorder(signal=None).start()
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, handle)
                ready(port)
                deadline = time.monotonic() + 50
                while not done() and time.monotonic() < deadline:
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

        anyio.run(main, backend="trio" if backend.endswith("trio") else "asyncio")
    else:
        import asyncio

        async def handle(reader, writer):
            data = await reader.readline()
            with aprof.record_function("request"):
                await asyncio.sleep(0.001)
            writer.write(data)
            await writer.drain()
            writer.close()

        async def main():
            if backend == "asyncio-eager":
                asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
            aprof.enable_remote_control()
            if flight:
                aprof.flight_recorder(signal=None).start()
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            ready(server.sockets[0].getsockname()[1])
            deadline = time.monotonic() + 50
            while not done() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            server.close()

        if backend == "uvloop":
            import uvloop
            uvloop.run(main())
        else:
            asyncio.run(main())
    """
)


def ctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aprof", "ctl", *args], cwd=cwd, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)


def request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"ping\n")
        assert s.recv(16) == b"ping\n"


@pytest.mark.parametrize("child_backend", BACKENDS)
def test_ctl_drives_a_running_server(child_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    # SPEC 15.3, 15.6: status, start, stop OUT, dump OUT on a live server
    # that was not profiled at launch; the socket is gone after exit.
    (tmp_path / "child.py").write_text(CHILD)
    flag = tmp_path / "quit"
    proc = subprocess.Popen(
        [sys.executable, "child.py", child_backend, str(flag)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid_text, port_text = proc.stdout.readline().split()
        pid, port = int(pid_text), int(port_text)
        assert pid == proc.pid
        sock = runtime_dir / "aprof" / f"{pid}.sock"

        status = ctl(str(pid), "status", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "no profile running" in status.stdout
        request(port)  # unprofiled

        started = ctl(str(pid), "start", "--no-loop-block", cwd=tmp_path)
        assert started.returncode == 0, started.stderr
        assert "profile started" in started.stdout
        for _ in range(5):
            request(port)
        assert "profile running" in ctl(str(pid), "status", cwd=tmp_path).stdout

        stopped = ctl(str(pid), "stop", "out.aprof", cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert str(tmp_path / "out.aprof") in stopped.stdout

        dumped = ctl(str(pid), "dump", "window.json", cwd=tmp_path)
        assert dumped.returncode == 1
        assert f"no flight recorder running in {pid}" in dumped.stderr
        again = ctl(str(pid), "stop", "again.json", cwd=tmp_path)
        assert again.returncode == 1
        assert "no profile is running" in again.stderr

        flag.write_text("")
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert err.count("aprof: remote control on") == 1
    assert "Traceback" not in err
    assert not sock.exists()
    session = read_profile(tmp_path / "out.aprof")
    requests = [e for e in session.events() if e.name == "request"]
    assert len(requests) == 5  # the 5 profiled requests, not the one before
    assert len({e.thread_id for e in requests}) == 5  # each on its own task's track
    gone = ctl(str(pid), "status", cwd=tmp_path)
    assert gone.returncode == 2
    assert f"no process {pid}" in gone.stderr


@pytest.mark.parametrize("child_backend", ["asyncio", "trio"])
def test_ctl_dump_writes_a_running_servers_flight_recorder(child_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    # Issue 19 items 2 and 3, end to end: a server with a flight recorder
    # on; `aprof ctl PID dump OUT` writes its window, and it records on.
    (tmp_path / "child.py").write_text(CHILD)
    flag = tmp_path / "quit"
    proc = subprocess.Popen(
        [sys.executable, "child.py", child_backend, str(flag), "flight"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        pid_text, port_text = proc.stdout.readline().split()
        pid, port = int(pid_text), int(port_text)
        for _ in range(3):
            request(port)
        assert "flight recorder" in ctl(str(pid), "status", cwd=tmp_path).stdout
        dumped = ctl(str(pid), "dump", "window.json", cwd=tmp_path)
        assert dumped.returncode == 0, dumped.stderr
        request(port)
        again = ctl(str(pid), "dump", "later.aprof", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        flag.write_text("")
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    first = [e for e in validate_trace(tmp_path / "window.json")["traceEvents"] if e.get("name") == "request"]
    assert len(first) == 3
    assert len({e["tid"] for e in first}) == 3  # each request on its task's track
    assert len([e for e in read_profile(tmp_path / "later.aprof").events() if e.name == "request"]) == 4


def test_aprof_run_control_writes_a_profile_still_running_at_exit(tmp_path: Path, runtime_dir: Path) -> None:
    # SPEC 10.1, 15.3: aprof run --control records nothing until aprof ctl start.
    (tmp_path / "prog.py").write_text(
        textwrap.dedent(
            """
            import asyncio, os, sys, time

            async def job():
                await asyncio.sleep(0.001)

            async def main():
                print(os.getpid(), flush=True)
                deadline = time.monotonic() + 50
                while not os.path.exists("go") and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.gather(*(job() for _ in range(4)))

            asyncio.run(main())
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "aprof", "run", "--control", "-o", "prog.json", "prog.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        started = ctl(str(pid), "start", cwd=tmp_path)
        assert started.returncode == 0, started.stderr
        assert "asyncio loop" in ctl(str(pid), "status", cwd=tmp_path).stdout
        (tmp_path / "go").write_text("")
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "aprof: wrote prog.json" in err
    tasks = [e for e in read_profile(tmp_path / "prog.json").events() if e.name.startswith("Task-")]
    assert len(tasks) == 4


def test_aprof_run_control_refuses_profile_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.py").write_text("")
    assert main(["run", "--control", "--python-tracer", "-o", str(tmp_path / "o.json"), str(tmp_path / "p.py")]) == 2
    assert "give --python-tracer to it there" in capsys.readouterr().err


# -- the client's errors ------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_ctl_no_such_process(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid = dead_pid()
    assert main(["ctl", str(pid), "status"]) == 2
    assert f"no process {pid}" in capsys.readouterr().err


def test_ctl_process_without_a_control_socket(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", str(os.getpid()), "status"]) == 2
    err = capsys.readouterr().err
    assert f"process {os.getpid()} has no aprof control socket" in err
    assert "enable_remote_control()" in err


def test_ctl_another_users_process(runtime_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # As a user other than the process's: os.kill(pid, 0) is refused.
    def refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    from aprof._cli import _ctl

    monkeypatch.setattr(_ctl.os, "kill", refused)
    assert main(["ctl", "1", "status"]) == 2
    assert "process 1 belongs to another user" in capsys.readouterr().err


def test_ctl_stale_socket_of_a_dead_process(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid = dead_pid()
    directory = runtime_dir / "aprof"
    directory.mkdir(mode=0o700)
    path = directory / f"{pid}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(os.fspath(path))  # bound, never listening, then closed: what a killed process leaves
    assert main(["ctl", str(pid), "start"]) == 2
    assert f"stale control socket {path}: process {pid} is gone" in capsys.readouterr().err
    assert not path.exists()


def test_ctl_output_format_checked_before_asking(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", str(os.getpid()), "stop", "out.txt"]) == 2
    assert "cannot tell the format of 'out.txt'" in capsys.readouterr().err


def test_ctl_unwritable_output_is_refused_and_the_profile_keeps_running(server: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", str(os.getpid()), "start"]) == 0
    try:
        assert main(["ctl", str(os.getpid()), "stop", str(tmp_path / "missing" / "o.json")]) == 1
        assert "does not exist" in capsys.readouterr().err
        assert ask(server, "status")["running"] is True
    finally:
        assert main(["ctl", str(os.getpid()), "stop", str(tmp_path / "o.json")]) == 0
    assert "profile stopped; wrote" in capsys.readouterr().out


def test_forked_child_leaves_the_parents_socket(server: Path) -> None:
    # SPEC 15.6: a child forked by the program does not remove the parent's socket at its exit.
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            aprof.disable_remote_control()
            code = 0 if not _control.remote_control_running() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert server.exists()
    not_running(server)
