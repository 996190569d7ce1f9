"""Results of a stopped profile: events, key_averages, save and load (SPEC 6).

Expected aggregates are computed from ``prof.events()`` (or from the raw
start/end times), never hard-coded: the tests check that the analysis agrees
with the events it summarises.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import re
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import aprof

from .sessionfiles import save_v1, v1_bytes, v1_document
from .tracecheck import validate_trace

USER = aprof.RecordScope.USER_SCOPE
TASK = aprof.RecordScope.TASK
STATS = ("count", "total_ns", "self_ns", "min_ns", "max_ns")

RUNNERS = [pytest.param(asyncio.run, id="asyncio")]
with contextlib.suppress(ImportError):
    import uvloop

    RUNNERS.append(pytest.param(uvloop.run, id="uvloop"))


def by_name(events: list[aprof.FunctionEvent], name: str) -> list[aprof.FunctionEvent]:
    return [e for e in events if e.name == name]


def one(events: list[aprof.FunctionEvent], name: str) -> aprof.FunctionEvent:
    found = by_name(events, name)
    assert len(found) == 1, f"expected one {name!r}, got {found}"
    return found[0]


def table_labels(table: str) -> list[str]:
    """The first column of a rendered table's data rows (labels hold no double spaces)."""
    lines = table.splitlines()
    assert [set(lines[i]) for i in (0, 2, -1)] == [{"-"}] * 3, table
    return [re.split(r"\s{2,}", line)[0] for line in lines[3:-1]]


# ---------------------------------------------------------------------------
# 6.1 and 6.2: events and their fields
# ---------------------------------------------------------------------------


def test_event_fields_and_nesting(backend) -> None:
    # SPEC 6.2: every documented field, with values a user can check against
    # what the code saw while it ran.
    seen: dict[str, Any] = {}

    async def child() -> None:
        seen["child_tid"] = aprof.current_thread_id()
        seen["child_os"] = threading.get_ident()
        with aprof.record_function("in-child"):
            await backend.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            seen["tid"] = aprof.current_thread_id()
            seen["os"] = threading.get_ident()
            with aprof.record_function("outer", args="batch=32"):
                with aprof.record_function("first"):
                    await backend.sleep(0.001)
                with aprof.record_function("second"), aprof.record_function("deep"):
                    await backend.checkpoint()
                with contextlib.suppress(ZeroDivisionError), aprof.record_function("raises"):
                    1 / 0  # noqa: B018
                async with backend.group() as g:
                    g.start_soon(child)
        return prof

    prof = backend.run(main)
    events = prof.events()
    assert all(isinstance(e, aprof.FunctionEvent) for e in events)
    user = [e for e in events if e.scope is USER]
    assert sorted(e.name for e in user) == ["deep", "first", "in-child", "outer", "raises", "second"]
    outer, first, second, deep, raises = (one(user, n) for n in ("outer", "first", "second", "deep", "raises"))
    in_child = one(user, "in-child")
    tracks = {t.id: t for t in prof.session.tracks()}
    for e in user:
        assert e.scope is USER
        assert 0 < e.start_ns <= e.end_ns
        assert e.duration_ns == e.end_ns - e.start_ns
        assert e.is_async is False
        assert e.unfinished is False
        assert e.end_thread_id == e.thread_id
        assert e.track == tracks[e.thread_id].name
        assert isinstance(e.track, str)
        assert e.track
        assert e.sequence_nr == -1
        assert e.forward_thread_id == 0
        assert e.inputs is None  # record_inputs is off
        assert e.stack is None  # with_stack is off
        assert e.node_id == aprof.get_default_node_id()
    for e in (outer, first, second, deep, raises):
        assert e.thread_id == seen["tid"]
        assert e.os_thread_id == seen["os"]
    assert in_child.thread_id == seen["child_tid"] != seen["tid"]
    assert in_child.os_thread_id == seen["child_os"]
    assert first.duration_ns > 0
    # SPEC 4.2 seen through 6.2: the exception's type name, None otherwise.
    assert raises.exception == "ZeroDivisionError"
    assert outer.exception is None
    assert outer.args == "batch=32"
    # SPEC 6.2: ranges of one logical thread nest properly, with parent/children.
    assert outer.parent is None
    assert outer.children == [first, second, raises]
    assert second.children == [deep]
    assert deep.parent is second
    assert second.parent is outer
    assert first.parent is outer
    for parent in (outer, second):
        for c in parent.children:
            assert parent.start_ns <= c.start_ns <= c.end_ns <= parent.end_ns
    for a, b in zip(outer.children, outer.children[1:], strict=False):
        assert a.end_ns <= b.start_ns  # siblings do not overlap
    # Self time is the duration minus the nested children's durations.
    assert outer.self_duration_ns == outer.duration_ns - first.duration_ns - second.duration_ns - raises.duration_ns
    assert second.self_duration_ns == second.duration_ns - deep.duration_ns
    assert deep.self_duration_ns == deep.duration_ns
    assert list(outer.iter_descendants()) == [first, second, deep, raises]
    # The child's range sits on the child's track, not among outer's children.
    assert in_child not in outer.children
    task = next(e for e in events if e.scope is TASK and e.thread_id == in_child.thread_id)
    assert in_child.parent is task
    assert task.forward_thread_id == seen["tid"]
    assert task.sequence_nr >= 0


def test_events_come_track_by_track_in_start_order(backend) -> None:
    # SPEC 6.1, 6.2: each logical thread's events are one list, in start order.
    async def worker(i: int) -> None:
        for j in range(3):
            with aprof.record_function(f"w{i}-{j}"):
                await backend.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(4):
                    g.start_soon(worker, i)
        return prof

    prof = backend.run(main)
    events = prof.events()
    order: list[int] = []
    for e in events:
        if not order or order[-1] != e.thread_id:
            order.append(e.thread_id)
    assert len(order) == len(set(order)), f"a track's events are split: {order}"
    per_track: dict[int, list[aprof.FunctionEvent]] = defaultdict(list)
    for e in events:
        per_track[e.thread_id].append(e)
    for evs in per_track.values():
        starts = [e.start_ns for e in evs]
        assert starts == sorted(starts)
    for i in range(4):
        names = [e.name for e in events if e.scope is USER and e.name.startswith(f"w{i}-")]
        assert names == [f"w{i}-0", f"w{i}-1", f"w{i}-2"]
        assert len({e.thread_id for e in events if e.name in names}) == 1


@pytest.mark.parametrize("run", RUNNERS)
def test_named_asyncio_tasks_name_their_tracks(run: Any) -> None:
    # SPEC 1 (track), 6.2: an event's track is its task's name.
    async def child() -> None:
        with aprof.record_function("job"):
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await asyncio.gather(asyncio.create_task(child(), name="alpha"), asyncio.create_task(child(), name="beta"))
        return prof

    prof = run(main())
    jobs = by_name(prof.events(), "job")
    assert sorted(e.track for e in jobs) == ["alpha", "beta"]
    assert {"alpha", "beta"} <= {t.name for t in prof.session.tracks() if t.kind == "asyncio"}


def test_low_level_range_keeps_inputs_and_sequence_nr() -> None:
    # SPEC 3.5, 6.2: inputs (as reprs, with record_inputs), sequence_nr and scope.
    with aprof.profile(record_inputs=True) as prof:
        rf = aprof.RecordFunction(aprof.RecordScope.FUNCTION)
        assert rf.is_active
        rf.before("low", (1, "x", [2.5]), sequence_nr=42)
        rf.end()
        with aprof.record_function("user", args="k=v"):
            pass
    low = one(prof.events(), "low")
    assert low.scope is aprof.RecordScope.FUNCTION
    assert low.inputs == ("1", "'x'", "[2.5]")
    assert low.sequence_nr == 42
    user = one(prof.events(), "user")
    assert user.args == "k=v"
    assert user.inputs == ("'k=v'",)


def test_unfinished_range_is_closed_at_stop() -> None:
    # SPEC 5.5, 6.2: a range still open at stop ends at the stop time, flagged.
    with aprof.profile() as prof:
        r = aprof.record_function("left-open").start()
        with aprof.record_function("inside"):
            pass
    r.end()  # after stop: dropped, never raises
    left = one(prof.events(), "left-open")
    inside = one(prof.events(), "inside")
    assert left.unfinished is True
    assert left.end_ns == prof.session.metadata["stop_ns"]
    assert inside.unfinished is False
    assert inside.parent is left
    assert left.children == [inside]


def test_range_ended_in_another_task_is_async(backend) -> None:
    # SPEC 4.3, 6.3: stored on the starting track, flagged is_async, with the
    # ending thread's id; later ranges on the starting track still nest.
    ids: dict[str, int] = {}

    async def ender(r: aprof.record_function) -> None:
        ids["ender"] = aprof.current_thread_id()
        await backend.sleep(0)
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            ids["main"] = aprof.current_thread_id()
            with aprof.record_function("enclosing"):
                r = aprof.record_function("handed-over").start()
                async with backend.group() as g:
                    g.start_soon(ender, r)
                with aprof.record_function("after"):
                    await backend.checkpoint()
        return prof

    prof = backend.run(main)
    events = prof.events()
    handed = one(events, "handed-over")
    enclosing, after = one(events, "enclosing"), one(events, "after")
    assert handed.is_async is True
    assert handed.thread_id == ids["main"]
    assert handed.end_thread_id == ids["ender"]
    assert handed.unfinished is False
    assert handed.start_ns <= handed.end_ns
    assert handed not in enclosing.children  # an async range is nobody's child
    assert enclosing.children == [after]
    assert after.parent is enclosing
    assert after.is_async is False


def test_no_event_objects_are_built_while_recording() -> None:
    # SPEC 6.1: recording appends raw records; FunctionEvents are built at stop.
    def count() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is aprof.FunctionEvent)

    before = count()
    with aprof.profile() as prof:
        for _ in range(200):
            with aprof.record_function("r"):
                pass
        assert count() == before
    events = prof.events()
    assert len(by_name(events, "r")) == 200
    assert count() >= before + 200


@pytest.mark.parametrize("method", ["events", "key_averages", "session"])
def test_results_before_start_and_while_running_raise(method: str, tmp_path: Path) -> None:
    # SPEC 6.2, 6.4, 12: results exist after stop only, with a clear RuntimeError.
    prof = aprof.profile()

    def get() -> object:
        attr = getattr(prof, method)
        return attr() if callable(attr) else attr

    with pytest.raises(RuntimeError, match="never started"):
        get()
    with prof:
        with aprof.record_function("kept"):
            pass
        with pytest.raises(RuntimeError, match="running"):
            get()
        with pytest.raises(RuntimeError, match="running"):
            prof.export_chrome_trace(tmp_path / "t.json")
        with pytest.raises(RuntimeError, match="running"):
            prof.save(tmp_path / "s.aprof")
    assert get() is not None
    assert [e.name for e in prof.events()] == ["kept"]  # nothing lost by the failed calls
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# 6.4: key_averages and the table
# ---------------------------------------------------------------------------


async def _synthetic(backend) -> aprof.profile:
    """3 x outer(2 x inner + 1 x inner), leaf ranges on 2 child tasks, a mark."""

    async def worker(n: int) -> None:
        for _ in range(n):
            with aprof.record_function("leaf"):
                await backend.sleep(0)

    async with aprof.profile() as prof:
        for i in range(3):
            with aprof.record_function("outer"):
                for _ in range(2):
                    with aprof.record_function("inner"):
                        await backend.sleep(0.0005 * (i + 1))
                with aprof.record_function("inner"):
                    pass
        aprof.mark("instant")
        async with backend.group() as g:
            g.start_soon(worker, 2)
            g.start_soon(worker, 5)
    return prof


def test_key_averages_by_name_match_events(backend) -> None:
    # SPEC 6.4: count, total, self, mean, min, max per name, from the events.
    prof = backend.run(_synthetic, backend)
    events = prof.events()
    rows = prof.key_averages()
    assert rows.group_by == "name"
    for name, n in (("outer", 3), ("inner", 9), ("leaf", 7)):
        evs = by_name(events, name)
        assert len(evs) == n
        row = rows[name]
        durations = [e.duration_ns for e in evs]
        assert row.count == n
        assert row.total_ns == sum(durations)
        assert row.self_ns == sum(e.self_duration_ns for e in evs)
        assert row.min_ns == min(durations)
        assert row.max_ns == max(durations)
        assert row.mean_ns == pytest.approx(sum(durations) / n)
    # Self time of "outer" from raw times: every "inner" runs inside an "outer".
    outer_total = sum(e.duration_ns for e in by_name(events, "outer"))
    inner_total = sum(e.duration_ns for e in by_name(events, "inner"))
    assert rows["outer"].self_ns == outer_total - inner_total
    assert rows["inner"].self_ns == inner_total  # leaves: self == total
    # Instants are not ranges: no row.
    with pytest.raises(KeyError):
        rows["instant"]
    # SPEC 6.4, 7.3: task rows split their time into running and waiting.
    task_rows = [r for r in rows if r.key.startswith("task ")]
    assert sum(r.count for r in task_rows) == 2
    for r in task_rows:
        assert r.running_ns > 0
        assert r.running_ns + r.waiting_ns == r.total_ns
    assert len(rows) == 3 + len(task_rows)


def test_key_averages_by_name_adds_every_event_as_add_would(backend) -> None:
    # SPEC 6.4 (issue 17): the one-pass aggregation by name gives the rows,
    # in the order, and with every field, that adding the events one by one
    # gives: plain ranges, ranges on task tracks, tasks, executor jobs.
    from aprof._post._analysis import FunctionEventAvg

    def work() -> None:
        with aprof.record_function("in-thread"):
            pass

    async def worker(i: int) -> None:
        with aprof.record_function("in-task"):
            await backend.sleep(0.001 * i)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await backend.to_thread(work)
            for _ in range(3):
                with aprof.record_function("outer"), aprof.record_function("inner"):
                    aprof.mark("instant")
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(worker, i)
        return prof

    prof = backend.run(main)
    expected: dict[Any, FunctionEventAvg] = {}
    for ev in prof.events():
        if ev.is_instant:
            continue
        extra = ev.extra or {}
        if ev.scope is aprof.RecordScope.TASK and extra.get("coro"):
            label = f"task {extra['coro']}"
        elif ev.scope is aprof.RecordScope.EXECUTOR:
            label = f"executor {ev.name}"
        else:
            label = ev.name
        key = (ev.scope, label) if label != ev.name else label
        expected.setdefault(key, FunctionEventAvg(label)).add(ev)
    rows = list(prof.key_averages())
    fields = ("key", "count", "total_ns", "self_ns", "min_ns", "max_ns", "running_ns", "waiting_ns", "max_step_ns", "queued_ns", "queued_count")
    assert [[getattr(r, f) for f in fields] for r in rows] == [[getattr(r, f) for f in fields] for r in expected.values()]
    assert any(r.running_ns for r in rows if not r.key.startswith("task "))  # ranges on task tracks were there


def test_key_averages_by_track_match_events(backend) -> None:
    # SPEC 6.4: group_by="track" gives one row per logical thread.
    prof = backend.run(_synthetic, backend)
    rows = prof.key_averages(group_by="track")
    assert rows.group_by == "track"
    per_track: dict[int, list[aprof.FunctionEvent]] = defaultdict(list)
    for e in prof.events():
        if not e.is_instant:
            per_track[e.thread_id].append(e)
    assert len(rows) == len(per_track) == 3  # the main task and two workers
    for tid, evs in per_track.items():
        [row] = [r for r in rows if r.key.endswith(f"({tid})")]
        assert evs[0].track in row.key
        durations = [e.duration_ns for e in evs]
        assert row.count == len(evs)
        assert row.total_ns == sum(durations)
        assert row.self_ns == sum(e.self_duration_ns for e in evs)
        assert (row.min_ns, row.max_ns) == (min(durations), max(durations))
    assert sorted(r.count for r in rows) == [3, 6, 12]  # worker(2)+task, worker(5)+task, 3 outer + 9 inner


def _leaf_work() -> None:
    with aprof.record_function("leaf"):
        pass


def _site_a() -> None:
    _leaf_work()


def _site_b() -> None:
    _leaf_work()


@aprof.record_function("decorated")
async def _decorated() -> None:
    pass


async def _site_c() -> None:
    await _decorated()


def test_key_averages_by_stack_split_call_sites(backend) -> None:
    # SPEC 6.4, 8.3: group_by="stack" splits one name by where it was called
    # from, and the stacks start in the user's code (this file), not in aprof.
    async def main() -> aprof.profile:
        async with aprof.profile(with_stack=True) as prof:
            for _ in range(3):
                _site_a()
            for _ in range(2):
                _site_b()
            with aprof.record_function("direct"):
                await backend.checkpoint()
            await _site_c()
        return prof

    prof = backend.run(main)
    events = [e for e in prof.events() if e.scope is USER]
    for e in events:
        assert e.stack, e
        file, line, func = e.stack[0]
        assert file == __file__
        assert line > 0
    leaf_events = by_name(events, "leaf")
    assert {e.stack[0][2] for e in leaf_events} == {"_leaf_work"}
    assert sorted(e.stack[1][2] for e in leaf_events) == ["_site_a"] * 3 + ["_site_b"] * 2
    assert one(events, "direct").stack[0][2] == "test_key_averages_by_stack_split_call_sites.<locals>.main"
    # A decorated coroutine's range starts at its caller, not in aprof's wrapper.
    assert one(events, "decorated").stack[0][2] == "_site_c"

    rows = prof.key_averages(group_by="stack")
    assert rows.group_by == "stack"
    leaf_rows = sorted((r for r in rows if r.key.startswith("leaf")), key=lambda r: r.count)
    assert [r.count for r in leaf_rows] == [2, 3]
    for row, site in zip(leaf_rows, ("_site_b", "_site_a"), strict=True):
        assert row.stack[0][2] == "_leaf_work"
        assert row.stack[1][2] == site
        assert Path(__file__).name in row.key  # the label points at the call site in this file
        evs = [e for e in leaf_events if e.stack[1][2] == site]
        assert row.total_ns == sum(e.duration_ns for e in evs)
        assert row.min_ns == min(e.duration_ns for e in evs)
    # group_by="name" merges the call sites again.
    assert prof.key_averages()["leaf"].count == 5


def test_table_sorts_and_limits_rows() -> None:
    # SPEC 6.4: .table(sort_by=..., row_limit=...) orders and cuts the rows.
    with aprof.profile() as prof:
        for name, n in (("few", 1), ("many", 5), ("some", 3)):
            for _ in range(n):
                with aprof.record_function(name):
                    sum(range(2000 if name == "few" else 10))
    rows = prof.key_averages()
    by_key = {r.key: r for r in rows}

    assert table_labels(rows.table(sort_by="count")) == ["many", "some", "few"]
    assert table_labels(rows.table(sort_by="name")) == ["few", "many", "some"]
    for sort_by, attr in (
        ("total", "total_ns"),
        ("self", "self_ns"),
        ("mean", "mean_ns"),
        ("max", "max_ns"),
        ("min", "min_ns"),
    ):
        values = [getattr(by_key[k], attr) for k in table_labels(rows.table(sort_by=sort_by))]
        assert values == sorted(values, reverse=True), sort_by
    assert table_labels(rows.table(sort_by="count", row_limit=2)) == ["many", "some"]
    assert table_labels(rows.table(sort_by="count", row_limit=0)) == []
    assert table_labels(rows.table(sort_by="count", row_limit=10)) == ["many", "some", "few"]
    text = rows.table()
    header = text.splitlines()[1].split()
    assert header[:7] == ["Name", "Count", "Total", "Self", "Mean", "Min", "Max"]
    counts = {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1] for line in text.splitlines()[3:-1]}
    assert counts == {"few": "1", "many": "5", "some": "3"}
    assert str(rows) == rows.table()


@pytest.mark.parametrize("run", RUNNERS)
def test_table_shows_running_and_waiting_for_tasks(run: Any) -> None:
    # SPEC 6.4, 7.3: task rows bring running and waiting columns.
    async def napper() -> None:
        await asyncio.sleep(0.02)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await asyncio.create_task(napper(), name="napper")
        return prof

    prof = run(main())
    rows = prof.key_averages()
    [task_row] = [r for r in rows if "napper" in r.key]
    assert task_row.waiting_ns > task_row.running_ns > 0  # it mostly slept
    header = rows.table().splitlines()[1].split()
    assert header[-4:] == ["Running", "Waiting", "Max", "step"]


@pytest.mark.parametrize("group_by", ["bogus", "Name", "", "thread"])
def test_unknown_group_by_is_refused(group_by: str) -> None:
    # SPEC 6.4, 12: a clear ValueError naming the unknown value.
    with aprof.profile() as prof:
        with aprof.record_function("r"):
            pass
    with pytest.raises(ValueError, match=f"group_by {group_by!r}"):
        prof.key_averages(group_by=group_by)
    assert prof.key_averages()["r"].count == 1  # nothing lost


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"sort_by": "bogus"}, "'bogus'"),
    ({"sort_by": "cpu_time_total"}, "'cpu_time_total'"),
    ({"row_limit": -1}, "row_limit"),
    ({"row_limit": 1.5}, "row_limit"),
])  # fmt: skip
def test_bad_table_arguments_are_refused(kwargs: dict[str, Any], named: str) -> None:
    # SPEC 6.4, 12: a clear ValueError naming what was wrong.
    with aprof.profile() as prof:
        with aprof.record_function("r"):
            pass
    rows = prof.key_averages()
    with pytest.raises(ValueError, match=re.escape(named)):
        rows.table(**kwargs)
    assert table_labels(rows.table()) == ["r"]


# ---------------------------------------------------------------------------
# 6.5: save and load
# ---------------------------------------------------------------------------

WEIRD = 'α\n"β"\t\\ 🚀'


async def _rich_session(backend) -> aprof.profile:
    """Every kind of field: nesting, args, inputs, stacks, exceptions, async,
    unfinished, instants, tasks with steps."""

    async def ender(r: aprof.record_function) -> None:
        with aprof.record_function(WEIRD):
            await backend.sleep(0)
        r.end()

    async with aprof.profile(record_inputs=True, with_stack=True) as prof:
        with aprof.record_function("outer", args="batch=32"):
            with aprof.record_function("inner"):
                await backend.sleep(0)
            with contextlib.suppress(KeyError), aprof.record_function("fails"):
                raise KeyError("x")
            r = aprof.record_function("handed-over").start()
            async with backend.group() as g:
                g.start_soon(ender, r)
            aprof.mark("instant", args="note")
        aprof.record_function("left-open").start()
    return prof


def _snapshot(session: aprof.Session | aprof.profile) -> list[dict[str, Any]]:
    """Every field of every event, with parent and children as indexes."""
    events = session.events()
    index = {id(e): i for i, e in enumerate(events)}
    out = []
    for e in events:
        d = e.to_dict()
        d["parent"] = None if e.parent is None else index[id(e.parent)]
        d["children"] = [index[id(c)] for c in e.children]
        d["duration_ns"] = e.duration_ns
        d["self_duration_ns"] = e.self_duration_ns
        d["scope"] = e.scope
        out.append(d)
    return out


def test_save_load_round_trip_keeps_every_field_and_the_tree(backend, tmp_path: Path) -> None:
    # SPEC 6.5, 6.2: the loaded session is the same session.
    prof = backend.run(_rich_session, backend)
    path = tmp_path / "run.aprof"
    prof.save(path)
    loaded = aprof.load(path)
    assert isinstance(loaded, aprof.Session)

    original = _snapshot(prof)
    assert _snapshot(loaded) == original
    names = {d["name"] for d in original}
    assert {"outer", "inner", "fails", "handed-over", WEIRD, "instant", "left-open"} <= names
    # The fixture session really covers every kind of field.
    assert any(d["is_async"] for d in original)
    assert any(d["unfinished"] for d in original)
    assert any(d["is_instant"] for d in original)
    assert any(d["exception"] == "KeyError" for d in original)
    assert any(d["inputs"] for d in original)
    assert any(d["stack"] for d in original)
    assert any(d["children"] for d in original)
    assert any(d["parent"] is not None for d in original)
    assert any(d["running_ns"] is not None for d in original)
    assert [t.to_dict() for t in loaded.tracks()] == [t.to_dict() for t in prof.session.tracks()]
    assert loaded.metadata == prof.session.metadata
    assert loaded.dropped == prof.session.dropped

    # Same analysis methods, same answers.
    for group_by in ("name", "track", "stack"):
        assert loaded.key_averages(group_by).table() == prof.key_averages(group_by).table()
    # Same export: the trace from the loaded session equals the original one.
    prof.export_chrome_trace(tmp_path / "a.json")
    loaded.export_chrome_trace(tmp_path / "b.json")
    assert validate_trace(tmp_path / "b.json") == validate_trace(tmp_path / "a.json")
    # And it saves again, losslessly.
    loaded.save(tmp_path / "again.aprof")
    assert _snapshot(aprof.load(tmp_path / "again.aprof")) == original


def test_save_writes_a_binary_session_and_accepts_str_paths(tmp_path: Path) -> None:
    # SPEC 6.5: str and Path both work; the file is the binary format,
    # version 2 (docs/how-it-works.md).
    with aprof.profile() as prof:
        with aprof.record_function("r"):
            pass
    path = str(tmp_path / "s.aprof")
    prof.save(path)
    raw = Path(path).read_bytes()
    assert raw[:8] == b"\x89APROF\r\n"
    assert int.from_bytes(raw[8:12], "little") == 2
    assert [e.name for e in aprof.load(path).events()] == ["r"]


def test_version_1_files_still_load(tmp_path: Path) -> None:
    # SPEC 6.5: a session saved by an aprof before the binary format
    # (gzip-compressed JSON, version 1) loads to the same session.
    with aprof.profile() as prof:
        with aprof.record_function("outer", args="a=1"):
            aprof.mark("here")
    save_v1(prof, tmp_path / "old.aprof")
    old = aprof.load(tmp_path / "old.aprof")
    assert [e.to_dict() for e in old.events()] == [e.to_dict() for e in prof.events()]
    # and convert writes it anew in the current format
    old.save(tmp_path / "new.aprof")
    assert (tmp_path / "new.aprof").read_bytes()[:8] == b"\x89APROF\r\n"
    assert [e.to_dict() for e in aprof.load(tmp_path / "new.aprof").events()] == [e.to_dict() for e in prof.events()]


# -- BI-07: load on files that are not whole sessions ------------------------


def _session_bytes(tmp_path: Path) -> bytes:
    with aprof.profile() as prof:
        for i in range(50):
            with aprof.record_function(f"range-{i}", args="x" * 20):
                pass
    prof.save(tmp_path / "good.aprof")
    prof.export_chrome_trace(tmp_path / "chrome.json")
    # The damage below is done to a version 1 file (gzip, JSON), or, for the
    # "v2-" kinds, to the binary file just saved.
    return v1_bytes(v1_document(prof))


def _v2(tmp: Path) -> bytes:
    return (tmp / "good.aprof").read_bytes()


def _v2_with(tmp: Path, offset: int, value: bytes) -> bytes:
    raw = bytearray(_v2(tmp))
    raw[offset : offset + len(value)] = value
    return bytes(raw)


def _cprofile_dump(path: Path) -> bytes:
    import cProfile

    p = cProfile.Profile()
    p.enable()
    sum(range(10))
    p.disable()
    p.dump_stats(path)
    return path.read_bytes()


BAD_FILES = {
    "cut-at-half": lambda good, tmp: good[: len(good) // 2],
    "json-cut-at-half": lambda good, tmp: gzip.decompress(good)[: len(gzip.decompress(good)) // 2],
    "empty": lambda good, tmp: b"",
    "gzip-cut-mid-stream": lambda good, tmp: gzip.compress(gzip.decompress(good) * 3)[:300],
    "gzip-without-trailer": lambda good, tmp: good[:-4],
    "gzip-header-only": lambda good, tmp: good[:10],
    "gzip-of-garbage": lambda good, tmp: gzip.compress(b"\x00\xff not json \xfe"),
    "not-json": lambda good, tmp: b"hello, world\n",
    "binary": lambda good, tmp: bytes(range(256)) * 4,
    "json-without-format": lambda good, tmp: json.dumps({"events": [], "tracks": []}).encode(),
    "json-list": lambda good, tmp: b"[1, 2, 3]",
    "json-string": lambda good, tmp: b'"aprof-session"',
    "other-format": lambda good, tmp: json.dumps({"format": "pyinstrument", "version": 1}).encode(),
    "future-version": lambda good, tmp: json.dumps({"format": "aprof-session", "version": 999}).encode(),
    "damaged-session": lambda good, tmp: json.dumps(
        {**json.loads(gzip.decompress(good)), "events": [["only", "two"]]}
    ).encode(),
    "nested-too-deep": lambda good, tmp: b"[" * 100_000 + b"]" * 100_000,
    "chrome-trace": lambda good, tmp: (tmp / "chrome.json").read_bytes(),
    "chrome-array-trace": lambda good, tmp: json.dumps([{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]).encode(),
    "speedscope": lambda good, tmp: json.dumps({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "main"}]},
        "profiles": [{"type": "evented", "name": "p", "unit": "none", "startValue": 0, "endValue": 1, "events": []}],
    }).encode(),
    "viztracer": lambda good, tmp: json.dumps({"traceEvents": [], "viztracer_metadata": {"version": "0.16"}}).encode(),
    "cprofile-stats": lambda good, tmp: _cprofile_dump(tmp / "stats.prof"),
    "v2-cut-at-half": lambda good, tmp: _v2(tmp)[: len(_v2(tmp)) // 2],
    "v2-last-byte-cut": lambda good, tmp: _v2(tmp)[:-1],
    "v2-magic-only": lambda good, tmp: _v2(tmp)[:8],
    "v2-future-version": lambda good, tmp: _v2_with(tmp, 8, (999).to_bytes(4, "little")),
    "v2-huge-header-length": lambda good, tmp: _v2_with(tmp, 12, (2**32 - 1).to_bytes(4, "little")),
    "v2-flipped-last-byte": lambda good, tmp: _v2(tmp)[:-1] + bytes([_v2(tmp)[-1] ^ 0xFF]),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_load_refuses_what_is_not_a_whole_session(kind: str, tmp_path: Path) -> None:
    # SPEC 6.5, 12, BI-07: ValueError naming the file; nothing hangs (timeout).
    good = _session_bytes(tmp_path)
    path = tmp_path / f"{kind}.aprof"
    path.write_bytes(BAD_FILES[kind](good, tmp_path))
    with pytest.raises(ValueError, match=re.escape(str(path))):
        aprof.load(path)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        aprof.load(str(path))
    assert len(aprof.load(tmp_path / "good.aprof").events()) == 50  # the good file still loads


def test_load_a_chrome_trace_says_what_it_is(tmp_path: Path) -> None:
    # SPEC 6.5, BI-07: the message tells a Chrome trace from a session.
    _session_bytes(tmp_path)
    with pytest.raises(ValueError, match="Chrome trace"):
        aprof.load(tmp_path / "chrome.json")


def test_load_missing_file_directory_and_non_path(tmp_path: Path) -> None:
    # SPEC 6.5, 12: the usual OS errors, naming the path; a non-path is a TypeError.
    missing = tmp_path / "nope.aprof"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        aprof.load(missing)
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        aprof.load(tmp_path)
    with pytest.raises(TypeError, match="path"):
        aprof.load(sys.stdin)  # type: ignore[arg-type]
