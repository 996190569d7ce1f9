"""A profile's memory budget: keep the first, or keep the latest (issue 19 item 1).

``profile(max_events=..., max_bytes=..., keep=...)`` bounds ranges, instants,
tasks (with their steps) and loop blocks while recording; what is not kept is
counted exactly, by kind, in the session, every export and the summary.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native
from aprof._core._ring import GENERATIONS, _PyBudget
from aprof._post._readers import read_profile

from .conftest import Backend, twin

C = _native.extension is not None


def _names(prof: Any) -> list[str]:
    return [e.name for e in prof.events() if e.scope == aprof.RecordScope.USER_SCOPE]


def _ranges(n: int, prefix: str = "r") -> None:
    for i in range(n):
        with aprof.record_function(f"{prefix}{i}"):
            pass


# -- Options -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_events": 0}, "'max_events' must be an int > 0"),
        ({"max_events": True}, "'max_events' must be an int > 0"),
        ({"max_bytes": 1.5e6}, "'max_bytes' must be an int > 0"),
        ({"max_bytes": 1000}, "at least 65536"),
        ({"keep": "oldest", "max_events": 10}, "'keep' must be 'first' or 'latest'"),
        ({"keep": "latest"}, "keep='latest' needs a budget"),
    ],
)
def test_bad_budget_options_name_the_option(kwargs: dict[str, Any], message: str) -> None:
    # SPEC 5.1: bad input gets a clear error naming what was wrong.
    with pytest.raises(ValueError, match=message):
        aprof.profile(**kwargs)


# -- Keep the first ----------------------------------------------------------------


def test_keep_first_keeps_the_first_and_counts_the_rest() -> None:
    # SPEC 5.1 (issue 19 item 1): past max_events nothing more is recorded;
    # the drops are counted exactly, by kind.
    with aprof.profile(max_events=100) as prof:
        _ranges(250)
        for _ in range(7):
            aprof.mark("m")
    assert _names(prof) == [f"r{i}" for i in range(100)]
    by_kind = prof.session.dropped_by_kind
    assert by_kind == {"ranges": 150, "instants": 7, "tasks": 0, "steps": 0, "tracer_events": 0, "allocations": 0}
    assert prof.session.dropped == 157


def test_keep_first_on_every_backend_counts_tasks(backend: Backend) -> None:
    # SPEC 15.2: Tasks spawned past the budget are not recorded, nor their ranges.
    async def child(i: int) -> None:
        with aprof.record_function(f"child{i}"):
            await backend.checkpoint()

    async def main() -> Any:
        async with aprof.profile(max_events=30) as prof:
            _ranges(10, "first")
            async with backend.group() as g:
                for i in range(40):
                    g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    events = prof.events()
    assert len(events) == 30
    assert [e.name for e in events if e.name.startswith("first")] == [f"first{i}" for i in range(10)]
    by_kind = prof.session.dropped_by_kind
    kept_tasks = sum(e.scope == aprof.RecordScope.TASK for e in events)
    assert by_kind["tasks"] == 40 - kept_tasks
    kept_children = sum(e.name.startswith("child") for e in events)
    # every task's one range is either kept or counted
    assert kept_children + by_kind["ranges"] == 40


def test_keep_first_by_bytes_stops_near_the_budget() -> None:
    # SPEC 15.2: max_bytes: the records' own memory; a range in a block is 48 bytes.
    with aprof.profile(max_bytes=1 << 20) as prof:
        for _ in range(100_000):
            with aprof.record_function("same"):
                pass
    kept = len(prof.events())
    dropped = prof.session.dropped_by_kind["ranges"]
    assert kept + dropped == 100_000
    assert dropped > 0
    if C:  # 48-byte slots: about 1 MiB / 48, less the slack it stops short by
        assert 18_000 <= kept <= (1 << 20) // 48


# -- Keep the latest (a ring) -----------------------------------------------------


def test_ring_keeps_the_latest_whole_events_and_counts_the_oldest() -> None:
    # SPEC 15.2
    with aprof.profile(max_events=800, keep="latest") as prof:
        _ranges(10_000)
    names = _names(prof)
    dropped = prof.session.dropped_by_kind["ranges"]
    assert len(names) + dropped == 10_000
    # The latest, in order, with no gap: whole generations go, oldest first.
    assert names == [f"r{i}" for i in range(dropped, 10_000)]
    assert 800 - 800 // GENERATIONS - 800 // GENERATIONS <= len(names) <= 800
    assert "Data dropped: " in str(prof.summary())
    assert f"{dropped:,} ranges" in str(prof.summary())


def test_ring_on_every_backend_keeps_tasks_steps_and_ranges_consistent(backend: Backend) -> None:
    # SPEC 15.2: Tasks, their steps and their ranges go with the generation they
    # started in; whatever is kept is whole and its counts add up.
    n = 300

    async def child(i: int) -> None:
        with aprof.record_function(f"child{i}"):
            await backend.checkpoint()
            await backend.checkpoint()

    async def main() -> Any:
        async with aprof.profile(max_events=200, keep="latest") as prof:
            for batch in range(n // 20):
                async with backend.group() as g:
                    for i in range(batch * 20, batch * 20 + 20):
                        g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    events = prof.events()
    tasks = [e for e in events if e.scope == aprof.RecordScope.TASK and e.name != "main"]
    by_kind = prof.session.dropped_by_kind
    children = [e for e in events if e.name.startswith("child")]
    assert len(children) + by_kind["ranges"] == n
    assert by_kind["tasks"] > 0
    assert by_kind["steps"] >= 2 * by_kind["tasks"]
    assert len(events) <= 200 + 20  # a generation may overrun by what its last take let in
    # The kept children are the latest ones (trio may run a batch's tasks
    # in any order: the latest by start, within the last batches).
    kept = sorted(int(e.name[5:]) for e in children)
    assert kept[-1] == n - 1
    assert kept[0] >= n - len(kept) - 20
    for t in tasks:  # a kept task has its running time (its steps)
        assert t.running_ns is not None
        assert t.running_ns >= 0


def test_a_long_running_task_let_go_keeps_no_steps(backend: Backend) -> None:
    # SPEC 15.2: A connection's task that lives as long as the server: when the ring
    # lets go of its generation, the task (counted dropped) stops keeping
    # its steps, so it does not grow without bound; its later ranges are
    # kept on its track like any others.
    from aprof._core._threads import current_logical_thread

    seen: list[Any] = []

    async def long_lived() -> None:
        for i in range(3_000):
            await backend.checkpoint()
            if i == 2_990:
                seen.append(current_logical_thread())
                with aprof.record_function("late"):
                    pass

    async def churn() -> None:
        for _ in range(300):
            _ranges(10)
            await backend.checkpoint()

    async def main() -> Any:
        async with aprof.profile(max_events=400, keep="latest") as prof:
            async with backend.group() as g:
                g.start_soon(long_lived)
                g.start_soon(churn)
            assert len(seen[0].steps) == 0  # let go: nothing kept while it ran on
        return prof

    prof = backend.run(main)
    assert prof.session.dropped_by_kind["tasks"] >= 2
    late = [e for e in prof.events() if e.name == "late"]
    assert len(late) == 1
    assert late[0].thread_id == seen[0].id


def test_a_range_open_across_generations_keeps_its_end() -> None:
    # SPEC 15.2: A range that starts in one generation and ends after several
    # rotations is kept whole while its generation is kept.
    with aprof.profile(max_events=1_000, keep="latest") as prof:
        with aprof.record_function("outer"):
            _ranges(400)
    outer = [e for e in prof.events() if e.name == "outer"]
    assert len(outer) == 1
    assert not outer[0].unfinished
    assert len([e for e in prof.events() if e.parent is outer[0]]) == 400


def test_a_range_whose_generation_was_let_go_is_counted_not_kept() -> None:
    # SPEC 15.2
    with aprof.profile(max_events=160, keep="latest") as prof:
        with aprof.record_function("outer"):
            _ranges(2_000)
    names = _names(prof)
    assert "outer" not in names
    assert len(names) + prof.session.dropped_by_kind["ranges"] == 2_001


def test_ring_bytes_stay_under_the_budget() -> None:
    # SPEC 15.2
    budget = 1 << 20
    with aprof.profile(max_bytes=budget, keep="latest") as prof:
        ring = prof._state.ring
        highest = 0
        for i in range(200_000):
            with aprof.record_function("r"):
                pass
            if i % 5_000 == 0:
                highest = max(highest, ring.held_bytes())
    assert highest <= budget * 1.05
    kept = len(prof.events())
    assert kept + prof.session.dropped_by_kind["ranges"] == 200_000
    if C:
        # At most 48 bytes a range held in the ring (the blocks of sealed
        # generations are trimmed), plus the list and block headers.
        assert ring.held_bytes() / kept < 52


def test_dropped_counts_reach_every_export_and_survive_a_round_trip(tmp_path: Path) -> None:
    # SPEC 15.2
    with aprof.profile(max_events=50, keep="latest") as prof:
        _ranges(500)
    by_kind = prof.session.dropped_by_kind
    assert by_kind["ranges"] > 0
    prof.export_chrome_trace(tmp_path / "t.json")
    other = json.loads((tmp_path / "t.json").read_text())["otherData"]
    assert other["dropped_by_kind"] == by_kind
    assert other["dropped"] == by_kind["ranges"]
    prof.save(tmp_path / "s.aprof")
    assert aprof.load(tmp_path / "s.aprof").dropped_by_kind == by_kind
    assert read_profile(tmp_path / "t.json").dropped_by_kind == by_kind


def test_an_old_session_reports_its_drops_as_tracer_events() -> None:
    # SPEC 15.2
    from aprof._post._events import EventTable

    s = aprof.Session(EventTable(), {}, {"start_ns": 0, "stop_ns": 1, "dropped": 5})
    assert s.dropped_by_kind == {"ranges": 0, "instants": 0, "tasks": 0, "steps": 0, "tracer_events": 5, "allocations": 0}


def test_an_unbounded_profile_drops_nothing() -> None:
    # SPEC 15.2
    with aprof.profile() as prof:
        _ranges(10)
    assert prof.session.dropped == 0
    assert set(prof.session.dropped_by_kind.values()) == {0}
    assert "Data dropped" not in str(prof.summary())


def test_a_failing_rotation_stops_recording_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.2: aprof's own failure never reaches the program: recording stops, the
    # events kept so far stay, and it says so once.
    from aprof._core import _ring

    def boom(self: Any) -> None:
        raise OSError("no room")

    monkeypatch.setattr(_ring.Ring, "_rotate", boom)
    with pytest.warns(aprof.AprofWarning, match="memory budget failed"):
        with aprof.profile(max_events=80, keep="latest") as prof:
            _ranges(500)
    assert len(_names(prof)) == 10  # the first generation's share
    assert prof.session.dropped_by_kind["ranges"] == 490


# -- The pieces --------------------------------------------------------------------


def test_budget_twins_agree() -> None:
    # SPEC 15.2: The C Budget and its pure-Python twin: same takes, same drops.
    def run(make: Any) -> tuple[list[bool], Any, int]:
        calls = []

        def on_full() -> None:
            calls.append(b.count)
            if len(calls) == 2:
                b.full = True
            else:
                b.count = 0

        b = make(on_full, 3)
        got = [b.take(i % 4) for i in range(12)]
        return got, b.dropped, len(calls)

    py = run(_PyBudget)
    assert py == ([True] * 6 + [False] * 6, (1, 1, 2, 2), 2)
    if C:
        assert run(_native.extension.Budget) == py


@pytest.mark.skipif(not C, reason="the C consolidation is the extension's")
def test_chunked_raw_lists_consolidate_as_one_list_on_both_paths() -> None:
    # SPEC 15.2: A bounded profile's chunks of one thread: each end names its start in
    # its own chunk; both consolidation paths pair them the same way.
    from aprof._core._threads import LogicalThread
    from aprof._post._events import consolidate

    ext = _native.extension
    block = ext.RangeBlock("user_scope")
    i = block.open("b0", None, 5)
    block.close(i, 6, 1, None)
    chunk1 = [("a", "user_scope", 1, None), block, (0, 9, 1, None)]
    chunk2 = [("c", "user_scope", 10, None), ("d", "user_scope", 11, None), (1, 12, 1, "KeyError"), (0, 20, 1, None)]
    lt = LogicalThread("thread", "t")
    lt.id = 1

    # The same ranges with the block spelled out as tuples (the pure-Python
    # paths never make blocks).
    tuples1 = [("a", "user_scope", 1, None), ("b0", "user_scope", 5, None), (1, 6, 1, None), (0, 9, 1, None)]

    def run(first: list[Any]) -> list[tuple[Any, ...]]:
        tab, _ = consolidate({lt: (first, chunk2)}, 30, 0)
        exc = {i: r[0] for i, r in tab.rare.items()}
        return [
            (tab.names[tab.name[i]], tab.start[i], tab.end[i], exc.get(i), tab.parent[i]) for i in range(len(tab))
        ]

    want = [("a", 1, 9, None, -1), ("b0", 5, 6, None, 0), ("c", 10, 20, None, -1), ("d", 11, 12, "KeyError", 2)]
    assert run(chunk1) == want
    assert run(tuples1) == want
    assert twin(run, tuples1) == want


@pytest.mark.skipif(not C, reason="raw_seal measures the extension's blocks")
def test_sealing_trims_blocks_to_48_bytes_a_range() -> None:
    # SPEC 15.2
    ext = _native.extension
    block = ext.RangeBlock("user_scope")
    for k in range(1_000):
        block.open("n", None, k)
    assert block.__sizeof__() > 48 * 1_000
    nbytes = ext.raw_seal([block])
    assert block.__sizeof__() - 48 * 1_000 < 100
    assert nbytes < 48 * 1_000 + 200
    assert ext.raw_counts([block, ("i", "user_scope", 1, None, -1, 0, None, None, 1, None), (0, 2, 1, None)]) == (1_000, 1)


# -- Soak: constant memory under steady load ------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc")
def test_soak_two_million_ranges_and_200k_tasks_stay_at_constant_memory() -> None:
    # SPEC 15.2: Issue 19 item 1: a profile left on under steady load holds constant
    # memory once its ring is full (here ~10x the ring goes through it).
    # The pure-Python paths run a tenth of it in a tenth of the ring.
    budget = 50_000_000 if C else 5_000_000
    batches = 200 if C else 20

    async def request(i: int) -> None:
        with aprof.record_function("handle", args=None):
            for _ in range(9):
                with aprof.record_function("step"):
                    pass

    async def main() -> tuple[Any, list[int]]:
        rss: list[int] = []
        async with aprof.profile(max_bytes=budget, keep="latest") as prof:
            for batch in range(batches):
                await asyncio.gather(*(request(i) for i in range(1_000)))
                if batch % (batches // 10) == batches // 10 - 1:
                    gc.collect()
                    rss.append(_rss())
        return prof, rss

    prof, rss = asyncio.run(main())
    by_kind = prof.session.dropped_by_kind
    events = prof.events()
    assert len([e for e in events if e.scope == aprof.RecordScope.USER_SCOPE]) + by_kind["ranges"] == batches * 10_000
    assert by_kind["tasks"] > batches * 500
    # Once full (the ring took the first ~quarter of the run), RSS stays
    # within 10%.
    settled = rss[len(rss) // 2 :]
    assert max(settled) <= min(settled) * 1.10, [r // 1_000_000 for r in rss]


def test_a_pinned_ring_seals_but_lets_nothing_go() -> None:
    # SPEC 15.2: A dump copying the generations pins the ring: a rotation meanwhile
    # (another thread recording) must not empty what is being copied.
    with aprof.profile(max_events=80, keep="latest") as prof:
        ring = prof._state.ring
        ring.pins += 1
        _ranges(400)
        assert sum(g.events for g in ring.sealed) >= 390
        ring.pins -= 1
        _ranges(100)
    assert len(_names(prof)) <= 80
    assert len(_names(prof)) + prof.session.dropped_by_kind["ranges"] == 500


def test_many_threads_recording_through_rotations_keep_the_ring_working() -> None:
    # SPEC 15.2: Threads record their first events (adding lists to the generation's
    # dict) while another seals it: the ring rotates on, never fills, holds
    # about its budget, and counts what it let go.
    import threading

    n_threads, per_thread = 6, 4_000

    def work() -> None:
        for i in range(per_thread):
            with aprof.record_function("r"):
                pass
            if i % 2 == 0:
                aprof.mark("m")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside the rotation, not only between ranges
    try:
        with aprof.profile(max_events=2_000, keep="latest", scope="global") as prof:
            ring = prof._state.ring
            threads = [threading.Thread(target=work) for _ in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not ring.budget.full
    recorded = n_threads * per_thread * 3 // 2
    by_kind = prof.session.dropped_by_kind
    kept = sum(e.name in ("r", "m") for e in prof.events())
    assert kept <= 2_000 + 2_000 // GENERATIONS * 2
    assert abs(kept + by_kind["ranges"] + by_kind["instants"] - recorded) <= n_threads  # see the reference's caveat
