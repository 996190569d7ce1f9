"""Loop-block detection (SPEC 7.5), on every backend including uvloop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import aprof

from .tracecheck import validate_trace


@pytest.fixture(autouse=True)
def _cheap_gc() -> Any:
    """A full collection of the whole test session's heap can hold the loop
    longer than these tests' thresholds: a real loop block, but not the one
    under test. Freezing the heap first keeps collections to new objects."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _hog(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_blocking_step_is_recorded_with_its_stack(backend, tmp_path: Path) -> None:
    # SPEC 7.5: a step that holds the loop longer than the threshold is a
    # LOOP_BLOCK range whose stack names the blocking code.
    async def blocker() -> None:
        await backend.sleep(0.01)
        _hog(0.15)

    async def polite() -> None:
        for _ in range(10):
            await backend.sleep(0.01)

    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.03) as prof:
            async with backend.group() as g:
                g.start_soon(blocker)
                g.start_soon(polite)
        return prof

    prof = backend.run(main)
    blocks = [e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]
    assert len(blocks) == 1, blocks
    block = blocks[0]
    # Coarse sanity only: the block covers most of the 150 ms hog.
    assert 0.08e9 < block.duration_ns < 1e9
    assert block.stack is not None
    names = [fn for _, _, fn in block.stack]
    assert names[0] == "_hog"
    assert any(fn.endswith("blocker") for fn in names)
    assert not any("TimedCoroutine" in fn for fn in names)
    if not backend.is_trio:
        assert block.extra["blocked_task"] != "(callback)"
    assert block.track == "event loop blocked"
    prof.export_chrome_trace(tmp_path / "t.json")
    validate_trace(tmp_path / "t.json")


def test_no_block_below_threshold(backend) -> None:
    # SPEC 7.5: short steps are not reported.
    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.5) as prof:
            for _ in range(5):
                _hog(0.005)
                await backend.sleep(0.01)
        return prof

    prof = backend.run(main)
    assert not [e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "0.1", True])
def test_bad_threshold_is_refused(bad: object) -> None:
    # SPEC 12, BI-03: the error names the option.
    with pytest.raises(ValueError, match="loop_block_threshold"):
        aprof.profile(loop_block_threshold=bad)  # type: ignore[arg-type]


def test_watchdog_thread_ends_at_stop_and_is_not_the_programs(backend) -> None:
    # SPEC 7.5, 12, 15.6: the watchdog is aprof's thread, does not outlive
    # the profile (the autouse fixture also checks), and is not among the
    # program's threads (threading.enumerate, threading.active_count).
    import threading

    from aprof._integrations._loop_block import live_watchdogs

    async def main() -> None:
        before = threading.active_count(), [t.name for t in threading.enumerate()]
        async with aprof.profile(loop_block_threshold=0.05):
            await backend.sleep(0.01)
            assert live_watchdogs() == 1
            assert (threading.active_count(), [t.name for t in threading.enumerate()]) == before
        assert live_watchdogs() == 0

    backend.run(main)


def _blocks(prof: aprof.profile) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]


def _task(prof: aprof.profile, track_id: int) -> aprof.FunctionEvent:
    (task,) = [e for e in prof.events() if e.scope is aprof.RecordScope.TASK and e.thread_id == track_id]
    return task


def test_back_to_back_blocks_of_two_tasks_are_two_exact_blocks(backend) -> None:
    # SPEC 7.5: one task's long step followed at once by another's is two
    # blocks, each named after its own task, with the step's exact edges
    # (from the task's recorded steps, not the heartbeat).
    async def first() -> None:
        _hog(0.12)

    async def second() -> None:
        _hog(0.12)

    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.05) as prof:
            async with backend.group() as g:
                g.start_soon(first)
                g.start_soon(second)
        return prof

    prof = backend.run(main)
    # (trio runs the two in either order)
    blocks = sorted(_blocks(prof), key=lambda e: e.extra["coro"])
    assert [b.extra["coro"].rsplit(".", 1)[-1] for b in blocks] == ["first", "second"], blocks
    for block in blocks:
        task = _task(prof, block.extra["task_id"])
        assert task.extra["coro"] == block.extra["coro"]
        assert block.extra["blocked_task"] == task.name
        assert block.name == f"loop blocked by {task.name}"
        flat = task.extra["steps"]
        long_steps = [(a, b) for a, b in zip(flat[::2], flat[1::2], strict=True) if b - a > 0.05e9]
        assert [(block.start_ns, block.end_ns)] == long_steps


def test_a_block_cut_short_by_stop_is_kept(backend) -> None:
    # SPEC 7.5, 5.5: a task that blocks the loop and then stops the profile
    # in the same step: its step runs across stop(), and the block is
    # recorded up to the stop time, not lost.
    holder: list[aprof.profile] = []

    async def blocker_then_stop() -> None:
        await backend.sleep(0.005)
        _hog(0.12)
        holder[0].stop()

    async def main() -> None:
        prof = aprof.profile(loop_block_threshold=0.05)
        holder.append(prof)
        prof.start()
        async with backend.group() as g:
            g.start_soon(blocker_then_stop)

    backend.run(main)
    prof = holder[0]
    (block,) = _blocks(prof)
    assert block.extra["coro"].endswith("blocker_then_stop")
    assert block.end_ns == prof.session.metadata["stop_ns"]
    assert block.duration_ns >= 0.1e9


def test_a_block_by_the_starting_task_just_before_stop_is_kept(backend) -> None:
    # SPEC 7.5: the task that started the profile has no recorded steps;
    # its block right before `async with` ends is still in progress at stop
    # and is recorded from the heartbeat, with the blocking stack.
    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.04) as prof:
            await backend.sleep(0.01)
            _hog(0.2)
        return prof

    prof = backend.run(main)
    (block,) = _blocks(prof)
    assert block.unfinished is False
    assert block.end_ns == prof.session.metadata["stop_ns"]
    assert block.stack is not None
    assert block.stack[0][2] == "_hog"
    assert block.extra["source"] == "heartbeat"
    assert block.extra["samples"], block.extra


def test_a_context_profile_does_not_name_other_tenants_blocks(backend, tmp_path: Path) -> None:
    # SPEC 5.2 (issue 15 item 17): request A profiles itself; request B, a
    # task A never spawned, blocks the loop. A really waited, so the block
    # is kept, but says "work outside this profile": no task name, no stack,
    # no file or function of B's anywhere in A's results or exports.
    async def tenant_b_secret_handler() -> None:
        await backend.sleep(0.03)
        _hog(0.2)

    async def request_a(out: list[aprof.profile]) -> None:
        async with aprof.profile(loop_block_threshold=0.04) as prof:
            for _ in range(20):
                await backend.sleep(0.01)
        out.append(prof)

    async def main() -> aprof.profile:
        out: list[aprof.profile] = []
        async with backend.group() as g:
            g.start_soon(tenant_b_secret_handler)
            g.start_soon(request_a, out)
        return out[0]

    prof = backend.run(main)
    (block,) = _blocks(prof)
    assert block.name == "loop blocked by work outside this profile"
    assert block.extra["blocked_task"] == "work outside this profile"
    assert block.stack is None
    assert "samples" not in block.extra
    assert block.duration_ns > 0.1e9
    prof.export_chrome_trace(tmp_path / "a.json")
    prof.save(tmp_path / "a.aprof")
    text = (tmp_path / "a.json").read_text()
    assert "tenant_b_secret_handler" not in text
    assert "_hog" not in text
    assert "test_loop_block.py" not in text
    assert "tenant_b" not in prof.key_averages().table()


def test_blocks_outside_a_global_profile_are_still_named(backend) -> None:
    # SPEC 5.3, 7.5: a global profile owns every task, so the same block is
    # named with its stack.
    async def blocker() -> None:
        await backend.sleep(0.03)
        _hog(0.15)

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(blocker)

    prof = aprof.profile(loop_block_threshold=0.04, scope="global")

    async def run_profiled() -> None:
        prof.start()
        try:
            await main()
        finally:
            prof.stop()

    backend.run(run_profiled)
    (block,) = _blocks(prof)
    assert block.extra["coro"].endswith("blocker")
    assert block.stack is not None
    assert any(fn == "_hog" for _, _, fn in block.stack)


@pytest.mark.parametrize("runtime", ["asyncio", "trio"])
def test_a_watch_ends_with_its_loop(runtime: str) -> None:
    # SPEC 7.5, 12: a global profile (aprof run, pytest --aprof) over a
    # program that runs many loops one after the other keeps one watchdog
    # per live loop, not one per loop ever run.
    import asyncio

    from aprof._integrations._loop_block import live_watchdogs as watchdogs

    async def block() -> None:
        await asyncio.sleep(0.001)
        _hog(0.06)

    async def trio_block() -> None:
        import trio

        await trio.sleep(0.001)
        _hog(0.06)

    prof = aprof.profile(scope="global", loop_block_threshold=0.02)
    prof.start()
    try:
        alive = []
        for _ in range(8):
            if runtime == "asyncio":
                asyncio.run(block())
            else:
                import trio

                trio.run(trio_block)
            deadline = time.monotonic() + 5.0  # a few polls: the watchdog sees its loop is gone
            while watchdogs() > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            alive.append(watchdogs())
    finally:
        prof.stop()
    assert max(alive) <= 1, alive
    blocks = [e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK]
    assert len(blocks) == 8


def test_a_sample_read_across_a_deschedule_is_dropped() -> None:
    # SPEC 7.5: a sample is a stack and a time; if the watchdog is
    # descheduled while reading the loop thread's frames, the loop runs on
    # and the two may belong to different steps (the sample would go to
    # the wrong block, or name the loop's own frames as a block's culprit).
    # Such a sample is dropped; a prompt one is kept.
    import threading

    from aprof._integrations._loop_block import LoopBlocks, _Watch

    blocks = LoopBlocks(None, 0.04, global_scope=True)  # type: ignore[arg-type]
    me = threading.get_ident()

    def prompt(frames: list[object]) -> tuple[str | None, bool]:
        return "t", True

    def descheduled(frames: list[object]) -> tuple[str | None, bool]:
        time.sleep(0.03)  # the watchdog loses the CPU mid-read
        return "t", True

    never = lambda: False  # noqa: E731
    # (this test's own read can be descheduled on a busy machine too: a few tries)
    kept = next((s for s in (_Watch(blocks, me, prompt, never, never)._sample() for _ in range(50)) if s is not None), None)
    assert kept is not None
    assert any(f[2].endswith("test_a_sample_read_across_a_deschedule_is_dropped") for f in kept.frames)
    assert _Watch(blocks, me, descheduled, never, never)._sample() is None


def test_an_idle_sample_read_across_a_deschedule_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 7.5: an idle sample (the loop in its I/O wait) only says a stall
    # was no block; it is kept however long its reading took, or a busy
    # machine's late heartbeat would become a block with nothing sampled.
    import threading

    from aprof._integrations import _loop_block

    monkeypatch.setattr(_loop_block, "_is_idle", lambda frames: True)
    blocks = _loop_block.LoopBlocks(None, 0.04, global_scope=True)  # type: ignore[arg-type]

    def descheduled(frames: list[object]) -> tuple[str | None, bool]:
        time.sleep(0.03)
        return None, True

    never = lambda: False  # noqa: E731
    sample = _loop_block._Watch(blocks, threading.get_ident(), descheduled, never, never)._sample()
    assert sample is not None
    assert sample.idle


def test_a_blocks_stack_is_the_stack_sampled_most() -> None:
    # SPEC 7.5: one stray sample (the first) does not name the block.
    from aprof._integrations._loop_block import LoopBlocks, _Block, _Sample

    blocks = LoopBlocks(None, 0.04, global_scope=True)  # type: ignore[arg-type]
    stray = (("loop.py", 1, "run_once"),)
    hot = (("app.py", 25, "verify_password"), ("app.py", 36, "handle"))
    block = _Block(0, 100, 1, "step", "login-1", 7, "login")
    block.samples = [_Sample(10, 1, stray, "login-1", True, False)] + [_Sample(t, 1, hot, "login-1", True, False) for t in (20, 30)]
    name, stack, extra = block.describe(blocks)
    assert name == "loop blocked by login-1"
    assert stack == hot
    assert extra["samples"][0] == [2, [list(f) for f in hot]]
    assert extra["samples"][1] == [1, [list(f) for f in stray]]
