"""``aprof run`` follows the Python programs it starts (SPEC 10.1, 15.4; issue 20 item 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aprof
from aprof._integrations import _follow

pytestmark = pytest.mark.timeout(120)

PARENT = """
import multiprocessing, os, subprocess, sys
import aprof

def mp_child():
    with aprof.record_function("mp child work"):
        sum(range(1000))

if __name__ == "__main__":
    with aprof.record_function("parent work"):
        code = "import aprof\\nwith aprof.record_function('sub child work'): pass"
        subprocess.run([sys.executable, "-c", code], check=True)
        # A child that becomes another Python program: the program it
        # execs is followed.
        execs = "import os, sys; os.execv(sys.executable, [sys.executable, '-c', " + repr(code.replace("sub", "exec")) + "])"
        subprocess.run([sys.executable, "-c", execs], check=True)
        out = subprocess.run(["sh", "-c", "echo not python"], check=True, capture_output=True, text=True).stdout
        assert out == "not python\\n", out
        p = multiprocessing.get_context("spawn").Process(target=mp_child)
        p.start()
        p.join()
        assert p.exitcode == 0
    print("child saw", subprocess.run([sys.executable, "-c", "import sys; print(sys.path)"], capture_output=True, text=True).stdout)
"""


def _run(tmp_path: Path, *options: str, script: str = PARENT) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``aprof run`` of ``script`` in ``tmp_path/cwd``, with its own temp dir."""
    cwd = tmp_path / "cwd"
    tmp = tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    (cwd / "parent.py").write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k not in ("APROF_FOLLOW", "PYTHONPATH")}
    env["TMPDIR"] = str(tmp)
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", *options, "parent.py"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    return proc, cwd


def test_run_follows_python_children_into_one_session(tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 3: subprocess, exec and multiprocessing
    # (spawn) children that run Python are profiled with the same options
    # and merged, each its own process named by pid and command line; a
    # child that is not Python is left alone; nothing is left in the temp
    # dir or the working directory but the output.
    proc, cwd = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    s = aprof.load(cwd / "out.aprof")
    by_name = {e.name: e for e in s.events()}
    assert sorted(by_name) == ["exec child work", "mp child work", "parent work", "sub child work"]
    nodes = {name: e.node_id for name, e in by_name.items()}
    assert nodes["parent work"] == 0
    assert len(set(nodes.values())) == 4  # each its own process
    pids = s.metadata["pids"]
    commands = s.metadata["commands"]
    for name in ("sub child work", "exec child work", "mp child work"):
        node = str(nodes[name])
        assert pids[node] == nodes[name]  # a child's node id is its pid
        assert commands[node].startswith(sys.executable)
    assert "sub child work" in commands[str(nodes["sub child work"])]
    assert "--multiprocessing-fork" in commands[str(nodes["mp child work"])]
    assert commands["0"] == "parent.py"
    assert s.lost == []
    # The child's sys.path is its own: the bootstrap took itself off it.
    assert "child saw [" in proc.stdout
    assert "aprof-follow" not in proc.stdout
    assert sorted(p.name for p in cwd.iterdir()) == ["out.aprof", "parent.py"]
    assert list((tmp_path / "tmp").iterdir()) == []
    # The summary groups by process, each named by its command line.
    table = s.key_averages(group_by="node").table()
    assert ": parent.py" in table
    mp = nodes["mp child work"]
    assert f"node {mp} (pid {mp}): {sys.executable}"[:50] in table


def test_no_follow_leaves_children_alone(tmp_path: Path) -> None:
    # Issue 20 item 3: --no-follow profiles this process only, and the
    # environment the children get is the program's own.
    proc, cwd = _run(tmp_path, "--no-follow")
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    assert [e.name for e in s.events()] == ["parent work"]
    assert "commands" not in s.metadata or set(s.metadata["commands"]) <= {"0"}


def test_a_child_still_running_at_the_end_is_named(tmp_path: Path) -> None:
    # Issue 20 "Bad input": a child that outlives the program is named in
    # session.lost by its command line; the parent's events are intact;
    # the child runs on and leaves nothing behind.
    script = """
    import subprocess, sys, time, os
    import aprof
    with aprof.record_function("parent work"):
        flag = "started"
        subprocess.Popen([sys.executable, "-c", "import time, pathlib; pathlib.Path('started').touch(); time.sleep(1.5)"])
        while not os.path.exists(flag):
            time.sleep(0.01)
    """
    proc, cwd = _run(tmp_path, script=script)
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    assert [e.name for e in s.events()] == ["parent work"]
    [lost] = s.lost
    assert "time.sleep(1.5)" in lost["name"]
    assert lost["reason"] == "still running when the profiled program ended"
    assert type(lost["pid"]) is int
    (cwd / "started").unlink()
    deadline = __import__("time").monotonic() + 10
    while list((tmp_path / "tmp").iterdir()) and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.05)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_child_ended_by_sigterm_keeps_its_profile_and_its_ending(tmp_path: Path) -> None:
    # Issue 20 items 3-4: a child with no SIGTERM handler of its own (a
    # server's worker told to stop) runs no exit hook when the signal ends
    # it: its profile is saved first, and it still ends by the signal.
    script = """
    import signal, subprocess, sys
    import aprof
    code = (
        "import os, signal, aprof\\n"
        "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN\\n"
        "with aprof.record_function('before the signal'): pass\\n"
        "os.kill(os.getpid(), signal.SIGTERM)\\n"
        "raise SystemExit('not reached')\\n"
    )
    with aprof.record_function("parent work"):
        p = subprocess.run([sys.executable, "-c", code])
    assert p.returncode == -signal.SIGTERM, p.returncode
    """
    proc, cwd = _run(tmp_path, script=script)
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    assert sorted(e.name for e in s.events()) == ["before the signal", "parent work"]
    assert s.lost == []


APP = """
import aprof

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    with aprof.record_function("request " + scope["path"]):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
"""


def test_uvicorn_workers_are_followed_into_one_trace(tmp_path: Path) -> None:
    # Issue 20 item 4: `aprof run -m uvicorn app:app --workers 2`: one
    # output with every request that either worker served, exactly once,
    # each worker its own process; stopped by Ctrl-C as a user would.
    import http.client
    import signal
    import socket
    import time

    pytest.importorskip("uvicorn")
    cwd = tmp_path / "cwd"
    tmp = tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    (cwd / "app.py").write_text(APP)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("APROF_FOLLOW", "PYTHONPATH")}
    env["TMPDIR"] = str(tmp)
    server = subprocess.Popen(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", "-m", "uvicorn", "app:app",
         "--workers", "2", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    n = 200
    try:
        deadline = time.monotonic() + 60
        served = 0
        while served < n:
            assert time.monotonic() < deadline, "the server did not answer"
            assert server.poll() is None, server.communicate()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", f"/r{served}")
                assert conn.getresponse().read() == b"ok"
            except ConnectionError:
                time.sleep(0.1)  # not listening yet
                continue
            finally:
                conn.close()
            served += 1
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    s = aprof.load(cwd / "out.aprof")
    names = sorted(e.name for e in s.events() if e.name.startswith("request "))
    assert names == sorted(f"request /r{i}" for i in range(n)), err  # every request, exactly once
    workers = {e.node_id for e in s.events() if e.name.startswith("request ")}
    assert 0 not in workers  # served in the workers, not in the supervisor
    for node in workers:
        assert "multiprocessing" in s.metadata["commands"][str(node)]
    assert s.lost == [], s.lost
    assert list(tmp.iterdir()) == []


def test_the_bootstrap_is_a_no_op_elsewhere(tmp_path: Path) -> None:
    # Issue 20 item 3: in a Python whose APROF_FOLLOW is not this
    # bootstrap's directory, or that cannot import aprof, the bootstrap
    # does nothing, and the sitecustomize it shadows still runs.
    home = tmp_path / "home"
    boot = home / "boot"
    boot.mkdir(parents=True)
    (boot / "sitecustomize.py").write_text(_follow.BOOTSTRAP)
    (home / "options.json").write_text("{}")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS = True\n")
    code = f"import builtins, sys; print(getattr(builtins, 'THEIRS', False), 'aprof' in sys.modules, {str(boot)!r} in sys.path)"
    path = os.pathsep.join([str(boot), str(theirs)])
    for follow in (str(tmp_path / "elsewhere"), str(home)):
        env = {**os.environ, "PYTHONPATH": path, "APROF_FOLLOW": follow}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        profiled = follow == str(home)
        assert out.stdout.split() == ["True", str(profiled), "False"]
    # The child profiled itself into home and saved its session there.
    assert len(list(home.glob("*.aprof"))) == 1
    assert list(home.glob("*.part")) == []
    # A Python that cannot import aprof (the system's): left alone.
    env = {**os.environ, "PYTHONPATH": path, "APROF_FOLLOW": str(home)}
    other = shutil.which("python3", path="/usr/bin")
    if other is not None:
        out = subprocess.run([other, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == "True"
