"""Chrome trace export (SPEC 9.1) and safe output files (SPEC 12).

Every exported trace goes through ``tracecheck.validate_trace``; the tests
then check that the trace shows what the events say: a process per node, a
named track per logical thread, complete events for nested ranges, async
slices for ranges that ended elsewhere, flow arrows for spawns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import io
import os
import re
import stat
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof

from .sessionfiles import v1_document
from .tracecheck import load_trace, validate_trace

USER = aprof.RecordScope.USER_SCOPE
TASK = aprof.RecordScope.TASK
# Timestamps are written in microseconds with 3 decimals.
TS_SLACK_US = 0.0015

RUNNERS = [pytest.param(asyncio.run, id="asyncio")]
with contextlib.suppress(ImportError):
    import uvloop

    RUNNERS.append(pytest.param(uvloop.run, id="uvloop"))


def of_phase(doc: dict[str, Any], *phases: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] in phases]


def thread_names(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in of_phase(doc, "M") if e["name"] == "thread_name"}


def process_names(doc: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in of_phase(doc, "M") if e["name"] == "process_name"}


def one(events: list[aprof.FunctionEvent], name: str) -> aprof.FunctionEvent:
    found = [e for e in events if e.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {found}"
    return found[0]


def simple_profile(n: int = 3) -> aprof.profile:
    with aprof.profile() as prof:
        for i in range(n):
            with aprof.record_function(f"r{i}"):
                pass
    return prof


# ---------------------------------------------------------------------------
# 9.1: what the trace shows
# ---------------------------------------------------------------------------


def test_trace_shows_events_on_every_backend(backend, tmp_path: Path) -> None:
    # SPEC 9.1, 6.2, 6.3, 7.2: JSON and gzip; X for nested ranges, b/e for an
    # async range, exception and args, instants, flow arrows; validates.
    async def child(i: int, r: aprof.record_function | None) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0)
        if r is not None:
            r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("outer", args="batch=32"):
                with aprof.record_function("inner"):
                    await backend.sleep(0.001)
                with contextlib.suppress(ValueError), aprof.record_function("fails"):
                    raise ValueError("boom")
                handed = aprof.record_function("handed-over").start()
                async with backend.group() as g:
                    g.start_soon(child, 0, handed)
                    g.start_soon(child, 1, None)
                aprof.mark("here")
        return prof

    prof = backend.run(main)
    prof.export_chrome_trace(tmp_path / "t.json")
    prof.export_chrome_trace(str(tmp_path / "t.json.gz"))
    doc = validate_trace(tmp_path / "t.json")
    gz = tmp_path / "t.json.gz"
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    assert validate_trace(gz) == doc  # same trace, compressed

    events = prof.events()
    base = prof.session.metadata["start_ns"]
    names = thread_names(doc)
    [pid] = process_names(doc)
    for ev in of_phase(doc, "X", "b", "e", "i", "s", "f"):
        assert ev["pid"] == pid
        assert (pid, ev["tid"]) in names, f"track without a name: {ev}"

    def ts_of(ns: int) -> float:
        return (ns - base) / 1000.0

    complete = defaultdict(list)
    for ev in of_phase(doc, "X"):
        complete[ev["name"]].append(ev)
    for e in events:
        if e.is_instant or e.is_async:
            continue
        [x] = [
            x for x in complete[e.name] if x["tid"] == e.thread_id and abs(x["ts"] - ts_of(e.start_ns)) < TS_SLACK_US
        ]
        assert abs(x["dur"] - e.duration_ns / 1000.0) < TS_SLACK_US
    # Nested ranges nest in the trace too.
    outer, inner = complete["outer"][0], complete["inner"][0]
    assert outer["tid"] == inner["tid"]
    assert outer["ts"] <= inner["ts"]
    assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + TS_SLACK_US
    # Exception and args.
    assert complete["fails"][0]["args"]["exception"] == "ValueError"
    assert complete["outer"][0]["args"]["args"] == "batch=32"
    assert "exception" not in complete["outer"][0].get("args", {})
    # The range ended in another task: a b/e pair on the starting track.
    handed = one(events, "handed-over")
    assert handed.is_async
    [b] = [e for e in of_phase(doc, "b") if e["name"] == "handed-over"]
    [e_] = [e for e in of_phase(doc, "e") if e["name"] == "handed-over"]
    assert b["id2"] == e_["id2"]
    assert b["tid"] == e_["tid"] == handed.thread_id
    assert abs(b["ts"] - ts_of(handed.start_ns)) < TS_SLACK_US
    assert abs(e_["ts"] - ts_of(handed.end_ns)) < TS_SLACK_US
    assert b["args"]["end_thread_id"] == handed.end_thread_id != handed.thread_id
    assert "handed-over" not in complete
    # The instant.
    [i] = [e for e in of_phase(doc, "i") if e["name"] == "here"]
    assert i["tid"] == one(events, "here").thread_id
    # SPEC 7.2: one flow arrow per spawned task, from the spawner to the task.
    tasks = [e for e in events if e.scope is TASK]
    assert len(tasks) == 2
    starts = {f["id"]: f for f in of_phase(doc, "s")}
    finishes = {f["id"]: f for f in of_phase(doc, "f")}
    assert starts.keys() == finishes.keys()
    arrows = {(starts[k]["tid"], finishes[k]["tid"]) for k in starts}
    assert arrows == {(t.forward_thread_id, t.thread_id) for t in tasks}


def test_async_slices_are_paired_by_id(backend, tmp_path: Path) -> None:
    # SPEC 9.1, 6.3: several ranges started in one task and ended in others
    # are b/e pairs with distinct ids, each pair on the starting track.
    async def ender(r: aprof.record_function, delay: float) -> None:
        await backend.sleep(delay)
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ranges = [aprof.record_function(f"handed-{i}").start() for i in range(3)]
            async with backend.group() as g:
                for i, r in enumerate(ranges):
                    g.start_soon(ender, r, 0.001 * (3 - i))  # they end in reverse order
        return prof

    prof = backend.run(main)
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    handed = [e for e in prof.events() if e.name.startswith("handed-")]
    assert len(handed) == 3
    assert all(e.is_async for e in handed)
    begins = {e["name"]: e for e in of_phase(doc, "b")}
    ends = {e["name"]: e for e in of_phase(doc, "e")}
    assert begins.keys() == ends.keys() == {e.name for e in handed}
    assert len({str(b["id2"]) for b in begins.values()}) == 3
    for ev in handed:
        b, e = begins[ev.name], ends[ev.name]
        assert b["id2"] == e["id2"]
        assert b["cat"] == e["cat"]
        assert b["tid"] == e["tid"] == ev.thread_id
        assert b["ts"] <= e["ts"]


def test_one_process_per_node(tmp_path: Path) -> None:
    # SPEC 9.1, 3.5: node_id tags the events and names the process.
    with aprof.profile(node_id=3) as prof:
        with aprof.record_function("on-node-3"):
            pass
        t = threading.Thread(target=aprof.wrap(lambda: aprof.mark("from-thread")))
        t.start()
        t.join()
    assert {e.node_id for e in prof.events()} == {3}
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    procs = process_names(doc)
    assert len(procs) == 1
    [(pid, name)] = procs.items()
    assert re.search(r"\b3\b", name), name
    assert {e["pid"] for e in doc["traceEvents"]} == {pid}
    assert len({tid for p, tid in thread_names(doc)}) == 2  # two tracks in the one process


def test_two_nodes_are_two_processes(tmp_path: Path) -> None:
    # SPEC 9.1, 11.4: a session holding two nodes' events (as a merge makes)
    # exports one process per node, each with its own tracks.
    import json

    with aprof.profile(node_id=3) as prof:
        with aprof.record_function("main-range"):
            pass
        t = threading.Thread(target=aprof.wrap(lambda: aprof.mark("other")), name="other-node")
        t.start()
        t.join()
    # Move the thread's track to node 4, through the (version 1) session file's own field list.
    doc = v1_document(prof)
    _move_to_node(doc, {t["id"] for t in doc["tracks"] if t["name"] == "other-node"}, 4)
    (tmp_path / "merged.aprof").write_bytes(gzip.compress(json.dumps(doc).encode()))
    merged = aprof.load(tmp_path / "merged.aprof")
    assert sorted({e.node_id for e in merged.events()}) == [3, 4]

    merged.export_chrome_trace(tmp_path / "t.json")
    trace = validate_trace(tmp_path / "t.json")
    procs = process_names(trace)
    assert len(procs) == 2
    pid_of = {int(re.findall(r"\d+", name)[-1]): pid for pid, name in procs.items()}
    assert sorted(pid_of) == [3, 4]
    [main_x] = [e for e in of_phase(trace, "X") if e["name"] == "main-range"]
    [other_i] = [e for e in of_phase(trace, "i") if e["name"] == "other"]
    assert main_x["pid"] == pid_of[3]
    assert other_i["pid"] == pid_of[4]
    assert thread_names(trace)[(pid_of[4], other_i["tid"])] == "other-node"


@pytest.mark.parametrize("run", RUNNERS)
def test_tracks_are_named_after_tasks_and_threads(run: Any, tmp_path: Path) -> None:
    # SPEC 9.1, 1 (track): thread_name metadata names each track after its
    # task (explicit asyncio names here) or its OS thread.
    def in_thread() -> None:
        with aprof.record_function("thread-work"):
            pass

    async def fetch(i: int) -> None:
        with aprof.record_function(f"fetching-{i}"):
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with asyncio.TaskGroup() as tg:
                for i in range(2):
                    tg.create_task(fetch(i), name=f"fetch-{i}")
            t = threading.Thread(target=aprof.wrap(in_thread), name="io-thread")
            t.start()
            t.join()
            with aprof.record_function("main-work"):
                pass
        return prof

    prof = run(main())
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    names = thread_names(doc)

    def track_label(range_name: str) -> str:
        [x] = [e for e in of_phase(doc, "X") if e["name"] == range_name]
        return names[(x["pid"], x["tid"])]

    assert "fetch-0" in track_label("fetching-0")
    assert "fetch-1" in track_label("fetching-1")
    assert "fetch-1" not in track_label("fetching-0")
    assert track_label("thread-work") == "io-thread"
    main_track = one(prof.events(), "main-work").track
    assert main_track in track_label("main-work")
    # Every track of the session is named, on a tid of its own.
    tracks = prof.session.tracks()
    assert len({t.id for t in tracks}) == len(tracks)
    for track in tracks:
        [pid] = process_names(doc)
        assert track.name in names[(pid, track.id)]


def test_gzip_export_round_trips_text_exactly(tmp_path: Path) -> None:
    # SPEC 9.1, BI-04: awkward names come back unchanged from both formats.
    weird = ["", "tab\tnew\nline", 'quote " backslash \\', "nul \x00", "emoji 🚀 α", "x" * 10_000]
    with aprof.profile() as prof:
        for name in weird:
            with aprof.record_function(name):
                pass
    for fname in ("t.json", "t.json.gz"):
        prof.export_chrome_trace(tmp_path / fname)
        doc = validate_trace(tmp_path / fname)
        assert sorted(e["name"] for e in of_phase(doc, "X")) == sorted(weird)


# ---------------------------------------------------------------------------
# FA-07: a full disk
# ---------------------------------------------------------------------------


class _FullDiskFile(io.FileIO):
    """A file on a disk that fills up after ``budget`` bytes: the OS-level
    write that crosses the limit writes what fits, then fails with ENOSPC."""

    budget = 512
    written = 0

    def write(self, data: Any) -> int:
        room = self.budget - self.written
        if len(data) > room:
            self.written += super().write(bytes(data)[:room]) or 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = super().write(data) or 0
        self.written += n
        return n


class _InterruptedFile(io.FileIO):
    """A file whose first OS-level write is interrupted by Ctrl-C."""

    interrupted = False

    def write(self, data: Any) -> int:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().write(data) or 0


def _patch_fdopen(monkeypatch: pytest.MonkeyPatch, file_class: type[io.FileIO]) -> list[io.FileIO]:
    """Make os.fdopen(fd, "wb") a real buffered file over ``file_class``.

    aprof writes through a temporary file from mkstemp, opened with os.fdopen;
    the fake fails below a real BufferedWriter, where the OS would.
    """
    opened: list[io.FileIO] = []

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> io.BufferedWriter:
        assert mode == "wb", mode
        raw = file_class(fd, "wb")
        opened.append(raw)
        return io.BufferedWriter(raw, buffer_size=256)

    monkeypatch.setattr(os, "fdopen", fdopen)
    return opened


EXPORTS = [
    pytest.param("trace.json", "export_chrome_trace", id="json"),
    pytest.param("trace.json.gz", "export_chrome_trace", id="json.gz"),
    pytest.param("run.aprof", "save", id="save"),
]


def _check_written(path: Path, n_events: int) -> None:
    if path.name.endswith(".aprof"):
        assert len(aprof.load(path).events()) == n_events
    else:
        doc = validate_trace(path)
        assert len(of_phase(doc, "X")) == n_events


@pytest.mark.parametrize(("fname", "method"), EXPORTS)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_full_disk_leaves_no_half_file_and_a_retry_works(
    fname: str, method: str, existing: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SPEC 12, FA-07: OSError naming the path; the target is as it was, no
    # temporary file is left, the data is still in memory, a retry succeeds.
    prof = simple_profile(200)
    target = tmp_path / fname
    if existing:
        target.write_bytes(b"the previous file")
    before = sorted(os.listdir(tmp_path))
    opened = _patch_fdopen(monkeypatch, _FullDiskFile)
    with pytest.raises(OSError, match=re.escape(str(target))) as info:
        getattr(prof, method)(target)
    assert info.value.errno == errno.ENOSPC
    assert len(opened) == 1, "the write path was not the one patched"
    assert opened[0].written > 0  # a temporary file was half written...
    monkeypatch.undo()

    assert sorted(os.listdir(tmp_path)) == before  # ...and removed; the target is untouched
    if existing:
        assert target.read_bytes() == b"the previous file"
    assert len(prof.events()) == 200
    getattr(prof, method)(target)
    assert sorted(os.listdir(tmp_path)) == sorted({*before, fname})
    _check_written(target, 200)


@pytest.mark.parametrize(("fname", "method"), EXPORTS)
def test_interrupted_write_leaves_no_temporary_file(
    fname: str, method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SPEC 12, FA-07: a KeyboardInterrupt mid-write propagates as itself and
    # leaves the directory as it was.
    prof = simple_profile(50)
    opened = _patch_fdopen(monkeypatch, _InterruptedFile)
    with pytest.raises(KeyboardInterrupt):
        getattr(prof, method)(tmp_path / fname)
    assert len(opened) == 1
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    getattr(prof, method)(tmp_path / fname)
    _check_written(tmp_path / fname, 50)


@pytest.mark.parametrize(("fname", "method"), EXPORTS)
def test_written_files_get_the_mode_open_would_give(fname: str, method: str, tmp_path: Path) -> None:
    # SPEC 9.1, 12: the temporary file behind the atomic write does not leak
    # its private 0o600 mode: a new file follows the umask, an overwritten
    # file keeps its mode, as with open(path, "w").
    prof = simple_profile(3)
    old_umask = os.umask(0o027)
    try:
        getattr(prof, method)(tmp_path / fname)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / fname).stat().st_mode) == 0o640
    for mode in (0o664, 0o600):
        (tmp_path / fname).chmod(mode)
        getattr(prof, method)(tmp_path / fname)
        assert stat.S_IMODE((tmp_path / fname).stat().st_mode) == mode
    _check_written(tmp_path / fname, 3)


# ---------------------------------------------------------------------------
# BI-06: unusable output paths
# ---------------------------------------------------------------------------


def _missing_dir(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    p = tmp / "no-such-dir" / f"out{suffix}"
    return p, FileNotFoundError, str(p)


def _a_directory(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    p = tmp / f"dir{suffix}"
    p.mkdir()
    return p, IsADirectoryError, str(p)


def _read_only(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    p = tmp / f"ro{suffix}"
    p.write_bytes(b"keep me")
    p.chmod(0o444)  # tests run as root: aprof must look at the mode bits
    return p, PermissionError, str(p)


def _string_io(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    return io.StringIO(), TypeError, "StringIO"


def _unknown_extension(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    p = tmp / "out.txt"
    return p, ValueError, str(p)


def _no_extension(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    p = str(tmp / "out")
    return p, ValueError, p


def _other_format(tmp: Path, suffix: str) -> tuple[object, type[Exception], str]:
    # A session name for a trace, a trace name for a session.
    p = tmp / ("out.aprof" if suffix != ".aprof" else "out.json")
    return p, ValueError, str(p)


BAD_PATHS: dict[str, Callable[[Path, str], tuple[object, type[Exception], str]]] = {
    "missing-directory": _missing_dir,
    "a-directory": _a_directory,
    "read-only-file": _read_only,
    "string-io": _string_io,
    "unknown-extension": _unknown_extension,
    "no-extension": _no_extension,
    "other-format": _other_format,
}


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("export_chrome_trace", ".json"), ("export_chrome_trace", ".json.gz"), ("save", ".aprof")],
)
@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_unusable_output_path_is_refused_and_nothing_written(
    case: str, method: str, suffix: str, tmp_path: Path
) -> None:
    # SPEC 12, BI-06: a clear error naming the path, nothing written, nothing lost.
    prof = simple_profile(3)
    path, error, named = BAD_PATHS[case](tmp_path, suffix)
    before = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*")}
    with pytest.raises(error, match=re.escape(named)):
        getattr(prof, method)(path)
    after = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*")}
    assert after == before
    if isinstance(path, io.StringIO):
        assert path.getvalue() == ""
    # Nothing lost: the same profile still writes to a good path.
    good = tmp_path / f"good{suffix}"
    getattr(prof, method)(good)
    _check_written(good, 3)


# ---------------------------------------------------------------------------
# LD-01, scaled down: many tasks, one range each
# ---------------------------------------------------------------------------


def test_ten_thousand_tasks_export_and_validate(tmp_path: Path) -> None:
    # SPEC 6.1, 9.1, LD-01 (10k instead of 100k; no timing asserted).
    n = 10_000

    async def work(i: int) -> None:
        with aprof.record_function("work"):
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with asyncio.TaskGroup() as tg:
                for i in range(n):
                    tg.create_task(work(i), name=f"w{i}")
        return prof

    prof = asyncio.run(main())
    events = prof.events()
    tasks = [e for e in events if e.scope is TASK]
    ranges = [e for e in events if e.scope is USER]
    assert len(tasks) == n
    assert len(ranges) == n
    assert len({e.thread_id for e in tasks}) == n
    task_of = {t.thread_id: t for t in tasks}
    assert all(r.parent is task_of[r.thread_id] for r in ranges)  # each range on its own task's track
    assert {t.name for t in tasks} == {f"w{i}" for i in range(n)}

    prof.export_chrome_trace(tmp_path / "big.json.gz")
    doc = validate_trace(tmp_path / "big.json.gz")
    work_x = [e for e in of_phase(doc, "X") if e["name"] == "work"]
    assert len(work_x) == n
    assert len({e["tid"] for e in work_x}) == n
    names = thread_names(doc)
    assert all(task_of[x["tid"]].name in names[(x["pid"], x["tid"])] for x in work_x)  # each track named for its task
    assert len(of_phase(doc, "s")) == n  # one spawn arrow per task
    assert load_trace(tmp_path / "big.json.gz") == doc


# ---------------------------------------------------------------------------
# Perfetto's importer rules (tracecheck.py lists them)
# ---------------------------------------------------------------------------


def test_every_row_has_a_32bit_tid_and_its_own_name(backend, tmp_path: Path) -> None:
    # SPEC 9.1, 7.3 (issue 16 item 5): Perfetto reads a tid above 32 bits as
    # 0, so every task's "running" row landed on the process's main thread
    # and took its name. Each row needs a 32-bit tid and keeps its name.
    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    names = thread_names(doc)
    rows = {key for key in names}
    assert all(0 <= tid < 2**32 for _, tid in rows)
    tasks = {t.id: t for t in prof.session.tracks() if t.steps}
    assert len(tasks) == 3
    running = [e for e in of_phase(doc, "X") if e["cat"] == "step"]
    running_rows = {(e["pid"], e["tid"]) for e in running}
    assert len(running_rows) == 3  # one row per task, not one shared row
    base = doc["otherData"]["running_tid_base"]
    for pid, tid in running_rows:
        task = tasks[tid - base]
        assert names[(pid, tid)] == names[(pid, task.id)] + " running"
        assert names[(pid, task.id)].startswith(task.name)  # the task's row kept its name


def test_every_arrow_starts_on_a_slice_at_the_spawn_point(backend, tmp_path: Path) -> None:
    # SPEC 7.2, 7.4, 9.1 (issue 16 item 5): Perfetto binds a flow start to the
    # slice on top of the spawner's stack, and drops it when there is none.
    # Spawns outside any range, and right after an inner range ended, left
    # arrows with no slice or starting on a slice that was over.
    def blocking() -> None:
        with aprof.record_function("in-thread"):
            pass

    async def child() -> None:
        await backend.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(child)  # no range open in the spawner
                with aprof.record_function("outer"):
                    with aprof.record_function("inner"):
                        await backend.sleep(0)
                    g.start_soon(child)  # inner is over: the stack's top is stale
            await backend.to_thread(blocking)
        return prof

    prof = backend.run(main)
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")  # replays Perfetto's binding for every s and f
    starts = of_phase(doc, "s")
    links = [e for e in of_phase(doc, "X") if e["cat"] == "spawn"]
    linked = [e for e in prof.events() if e.forward_thread_id and e.sequence_nr > 0]
    assert len(starts) == len(links) == len(linked) >= 2
    for s in starts:
        [link] = [x for x in links if (x["pid"], x["tid"], x["ts"]) == (s["pid"], s["tid"], s["ts"])]
        assert link["dur"] == 0
        assert link["name"].startswith(("spawn ", "submit "))
    # The drawing aid is not a range: reading the trace back gives the same events.
    from aprof._post._readers import read_profile

    back = read_profile(tmp_path / "t.json")
    assert sorted(e.name for e in back.events()) == sorted(e.name for e in prof.events())


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 2**40, "ts": 0, "dur": 1}], "tid Perfetto reads as 0"),
        ([{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2**40, "args": {"name": "a"}}], "tid Perfetto reads as 0"),
        (
            [
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "a"}},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "b"}},
            ],
            "named twice",
        ),
        (
            [{"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 0, "dur": 1}, {"ph": "X", "name": "b", "pid": 3, "tid": 2, "ts": 5, "dur": 1}],
            "in two processes",
        ),
        (
            [{"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 0, "dur": 2}, {"ph": "X", "name": "b", "pid": 1, "tid": 2, "ts": 1, "dur": 2}],
            "overlaps",
        ),
        (
            [
                {"ph": "s", "name": "spawn", "cat": "task", "id": 1, "pid": 1, "tid": 2, "ts": 1},
                {"ph": "X", "name": "t", "cat": "task", "pid": 1, "tid": 3, "ts": 1, "dur": 5},
                {"ph": "f", "bp": "e", "name": "spawn", "cat": "task", "id": 1, "pid": 1, "tid": 3, "ts": 1},
            ],
            "with no slice there",
        ),
        (
            [
                {"ph": "X", "name": "outer", "pid": 1, "tid": 2, "ts": 0, "dur": 10},
                {"ph": "X", "name": "inner", "pid": 1, "tid": 2, "ts": 1, "dur": 2},
                {"ph": "s", "name": "spawn", "cat": "task", "id": 1, "pid": 1, "tid": 2, "ts": 5},
                {"ph": "X", "name": "t", "cat": "task", "pid": 1, "tid": 3, "ts": 5, "dur": 5},
                {"ph": "f", "bp": "e", "name": "spawn", "cat": "task", "id": 1, "pid": 1, "tid": 3, "ts": 5},
            ],
            "does not contain it",
        ),
        (
            [
                {"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 0, "dur": 10},
                {"ph": "s", "name": "spawn", "cat": "task", "id": 1, "pid": 1, "tid": 2, "ts": 5},
            ],
            "1 starts, 0 ends",
        ),
        ([{"ph": "X", "name": "a", "pid": 1, "tid": 2, "dur": 1}], "without ts"),
        (
            [
                {"ph": "b", "name": "a", "cat": "c", "id2": {"local": "0x1"}, "pid": 1, "tid": 2, "ts": 0},
                {"ph": "e", "name": "other", "cat": "c", "id2": {"local": "0x1"}, "pid": 1, "tid": 2, "ts": 1},
            ],
            "async end before begin",
        ),
    ],
)
def test_tracecheck_refuses_what_perfetto_would_lose(tmp_path: Path, events: list[dict[str, Any]], message: str) -> None:
    # The validator every export test relies on must catch each rule it lists.
    import json

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(AssertionError, match=re.escape(message)):
        validate_trace(path)


def test_task_tracks_say_what_the_summary_calls_them(backend, tmp_path: Path) -> None:
    # SPEC 9.1 (issue 16 item 4): the summary groups tasks as "task <coro>";
    # a task's track says it too when the task's own name does not, and
    # reading the trace back gives the task's own name.
    from aprof._post._readers import read_profile

    async def child() -> None:
        with aprof.record_function("child work"):
            await backend.checkpoint()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(child)
        return prof

    prof = backend.run(main)
    prof.export_chrome_trace(tmp_path / "t.json")
    doc = validate_trace(tmp_path / "t.json")
    names = thread_names(doc)
    [task] = [e for e in prof.events() if e.scope is TASK]
    key = f"task {child.__qualname__}"
    assert key in {r.key for r in prof.key_averages()}
    label = names[(next(iter(process_names(doc))), task.thread_id)]
    assert label.startswith(task.track)
    assert key in label or child.__qualname__ in task.track  # trio names tasks after the function already
    back = read_profile(tmp_path / "t.json")
    assert {t.name for t in back.tracks()} == {t.name for t in prof.session.tracks()}


# -- Issue 17 item 3: traces too large for the viewer ------------------------------


def _many_short_and_a_few_long(backend: Any) -> aprof.profile:
    async def child(i: int) -> None:
        with aprof.record_function("long-in-task"):
            await backend.sleep(0.002)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            for _ in range(300):
                with aprof.record_function("short"):
                    pass
                aprof.mark("tick")
            for _ in range(5):
                with aprof.record_function("long"):
                    time.sleep(0.002)
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(child, i)
        return prof

    return backend.run(main)


def test_a_capped_trace_keeps_the_longest_events_and_says_what_it_dropped(backend: Any, tmp_path: Path) -> None:
    # SPEC 9.1 (issue 17 item 3): max_events cuts a trace a viewer cannot
    # load whole to its longest events: tasks always, then the longest
    # ranges; instants and the shortest ranges go. otherData says so, and
    # the trace (arrows included) is still valid.
    prof = _many_short_and_a_few_long(backend)
    events = prof.events()
    assert len(events) > 600
    prof.export_chrome_trace(tmp_path / "capped.json", max_events=20)
    trace = validate_trace(tmp_path / "capped.json")
    capped = trace["otherData"]["capped"]
    kept = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i", "b") and e.get("cat") not in ("spawn", "step")]
    assert capped["events"] == len(events)
    assert capped["kept"] == len(kept) <= 20
    assert capped["dropped"] == len(events) - len(kept)
    names = [e["name"] for e in kept]
    assert names.count("long") == 5
    assert names.count("long-in-task") == 3
    assert "tick" not in names
    assert sum(1 for e in kept if e.get("cat") == "task") == 3  # every task is kept
    assert len(kept) == 20  # the budget is filled with the longest of the short ranges
    # The short ranges kept are no shorter, to a power of two, than any
    # dropped (ranked by power of two, then first come within the last).
    base = trace["otherData"]["start_ns"]
    kept_ts = {round(e["ts"], 3) for e in kept if e["name"] == "short"}
    shorts = [e for e in events if e.name == "short"]
    kept_bits = [e.duration_ns.bit_length() for e in shorts if round((e.start_ns - base) / 1000.0, 3) in kept_ts]
    dropped_bits = [e.duration_ns.bit_length() for e in shorts if round((e.start_ns - base) / 1000.0, 3) not in kept_ts]
    assert kept_bits
    assert dropped_bits
    assert min(kept_bits) >= max(dropped_bits)
    assert capped["shortest_kept_ns"] == min(e.duration_ns for e in events if e.name == "short" and round((e.start_ns - base) / 1000.0, 3) in kept_ts)
    # A cap above the event count writes everything, with no "capped".
    prof.export_chrome_trace(tmp_path / "whole.json", max_events=10**6)
    assert "capped" not in load_trace(tmp_path / "whole.json")["otherData"]


def test_a_large_trace_is_written_whole_with_a_warning_naming_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 9.1, 12: past what Perfetto's UI loads comfortably, the trace is
    # still written whole, and an AprofWarning says how to cap it.
    from aprof._export import _chrome

    monkeypatch.setattr(_chrome, "LARGE_TRACE", 50)
    with aprof.profile() as prof:
        for _ in range(60):
            with aprof.record_function("r"):
                pass
    with pytest.warns(aprof.AprofWarning, match=r"60 events.*max_events=N.*--max-events N"):
        prof.export_chrome_trace(tmp_path / "big.json")
    assert sum(1 for e in load_trace(tmp_path / "big.json")["traceEvents"] if e["ph"] == "X") == 60
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof.export_chrome_trace(tmp_path / "cut.json", max_events=10)  # asked for: no warning


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True])
def test_max_events_must_be_a_positive_int(bad: Any, tmp_path: Path) -> None:
    # SPEC 12: a clear error naming the argument; nothing is written.
    with aprof.profile() as prof:
        with aprof.record_function("r"):
            pass
    with pytest.raises(ValueError, match="max_events"):
        prof.export_chrome_trace(tmp_path / "t.json", max_events=bad)
    assert not (tmp_path / "t.json").exists()


def test_convert_caps_a_chrome_trace_and_refuses_the_option_for_other_formats(tmp_path: Path) -> None:
    # SPEC 10.1: `aprof convert IN OUT.json --max-events N`.
    import subprocess
    import sys

    with aprof.profile() as prof:
        for _ in range(50):
            with aprof.record_function("r"):
                pass
    prof.save(tmp_path / "s.aprof")

    def convert(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "aprof", "convert", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)

    ok = convert("s.aprof", "t.json", "--max-events", "10")
    assert ok.returncode == 0, ok.stderr
    assert "capped to the longest 10" in ok.stderr
    assert load_trace(tmp_path / "t.json")["otherData"]["capped"]["kept"] <= 10
    refused = convert("s.aprof", "t.html", "--max-events", "10")
    assert refused.returncode == 2, refused.stderr
    assert "--max-events applies to Chrome traces" in refused.stderr
    assert not (tmp_path / "t.html").exists()


def _two_process_session(tmp_path: Path) -> aprof.Session:
    """A session of two processes (node 3, pid 1003; node 4, pid 1004), as a
    merge makes, each with a range on its own MainThread-like track."""
    import json

    with aprof.profile(node_id=3) as prof:
        with aprof.record_function("main-range"):
            time.sleep(0.002)  # folded stacks keep frames of 1 us or more

        def other() -> None:
            with aprof.record_function("other-range"):
                time.sleep(0.002)

        t = threading.Thread(target=aprof.wrap(other), name="MainThread")
        t.start()
        t.join()
    doc = v1_document(prof)
    _move_to_node(doc, {t["id"] for t in doc["tracks"]} - {e.thread_id for e in prof.events() if e.name == "main-range"}, 4)
    doc["metadata"]["pids"] = {"3": 1003, "4": 1004}
    (tmp_path / "merged.aprof").write_bytes(gzip.compress(json.dumps(doc).encode()))
    merged = aprof.load(tmp_path / "merged.aprof")
    assert {e.name: e.node_id for e in merged.events() if e.name.endswith("-range")} == {"main-range": 3, "other-range": 4}
    return merged


def test_every_export_of_a_merged_session_says_each_events_process(tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 6: in a session of several processes, every
    # exported event says its process: Chrome by pid, folded stacks and
    # speedscope by the track's name ("pid N · track", so two processes'
    # MainThreads stay apart, and read back as two processes),
    # OpenTelemetry spans by aprof.node_id and process.pid; the summary
    # groups by process.
    import json

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from aprof._post._readers import read_profile

    merged = _two_process_session(tmp_path)
    merged.export_chrome_trace(tmp_path / "t.json")
    trace = validate_trace(tmp_path / "t.json")
    pid_of_range = {e["name"]: e["pid"] for e in trace["traceEvents"] if e.get("name") in ("main-range", "other-range")}
    assert pid_of_range == {"main-range": 1003, "other-range": 1004}

    merged.export_folded(tmp_path / "t.folded")
    lines = (tmp_path / "t.folded").read_text(encoding="utf-8").splitlines()
    roots = sorted(line.split(";")[0] for line in lines if "-range" in line)
    assert roots == ["pid\u00a01003\u00a0\u00b7\u00a0MainThread", "pid\u00a01004\u00a0\u00b7\u00a0MainThread"]
    back = read_profile(tmp_path / "t.folded")
    assert sorted((e.name, e.node_id) for e in back.events() if e.name.endswith("-range")) == [("main-range", 1003), ("other-range", 1004)]
    assert sorted((t.name, t.node_id) for t in back.tracks()) == [("MainThread", 1003), ("MainThread", 1004)]

    merged.export_speedscope(tmp_path / "t.speedscope.json")
    doc = json.loads((tmp_path / "t.speedscope.json").read_text())
    names = sorted(p["name"] for p in doc["profiles"])
    assert [n.rsplit(" (", 1)[0] for n in names] == ["pid 1003 \u00b7 MainThread", "pid 1004 \u00b7 MainThread"]
    back = read_profile(tmp_path / "t.speedscope.json")
    assert sorted((e.name, e.node_id) for e in back.events() if e.name.endswith("-range")) == [("main-range", 1003), ("other-range", 1004)]
    assert sorted(t.name for t in back.tracks()) == ["MainThread", "MainThread"]

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        merged.export_opentelemetry(provider)
        spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    finally:
        provider.shutdown()
    assert (spans["main-range"]["aprof.node_id"], spans["main-range"]["process.pid"]) == (3, 1003)
    assert (spans["other-range"]["aprof.node_id"], spans["other-range"]["process.pid"]) == (4, 1004)

    table = merged.key_averages(group_by="node").table()
    assert "node 3 (pid 1003)" in table
    assert "node 4 (pid 1004)" in table
    # One process: the names stay bare, and a span still says its node.
    with aprof.profile() as one:
        with aprof.record_function("alone"):
            time.sleep(0.002)
    one.export_folded(tmp_path / "one.folded")
    assert (tmp_path / "one.folded").read_text(encoding="utf-8").startswith("MainThread;alone ")


def _move_to_node(doc: dict[str, Any], moved: set[int], node: int) -> None:
    """Move the tracks ``moved`` (one) of a version 1 session document,
    and their events, to process ``node``: a merged session made by hand,
    through the file's own field list."""
    assert len(moved) == 1
    fields = doc["fields"]
    for t in doc["tracks"]:
        if t["id"] in moved:
            t["node_id"] = node
    for row in doc["events"]:
        if row[fields.index("thread_id")] in moved:
            row[fields.index("node_id")] = node
