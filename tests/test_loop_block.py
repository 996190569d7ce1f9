"""Loop-block detection (SPEC 7.5), on every backend including uvloop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import aprof

from .tracecheck import validate_trace


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


def test_watchdog_thread_ends_at_stop(backend) -> None:
    # SPEC 7.5, 12: the watchdog is aprof's thread and does not outlive the profile
    # (the autouse fixture also checks for aprof threads).
    import threading

    async def main() -> None:
        async with aprof.profile(loop_block_threshold=0.05):
            await backend.sleep(0.01)
            assert any(t.name == "aprof-loop-watchdog" for t in threading.enumerate())
        assert not any(t.name == "aprof-loop-watchdog" and t.is_alive() for t in threading.enumerate())

    backend.run(main)
