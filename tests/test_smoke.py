"""End to end on every backend: ranges in a profile, on the right tracks."""

from __future__ import annotations

from pathlib import Path

import aprof

from .tracecheck import validate_trace


def test_profile_records_ranges_per_task(backend, tmp_path: Path) -> None:
    # SPEC 5.2, 6.2, 9.1
    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                async with backend.group() as g:
                    for i in range(3):
                        g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    events = [e for e in prof.events() if e.scope is aprof.RecordScope.USER_SCOPE]
    assert sorted(e.name for e in events) == ["child-0", "child-1", "child-2", "parent"]
    parent = next(e for e in events if e.name == "parent")
    children = [e for e in events if e.name.startswith("child")]
    assert len({e.thread_id for e in children} | {parent.thread_id}) == 4
    assert all(not e.is_async and not e.unfinished for e in events)
    # SPEC 7.1, 7.2: each child task is a TASK range on its own track, linked to the spawner.
    tasks = [e for e in prof.events() if e.scope is aprof.RecordScope.TASK]
    assert len(tasks) == 3
    for c in children:
        task = next(t for t in tasks if t.thread_id == c.thread_id)
        assert c.parent is task
        assert task.forward_thread_id == parent.thread_id
        assert task.parent is parent
        assert task.extra["outcome"] == "returned"
        assert task.running_ns is not None
        assert task.waiting_ns is not None
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")
