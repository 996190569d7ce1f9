"""``aprof run`` follows the Python programs it starts (SPEC 10.1, 15.4; issue 20 item 3)."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import textwrap
import time
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


def _server_dirs(tmp_path: Path) -> tuple[Path, Path, int, dict[str, str]]:
    """For a real server under ``aprof run``: its working directory (with
    ``APP``), a private TMPDIR (empty again after the run), a free port on
    loopback, and an environment that follows nothing yet."""
    import socket

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
    return cwd, tmp, port, env


def _serve(server: subprocess.Popen[str], port: int, n: int, workers: int = 1) -> None:
    """Send ``n`` real HTTP requests (``/r0`` ...) to the server on
    ``port``, one at a time, waiting (60 s at most) for it to listen and,
    first, for ``workers`` worker processes to answer (``/warm...``
    requests until that many pids did: a worker still booting would serve
    none of the ``n`` and be stopped before its profile starts)."""
    deadline = time.monotonic() + 60
    served = warm = 0
    pids: set[str] = set()
    while served < n:
        assert time.monotonic() < deadline, f"the server did not answer (worker pids seen: {pids})"
        assert server.poll() is None, server.communicate()
        warming = workers > 1 and len(pids) < workers
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", f"/warm{warm}" if warming else f"/r{served}")
            response = conn.getresponse()
            assert response.read() == b"ok"
            pids.add(response.getheader("x-pid", ""))
        except ConnectionError:
            time.sleep(0.1)  # not listening yet
            continue
        finally:
            conn.close()
        if warming:
            warm += 1
        else:
            served += 1


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


SAMPLED_PARENT = """
import subprocess, sys

CHILD = (
    "import time\\n"
    "def child_burn(seconds):\\n"
    "    end = time.perf_counter() + seconds\\n"
    "    while time.perf_counter() < end:\\n"
    "        pass\\n"
    "child_burn(0.2)\\n"
)

if __name__ == "__main__":
    subprocess.run([sys.executable, "-c", CHILD], check=True)
"""


def test_run_sample_follows_children_with_their_samples(tmp_path: Path) -> None:
    # SPEC 8.4, 15.4: aprof run --sample profiles the children with the
    # sampler too, and their samples are merged onto their own tracks,
    # under their process.
    proc, cwd = _run(tmp_path, "--sample", "0.001", script=SAMPLED_PARENT)
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    smp = s.samples
    assert smp is not None
    tracks = {t.id: t for t in s.tracks()}
    hot = [i for i in range(len(smp)) if smp.stack(i)[-1:] and smp.stack(i)[-1].endswith(": child_burn")]
    assert hot
    nodes = {tracks[smp.thread_id[i]].node_id for i in hot}
    assert len(nodes) == 1
    [node] = nodes
    assert node != 0
    assert s.metadata["pids"][str(node)] == node
    assert s.lost == []


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
import os

import aprof

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    with aprof.record_function("request " + scope["path"]):
        headers = [(b"content-length", b"2"), (b"x-pid", str(os.getpid()).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})
"""


def test_uvicorn_workers_are_followed_into_one_trace(tmp_path: Path) -> None:
    # Issue 20 item 4: `aprof run -m uvicorn app:app --workers 2`: one
    # output with every request that either worker served, exactly once,
    # each worker its own process; stopped by Ctrl-C as a user would.
    import signal

    pytest.importorskip("uvicorn")
    cwd, tmp, port, env = _server_dirs(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", "-m", "uvicorn", "app:app",
         "--workers", "2", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    n = 200
    try:
        _serve(server, port, n)
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


FORKS = """
import asyncio, os, signal, sys, time
import aprof

async def in_child():
    with aprof.record_function("child async"):
        await asyncio.sleep(0)

with aprof.record_function("parent work"):
    # A fork inside a profiled range: the child runs on through the
    # program's own code (as a gunicorn worker does) and ends by sys.exit
    # through it; the range it inherited open is the parent's, not its own.
    pid = os.fork()
    if pid == 0:
        with aprof.record_function("fork work"):
            asyncio.run(in_child())
        sys.exit(3)
    assert os.waitpid(pid, 0)[1] >> 8 == 3
    # A fork ended by SIGTERM (it inherits aprof run's handler): it saves,
    # then ends by the signal.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        with aprof.record_function("fork before the signal"):
            pass
        os.write(w, b"x")
        time.sleep(30)
        os._exit(1)
    os.read(r, 1)
    os.kill(pid, signal.SIGTERM)
    assert os.waitpid(pid, 0)[1] & 0x7F == signal.SIGTERM
    # A fork that execs Python: the program it becomes is followed, once.
    pid = os.fork()
    if pid == 0:
        code = "import aprof\\nwith aprof.record_function('exec work'): pass"
        os.execv(sys.executable, [sys.executable, "-c", code])
    assert os.waitpid(pid, 0)[1] == 0
    # The program's own profile, inherited by a fork, still stops there
    # with an empty session (RELIABILITY LC-01); the fork's own profile
    # records what the fork does.
    mine = aprof.profile()
    mine.start()
    with aprof.record_function("parent in its own profile"):
        pass
    pid = os.fork()
    if pid == 0:
        with aprof.record_function("fork with the program's profile"):
            pass
        mine.stop()
        assert mine.session.events() == [], mine.session.events()
        sys.exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    mine.stop()
    assert [e.name for e in mine.session.events()] == ["parent in its own profile"]
    # A fork that leaves by os._exit runs no exit hook: it is named as lost.
    pid = os.fork()
    if pid == 0:
        with aprof.record_function("fork that leaves by os._exit"):
            pass
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    print("forks", os.getpid())
"""


def test_run_follows_forks_into_one_session(tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 4: a process forked by the program (not a
    # new program: gunicorn's workers) is profiled as its own process with
    # the same options, named by the command line and the pid that forked
    # it, and merged; the parent's events are in the output once, the
    # fork's own too; exec and os._exit are as documented.
    proc, cwd = _run(tmp_path, script=FORKS)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    parent = int(proc.stdout.split("forks ")[1].split()[0])
    s = aprof.load(cwd / "out.aprof")
    names = sorted(e.name for e in s.events() if e.scope is not aprof.RecordScope.TASK)
    assert names == [
        "child async", "exec work", "fork before the signal", "fork with the program's profile", "fork work",
        "parent in its own profile", "parent work",
    ], names  # fmt: skip
    nodes = {e.name: e.node_id for e in s.events()}
    assert nodes["parent work"] == 0
    assert len({nodes[n] for n in ("fork work", "fork before the signal", "exec work")}) == 3
    assert nodes["child async"] == nodes["fork work"]
    commands = s.metadata["commands"]
    for name in ("fork work", "fork before the signal"):
        assert commands[str(nodes[name])] == f"parent.py (forked by pid {parent})"
        assert s.metadata["pids"][str(nodes[name])] == nodes[name]
    assert commands[str(nodes["exec work"])].startswith(sys.executable)
    # The task the fork ran is on the fork's tracks.
    tasks = [e for e in s.events() if e.scope is aprof.RecordScope.TASK]
    assert tasks
    assert {e.node_id for e in tasks} == {nodes["fork work"]}
    [lost] = s.lost
    assert lost["name"] == f"parent.py (forked by pid {parent})"
    assert lost["reason"] == "ended without saving its profile (killed by SIGKILL, crashed, or left by os._exit)"
    assert sorted(p.name for p in cwd.iterdir()) == ["out.aprof", "parent.py"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_fork_that_execs_through_subprocess_is_not_followed_twice(tmp_path: Path) -> None:
    # Issue 20 item 4: subprocess with a preexec_fn forks, runs the fork
    # hooks, then execs: that fork is not a copy of the program. A program
    # it execs that is not Python is left alone (nothing named as lost); a
    # Python one is followed once.
    script = """
    import subprocess, sys
    import aprof
    with aprof.record_function("parent work"):
        subprocess.run(["sh", "-c", "true"], preexec_fn=lambda: None, check=True)
        code = "import aprof\\nwith aprof.record_function('python child'): pass"
        subprocess.run([sys.executable, "-c", code], preexec_fn=lambda: None, check=True)
    """
    proc, cwd = _run(tmp_path, script=script)
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    assert sorted(e.name for e in s.events()) == ["parent work", "python child"]
    assert s.lost == []
    assert len(s.metadata["commands"]) == 2
    assert list((tmp_path / "tmp").iterdir()) == []


POOLS = """
import concurrent.futures, multiprocessing, sys
import aprof

def crunch(n):
    with aprof.record_function("crunch inner"):
        return sum(range(n))

def target():
    with aprof.record_function("process target"):
        pass

def doomed(n):
    with aprof.record_function("doomed"):
        return n

if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[1])
    with aprof.record_function("parent work"):
        with aprof.propagating(concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx)) as pool:
            assert sum(pool.map(crunch, [1000] * 6)) == 6 * 499500
        p = ctx.Process(target=target)
        p.start()
        p.join()
        mp_pool = ctx.Pool(2)
        assert mp_pool.map(crunch, [10] * 4) == [45] * 4
        mp_pool.close()
        mp_pool.join()
        # terminate() (the end of a with block) SIGTERMs the workers: it
        # must not hang; what those workers recorded may be lost.
        with ctx.Pool(2) as terminated:
            assert terminated.map(doomed, [1, 2]) == [1, 2]
            print("terminated", *(p.pid for p in terminated._pool))
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pools_under_run_count_each_job_once(tmp_path: Path, method: str) -> None:
    # Issue 20 items 1-4: under aprof run, a process pool's workers are
    # followed (fork: as forks; spawn, forkserver: as programs or forks of
    # the server) and also run jobs a profile propagated to them. Each job
    # is recorded once, by the profile that sent it (with its link), and a
    # multiprocessing child or Pool worker with no propagated work is
    # followed: every range once, on its process's node, nothing lost.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "parent.py").write_text(textwrap.dedent(POOLS))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("APROF_FOLLOW", "PYTHONPATH")}
    env["TMPDIR"] = str(tmp)
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", "parent.py", method],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = aprof.load(cwd / "out.aprof")
    counts: dict[str, int] = {}
    for e in s.events():
        counts[e.name] = counts.get(e.name, 0) + 1
    assert counts["crunch"] == 6  # the pool's jobs, as EXECUTOR ranges
    assert counts["crunch inner"] == 6 + 4
    assert counts["process target"] == 1
    assert counts["parent work"] == 1
    assert counts.get("doomed", 0) <= 2
    assert {e.node_id for e in s.events() if e.name != "parent work"}.isdisjoint({0})
    terminated = {int(p) for p in proc.stdout.split("terminated")[1].split()}
    for lost in s.lost:  # only a terminated worker, if any, and said so
        assert lost["pid"] in terminated, s.lost
        assert lost["reason"].startswith("ended without saving its profile"), lost
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("stop", ["SIGTERM to the master", "Ctrl-C to the group"])
def test_gunicorn_uvicorn_workers_are_followed_into_one_trace(tmp_path: Path, stop: str) -> None:
    # Issue 20 item 4: `aprof run -m gunicorn app:app -w 2 -k
    # uvicorn.workers.UvicornWorker`: gunicorn forks its workers, and each
    # is followed as its own process; the output has every request that
    # either worker served, exactly once, none in the master; stopped as
    # an operator does (SIGTERM to the master: a graceful stop) or as a
    # terminal's Ctrl-C does (SIGINT to the whole process group). The
    # workers put SIGTERM back to its default after the fork and uvicorn
    # ends them by re-raising the signal: their profiles are saved first.
    import signal

    pytest.importorskip("uvicorn")
    pytest.importorskip("gunicorn")
    cwd, tmp, port, env = _server_dirs(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "out.aprof", "-m", "gunicorn", "app:app",
         "-w", "2", "-k", "uvicorn.workers.UvicornWorker", "-b", f"127.0.0.1:{port}", "--log-level", "warning",
         "--graceful-timeout", "20"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    n = 200
    try:
        _serve(server, port, n, workers=2)
    finally:
        if stop == "SIGTERM to the master":
            server.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.pid, signal.SIGINT)
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    s = aprof.load(cwd / "out.aprof")
    requests = [e for e in s.events() if e.name.startswith("request /r")]  # /warm...: until both workers answered
    assert sorted(e.name for e in requests) == sorted(f"request /r{i}" for i in range(n)), err  # every request, exactly once
    commands = s.metadata["commands"]
    master = commands["0"]
    assert master.startswith("gunicorn app:app -w 2")
    workers = {node for node, command in commands.items() if command.startswith(master + " (forked by pid ")}
    assert len(workers) == 2, commands  # both workers, each its own process
    assert {str(e.node_id) for e in requests} <= workers  # served in the workers, not in the master
    assert s.lost == [], s.lost
    assert sorted(p.name for p in cwd.iterdir() if p.name != "__pycache__") == ["app.py", "out.aprof"]
    assert list(tmp.iterdir()) == []
