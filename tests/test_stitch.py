"""Who awaits whom (issue 16 item 3, the viewers' side): a task's waits
charged to the child task or executor job that held it up, in the stitched
timelines behind the HTML report's "who awaits whom" flame graph and the
speedscope export's stitched profiles (SPEC 7.2, 7.3, 7.4, 9.2).

Every scenario runs on every backend. The assertions are about structure
(which frames hang under which), never about how long anything took.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._post._stitch import QUEUED, WAITING, merge_tree, stitched_timelines

from .speedscopecheck import validate_speedscope


def paths(tree: dict[str, Any]) -> set[tuple[str, ...]]:
    """Every call path of a merged tree, below its ``all`` root."""
    out: set[tuple[str, ...]] = set()
    todo = [((), tree)]
    while todo:
        prefix, node = todo.pop()
        for kid in node["children"]:
            path = (*prefix, kid["name"])
            out.add(path)
            todo.append((path, kid))
    return out


def has(tree_paths: set[tuple[str, ...]], *frames: str) -> bool:
    """Whether ``frames`` occur in this order, consecutively, on some path."""
    n = len(frames)
    return any(p[i : i + n] == frames for p in tree_paths for i in range(len(p) - n + 1))


def task(fn: Any) -> str:
    """A task's frame: the summary's name for it, after its coroutine."""
    return f"task {fn.__qualname__}"


def check_totals(node: dict[str, Any]) -> None:
    """A node's time covers its children's: the tree can be drawn."""
    assert sum(k["total"] for k in node["children"]) <= node["total"]
    for k in node["children"]:
        check_totals(k)


async def slow_child(backend) -> None:
    with aprof.record_function("slow work"):
        await backend.sleep(0.03)


async def fast_child(backend) -> None:
    with aprof.record_function("fast work"):
        await backend.checkpoint()


def test_the_slowest_child_hangs_under_its_parents_wait(backend) -> None:
    # A fan-out with one slow child: the parent's wait is the slow child's
    # time; the fast children did not hold the parent up.
    async def parent() -> None:
        with aprof.record_function("fan out"):
            async with backend.group() as g:
                g.start_soon(fast_child, backend)
                g.start_soon(slow_child, backend)
                g.start_soon(fast_child, backend)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    prof = backend.run(main)
    timelines = stitched_timelines(prof.session)
    tree = merge_tree(timelines)
    check_totals(tree)
    p = paths(tree)
    assert has(p, task(parent), "fan out", task(slow_child), "slow work", WAITING), sorted(p)
    assert not any(task(fast_child) in path for path in p)
    for _, segs in timelines:  # contiguous, ordered, never overlapping
        assert all(s0 < s1 for s0, s1, _ in segs)
        assert all(a[1] <= b[0] for a, b in zip(segs, segs[1:], strict=False))


def test_an_awaited_executor_job_shows_its_queue_and_its_ranges(backend) -> None:
    # A task awaiting work in a thread: the job's frames hang under the wait.
    def blocking() -> None:
        with aprof.record_function("in thread"):
            # Long enough that the thread's hand-back to the loop (a wake-up
            # of its own, milliseconds on a loaded machine) stays within the
            # rule's quarter of the job's time.
            time.sleep(0.1)

    async def parent() -> None:
        with aprof.record_function("handler"):
            await backend.to_thread(blocking)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    prof = backend.run(main)
    tree = merge_tree(stitched_timelines(prof.session))
    check_totals(tree)
    p = paths(tree)
    [job] = [e for e in prof.events() if e.scope is aprof.RecordScope.EXECUTOR]
    label = f"executor {job.name}"
    assert has(p, task(parent), "handler", label, "in thread"), sorted(p)
    queued = [path for path in p if path[-1] == QUEUED]
    assert all(path[-2] == label for path in queued)  # queueing, when measurable, sits in the job


def test_a_child_that_finished_long_before_its_parent_woke_is_not_charged(backend) -> None:
    # The parent sleeps; a child it spawned ends at once, and the loop then
    # sits idle until the sleep ends: the child did not wake the parent.
    async def parent() -> None:
        async with backend.group() as g:
            g.start_soon(fast_child, backend)
            with aprof.record_function("nap"):
                await backend.sleep(0.03)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    prof = backend.run(main)
    p = paths(merge_tree(stitched_timelines(prof.session)))
    assert has(p, task(parent), "nap", WAITING)
    assert not any(task(fast_child) in path for path in p), sorted(p)


def test_speedscope_opens_on_the_stitched_profile(backend, tmp_path: Path) -> None:
    # SPEC 9.2: the stitched view is a speedscope profile that passes the
    # published schema, and the file opens on it.
    async def parent() -> None:
        with aprof.record_function("fan out"):
            async with backend.group() as g:
                g.start_soon(slow_child, backend)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    prof = backend.run(main)
    out = tmp_path / "p.speedscope.json"
    prof.export_speedscope(out)
    doc = validate_speedscope(out)
    frames = [f["name"] for f in doc["shared"]["frames"]]
    active = doc["profiles"][doc["activeProfileIndex"]]
    assert active["name"].endswith(" [who awaits whom]")
    opened = [frames[e["frame"]] for e in active["events"] if e["type"] == "O"]
    order = [opened.index(f) for f in (task(parent), "fan out", task(slow_child), "slow work")]
    assert order == sorted(order)


def _session(hog: bool) -> Any:
    """A parent task (track 1) waiting on a child it spawned (track 2), built
    from a compact document so the times are exact. Milliseconds:

    parent runs [0, 1] and [30, 31]; the child (spawned at 0.5) runs [2, 3]
    and [19, 20] and ends at 20; with ``hog``, another task keeps the loop
    busy from 20 to 30."""
    from aprof._post._compact import session_from_compact

    ms = 1_000_000
    tracks = [
        {"id": 1, "name": "Task-1", "kind": "asyncio", "os_thread_id": 7, "node_id": 0, "steps": [0, 1 * ms, 30 * ms, 31 * ms]},
        {"id": 2, "name": "Task-2", "kind": "asyncio", "os_thread_id": 7, "node_id": 0, "steps": [2 * ms, 3 * ms, 19 * ms, 20 * ms]},
    ]
    events = [0, 0, 31 * ms, -1, 0, 0, 0, 0, 1, ms // 2, 20 * ms - ms // 2, -1, 1, 0, 0, 1]
    details: list[dict[str, Any]] = [
        {"extra": {"coro": "parent", "spawn_ns": 0, "outcome": "returned"}},
        {"forward_thread_id": 1, "sequence_nr": 1, "extra": {"coro": "child", "spawn_ns": ms // 2, "outcome": "returned"}},
    ]
    if hog:
        tracks.append({"id": 3, "name": "Task-3", "kind": "asyncio", "os_thread_id": 7, "node_id": 0, "steps": [20 * ms, 30 * ms]})
        events += [2, 20 * ms, 10 * ms, -1, 2, 0, 0, 2]
        details.append({"extra": {"coro": "hog", "spawn_ns": 20 * ms, "outcome": "returned"}})
    doc = {
        "format": "aprof-compact", "version": 1, "metadata": {"start_ns": 0, "stop_ns": 31 * ms},
        "names": ["Task-1", "Task-2", "Task-3"], "scopes": ["task"], "tracks": tracks, "events": events, "details": details,
    }  # fmt: skip
    return session_from_compact(doc)


def test_a_task_ready_behind_a_busy_loop_is_not_waiting() -> None:
    # The child woke its parent at 20 ms, but other work held the loop until
    # 30: the parent was ready, not waiting (CPU starvation shows).
    from aprof._post._stitch import READY

    [(track, segs), *_] = stitched_timelines(_session(hog=True))
    assert track.id == 1
    ms = 1_000_000
    charged = [(a, b) for a, b, f in segs if f[:2] == ("task parent", "task child")]
    assert (charged[0][0], charged[-1][1]) == (1 * ms, 20 * ms)  # the child's part of the wait
    assert (20 * ms, 30 * ms, ("task parent", READY)) in segs


def test_a_child_ending_long_before_an_idle_parent_woke_is_not_charged() -> None:
    # Without the hog the loop sat idle from 20 to 30 ms: the parent woke for
    # some other reason (a sleep), so the wait stays its own.
    [(track, segs), *_] = stitched_timelines(_session(hog=False))
    assert track.id == 1
    ms = 1_000_000
    assert (1 * ms, 30 * ms, ("task parent", WAITING)) in segs
    assert not any("task child" in f for _, _, f in segs)


def test_work_spawned_outside_the_ranges_of_a_thread_without_steps_is_a_root(backend) -> None:
    # The task that starts an in-code profile has no recorded steps; once it
    # has a track (it recorded a range), what it spawns outside its ranges
    # cannot be charged to a wait of its, and must still be in the view.
    async def child() -> None:
        with aprof.record_function("child work"):
            await backend.sleep(0.005)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("setup"):
                pass
            async with backend.group() as g:  # no range open here
                g.start_soon(child)
                g.start_soon(child)
        return prof

    prof = backend.run(main)
    p = paths(merge_tree(stitched_timelines(prof.session)))
    assert ("setup",) in p
    assert has(p, task(child), "child work"), sorted(p)


def test_a_deep_chain_keeps_its_outermost_frames_and_all_its_time() -> None:
    # SPEC 9.2: 2,000 nested ranges (past Python's recursion limit) stitch
    # to paths of at most MAX_FRAMES frames, outermost first; time below the
    # cut counts in the deepest kept frame, so the root's total is whole.
    import contextlib

    from aprof._post._stitch import MAX_FRAMES

    with aprof.profile() as prof, contextlib.ExitStack() as stack:
        for i in range(2000):
            stack.enter_context(aprof.record_function(f"level {i}"))
    timelines = stitched_timelines(prof.session)
    frames = [f for _, segs in timelines for _, _, f in segs]
    assert max(len(f) for f in frames) == MAX_FRAMES
    assert all(f[: min(len(f), 3)] == ("level 0", "level 1", "level 2")[: len(f)] for f in frames)
    tree = merge_tree(timelines)
    outer = next(e for e in prof.events() if e.name == "level 0")
    assert tree["total"] == outer.end_ns - outer.start_ns


def test_the_c_segment_walk_matches_the_python_twin(backend) -> None:
    # SPEC 14: stitch_segments in C and _range_segments in Python agree,
    # frame for frame, on every track and on windows cutting ranges.
    from aprof._core import _native
    from aprof._post import _stitch

    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1 or not built)")
    from .test_lod import mixed_profile

    session = mixed_profile(backend).session
    st = _stitch._Stitcher(session)
    assert st.labels
    for rows in st.nested.values():
        starts = [session._table.start[i] for i in rows]
        ends = [session._table.end[i] for i in rows]
        lo, hi = min(starts), max(ends)
        for a, b in ((lo, hi), (lo + (hi - lo) // 3, hi - (hi - lo) // 3), (hi, hi + 10)):
            want = _stitch._range_segments([session._table.view(i) for i in rows], a, b)
            assert _stitch.range_segments(session._table, rows, a, b, st.labels) == want
    assert _stitch.stitched_timelines(session)
