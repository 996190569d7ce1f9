"""The command line as a user runs it: a subprocess (SPEC 10.1)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aprof

from .conftest import sigint_as_from_a_terminal
from .tracecheck import validate_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run_aprof(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aprof", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_runs_under_aprof(example: Path, tmp_path: Path) -> None:
    # SPEC 10.1, STYLE "every example runs in the test suite".
    out = tmp_path / "trace.json"
    proc = run_aprof("run", "-o", str(out), str(example), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = validate_trace(out)
    assert any(e.get("ph") == "X" for e in doc["traceEvents"])
    assert f"wrote {out}" in proc.stderr


def test_run_fanout_shows_tasks_executors_and_arrows(tmp_path: Path) -> None:
    # SPEC 10.1, 7.1, 7.2, 7.4: the README's main job.
    out = tmp_path / "trace.json"
    proc = run_aprof("run", "-o", str(out), str(ROOT / "examples" / "fanout.py"), "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "handled 4 requests" in proc.stdout
    assert "task handle" in proc.stderr  # the summary table groups tasks by coroutine
    events = validate_trace(out)["traceEvents"]
    cats = {e.get("cat") for e in events if e.get("ph") == "X"}
    assert {"task", "user_scope", "executor"} <= cats
    assert sum(1 for e in events if e.get("ph") == "s") == sum(1 for e in events if e.get("ph") == "f") > 0
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("cache-") for n in names)


def test_exit_code_and_trace_survive_a_failing_program(tmp_path: Path) -> None:
    # SPEC 10.1: the program's exit code is aprof's; the trace is written anyway.
    script = tmp_path / "fails.py"
    script.write_text("import aprof, sys\nwith aprof.record_function('before'):\n    pass\nsys.exit(3)\n")
    out = tmp_path / "t.json"
    proc = run_aprof("run", "-o", str(out), str(script), cwd=tmp_path)
    assert proc.returncode == 3
    assert "before" in {e.get("name") for e in validate_trace(out)["traceEvents"]}

    script.write_text("import aprof\nwith aprof.record_function('doomed'):\n    raise ValueError('boom')\n")
    proc = run_aprof("run", "-o", str(out), str(script), cwd=tmp_path)
    assert proc.returncode == 1
    assert "ValueError: boom" in proc.stderr
    doomed = [e for e in validate_trace(out)["traceEvents"] if e.get("name") == "doomed"]
    assert doomed[0]["args"]["exception"] == "ValueError"


def test_script_arguments_and_module_mode(tmp_path: Path) -> None:
    # SPEC 10.1: `aprof run -m module args...`, and args reach the script.
    (tmp_path / "mymod.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    proc = run_aprof("run", "--no-summary", "-o", "m.json", "-m", "mymod", "a", "-o", "b", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['a', '-o', 'b']" in proc.stdout
    validate_trace(tmp_path / "m.json")


def test_session_output_and_report(tmp_path: Path) -> None:
    # SPEC 10.1, 6.5: `-o x.aprof` writes a session; `aprof report` prints its summary.
    script = tmp_path / "s.py"
    script.write_text("import aprof\nfor _ in range(3):\n    with aprof.record_function('step'):\n        pass\n")
    proc = run_aprof("run", "-o", "s.aprof", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [e.name for e in aprof.load(tmp_path / "s.aprof").events()] == ["step"] * 3
    report = run_aprof("report", "s.aprof", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    row = next(line for line in report.stdout.splitlines() if line.startswith("step"))
    assert row.split()[1] == "3"
    # A session file under another name is still recognised by its bytes.
    (tmp_path / "s.aprof").rename(tmp_path / "session.bin")
    renamed = run_aprof("report", "session.bin", cwd=tmp_path)
    assert renamed.returncode == 0, renamed.stderr
    assert renamed.stdout == report.stdout


@pytest.mark.parametrize("fmt", [".json", ".json.gz", ".html", ".aprof"])
def test_report_and_convert_read_every_trace_format(tmp_path: Path, fmt: str) -> None:
    # SPEC 10.1: `aprof report` prints the summary of a session or a trace;
    # `aprof convert IN OUT` rewrites it, and the summary survives the trip.
    out = f"trace{fmt}"
    proc = run_aprof("run", "--no-summary", "-o", out, str(ROOT / "examples" / "fanout.py"), "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = run_aprof("report", out, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "task handle" in first.stdout
    conv = run_aprof("convert", out, "again.html", cwd=tmp_path)
    assert conv.returncode == 0, conv.stderr
    assert "wrote again.html" in conv.stderr
    again = run_aprof("report", "again.html", cwd=tmp_path)
    assert again.stdout == first.stdout


def test_ctrl_c_still_writes_the_trace(tmp_path: Path) -> None:
    # SPEC 10.1, 15.6: interrupted with Ctrl-C, aprof writes the trace and
    # ends as python ends on an uncaught KeyboardInterrupt: killed by SIGINT
    # (the shell's 130).
    script = tmp_path / "forever.py"
    script.write_text(
        "import asyncio, aprof\n"
        "async def main():\n"
        "    with aprof.record_function('before'):\n"
        "        pass\n"
        "    print('ready', flush=True)\n"
        "    with aprof.record_function('waiting'):\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "t.json", str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGINT, stderr
    assert "interrupted" in stderr
    assert stderr.rstrip().endswith("KeyboardInterrupt")
    events = validate_trace(tmp_path / "t.json")["traceEvents"]
    waiting = next(e for e in events if e.get("name") == "waiting")
    assert waiting["args"]["exception"] in ("CancelledError", "KeyboardInterrupt")
    assert "before" in {e.get("name") for e in events}


def test_run_keep_latest_keeps_the_last_ranges_and_says_what_it_dropped(tmp_path: Path) -> None:
    # Issue 19 item 1: aprof run --max-events N --keep latest is a ring; the
    # summary names the drops, the trace counts them by kind.
    (tmp_path / "many.py").write_text(
        "import aprof\nfor i in range(5000):\n    with aprof.record_function(f'r{i}'):\n        pass\n"
    )
    out = tmp_path / "t.json"
    proc = run_aprof("run", "--max-events", "800", "--keep", "latest", "-o", str(out), "many.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = validate_trace(out)
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_scope"]
    dropped = doc["otherData"]["dropped_by_kind"]["ranges"]
    assert len(names) + dropped == 5000
    assert names[-1] == "r4999"
    assert f"Data dropped: {dropped:,} ranges" in proc.stdout + proc.stderr


def test_run_keep_latest_bounds_the_python_tracer_too(tmp_path: Path) -> None:
    # Issue 19 item 1: --python-tracer with --keep latest keeps the latest
    # calls (the tracer's ring) and says how many tracer events went.
    (tmp_path / "calls.py").write_text(
        "def early():\n    pass\ndef late():\n    pass\n"
        "for _ in range(3000):\n    early()\nfor _ in range(20):\n    late()\n"
    )
    out = tmp_path / "t.json"
    proc = run_aprof(
        "run", "--python-tracer", "--max-events", "1000", "--keep", "latest", "-o", str(out), "calls.py", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = validate_trace(out)
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert sum(n.endswith(": late") for n in names) == 20
    assert 0 < sum(n.endswith(": early") for n in names) < 3000
    dropped = doc["otherData"]["dropped_by_kind"]["tracer_events"]
    assert dropped > 0
    assert f"{dropped:,} tracer events" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "missing.py"], "cannot find script 'missing.py'"),
        (["run", "-o", "t.txt", "s.py"], "cannot tell the format of 't.txt'"),
        (["run", "-o", "nodir/t.json", "s.py"], "directory 'nodir' does not exist"),
        (["report", "nothere.aprof"], "no such file 'nothere.aprof'"),
        (["report", "garbage.aprof"], "is truncated or not JSON"),
        (["report", "garbage.json"], "'garbage.json' is not a session, a Chrome trace or an HTML report"),
        (["convert", "nothere.json", "out.html"], "no such file 'nothere.json'"),
        (["convert", "garbage.json", "out.html"], "'garbage.json' is not a session"),
        (["run", "--keep", "latest", "s.py"], "--keep latest needs a budget: add --max-events N or --max-bytes B"),
        (["run", "--max-bytes", "1000", "s.py"], "--max-bytes must be at least 65536"),
        (["run", "--no-c-calls", "s.py"], "--no-c-calls changes what the Python tracer records: add --python-tracer"),
        (["run", "--c-calls", "s.py"], "--c-calls changes what the Python tracer records: add --python-tracer"),
        (["run", "--python-tracer", "--c-calls", "--no-c-calls", "s.py"], "--c-calls and --no-c-calls contradict"),
    ],
)
def test_bad_input_is_one_line_naming_it(tmp_path: Path, args: list[str], message: str) -> None:
    # SPEC 10.1, 12: a one-line error that names the file, not a traceback.
    (tmp_path / "s.py").write_text("pass\n")
    (tmp_path / "garbage.aprof").write_text("{not json")
    (tmp_path / "garbage.json").write_text("{not json")
    proc = run_aprof(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_python_dash_m_aprof_matches_the_console_script(tmp_path: Path) -> None:
    # SPEC 10.1: `python -m aprof` is the same program.
    proc = run_aprof("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"aprof {aprof.__version__}"


def test_aiohttp_example_traces_only_the_profiled_request(tmp_path: Path) -> None:
    # SPEC 5.2, 11.1, examples: one request profiled inside a running aiohttp
    # server holds its own work and none of the nine concurrent requests'.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "aiohttp_request.py")], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    events = validate_trace(tmp_path / "request.trace.json")["traceEvents"]
    lookups = sorted(e["args"]["args"] for e in events if e.get("name") == "lookup")
    assert lookups == ["orders:traced", "profile:traced"]
    assert [e.get("name") for e in events if e.get("name") in ("handle", "checksum")].count("handle") == 1
    assert "checksum" in {e.get("name") for e in events}  # to_thread work stays in the request's profile


def test_sampling_monitor_example_samples_one_range_in_ten(tmp_path: Path) -> None:
    # SPEC 3.2, 3.3, 3.7, examples: a global callback with sampling_prob(0.1)
    # sees about a tenth of the 3,000 ranges, with no profile running.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sampling_monitor.py")], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: int(line.split()[1]) for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"db", "render", "request"}
    assert 150 <= sum(rows.values()) <= 450


RUNTIMES = ["asyncio", "uvloop", "trio", "anyio-asyncio", "anyio-trio"]

# One program for every runtime: a worker task that computes, a task that
# holds the loop with time.sleep. Started by `aprof run` before any loop or
# trio run exists, so the global profile must hook the one the program makes.
SPAWNS_AND_BLOCKS = """
import sys
import time

RUNTIME = sys.argv[1]


def crunch(n):
    return sum(i * i for i in range(n))


async def worker():
    await sleep(0.01)
    return crunch(2000)


async def hog():
    await sleep(0.01)
    time.sleep(0.2)


if RUNTIME in ("asyncio", "uvloop"):
    import asyncio

    sleep = asyncio.sleep

    async def main():
        await asyncio.gather(asyncio.create_task(worker(), name="worker"), asyncio.create_task(hog(), name="hog"))

    if RUNTIME == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
elif RUNTIME == "trio":
    import trio

    sleep = trio.sleep

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(worker, name="worker")
            n.start_soon(hog, name="hog")

    trio.run(main)
else:
    import anyio

    sleep = anyio.sleep

    async def main():
        async with anyio.create_task_group() as g:
            g.start_soon(worker, name="worker")
            g.start_soon(hog, name="hog")

    anyio.run(main, backend=RUNTIME.split("-")[1])
"""


def _trace_of_prog(tmp_path: Path, runtime: str, *options: str) -> dict[str, Any]:
    """Run SPAWNS_AND_BLOCKS on ``runtime`` under ``aprof run *options``; its valid Chrome trace."""
    script = tmp_path / "prog.py"
    script.write_text(SPAWNS_AND_BLOCKS)
    out = tmp_path / "t.json"
    proc = run_aprof("run", *options, "-o", str(out), str(script), runtime, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return validate_trace(out)


def _tracks_by_tid(events: list[dict]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_run_hooks_the_programs_own_loop_or_trio_run(tmp_path: Path, runtime: str) -> None:
    # SPEC 10.1, 7.1, 7.5: the global profile of `aprof run` starts before the
    # program's loop (or trio run) exists, and still gets each task on its
    # own track (and no track for the runtime's own machinery), and the
    # stretch in which `hog` held the loop, with hog's line on top of the stack.
    events = _trace_of_prog(tmp_path, runtime, "--loop-block-threshold", "0.05")["traceEvents"]
    tracks = _tracks_by_tid(events)
    tasks = sorted(tracks[e["pid"], e["tid"]] for e in events if e.get("ph") == "X" and e.get("cat") == "task")
    assert len(tasks) == 3, tasks  # main, worker, hog
    assert any("worker" in t for t in tasks)
    assert any("hog" in t for t in tasks)
    blocks = [e for e in events if e.get("ph") == "X" and e.get("cat") == "loop_block"]
    assert len(blocks) == 1, blocks
    assert blocks[0]["dur"] >= 100_000  # us: most of the 0.2 s sleep
    top = blocks[0]["args"]["stack"][0]
    assert "prog.py:" in top, top
    assert top.endswith(" hog"), top
    assert all((e["pid"], e["tid"]) in tracks for e in events if e.get("ph") != "M")  # no nameless track


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_run_python_tracer_puts_calls_on_the_calling_tasks_track(tmp_path: Path, runtime: str) -> None:
    # SPEC 10.1, 8.1: --python-tracer records the program's Python calls; the
    # worker's crunch() is on the worker task's track.
    events = _trace_of_prog(tmp_path, runtime, "--python-tracer", "--no-summary")["traceEvents"]
    tracks = _tracks_by_tid(events)
    crunch = [e for e in events if e.get("ph") == "X" and e["name"].endswith(": crunch")]
    assert len(crunch) == 1, crunch
    assert crunch[0]["cat"] == "python_function"
    assert "worker" in tracks[crunch[0]["pid"], crunch[0]["tid"]]


@pytest.mark.parametrize("flags", [(), ("--no-c-calls",)])
def test_run_python_tracer_records_the_python_frames_only_by_default(tmp_path: Path, flags: tuple[str, ...]) -> None:
    # SPEC 10.1, 8.1: Python frames only is the default (--no-c-calls, kept
    # as an alias, changes nothing): crunch() on the worker's track, no C call.
    events = _trace_of_prog(tmp_path, "asyncio", "--python-tracer", *flags, "--no-summary")["traceEvents"]
    tracks = _tracks_by_tid(events)
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    (crunch,) = [e for e in calls if e["name"].endswith(": crunch")]
    assert "worker" in tracks[crunch["pid"], crunch["tid"]]
    assert not [e["name"] for e in calls if e["name"].startswith("<built-in")]


def test_run_c_calls_records_the_c_functions_too(tmp_path: Path) -> None:
    # SPEC 10.1, 8.1: --c-calls opts in to the C calls Python code makes.
    events = _trace_of_prog(tmp_path, "asyncio", "--python-tracer", "--c-calls", "--no-summary")["traceEvents"]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    assert [e for e in calls if e["name"].endswith(": crunch")]
    assert [e["name"] for e in calls if e["name"].startswith("<built-in")]


def test_run_max_events_keeps_the_first_events_and_counts_the_rest(tmp_path: Path) -> None:
    # SPEC 10.1, 8.1, RELIABILITY LD-02: the cap is reported, the trace loads.
    doc = _trace_of_prog(tmp_path, "asyncio", "--python-tracer", "--max-events", "200")
    assert doc["otherData"]["dropped"] > 0
    assert sum(1 for e in doc["traceEvents"] if e.get("cat") == "python_function") <= 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loop-block-threshold", "0"], "expected a number of seconds > 0, got '0'"),
        (["--loop-block-threshold", "soon"], "expected a number of seconds > 0, got 'soon'"),
        (["--max-events", "-3", "--python-tracer"], "expected a whole number > 0, got '-3'"),
    ],
)
def test_bad_option_values_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    # SPEC 10.1, 12: argparse's usage line, then the option and what was wrong.
    (tmp_path / "s.py").write_text("pass\n")
    proc = run_aprof("run", *args, "s.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert args[0] in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------
# Issue 16 item 6: the command line gets out of the program's way
# ---------------------------------------------------------------------------

ARGV_SCRIPT = "import sys\nprint(repr(sys.argv[1:]))\n"


@pytest.mark.parametrize(
    "program",
    [
        ["-m", "json.tool", "--help"],
        ["-m", "mymod", "-q", "-x", "--help"],
        ["-mmymod", "-o", "x"],
        ["argv.py", "--", "-p"],
        ["argv.py", "--no-summary", "-o", "t.txt", "-m", "x"],
        ["argv.py", "-"],
    ],
    ids=["json.tool --help", "-m mod -q -x --help", "-mmod", "script -- -p", "script aprof-like options", "script -"],
)
def test_everything_after_the_program_is_the_programs(tmp_path: Path, program: list[str]) -> None:
    # SPEC 10.1, 15.6: the words after the script or `-m module` reach the
    # program exactly as `python` passes them, and it exits as under python.
    (tmp_path / "argv.py").write_text(ARGV_SCRIPT)
    (tmp_path / "mymod.py").write_text(ARGV_SCRIPT)
    plain = subprocess.run([sys.executable, *program], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    proc = run_aprof("run", "--no-summary", "-o", "t.json", *program, cwd=tmp_path)
    assert proc.stdout == plain.stdout
    assert proc.returncode == plain.returncode, proc.stderr
    assert "wrote t.json" in proc.stderr


def test_run_pytest_as_a_module(tmp_path: Path) -> None:
    # SPEC 10.1: `aprof run -m pytest -q -x` runs pytest with -q -x, and its
    # exit status is pytest's (1: a test failed).
    (tmp_path / "test_two.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert False\n\ndef test_never():\n    pass\n")
    proc = run_aprof("run", "--no-summary", "-o", "t.json", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "test_two.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "1 failed, 1 passed" in proc.stdout  # -x stopped before test_never
    assert "wrote t.json" in proc.stderr


@pytest.mark.parametrize("case", ["read-only file", "directory", "missing directory"])
def test_an_unwritable_output_is_refused_before_the_program_runs(tmp_path: Path, case: str) -> None:
    # SPEC 10.1, 12: refused in one line naming it, and the program never ran.
    (tmp_path / "side_effect.py").write_text("open('ran', 'w').close()\n")
    if case == "read-only file":
        target = tmp_path / "t.json"
        target.write_text("{}")
        target.chmod(0o444)
        expected = "the file is read-only"
    elif case == "directory":
        target = tmp_path / "out.json"
        target.mkdir()
        expected = "is a directory"
    else:
        target = tmp_path / "nodir" / "t.json"
        expected = "does not exist"
    proc = run_aprof("run", "-o", str(target), "side_effect.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()


SIGTERM_PROGRAM = """
import asyncio, sys, aprof

async def main():
    with aprof.record_function("before"):
        pass
    with aprof.record_function("serving"):
        print("ready", flush=True)
        await asyncio.sleep(60)

if "--own-handler" in sys.argv:
    import signal
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
asyncio.run(main())
"""


@pytest.mark.parametrize("own_handler", [False, True], ids=["default", "program's own handler"])
def test_sigterm_writes_the_trace_and_exits_as_the_program_would(tmp_path: Path, own_handler: bool) -> None:
    # SPEC 10.1, 15.6: SIGTERM (docker stop, systemd, Kubernetes) writes the
    # trace as Ctrl-C does; the exit status is the program's own: killed by
    # SIGTERM when it has no handler, its handler's exit code when it has one.
    script = tmp_path / "server.py"
    script.write_text(SIGTERM_PROGRAM)
    extra = ["--own-handler"] if own_handler else []

    def run(cmd: list[str]) -> tuple[int, str]:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        return proc.returncode, stderr

    plain_code, _ = run([sys.executable, str(script), *extra])
    code, stderr = run([sys.executable, "-m", "aprof", "run", "-o", "t.json", str(script), *extra])
    assert code == plain_code == (7 if own_handler else -signal.SIGTERM), stderr
    assert "wrote t.json" in stderr
    events = validate_trace(tmp_path / "t.json")["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"before", "serving"} <= names


def test_report_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # SPEC 10.1: `aprof report t.aprof | head` - the reader goes away; no
    # BrokenPipeError traceback.
    script = tmp_path / "s.py"
    script.write_text("import aprof\nfor i in range(200):\n    with aprof.record_function(f'r{i}'):\n        pass\n")
    assert run_aprof("run", "--no-summary", "-o", "s.aprof", str(script), cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "aprof", "report", "s.aprof", "--row-limit", "200"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # gone before aprof writes a line
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert stderr == b""


@pytest.mark.parametrize("command", ["run", "report", "convert"])
def test_every_option_is_documented_in_help(command: str, tmp_path: Path) -> None:
    # SPEC 10.1: `aprof <command> --help` explains every option.
    from aprof._cli._main import _parser

    sub = next(a for a in _parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]
    undocumented = [a.dest for a in parser._actions if not (a.help and a.help.strip())]
    assert undocumented == []
    text = run_aprof(command, "--help", cwd=tmp_path).stdout
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text


def test_loop_blocks_are_watched_by_default(tmp_path: Path) -> None:
    # Issue 16 item 2: `aprof run` records loop blocks without being asked
    # (50 ms); --no-loop-block turns it off; the summary names the culprit.
    script = tmp_path / "prog.py"
    script.write_text(SPAWNS_AND_BLOCKS)
    proc = run_aprof("run", "-o", "t.json", str(script), "asyncio", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    blocks = [e for e in validate_trace(tmp_path / "t.json")["traceEvents"] if e.get("cat") == "loop_block"]
    assert len(blocks) == 1
    assert "What blocked the loop: 1 step or callback longer than 50.000ms" in proc.stderr
    assert "task hog at prog.py:19 hog" in proc.stderr
    off = run_aprof("run", "--no-loop-block", "-o", "t.json", str(script), "asyncio", cwd=tmp_path)
    assert off.returncode == 0, off.stderr
    assert not [e for e in validate_trace(tmp_path / "t.json")["traceEvents"] if e.get("cat") == "loop_block"]
    assert "What blocked the loop" not in off.stderr


EXECUTOR_PROGRAM = """
import asyncio, contextvars, time
from concurrent.futures import ThreadPoolExecutor

request = contextvars.ContextVar("request", default="none")
seen = []

def resize(n):
    seen.append(request.get())
    time.sleep(0.02)
    return n

async def main():
    request.set("r1")
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, resize, i) for i in range(4)))
    print("contexts", seen)

asyncio.run(main())
"""


TO_THREAD_PROGRAM = """
import asyncio, contextvars, time

request = contextvars.ContextVar("request", default="none")

def resize(n):
    time.sleep(0.01)
    return request.get()

async def main():
    request.set("r1")
    print("seen", await asyncio.gather(*(asyncio.to_thread(resize, i) for i in range(3))))

asyncio.run(main())
"""


@pytest.mark.parametrize("runtime", ["asyncio", "uvloop"])
def test_to_thread_under_aprof_run_is_one_executor_range_per_call(tmp_path: Path, runtime: str) -> None:
    # SPEC 7.4, 15.6: asyncio.to_thread hands the pool a job aprof already
    # wraps (the to_thread wrapper); following bare executor work must not
    # wrap it again (it did: two EXECUTOR ranges per call). The job still
    # sees the caller's context, as asyncio.to_thread promises.
    program = TO_THREAD_PROGRAM if runtime == "asyncio" else TO_THREAD_PROGRAM.replace("asyncio.run(main())", "import uvloop\nuvloop.run(main())")
    (tmp_path / "tt.py").write_text(program)
    proc = run_aprof("run", "-o", "t.json", "tt.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "seen ['r1', 'r1', 'r1']" in proc.stdout
    events = validate_trace(tmp_path / "t.json")["traceEvents"]
    jobs = [e for e in events if e.get("cat") == "executor" and e.get("ph") == "X"]
    assert [e["name"] for e in jobs] == ["resize"] * 3


@pytest.mark.parametrize("runtime", ["asyncio", "uvloop"])
def test_bare_run_in_executor_is_followed_without_changing_its_context(tmp_path: Path, runtime: str) -> None:
    # Issue 16 item 7, SPEC 7.4, 15.6: under `aprof run`, bare
    # run_in_executor jobs are EXECUTOR ranges linked to the submitting
    # task, with their queueing; the worker still runs in its own context
    # (the program sees "none", as without aprof).
    program = EXECUTOR_PROGRAM if runtime == "asyncio" else EXECUTOR_PROGRAM.replace("asyncio.run(main())", "import uvloop\nuvloop.run(main())")
    (tmp_path / "ex.py").write_text(program)
    proc = run_aprof("run", "-o", "t.json", "ex.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "contexts ['none', 'none', 'none', 'none']" in proc.stdout
    events = validate_trace(tmp_path / "t.json")["traceEvents"]
    jobs = [e for e in events if e.get("cat") == "executor" and e.get("ph") == "X"]
    assert [e["name"] for e in jobs] == ["resize"] * 4
    assert sum(1 for e in events if e.get("ph") == "s") >= 4  # arrows from the task
    header = next(line for line in proc.stderr.splitlines() if line.startswith("Name"))
    assert "Queued" in header
    assert "resize: 4 jobs, queued mean" in proc.stderr  # one worker: they queued
    off = run_aprof("run", "--no-follow-executors", "-o", "t.json", "ex.py", cwd=tmp_path)
    assert not [e for e in validate_trace(tmp_path / "t.json")["traceEvents"] if e.get("cat") == "executor"]
    assert "contexts ['none', 'none', 'none', 'none']" in off.stdout
