"""Process lifecycle: fork and interpreter exit (RELIABILITY LC-01, LC-02)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .tracecheck import validate_trace


def run_script(
    tmp_path: Path, code: str, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def test_fork_while_profiling_and_holding_a_lock(tmp_path: Path) -> None:
    # LC-01, SPEC 11.4: the child does not deadlock on a lock another thread
    # held at the fork, and its profile holds none of the parent's events.
    proc = run_script(
        tmp_path,
        """
        import os, threading, aprof
        from aprof._core import _callbacks

        prof = aprof.profile().start()
        with aprof.record_function("parent-before-fork"):
            pass
        held = threading.Event(); release = threading.Event()
        def hold():
            with _callbacks._global_lock:
                held.set(); release.wait()
        t = threading.Thread(target=hold); t.start(); held.wait()
        pid = os.fork()
        if pid == 0:
            h = aprof.add_global_callback(aprof.RecordFunctionCallback(lambda rf: None))  # takes the lock
            aprof.remove_callback(h)
            with aprof.record_function("child"):
                pass
            prof.stop()
            names = [e.name for e in prof.events()]
            prof.export_chrome_trace("child.json")
            os._exit(0 if names == [] else 3)
        release.set(); t.join()
        _, status = os.waitpid(pid, 0)
        prof.stop()
        assert [e.name for e in prof.events()] == ["parent-before-fork"], prof.events()
        print("child exit", os.waitstatus_to_exitcode(status))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "child exit 0" in proc.stdout
    doc = validate_trace(tmp_path / "child.json")
    assert not [e for e in doc["traceEvents"] if e.get("name") == "parent-before-fork"]


def test_a_forked_child_records_on_its_own_track(tmp_path: Path) -> None:
    # LC-01, SPEC 2.3: the child's main thread is a new logical thread, on
    # both range paths; the C path must not answer from what it cached in
    # the parent (same thread state, same context).
    proc = run_script(
        tmp_path,
        """
        import os, aprof

        def one_range():
            prof = aprof.profile().start()
            with aprof.record_function("r"):
                pass
            prof.stop()
            (event,) = prof.events()
            return event.thread_id, event.end_thread_id

        parent = aprof.current_thread_id()
        assert one_range() == (parent, parent)
        pid = os.fork()
        if pid == 0:
            child = aprof.current_thread_id()
            os._exit(0 if child != parent and one_range() == (child, child) else 3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "child exit 0" in proc.stdout


def test_exit_with_a_profile_running_and_daemon_threads_in_ranges(tmp_path: Path) -> None:
    # LC-02: exit code 0, nothing on stderr, no crash.
    proc = run_script(
        tmp_path,
        """
        import threading, time, aprof

        prof = aprof.profile(scope="global").start()
        def spin():
            while True:
                with aprof.record_function("daemon"):
                    time.sleep(0.001)
        for _ in range(3):
            threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.05)
        print("bye")
        """,
    )
    assert proc.returncode == 0
    assert proc.stdout.strip() == "bye"
    # The running profile is collected at exit: at most aprof's one warning.
    assert proc.stderr.count("AprofWarning") <= 1
    assert "Traceback" not in proc.stderr


EXIT_SCENARIOS = {
    # asyncio.run under a global profile patches asyncio's Runner and adds
    # trio's import hook to sys.meta_path: both are undone at exit.
    "global": """
        import asyncio, aprof
        prof = aprof.profile(scope="global").start()
        async def main():
            with aprof.record_function("x"):
                await asyncio.sleep(0)
        asyncio.run(main())
    """,
    "global-tracer": """
        import asyncio, aprof
        prof = aprof.profile(scope="global", python_tracer=True).start()
        def f():
            return 1
        async def main():
            f()
            await asyncio.sleep(0)
        asyncio.run(main())
    """,
    "context-tracer-threads": """
        import threading, time, aprof
        prof = aprof.profile(python_tracer=True).start()
        def spin():
            while True:
                with aprof.record_function("daemon"):
                    time.sleep(0.001)
        for _ in range(2):
            threading.Thread(target=aprof.wrap(spin), daemon=True).start()
        time.sleep(0.05)
    """,
    "tracer-no-c-calls": """
        import aprof
        prof = aprof.profile(python_tracer=True, c_calls=False).start()
        def f():
            return 1
        f()
    """,
}

EXIT_WARNING = (
    "AprofWarning: aprof: the interpreter exited while a profile was running (stop() was never called); "
    "it was stopped and its events discarded"
)


@pytest.mark.parametrize("pure", [False, True], ids=["c", "pure"])
@pytest.mark.parametrize("scenario", sorted(EXIT_SCENARIOS))
def test_exit_with_a_profile_running_prints_one_warning_only(tmp_path: Path, scenario: str, pure: bool) -> None:
    # SPEC 12, LC-02 (issue 15 item 20): a profile (and its tracer) still
    # running at interpreter exit is stopped before modules are torn down:
    # stderr holds the documented warning and nothing else, with the C
    # extension and with the pure-Python twins.
    env = dict(os.environ, APROF_PURE_PYTHON="1" if pure else "0")
    proc = run_script(tmp_path, textwrap.dedent(EXIT_SCENARIOS[scenario]) + 'print("bye")\n', env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "bye\n"
    lines = proc.stderr.splitlines()
    # The warning, and the line of aprof that issued it.
    assert len(lines) == 2, proc.stderr
    assert re.fullmatch(r".*_profiler\.py:\d+: " + re.escape(EXIT_WARNING), lines[0]), proc.stderr
    assert lines[1].startswith("  "), proc.stderr
