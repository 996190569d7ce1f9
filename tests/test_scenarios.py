"""The first screen names the culprit (issue 16, Targets).

Each scenario program in ``examples/`` has one planted performance bug; the
default ``aprof run`` text output must name the culprit function and the
task it ran in, in the section that explains it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADINGS = (
    "Slowest tasks",
    "What blocked the loop",
    "Where the loop was held",
    "Longest waits",
    "Executor queueing",
    "Tasks pending at exit",
    "Repeated sequential awaits",
)


def sections(stderr: str) -> dict[str, str]:
    """The summary's sections by heading (the table before them is left out)."""
    out: dict[str, str] = {}
    current = None
    for line in stderr.splitlines():
        heading = next((h for h in HEADINGS if line.startswith(h)), None)
        if heading is not None:
            current = heading
            out[current] = line + "\n"
        elif current is not None and line.startswith(" "):
            out[current] += line + "\n"
        else:
            current = None
    return out


def run_default(example: str, tmp_path: Path) -> dict[str, str]:
    """``aprof run examples/<example>.py``, from the repository's root, with
    no option but where the trace goes; the sections it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "-o", str(tmp_path / "t.json"), f"examples/{example}.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return sections(proc.stderr)


def test_blocking_call_in_one_handler(tmp_path: Path) -> None:
    # The login handlers' verify_password holds the loop.
    s = run_default("blocking_handler", tmp_path)
    blocked = s["What blocked the loop"]
    assert re.search(r"handle tasks, e\.g\. 'GET /login #\d+', at examples/blocking_handler\.py:\d+ verify_password", blocked), blocked
    assert "verify_password" in s["Where the loop was held"]
    assert "handle (4 tasks)" in s["Where the loop was held"]
    # The other requests' waits are charged to the login requests.
    assert re.search(r"mostly by 'GET /login #\d+' \(handle\)", s["Longest waits"]), s["Longest waits"]


def test_slow_executor_job(tmp_path: Path) -> None:
    # render_report holds a pool worker; the request that waited on it, and
    # the resize jobs queueing behind it.
    s = run_default("slow_executor_job", tmp_path)
    assert "task 'request-3' (handle) waited on executor job render_report" in s["Longest waits"]
    assert re.search(r"resize: 12 jobs, queued mean", s["Executor queueing"]), s["Executor queueing"]
    assert "'request-3' (handle)" in s["Slowest tasks"]


def test_cpu_starved_heartbeat(tmp_path: Path) -> None:
    # compute_stats in the stats task holds the loop; the heartbeat's wait
    # is charged to it.
    s = run_default("starved_heartbeat", tmp_path)
    assert re.search(r"task 'stats' \(stats_loop\) at examples/starved_heartbeat\.py:\d+ compute_stats|stats_loop tasks, e\.g\. 'stats', at examples/starved_heartbeat\.py:\d+ compute_stats", s["What blocked the loop"]), s["What blocked the loop"]
    assert "compute_stats" in s["Where the loop was held"]
    assert re.search(
        r"task heartbeat waited on asyncio\.sleep at examples/starved_heartbeat\.py:\d+ heartbeat; the loop was blocked .* mostly by 'stats' \(stats_loop\)",
        s["Longest waits"],
    ), s["Longest waits"]


def test_fan_out_with_one_slow_child(tmp_path: Path) -> None:
    # shard-7 is the slow child; the search task waited on it.
    s = run_default("fanout_slow_child", tmp_path)
    shard_rows = [line for line in s["Slowest tasks"].splitlines() if "shard-" in line]
    assert "'shard-7' (fetch_shard)" in shard_rows[0], s["Slowest tasks"]
    assert "task search waited on task 'shard-7' (fetch_shard)" in s["Longest waits"]


def test_lock_held_across_a_slow_await(tmp_path: Path) -> None:
    # update_cache (the refresh task) holds the lock while it waits on
    # fetch_remote; the readers wait as long, on the lock (issue 16 item 3:
    # the await chain, recorded when a step starts after a long wait).
    s = run_default("lock_held_across_await", tmp_path)
    assert "'refresh' (update_cache)" in s["Slowest tasks"]
    waits = s["Longest waits"]
    assert re.search(r"task 'refresh' \(update_cache\) waited on asyncio\.sleep at examples/lock_held_across_await\.py:\d+ fetch_remote", waits), waits
    assert re.search(r"task 'reader-\d' \(read\) waited on asyncio\.Lock\.acquire at examples/lock_held_across_await\.py:\d+ read", waits), waits
    assert re.search(r"'reader-\d' \(read\), spawned at examples/lock_held_across_await\.py:\d+ main", s["Slowest tasks"])


def test_trio_task_blocking_the_run(tmp_path: Path) -> None:
    # parse_config in the load_config task holds the trio run.
    s = run_default("trio_blocking_task", tmp_path)
    assert re.search(r"task load_config at examples/trio_blocking_task\.py:\d+ parse_config", s["What blocked the loop"]), s["What blocked the loop"]
    assert "parse_config" in s["Where the loop was held"]
    assert "mostly by load_config" in s["Longest waits"]


def test_task_leak(tmp_path: Path) -> None:
    # Every publish leaves a _deliver task waiting; asyncio.run cancels them at exit.
    s = run_default("task_leak", tmp_path)
    pending = s["Tasks pending at exit"]
    count = int(pending.splitlines()[0].rsplit(" ", 1)[1].replace(",", ""))
    assert count >= 200, pending
    assert re.search(r"^\s+[\d,]+\s+EventBus\._deliver", pending, re.M), pending
    # Issue 16 item 7: the leak reads with its spawn site and what the tasks wait on.
    assert re.search(
        r"EventBus\._deliver, spawned at examples/task_leak\.py:\d+ EventBus\.publish, "
        r"waiting on asyncio\.Queue\.put at examples/task_leak\.py:\d+ EventBus\._deliver",
        pending,
    ), pending


@pytest.mark.parametrize("example", ["blocking_handler", "trio_blocking_task"])
def test_report_prints_the_same_sections(tmp_path: Path, example: str) -> None:
    # SPEC 10.1: `aprof report` of the written trace explains it the same way.
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "-o", str(out), str(ROOT / "examples" / f"{example}.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = subprocess.run([sys.executable, "-m", "aprof", "report", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert report.returncode == 0, report.stderr
    assert sections(report.stdout)["What blocked the loop"] == sections(proc.stderr)["What blocked the loop"]
