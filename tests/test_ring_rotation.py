"""The ring's rotation in pieces (issue 19: the always-on server's p99).

A rotation only swaps the current generation out and lets the oldest go
(counting it, exactly); measuring the generation it sealed and freeing the
one it let go are done in pieces, a little every few records, so that no
record waits for a whole generation's work. These tests pin down what a
user relies on through that: exact dropped counts, the budget, the window a
dump holds, a stop at any moment, and (with the extension) sealed records
kept out of the cyclic garbage collector's walks.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

import aprof
from aprof._core import _native, _ring

from .conftest import Backend, twin

C = _native.extension is not None


def _user(session: Any) -> list[str]:
    return [e.name for e in session.events() if e.scope == aprof.RecordScope.USER_SCOPE]


class _Pieces:
    """Counts the pieces of work the ring did between rotations."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pieces = 0  # calls with work pending and a deadline: a piece
        self.drained = 0  # work found pending at a rotation
        work = _ring.Ring._work

        def spy(ring: Any, deadline: int | None) -> None:
            if ring._measuring or ring._dying:
                if deadline is None:
                    self.drained += 1
                else:
                    self.pieces += 1
            work(ring, deadline)

        monkeypatch.setattr(_ring.Ring, "_work", spy)


def _all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring as it was: every rotation does all its work at once."""

    def schedule(ring: Any) -> None:
        ring.budget.limit = ring._gen_limit

    monkeypatch.setattr(_ring.Ring, "_schedule", schedule)


def _tasks_run(backend: Backend, n: int) -> Any:
    async def child(i: int) -> None:
        with aprof.record_function(f"child{i}"):
            await backend.checkpoint()
        await backend.checkpoint()

    async def main() -> Any:
        async with aprof.profile(max_events=8 * 256, keep="latest") as prof:
            for batch in range(n // 50):
                async with backend.group() as g:
                    for i in range(batch * 50, batch * 50 + 50):
                        g.start_soon(child, i)
        return prof

    return backend.run(main)


def test_counts_stay_exact_through_many_rotations_done_in_pieces(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.2: the work a rotation leaves is done in pieces between records, and
    # what the ring lets go is still counted exactly, by kind: every range,
    # every task, and the steps of each task dropped.
    spy = _Pieces(monkeypatch)
    n = 3_000
    prof = _tasks_run(backend, n)
    assert spy.pieces > 0
    by_kind = prof.session.dropped_by_kind
    children = [e for e in prof.events() if e.name.startswith("child")]
    assert len(children) + by_kind["ranges"] == n
    kept_tasks = [e for e in prof.events() if e.scope == aprof.RecordScope.TASK]
    assert by_kind["tasks"] >= n - len(kept_tasks)
    assert by_kind["tasks"] <= n + 2 - len(kept_tasks)  # a backend's own task or two
    assert by_kind["steps"] >= 2 * (n - len(kept_tasks))
    assert len(children) <= 8 * 256


def test_counts_in_pieces_are_those_of_the_rotation_all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.2: on a deterministic loop (asyncio), the same program keeps the
    # same events and drops the same counts whether the ring's work is done
    # in pieces or all at once in each rotation (the ring as it was).
    def run() -> tuple[dict[str, int], list[str], int]:
        prof = _tasks_run(Backend("asyncio"), 2_000)
        tasks = sum(e.scope == aprof.RecordScope.TASK for e in prof.events())
        return prof.session.dropped_by_kind, _user(prof), tasks

    spy = _Pieces(monkeypatch)
    pieces = run()
    assert spy.pieces > 0
    with monkeypatch.context() as m:
        _all_at_once(m)
        spy.pieces = 0
        at_once = run()
        assert spy.pieces == 0
    assert pieces == at_once
    assert pieces[0]["steps"] > 0


def _until(done: Any, start: int = 0, limit: int = 100_000) -> int:
    """Record plain ranges ``r<start>``, ``r<start + 1>``... until ``done()``;
    how many."""
    for i in range(start, start + limit):
        with aprof.record_function(f"r{i}"):
            pass
        if done():
            return i + 1 - start
    raise AssertionError("the ring never got there")


def test_a_generation_let_go_is_freed_in_pieces_across_later_records() -> None:
    # SPEC 15.2: right after a rotation lets a generation go, it is counted but
    # not yet freed; the records after it free it, a piece at a time, before
    # the next rotation; then none of its records is held.
    with aprof.profile(max_events=8 * 4_096, keep="latest") as prof:
        ring = prof._state.ring
        recorded = _until(lambda: bool(ring._dying))
        gen = ring._dying[0]
        lists = list(gen.lists.values())
        assert sum(map(len, lists)) > 0
        dropped = ring.dropped()["ranges"]
        assert dropped > 0  # counted as it was let go
        sealed = list(ring.sealed)
        recorded += _until(lambda: not ring._dying and not ring._measuring, start=recorded)
        assert list(ring.sealed) == sealed  # no rotation since: the pieces did it
        assert all(len(lst) == 0 for lst in lists)
        assert not gen.lists
        assert ring.dropped()["ranges"] == dropped
    names = _user(prof)
    assert len(names) + prof.session.dropped_by_kind["ranges"] == recorded
    assert names == [f"r{i}" for i in range(recorded - len(names), recorded)]


def test_the_budget_holds_with_the_work_in_pieces() -> None:
    # SPEC 15.2: max_bytes is honoured while generations are measured and freed in
    # pieces (the bytes of a generation being freed count until it is).
    budget = 1 << 21
    with aprof.profile(max_bytes=budget, keep="latest") as prof:
        ring = prof._state.ring
        highest = 0
        for i in range(300_000):
            with aprof.record_function("r"):
                pass
            if i % 997 == 0:
                highest = max(highest, ring.held_bytes())
    assert highest <= budget * 1.05
    assert len(prof.events()) + prof.session.dropped_by_kind["ranges"] == 300_000


def test_a_dump_while_a_generation_is_freed_holds_only_the_window(backend: Backend, tmp_path: Any) -> None:
    # SPEC 15.2: a flight recorder's dump taken while the ring frees a generation
    # in pieces holds the latest events, whole, none of the generation let
    # go, and the exact count of what was dropped.
    out: dict[str, Any] = {}

    async def main() -> None:
        async with aprof.flight_recorder(window=3600.0, max_bytes=1 << 20, signal=None) as rec:
            ring = rec.profile._state.ring
            n = 0
            while not (ring._dying and ring._dropped[0]):
                with aprof.record_function(f"r{n}"):
                    pass
                n += 1
                if n % 500 == 0:
                    await backend.checkpoint()
            out["pending"] = len(ring._dying)
            out["snap"] = rec.snapshot()
            out["n"] = n

    backend.run(main)
    snap, n = out["snap"], out["n"]
    assert out["pending"] >= 1
    names = _user(snap)
    assert names == [f"r{i}" for i in range(n - len(names), n)]
    assert len(names) + snap.dropped_by_kind["ranges"] == n


def test_stopping_while_the_ring_works_in_pieces_keeps_counts_exact_and_frees_all() -> None:
    # SPEC 15.2: a stop between the pieces: the session has every kept event and
    # the exact counts; the generations let go are freed at stop.
    with aprof.profile(max_events=8 * 4_096, keep="latest") as prof:
        ring = prof._state.ring
        recorded = _until(lambda: bool(ring._dying) and bool(ring._measuring))
        lists = [lst for g in ring._dying for lst in g.lists.values()]
    assert lists
    assert all(len(lst) == 0 for lst in lists)
    assert not ring._dying
    assert not ring.sealed
    names = _user(prof)
    assert len(names) + prof.session.dropped_by_kind["ranges"] == recorded
    assert names == [f"r{i}" for i in range(recorded - len(names), recorded)]


@pytest.mark.skipif(not C, reason="the extension takes sealed records out of the GC's lists")
def test_sealed_generations_stay_out_of_the_cyclic_gcs_walks(backend: Backend) -> None:
    # SPEC 15.6: a server's ring holds a list and a record for each of tens of
    # thousands of tasks; once sealed and measured, the lists, the finished
    # tasks' records and their steps are not tracked by the collector, so a
    # full collection (a pause every request in flight sees) does not walk
    # them. What the program sees is unchanged.
    seen: dict[str, Any] = {}

    async def child(i: int) -> None:
        with aprof.record_function("c"):
            await backend.checkpoint()

    async def main() -> None:
        async with aprof.profile(max_events=8 * 512, keep="latest") as prof:
            ring = prof._state.ring
            for _ in range(30):
                async with backend.group() as g:
                    for i in range(50):
                        g.start_soon(child, i)
            measured = [g for g in ring.sealed if g.measured]
            seen["lists"] = [lst for g in measured for lst in g.lists.values()]
            # (a task that finished after its generation was measured is
            # left to the collector, which untracks its record itself)
            seen["records"] = [
                r for g in measured for i, r in enumerate(g.task_records) if type(r) in _native.TASK_RECORD_TYPES and i not in g._running
            ]
        seen["kept"] = sum(e.name == "c" for e in prof.events())

    backend.run(main)
    assert seen["lists"]
    assert seen["records"]
    assert not any(gc.is_tracked(lst) for lst in seen["lists"])
    assert not any(gc.is_tracked(r) or gc.is_tracked(r[11]) for r in seen["records"])
    assert seen["kept"] > 0


def test_a_finished_tasks_steps_are_held_at_their_size_and_measured_so(backend: Backend) -> None:
    # SPEC 15.2, issue 19: a finished task's record holds its steps at their
    # size (the C StepLog itself, its room cut to its times, or an array
    # copied to its size), and the budget measures what they hold.
    import sys

    seen: list[Any] = []

    async def child() -> None:
        for _ in range(3):  # three steps: the log has room for eight
            await backend.checkpoint()

    async def main() -> None:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for _ in range(5):
                    g.start_soon(child)
            seen.extend(r for r in prof._state.task_records if type(r) in _native.TASK_RECORD_TYPES)

    backend.run(main)
    assert len(seen) >= 5
    for rec in seen:
        steps = rec[11]
        assert len(steps) % 2 == 0
        assert len(steps) >= 2
        if type(steps).__name__ == "StepLog":
            assert sys.getsizeof(steps) == sys.getsizeof(type(steps)()) + 8 * len(steps)  # fitted, and measured
        else:
            assert sys.getsizeof(steps) >= 8 * len(steps)
    nbytes = _ring._measure_records(seen)[0]
    assert nbytes == sum(sys.getsizeof(r) + sys.getsizeof(r[11]) for r in seen)
    if C and not backend.is_trio:  # a C Task's end, recorded in C
        assert {type(r[11]).__name__ for r in seen} == {"StepLog"}


def test_a_step_log_fits_its_room_to_its_times_unless_a_buffer_is_out() -> None:
    # Issue 19: StepLog.fit cuts its room (four times at first, then twice
    # as much at each growth: eight for five times) to its times and returns
    # it; __sizeof__ counts the room. A buffer handed out pins the room:
    # fit leaves it as it is.
    import sys

    if not C:
        pytest.skip("the StepLog is the extension's")
    step_log = _native.extension.StepLog
    empty = sys.getsizeof(step_log())
    log = step_log()
    for t in range(5):
        log.append(t)
    assert sys.getsizeof(log) == empty + 8 * 8
    view = memoryview(log)
    assert log.fit() is log
    assert sys.getsizeof(log) == empty + 8 * 8  # the buffer is out
    view.release()
    assert log.fit() is log
    assert sys.getsizeof(log) == empty + 5 * 8
    assert list(log) == [0, 1, 2, 3, 4]
    log.append(5)  # it grows again as it did
    assert list(log) == [0, 1, 2, 3, 4, 5]


def test_the_ring_helpers_agree_with_their_twins() -> None:
    # SPEC 15.2: the extension's ring_counts, ring_records and ring_seal, and
    # their pure-Python twins, count and measure alike.
    from array import array

    if not C:
        pytest.skip("no extension: the twins are all there is")

    class Running:
        def __init__(self, steps: Any) -> None:
            self.steps = steps

    def records() -> list[Any]:
        def rec(i: int, nsteps: int) -> tuple[Any, ...]:
            return (i, "t", "asyncio", 1, "c", 10, i, 0, 20, "ok", None, array("Q", range(nsteps)), None, None)

        return [rec(1, 4), Running(array("Q", range(3))), rec(2, 0), rec(3, 7)]

    lists = [[("a", "user_scope", 1, None, -1, 0, None, None, 0, None), (0, 2, 1, None)], [("i", "user_scope", 1, None, -1, 0, None, None, 1, None)]]
    by_lt = dict(enumerate(lists))
    got = _ring._counts(by_lt, records()), _ring._measure_records(records())  # type: ignore[arg-type]
    want = twin(_ring._counts, by_lt, records()), twin(_ring._measure_records, records())
    assert got[0][:4] == want[0][:4] == (1, 1, 4, 2 + 2 + 0 + 4)
    assert [type(r) for r in got[0][4]] == [type(r) for r in want[0][4]] == [Running]
    assert got[1] == want[1]
    assert got[1][1:] == (2 + 0 + 4, [1])
    assert _ring._seal_sealed([list(x) for x in lists]) > 0
    assert twin(_ring._seal_sealed, [list(x) for x in lists]) > 0


def test_a_record_added_to_a_generation_after_it_was_measured_is_counted_when_it_goes() -> None:
    # SPEC 15.2: a thread that took room before a rotation may add its task's
    # record to the generation after it was sealed and measured (it paused in
    # between); when that generation goes, the record is counted, its steps
    # too, and the task, still running, is told it was let go.
    class Late:
        def __init__(self) -> None:
            self.steps = [1, 2, 3, 4, 5]  # two steps and a third one running
            self.let_go_by: list[Any] = []

        def let_go(self, state: Any) -> None:
            self.let_go_by.append(state)

    late = Late()
    with aprof.profile(max_events=8 * 1_024, keep="latest") as prof:
        ring = prof._state.ring
        recorded = _until(lambda: bool(ring.sealed) and ring.sealed[-1].measured)
        gen = ring.sealed[-1]
        gen.task_records.append(late)
        recorded += _until(lambda: gen not in ring.sealed, start=recorded)
        assert ring.dropped()["tasks"] == 1
        assert ring.dropped()["steps"] == 3
        assert late.let_go_by == [prof._state]
    assert prof.session.dropped_by_kind["tasks"] == 1
    assert len(_user(prof)) + prof.session.dropped_by_kind["ranges"] == recorded


def test_the_first_generation_is_sized_by_what_records_hold_not_a_guess(backend: Backend) -> None:
    # SPEC 15.2: a ring by bytes sizes its first generation from its first
    # records, measured: a server's tasks hold several times the bytes per
    # event guessed before anything is measured, and a first generation
    # sized by the guess would hold most of the budget (and cost its
    # rotation that much more).
    budget = 4_000_000
    seen: dict[str, Any] = {}

    async def child(i: int) -> None:
        with aprof.record_function("c"):
            await backend.checkpoint()

    async def main() -> None:
        async with aprof.profile(max_bytes=budget, keep="latest") as prof:
            ring = prof._state.ring
            while not any(g.measured for g in ring.sealed):
                async with backend.group() as g:
                    for i in range(100):
                        g.start_soon(child, i)
            seen["first"] = ring.sealed[0].bytes

    backend.run(main)
    assert seen["first"] <= budget // 8 * 1.5
