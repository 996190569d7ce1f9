"""profile_memory (SPEC 15.5, issue 21): allocations per task, request and range.

Scenarios run on every backend. Exact mode (``memory_interval=0``) is
checked to the byte where Python's own object headers allow; sampled mode
with a fixed seed and a tolerance its statistics cannot break (the bench,
bench/memory.py, reports the error over many seeds).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _memory, _native

from .conftest import Backend, require_c_extension, twin
from .test_html import attr, render, table_cells
from .test_html import chromium as chromium  # the fixture, for the report test
from .tracecheck import validate_trace

CHUNK = 64 * 1024
COUNT = 16  # 1 MB
SLACK = 4096  # the bytes objects' headers, the list's growth


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> Iterator[None]:
    require_c_extension()
    if _native.extension is None and request.node.name != "test_without_the_extension_a_clear_error":
        # APROF_PURE_PYTHON=1: the allocator hooks are C only (that test checks the error)
        pytest.skip("APROF_PURE_PYTHON=1: profile_memory needs the C extension")
    _memory.seed = 12345
    try:
        yield
    finally:
        _memory.seed = 0


def _one(prof: aprof.profile, name: str) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.name == name]


def _run_workers(backend: Backend, interval: int, keep: list[Any], free_too: bool = False) -> aprof.profile:
    async def worker(i: int) -> None:
        with aprof.record_function(f"alloc{i}"):
            for _ in range(COUNT):
                keep.append(bytes(CHUNK))
                await backend.checkpoint()  # across steps
            if free_too:
                del keep[-COUNT:]

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=interval) as prof:
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(worker, i)
        return prof

    prof: aprof.profile = backend.run(main)
    return prof


# SPEC 15.5
def test_exact_mode_charges_each_range_and_task(backend: Backend) -> None:
    keep: list[bytes] = []
    prof = _run_workers(backend, 0, keep)
    m = prof.session.memory
    assert m is not None
    assert m.exact
    by_thread = m.by_thread()
    for i in range(3):
        (ev,) = _one(prof, f"alloc{i}")
        st = ev.memory
        assert st is not None
        # every chunk, across every step of the task, in its range (and
        # the runtime's short-lived objects of each await, freed again)
        assert CHUNK * COUNT <= st.allocated <= CHUNK * COUNT * 1.05
        assert CHUNK * COUNT <= st.net <= CHUNK * COUNT + SLACK  # kept alive: a leak, as it reads
        assert st.peak >= CHUNK * COUNT
        assert st.count >= COUNT
        assert ev.cpu_memory_usage == st.net
        assert ev.self_cpu_memory_usage == ev.self_memory.net  # type: ignore[union-attr]
        # the task (its track) has at least what its range had
        task = by_thread[ev.thread_id]
        assert task.allocated >= st.allocated
        assert m.threads[ev.thread_id][1] in ("asyncio", "trio")


# SPEC 15.5
def test_exact_mode_net_zero_after_freeing(backend: Backend) -> None:
    keep: list[bytes] = []
    prof = _run_workers(backend, 0, keep, free_too=True)
    for i in range(3):
        (ev,) = _one(prof, f"alloc{i}")
        st = ev.memory
        assert st is not None
        assert st.allocated >= CHUNK * COUNT
        assert abs(st.net) <= 0.01 * st.allocated
        assert st.peak >= CHUNK  # alive while the range ran


# SPEC 15.5
def test_sampled_mode_is_unbiased_within_5_percent(backend: Backend) -> None:
    # 10 MB in 64 KB chunks at the default interval (16 KiB): each chunk is
    # sampled with p = 1 - exp(-4) and weighted 1/p; the relative standard
    # deviation of the sum is about 0.4%, so 5% holds for every seed.
    keep: list[bytes] = []

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True) as prof:

            async def task() -> None:
                with aprof.record_function("ten"):
                    for _ in range(160):
                        keep.append(bytes(CHUNK))
                        await backend.checkpoint()

            async with backend.group() as g:
                g.start_soon(task)
        return prof

    prof = backend.run(main)
    m = prof.session.memory
    assert m is not None
    assert m.interval == _memory.DEFAULT_INTERVAL
    (ev,) = _one(prof, "ten")
    assert ev.memory is not None
    assert abs(ev.memory.allocated - 160 * CHUNK) <= 0.05 * 160 * CHUNK
    # sampled: far fewer records than allocations
    assert len(m) < 2000


# SPEC 15.5
def test_innermost_range_gets_the_bytes_and_parents_include_them(backend: Backend) -> None:
    keep: list[bytes] = []

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            with aprof.record_function("outer"):
                keep.append(bytes(CHUNK))
                with aprof.record_function("inner"):
                    keep.append(bytes(2 * CHUNK))
                await backend.checkpoint()
        return prof

    prof = backend.run(main)
    (outer,) = _one(prof, "outer")
    (inner,) = _one(prof, "inner")
    assert inner.memory is not None
    assert outer.memory is not None
    assert outer.self_memory is not None
    assert 2 * CHUNK <= inner.memory.allocated <= 2 * CHUNK + SLACK
    assert CHUNK <= outer.self_memory.allocated <= CHUNK + SLACK
    assert outer.memory.allocated >= inner.memory.allocated + CHUNK
    assert outer.cpu_memory_usage >= 3 * CHUNK
    assert outer.self_cpu_memory_usage < 2 * CHUNK


# SPEC 15.5 (each allocation goes to the innermost range open on its track)
def test_the_c_charge_gives_the_twins_answer(backend: Backend) -> None:
    """The C walk that charges allocations to ranges at stop answers as the
    Python loop does, on a real session's table: nested and sibling ranges
    on several tasks, allocations at random times on every track, and at
    the exact start and end of ranges (ties)."""
    import random
    from array import array

    from aprof._post import _memory as post

    async def worker(i: int) -> None:
        for k in range(3):
            with aprof.record_function(f"w{i}.{k}"):
                with aprof.record_function("inner"):
                    await backend.checkpoint()
                with aprof.record_function("inner2"):
                    pass

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            with aprof.record_function("outer"):
                async with backend.group() as g:
                    for i in range(4):
                        g.start_soon(worker, i)
        return prof

    prof = backend.run(main)
    sess = prof.session
    tab = sess._table
    m = sess.memory
    assert m is not None
    assert len(m) > 0
    rng = random.Random(7)
    ids = [t.id for t in tab.tracks] + [999_999_999]  # and a track with no events
    edges = list(tab.start) + list(tab.end)
    lo, hi = min(edges) - 10, max(edges) + 10
    n = 4000
    m.thread_id = array("q", [rng.choice(ids) for _ in range(n)])
    m.time = array("q", [rng.choice(edges) if rng.random() < 0.4 else rng.randint(lo, hi) for _ in range(n)])
    c = post._charge(tab, m)
    assert c == post._charge_py(tab, m)
    charged = [r for r in c if r >= 0]
    assert len(set(charged)) > 10  # many ranges got allocations: the comparison is not all -1
    assert {tab.names[tab.name[r]] for r in charged} >= {"outer", "inner", "inner2"}


# SPEC 15.5 (context scope: unprofiled work is not charged, it is "other")
def test_context_scope_leaves_other_threads_out_as_other() -> None:
    keep: list[bytes] = []
    done = threading.Event()

    def outsider() -> None:
        keep.append(bytes(4 * CHUNK))  # not the profile's work
        done.set()

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            t = threading.Thread(target=outsider)
            t.start()
            while not done.is_set():
                await asyncio.sleep(0.001)
            t.join()
            with aprof.record_function("mine"):
                keep.append(bytes(CHUNK))
        return prof

    prof = asyncio.run(main())
    m = prof.session.memory
    assert m is not None
    assert m.other_bytes >= 4 * CHUNK
    assert all(st.allocated < 4 * CHUNK for st in m.by_thread().values())
    (mine,) = _one(prof, "mine")
    assert mine.memory is not None
    assert mine.memory.allocated >= CHUNK


# SPEC 15.5 (global scope: a thread's allocations go to the thread's track)
def test_global_scope_charges_threads() -> None:
    keep: list[bytes] = []

    def worker() -> None:
        with aprof.record_function("in thread"):
            keep.append(bytes(4 * CHUNK))
        keep.append(bytes(CHUNK))  # outside any range: still the thread's

    with aprof.profile(profile_memory=True, memory_interval=0, scope="global") as prof:
        t = threading.Thread(target=worker, name="mem-worker")
        t.start()
        t.join()
    m = prof.session.memory
    assert m is not None
    named = {m.threads[tid][0]: st for tid, st in m.by_thread().items()}
    assert named["mem-worker"].allocated >= 5 * CHUNK
    (ev,) = _one(prof, "in thread")
    assert ev.memory is not None
    assert 4 * CHUNK <= ev.memory.net <= 4 * CHUNK + SLACK


def test_stop_restores_the_allocator_and_a_users_tracemalloc() -> None:
    ext = require_c_extension()
    assert ext._memory_hooked() == (0, 0)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        with aprof.profile(profile_memory=True, memory_interval=0):
            assert ext._memory_hooked() == (1, 1)
            data = [bytes(CHUNK) for _ in range(4)]
        assert ext._memory_hooked() == (0, 0)
        assert tracemalloc.is_tracing()
        after = tracemalloc.take_snapshot()
        stats = after.compare_to(before, "filename")
        grown = sum(s.size_diff for s in stats if s.traceback[0].filename == __file__)
        assert grown >= 4 * CHUNK  # tracemalloc saw the allocations made under aprof
    finally:
        tracemalloc.stop()
    del data


def test_tracemalloc_started_during_a_profile() -> None:
    ext = require_c_extension()
    with aprof.profile(profile_memory=True):
        tracemalloc.start()
    try:
        # tracemalloc's hooks sit on top of aprof's: aprof's stay underneath,
        # passing through, and a new memory profile refuses to start
        assert ext._memory_hooked() == (1, 0)
        with pytest.raises(RuntimeError, match="tracemalloc"):
            aprof.profile(profile_memory=True).start()
        assert tracemalloc.take_snapshot() is not None
    finally:
        tracemalloc.stop()
    # tracemalloc put aprof's hooks back: the next profile reuses them
    with aprof.profile(profile_memory=True, memory_interval=0) as prof:
        keep = bytes(CHUNK)
    assert ext._memory_hooked() == (0, 0)
    assert prof.session.memory is not None
    assert prof.session.memory.total().allocated >= CHUNK
    del keep


def test_one_memory_profile_at_a_time() -> None:
    async def main() -> None:
        async with aprof.profile(profile_memory=True):

            async def other() -> None:
                with pytest.raises(RuntimeError, match="another profile is tracking memory"):
                    aprof.profile(profile_memory=True).start()

            await asyncio.create_task(other())

    asyncio.run(main())
    assert require_c_extension()._memory_hooked() == (0, 0)


def test_bad_options_are_named() -> None:
    for bad in (-1, 1.5, "16k", True, 1 << 41):
        with pytest.raises(ValueError, match="memory_interval"):
            aprof.profile(profile_memory=True, memory_interval=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="profile_memory"):
        aprof.profile(profile_memory="yes")  # type: ignore[arg-type]


def test_without_the_extension_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="profile_memory needs aprof's C extension"):
        twin(lambda: aprof.profile(profile_memory=True))
    twin(aprof.profile)  # without memory it builds


def test_no_memory_no_figures() -> None:
    with aprof.profile() as prof:
        with aprof.record_function("r"):
            pass
    assert prof.session.memory is None
    (ev,) = prof.events()
    assert ev.memory is None
    assert ev.cpu_memory_usage == 0
    assert "Net mem" not in prof.key_averages().table()


def _leaky_profile() -> aprof.profile:
    cache: list[bytes] = []

    async def handler(i: int) -> None:
        with aprof.record_function("handler"):
            cache.append(bytes(CHUNK))
            tmp = [bytes(1000) for _ in range(10)]
            del tmp
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            await asyncio.gather(*(handler(i) for i in range(5)))
        return prof

    return asyncio.run(main())


def test_key_averages_columns_sort_and_table() -> None:
    prof = _leaky_profile()
    avg = prof.key_averages()
    row = avg["handler"]
    assert row.allocated_bytes >= 5 * CHUNK
    assert row.cpu_memory_usage >= 5 * CHUNK
    assert row.self_cpu_memory_usage >= 5 * CHUNK
    assert row.peak_memory >= CHUNK
    assert row.allocation_count >= 5 * 11
    text = avg.table(sort_by="cpu_memory_usage")
    for col in ("Allocated", "Net mem", "Self net", "Peak mem", "# Allocs", "Memory (exact)"):
        assert col in text
    first = text.splitlines()[3]
    assert first.startswith(("handler", "task _leaky_profile.<locals>.handler"))
    for key in ("self_cpu_memory_usage", "allocated", "peak_memory", "allocations"):
        avg.table(sort_by=key)
    by_track = prof.key_averages(group_by="track")
    assert sum(r.allocated_bytes for r in by_track) >= 5 * CHUNK


def test_session_file_round_trip(tmp_path: Path) -> None:
    prof = _leaky_profile()
    path = tmp_path / "s.aprof"
    prof.save(path)
    back = aprof.load(path)
    m0, m1 = prof.session.memory, back.memory
    assert m0 is not None
    assert m1 is not None
    assert m1.to_json() == m0.to_json()
    a = {(e.name, e.start_ns): e.memory.to_dict() for e in prof.events() if e.memory is not None}  # type: ignore[union-attr]
    b = {(e.name, e.start_ns): e.memory.to_dict() for e in back.events() if e.memory is not None}  # type: ignore[union-attr]
    assert a == b
    # the JSON document too
    doc = prof.session._to_json()
    from aprof._post._session import session_from_document

    again = session_from_document(json.loads(json.dumps(doc)), "test")
    assert again.memory is not None
    assert again.memory.to_json() == m0.to_json()
    doc["memory"]["event"] = [10**6] * len(doc["memory"]["event"])
    with pytest.raises(ValueError, match="memory: an allocation is charged to event"):
        session_from_document(doc, "test")


def test_chrome_trace_has_a_memory_counter(tmp_path: Path) -> None:
    prof = _leaky_profile()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(path)
    doc = validate_trace(path)
    counters = [e for e in doc["traceEvents"] if e.get("ph") == "C"]
    assert counters
    assert all(e["name"] == "memory" for e in counters)
    assert max(e["args"]["live bytes"] for e in counters) >= 5 * CHUNK
    capped = tmp_path / "c.json"
    prof.export_chrome_trace(capped, max_events=2)
    assert any(e.get("ph") == "C" for e in json.loads(capped.read_text())["traceEvents"])


def test_cli_run_memory_and_report(tmp_path: Path) -> None:
    script = tmp_path / "leak.py"
    script.write_text(
        "import asyncio\nCACHE = []\n"
        "async def handle(i):\n    CACHE.append(bytes(65536))\n    await asyncio.sleep(0)\n"
        "async def main():\n    await asyncio.gather(*(handle(i) for i in range(10)))\n"
        "asyncio.run(main())\n"
    )
    out = tmp_path / "leak.aprof"
    r = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--memory", "--memory-interval", "0", "-o", str(out), str(script)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Net mem" in r.stderr
    assert "task handle" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "aprof", "report", str(out), "--sort", "cpu_memory_usage", "--row-limit", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[3].startswith("task handle")
    r = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--memory-interval", "0", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "add --memory" in r.stderr


def test_summary_names_what_kept_memory() -> None:
    summary = _leaky_profile().summary()
    kept = {(ml.kind, ml.name): ml for ml in summary.memory_kept}
    assert kept["range", "handler"].net >= 5 * CHUNK
    assert kept["range", "handler"].count == 5
    task = next(ml for ml in summary.memory_kept if ml.kind == "task" and ml.name.endswith("handler"))
    assert task.count == 5
    assert task.net >= 5 * CHUNK
    assert task.example.startswith("Task-")
    text = summary.render()
    assert "Memory kept at stop (allocated and not freed; exact)" in text
    assert "range 'handler' (5 ranges)" in text


def test_the_leak_example_names_the_handler_and_its_tasks(tmp_path: Path) -> None:
    # issue 21 item 4: aprof's default memory output finds the leak.
    example = Path(__file__).resolve().parent.parent / "examples" / "memory_leak.py"
    r = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--memory", "-o", str(tmp_path / "t.json"), str(example)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    section = r.stderr.split("Memory kept at stop", 1)[1].splitlines()
    assert "range 'handle_request' (200 ranges)" in section[2]
    assert "200 tasks of handle_request" in section[3]


def test_html_report_has_memory_columns_and_counter_track(chromium: str, tmp_path: Path) -> None:
    # issue 21 item 3: the HTML report's summary has the memory columns and
    # its timeline a memory counter track.
    prof = _leaky_profile()
    out = tmp_path / "r.html"
    prof.export_html(out)
    dom = render(chromium, out, tmp_path)
    assert attr(dom, "errors", "data-error") is None
    assert 'data-ready="1"' in dom
    assert int(attr(dom, "tl", "data-memory-drawn") or 0) >= 2
    head = re.findall(r"<th[^>]*>([^<]*)</th>", dom.split('id="summary-table"', 1)[1].split("</thead>", 1)[0])
    head = [h.rstrip(" \u25be\u25b4") for h in head]
    assert head[-5:] == ["Allocated", "Net mem", "Self net", "Peak mem", "# Allocs"]
    rows = {r[0]: r for r in table_cells(dom, "summary-table")}
    assert rows["handler"][-4].endswith("KB")  # net memory, as bytes


def test_max_events_caps_the_allocations_kept() -> None:
    # SPEC 12: a bounded profile stays bounded; what is not kept is counted.
    with aprof.profile(profile_memory=True, memory_interval=0, max_events=5) as prof:
        keep = [bytes(1000) for _ in range(50)]
    m = prof.session.memory
    assert m is not None
    assert len(m) == 5
    assert m.dropped >= 45
    assert prof.session.dropped_by_kind["allocations"] == m.dropped  # SPEC 15.2
    assert prof.session.dropped == 0  # no event was dropped
    del keep


# SPEC 15.2
def test_keep_latest_keeps_the_latest_allocations() -> None:
    # Issue 21: allocation records obey the budget's policy. A ring keeps
    # the newest records, and the blocks of the records it let go, freed
    # later, change none of the records kept.
    with aprof.profile(profile_memory=True, memory_interval=0, max_events=300, keep="latest") as prof:
        with aprof.record_function("old"):
            old = [bytes(1000) for _ in range(2000)]
        with aprof.record_function("new"):
            new = [bytes(5000) for _ in range(50)]
        del old  # frees 2,000 blocks whose records the ring let go
        with aprof.record_function("newest"):
            newest = [bytes(7000) for _ in range(20)]
            del newest[10:]
    m = prof.session.memory
    assert m is not None
    assert len(m) == 300
    assert m.dropped >= 1700
    assert prof.session.dropped_by_kind["allocations"] == m.dropped
    assert list(m.time) == sorted(m.time)  # oldest first
    (ev_new,) = _one(prof, "new")
    (ev_newest,) = _one(prof, "newest")
    st, st2 = ev_new.memory, ev_newest.memory
    assert st is not None
    assert st2 is not None
    assert 50 * 5000 <= st.net <= 50 * 5000 + SLACK  # nothing of "old" was charged to it
    assert st.count >= 50
    assert 10 * 7000 <= st2.net <= 10 * 7000 + SLACK
    assert st2.allocated >= 20 * 7000
    (ev_old,) = _one(prof, "old")
    assert ev_old.memory is not None
    assert ev_old.memory.count < 2000  # its first records went
    del new


# SPEC 15.2
def test_max_bytes_bounds_the_allocations_kept() -> None:
    # A profile bounded by bytes alone does not grow its allocation records
    # without bound either.
    with aprof.profile(profile_memory=True, memory_interval=0, max_bytes=1 << 16) as prof:
        keep = [bytes(100) for _ in range(5000)]
    m = prof.session.memory
    assert m is not None
    assert len(m) == (1 << 16) // _memory.RECORD_BYTES
    assert m.dropped >= 5000 - len(m)
    assert prof.session.dropped_by_kind["allocations"] == m.dropped
    del keep


def test_a_forked_child_stops_tracking() -> None:
    # RELIABILITY LC-01: a child forked during a memory profile records
    # nothing for its parent and runs on the allocator it had before.
    script = """
import os, aprof
from aprof import _ctracer as ext
with aprof.profile(profile_memory=True, memory_interval=0) as prof:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, repr(ext._memory_hooked()).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read()
    os.waitpid(pid, 0)
    keep = bytes(65536)
assert child == "(0, 0)", child
assert prof.session.memory.total().allocated >= 65536
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_the_hooks_do_not_keep_a_contexts_values_alive(backend: Backend) -> None:
    # SPEC 15.6: the hooks cache answers per context, but a value the
    # program set in a context it is done with is freed during the profile,
    # as without aprof (not kept until stop).
    import contextvars
    import gc
    import weakref

    var: contextvars.ContextVar[Any] = contextvars.ContextVar("test_memory_value")
    refs: list[weakref.ref[Any]] = []

    class Value:
        pass

    async def user(i: int) -> None:
        v = Value()
        refs.append(weakref.ref(v))
        var.set(v)
        del v
        keep = [bytes(100) for _ in range(20)]  # allocations in this context
        await backend.checkpoint()
        del keep

    async def main() -> int:
        async with aprof.profile(profile_memory=True, memory_interval=0):
            for _round in range(5):
                async with backend.group() as g:
                    for i in range(40):
                        g.start_soon(user, i)
                junk = [bytes(100) for _ in range(100)]  # other contexts' allocations move the cache on
                del junk
                await backend.sleep(0.001)
            gc.collect()
            await backend.checkpoint()
            return sum(r() is not None for r in refs)

    alive = backend.run(main)
    assert alive <= 2  # at most what the cache's current entries still name


# -- reading memory back from traces and reports, and merging it (issue 21) ----


def _figures(session: aprof.Session) -> dict[tuple[str, int], tuple[dict[str, int], int]]:
    """Each event's memory figures (with its children) and its own net bytes."""
    out = {}
    for e in session.events():
        if e.memory is not None:
            assert e.self_memory is not None
            out[e.name, e.start_ns] = (e.memory.to_dict(), e.self_memory.net)
    return out


def _per_thread(session: aprof.Session) -> dict[int, dict[str, int]]:
    m = session.memory
    assert m is not None
    return {tid: st.to_dict() for tid, st in m.by_thread().items()}


# SPEC 9.1, 10.1, 15.5
@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "r.html"])
def test_traces_and_reports_give_the_memory_back(backend: Backend, tmp_path: Path, name: str) -> None:
    # Issue 21: a Chrome trace or an HTML report read back (aprof report,
    # aprof.merge) has the memory figures of every range and task.
    from aprof._post._readers import read_profile

    keep: list[bytes] = []
    prof = _run_workers(backend, 0, keep, free_too=True)
    session = prof.session
    path = tmp_path / name
    if name.endswith(".html"):
        prof.export_html(path)
    else:
        prof.export_chrome_trace(path)
        doc = validate_trace(path)  # still what Perfetto loads
        # Perfetto shows each range's figures on its slice
        ranges = [e for e in doc["traceEvents"] if e.get("name", "").startswith("alloc") and e.get("ph") == "X"]
        assert len(ranges) == 3
        for e in ranges:
            (ev,) = _one(prof, e["name"])
            assert ev.memory is not None
            assert e["args"]["memory"] == {**ev.memory.to_dict(), "self_net": ev.self_memory.net}  # type: ignore[union-attr]
        # and each task's slice (the C writer's task rows leave these to the loop)
        allocated = {ev.memory.allocated for ev in prof.events() if ev.scope is aprof.RecordScope.TASK and ev.memory}
        assert len(allocated) >= 1
        task_slices = [e for e in doc["traceEvents"] if e.get("cat") == "task" and e.get("ph") == "X"]
        with_memory = [e for e in task_slices if "memory" in e.get("args", {})]
        assert len(with_memory) >= 3, task_slices
        assert {e["args"]["memory"]["allocated"] for e in with_memory} <= allocated
    back = read_profile(path)
    m0, m1 = session.memory, back.memory
    assert m0 is not None
    assert m1 is not None
    assert (m1.interval, m1.other_bytes, m1.other_count, m1.dropped) == (m0.interval, m0.other_bytes, m0.other_count, m0.dropped)
    assert len(_figures(session)) >= 6  # three ranges and their tasks
    assert _figures(back) == _figures(session)
    assert _per_thread(back) == _per_thread(session)
    assert m1.timeline() == m0.timeline()
    assert m1.threads == m0.threads
    for e in back.events():  # aprof's own args.memory is not an extra field
        assert "memory" not in (e.extra or {})
    # and the summary says the same
    a, b = session.key_averages(), back.key_averages()
    for i in range(3):
        assert b[f"alloc{i}"].allocated_bytes == a[f"alloc{i}"].allocated_bytes
        assert b[f"alloc{i}"].peak_memory == a[f"alloc{i}"].peak_memory


def test_a_capped_trace_charges_the_missing_ranges_bytes_to_their_parent(tmp_path: Path) -> None:
    # SPEC 9.1: a trace cut to its longest events keeps every byte: a range
    # it dropped leaves its allocations to the range around it.
    from aprof._post._readers import read_profile

    keep: list[bytes] = []

    async def main() -> aprof.profile:
        async with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            with aprof.record_function("outer"):
                await asyncio.sleep(0.01)
                with aprof.record_function("inner"):
                    keep.append(bytes(CHUNK))
        return prof

    prof = asyncio.run(main())
    path = tmp_path / "c.json"
    prof.export_chrome_trace(path, max_events=1)
    back = read_profile(path)
    names = {e.name for e in back.events()}
    assert "inner" not in names
    (outer,) = [e for e in back.events() if e.name == "outer"]
    (outer0,) = _one(prof, "outer")
    assert outer.memory is not None
    assert outer0.memory is not None
    assert outer.memory.to_dict() == outer0.memory.to_dict()
    assert outer.self_memory is not None
    assert outer.self_memory.net >= CHUNK  # inner's, now its own


def test_a_foreign_args_memory_stays_an_extra_field(tmp_path: Path) -> None:
    # SPEC 10.1: only aprof's own traces have their args.memory read as figures.
    from aprof._post._readers import read_profile

    path = tmp_path / "other.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "args": {"memory": 12}},
    ]}))  # fmt: skip
    back = read_profile(path)
    assert back.memory is None
    (ev,) = back.events()
    assert ev.extra == {"memory": 12}


def test_damaged_memory_records_name_the_part(tmp_path: Path) -> None:
    # SPEC 12: a damaged file is refused with a message naming what is wrong.
    from aprof._post._readers import read_profile

    prof = _leaky_profile()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(path)
    doc = json.loads(path.read_text())
    doc["otherData"]["aprof_memory"]["records"]["weight"] = ["x"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"t\.json.*aprof_memory: memory: weight is not a list of ints"):
        read_profile(path)


def test_cli_report_of_a_trace_has_the_memory_columns(tmp_path: Path) -> None:
    # SPEC 10.1: `aprof report trace.json` prints what `aprof report s.aprof` does.
    prof = _leaky_profile()
    for name in ("t.json", "r.html"):
        path = tmp_path / name
        if name.endswith(".html"):
            prof.export_html(path)
        else:
            prof.export_chrome_trace(path)
        r = subprocess.run(
            [sys.executable, "-m", "aprof", "report", str(path), "--sort", "cpu_memory_usage", "--row-limit", "2"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "Net mem" in r.stdout
        assert "Memory kept at stop (allocated and not freed; exact)" in r.stdout
        assert "range 'handler' (5 ranges)" in r.stdout


def _as_other_process(session: aprof.Session, pid: int) -> aprof.Session:
    """The same session as if another process (pid) had recorded it."""
    session.metadata = {**session.metadata, "pids": {"0": pid}}
    return session


# SPEC 15.4, 15.5
def test_merge_keeps_each_process_memory(backend: Backend, tmp_path: Path) -> None:
    # Issue 21: aprof.merge carries every input's allocations: each event
    # keeps its figures and each task its own, across processes.
    keep: list[bytes] = []
    a = _run_workers(backend, 0, keep).session
    b = _as_other_process(_run_workers(backend, 0, keep, free_too=True).session, 4242)
    with aprof.profile() as plain:  # an input without memory adds none
        with aprof.record_function("no memory"):
            pass
    merged = aprof.merge([a, b, _as_other_process(plain.session, 4343)])
    m = merged.memory
    assert m is not None
    ma, mb = a.memory, b.memory
    assert ma is not None
    assert mb is not None
    assert len(m) == len(ma) + len(mb)
    assert (m.other_bytes, m.dropped) == (ma.other_bytes + mb.other_bytes, ma.dropped + mb.dropped)
    # b's tracks got new ids (their ids are a's too): the figures follow them
    fig = _figures(merged)
    assert {k: v for k, v in fig.items() if k in _figures(a)} == _figures(a)
    assert {k: v for k, v in fig.items() if k in _figures(b)} == _figures(b)
    assert len(fig) == len(_figures(a)) + len(_figures(b)) + 1
    assert fig["no memory", _one(plain, "no memory")[0].start_ns][0]["allocated"] == 0
    by_node: dict[int, list[int]] = {}
    for e in merged.events():
        if e.name.startswith("alloc"):
            by_node.setdefault(e.node_id, []).append(e.memory.net)  # type: ignore[union-attr]
    assert len(by_node) == 2
    nets = sorted(by_node.values(), key=sum)
    assert all(abs(n) <= 0.01 * CHUNK * COUNT for n in nets[0])  # b freed everything
    assert all(n >= CHUNK * COUNT for n in nets[1])  # a kept everything
    per = {merged._tracks[tid].node_id: st for tid, st in m.by_thread().items() if tid in merged._tracks}
    assert set(per) == set(by_node)
    # each process has its own counter track in the Chrome trace, and the
    # merged trace and file give it all back
    path = tmp_path / "m.json"
    merged.export_chrome_trace(path)
    doc = validate_trace(path)
    assert {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "C"} == {int(p) for p in merged.metadata["pids"].values() if p in (4242, a.metadata["pids"]["0"])}
    from aprof._post._readers import read_profile

    assert _figures(read_profile(path)) == fig
    merged.save(tmp_path / "m.aprof")
    assert _figures(aprof.load(tmp_path / "m.aprof")) == fig


def test_merge_of_files_keeps_memory_of_threads_without_events(tmp_path: Path) -> None:
    # SPEC 15.4: a thread that allocated but recorded no range is counted
    # in its own process after a merge of saved files, and again after
    # merging the merge.
    keep: list[bytes] = []

    def profiled() -> aprof.Session:
        done, go = threading.Event(), threading.Event()

        def worker() -> None:
            keep.append(bytes(4 * CHUNK))
            done.set()
            go.wait(60)  # alive at stop: named after itself

        t = threading.Thread(target=worker, name="quiet-worker")
        with aprof.profile(profile_memory=True, memory_interval=0, scope="global") as prof:
            t.start()
            done.wait(60)
        go.set()
        t.join()
        return prof.session

    a, b = profiled(), _as_other_process(profiled(), 4242)
    quiet = [tid for tid, (name, _) in (a.memory.threads.items()) if name == "quiet-worker"]  # type: ignore[union-attr]
    assert quiet
    assert quiet[0] not in a._tracks  # no event of its own
    a.export_chrome_trace(tmp_path / "a.json")
    b.save(tmp_path / "b.aprof")
    merged = aprof.merge([tmp_path / "a.json", tmp_path / "b.aprof"])
    m = merged.memory
    assert m is not None
    quiet_m = {tid: st for tid, st in m.by_thread().items() if m.threads[tid][0] == "quiet-worker"}
    assert len(quiet_m) == 2  # one per process
    assert all(st.allocated >= 4 * CHUNK for st in quiet_m.values())
    nodes = {m.nodes.get(tid, merged.metadata.get("node_id", 0)) for tid in quiet_m}
    assert len(nodes) == 2
    merged.save(tmp_path / "m.aprof")
    again = aprof.merge([aprof.load(tmp_path / "m.aprof")])
    assert again.memory is not None
    assert again.memory.nodes == m.nodes


def test_a_flight_recorders_dump_charges_its_windows_allocations(backend: Backend, tmp_path: Path) -> None:
    # Issue 19 with issue 21: a flight recorder can track memory; a dump
    # holds the allocations of its window, charged to their ranges and
    # tasks, and tracking goes on.
    keep: list[bytes] = []

    async def worker(i: int) -> None:
        with aprof.record_function(f"alloc{i}"):
            for _ in range(COUNT):
                keep.append(bytes(CHUNK))
                await backend.checkpoint()

    async def main() -> tuple[Path, aprof.Session]:
        async with aprof.flight_recorder(profile_memory=True, memory_interval=0, signal=None) as rec:
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(worker, i)
            path = rec.dump(tmp_path / "d.aprof")
            keep.append(bytes(CHUNK))  # after the dump: in the recorder's own session only
        return path, rec.session

    path, whole = backend.run(main)
    s = aprof.load(path)
    m = s.memory
    assert m is not None
    assert m.exact
    for i in range(3):
        (ev,) = [e for e in s.events() if e.name == f"alloc{i}"]
        assert ev.memory is not None
        assert CHUNK * COUNT <= ev.memory.allocated <= CHUNK * COUNT * 1.05  # and each await's short-lived objects
        assert CHUNK * COUNT <= ev.memory.net <= CHUNK * COUNT + SLACK
    assert whole.memory is not None
    assert len(whole.memory.time) > len(m.time)  # tracked on after the dump


def test_a_dumps_window_leaves_out_older_allocations() -> None:
    keep: list[bytes] = []
    with aprof.flight_recorder(window=0.2, profile_memory=True, memory_interval=0, signal=None) as rec:
        with aprof.record_function("old"):
            keep.append(bytes(CHUNK))
        time.sleep(0.3)
        with aprof.record_function("new"):
            keep.append(bytes(CHUNK))
        snap = rec.snapshot()
    m = snap.memory
    assert m is not None
    since = snap.metadata["flight_recorder"]["since_ns"]
    assert len(m.time) > 0
    assert min(m.time) >= since
    (new,) = [e for e in snap.events() if e.name == "new"]
    assert new.memory is not None
    assert CHUNK <= new.memory.net <= CHUNK + SLACK
    assert not [e for e in snap.events() if e.name == "old"]


def test_a_dump_records_nothing_of_its_own_work(tmp_path: Path) -> None:
    # SPEC 15.6: a dump's own work (copying the ring, writing the file) is
    # not the program's: neither its allocations, nor its samples, nor its
    # ranges land in the ring, whichever thread dumps.
    # The program's threads: this one, and any an earlier test left running
    # (a trio thread cache's idle worker, which the global recorder may
    # sample as it times out). aprof's dump threads start after this.
    program = {threading.get_ident()} | {t.ident for t in threading.enumerate()}
    with aprof.flight_recorder(profile_memory=True, memory_interval=0, sample_interval=0.001, signal=None,
                               dump_dir=tmp_path, dump_format="json.gz") as rec:  # fmt: skip
        with aprof.record_function("work"):
            _ = [bytes(1024) for _ in range(10)]
        rec.dump(tmp_path / "by-the-program.json.gz")
        assert rec.trigger("test")
        deadline = time.monotonic() + 20
        while not rec.dumps or len(rec.dumps) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        snap = rec.snapshot(window=60.0)
    m = snap.memory
    assert m is not None
    tracks = {t.id: t for t in snap.tracks()}
    threads = {tracks[tid].os_thread_id if tid in tracks else None for tid in m.by_thread()}
    assert threads <= program
    # The dumps allocated megabytes; the program a few kilobytes.
    assert sum(st.allocated for st in m.by_thread().values()) < 1_000_000
    samples = snap.samples
    assert samples is not None
    assert {tracks[t].os_thread_id for t in set(samples.thread_id) if t in tracks} <= program


def test_aprofs_own_threads_allocate_nothing_the_program_is_charged_for(backend: Backend) -> None:
    # SPEC 15.6: a global memory profile with the loop-block watchdog (one
    # of aprof's own threads, beating every few milliseconds) charges only
    # the program's threads and tasks.
    async def main() -> aprof.profile:
        async with aprof.profile(scope="global", profile_memory=True, memory_interval=0, loop_block_threshold=0.005) as prof:
            for _ in range(20):
                await backend.sleep(0.005)
        return prof

    prof = backend.run(main)
    m = prof.session.memory
    assert m is not None
    charged = {m.threads[tid] for tid in m.by_thread()}
    assert {name for name, kind in charged if kind == "thread"} == {threading.main_thread().name}


def _noop() -> None:
    pass


def test_the_tracers_event_buffer_is_not_charged_to_the_traced_code() -> None:
    # SPEC 15.6: with the Python tracer and a memory profile on together, the
    # tracer's event buffer (megabytes, grown while the traced code runs) is
    # aprof's own memory, not an allocation of the code it traces.
    import itertools

    with aprof.profile(python_tracer=True, profile_memory=True, memory_interval=0, tasks=False) as prof:
        with aprof.record_function("calls"):
            for _ in itertools.repeat(None, 200_000):  # 400k events: 6.4 MB of buffer; no allocation of its own
                _noop()
    m = prof.session.memory
    assert m is not None
    (ev,) = [e for e in prof.events() if e.name == "calls"]
    assert prof.session.dropped == 0
    assert sum(1 for e in prof.events() if e.name.endswith("_noop")) == 200_000
    charged = ev.memory.allocated if ev.memory is not None else 0
    assert charged < 100_000, f"{charged:,} bytes charged to a range that allocates nothing"
    assert m.total().allocated < 1_000_000


def test_a_small_tracer_rings_segments_are_not_charged_to_the_traced_code() -> None:
    # SPEC 15.6: the same for a ring's segments, small enough to come from
    # Python's allocator (a ring of 40k events: segments of 80 KB).
    import itertools

    opts: dict[str, Any] = {"max_events": 40_000, "keep": "latest"}
    with aprof.profile(python_tracer=True, profile_memory=True, memory_interval=0, tasks=False, **opts) as prof:
        with aprof.record_function("calls"):
            for _ in itertools.repeat(None, 100_000):
                _noop()
    (ev,) = [e for e in prof.events() if e.name == "calls"]
    assert prof.session.dropped > 0  # the ring turned
    charged = ev.memory.allocated if ev.memory is not None else 0
    assert charged < 50_000, f"{charged:,} bytes charged to a range that allocates nothing"
