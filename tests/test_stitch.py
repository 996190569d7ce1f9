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
            time.sleep(0.01)

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
