"""Step schedules (SPEC 5.6) with torch.profiler's meanings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import aprof

from .tracecheck import validate_trace

A = aprof.ProfilerAction


def torch_reference(step: int, wait: int, warmup: int, active: int, repeat: int, skip_first: int) -> A:
    """torch.profiler.schedule's rule, written out independently."""
    if step < skip_first:
        return A.NONE
    step -= skip_first
    n = wait + warmup + active
    if repeat > 0 and step / n >= repeat:
        return A.NONE
    m = step % n
    if m < wait:
        return A.NONE
    if m < wait + warmup:
        return A.WARMUP
    return A.RECORD if m < n - 1 else A.RECORD_AND_SAVE


@pytest.mark.parametrize(
    "opts",
    [
        {"wait": 1, "warmup": 1, "active": 2, "repeat": 0, "skip_first": 0},
        {"wait": 0, "warmup": 0, "active": 1, "repeat": 3, "skip_first": 2},
        {"wait": 2, "warmup": 0, "active": 3, "repeat": 2, "skip_first": 1},
    ],
)
def test_schedule_matches_torch(opts: dict[str, int]) -> None:
    # SPEC 5.6
    fn = aprof.schedule(**opts)
    assert [fn(i) for i in range(40)] == [torch_reference(i, **opts) for i in range(40)]


@pytest.mark.parametrize(
    ("opts", "name"),
    [
        ({"wait": 0, "warmup": 0, "active": 0}, "active"),
        ({"wait": -1, "warmup": 0, "active": 1}, "wait"),
        ({"wait": 0, "warmup": -2, "active": 1}, "warmup"),
        ({"wait": 0, "warmup": 0, "active": 1, "repeat": -1}, "repeat"),
        ({"wait": 0, "warmup": 0, "active": 1, "skip_first": -1}, "skip_first"),
    ],
)
def test_bad_schedule_names_the_option(opts: dict[str, int], name: str) -> None:
    # SPEC 12, BI-03
    with pytest.raises(ValueError, match=name):
        aprof.schedule(**opts)
    with pytest.raises(TypeError, match="wait"):
        aprof.schedule(wait=1.5, warmup=0, active=1)  # type: ignore[arg-type]


def test_scheduled_profile_records_only_active_steps() -> None:
    # SPEC 5.6: wait and warmup steps are not in the results; each cycle's
    # RECORD steps are, and on_trace_ready runs once per cycle.
    cycles: list[list[str]] = []

    def ready(prof: aprof.profile) -> None:
        cycles.append([e.name for e in prof.events()])

    with aprof.profile(schedule=aprof.schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=ready) as prof:
        for step in range(10):
            with aprof.record_function(f"step{step}"):
                pass
            prof.step()
    assert cycles == [["step2", "step3"], ["step6", "step7"]]
    assert [e.name for e in prof.events()] == ["step6", "step7"]


def test_stop_mid_cycle_delivers_what_was_recorded() -> None:
    # SPEC 5.6: a cycle cut short by stop() still reaches on_trace_ready.
    cycles: list[list[str]] = []
    prof = aprof.profile(
        schedule=aprof.schedule(wait=0, warmup=0, active=3), on_trace_ready=lambda p: cycles.append([e.name for e in p.events()])
    )
    prof.start()
    for step in range(4):
        with aprof.record_function(f"s{step}"):
            pass
        prof.step()
    prof.stop()
    assert cycles == [["s0", "s1", "s2"], ["s3"]]


def test_trace_handler_writes_one_trace_per_cycle(tmp_path: Path) -> None:
    # SPEC 5.6: named as torch.profiler's tensorboard_trace_handler names them.
    out = tmp_path / "traces"
    handler = aprof.trace_handler(out, worker_name="worker0", use_gzip=True)
    with aprof.profile(schedule=aprof.schedule(wait=0, warmup=1, active=1, repeat=3), on_trace_ready=handler) as prof:
        for _ in range(8):
            with aprof.record_function("work"):
                pass
            prof.step()
    files = sorted(out.iterdir())
    assert len(files) == 3
    for f in files:
        assert f.name.startswith("worker0.")
        assert f.name.endswith(".pt.trace.json.gz")
        doc = validate_trace(f)
        assert [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"] == ["work"]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"dir_name": 5}, "dir_name"),
        ({"dir_name": None}, "dir_name"),
        ({"dir_name": "d", "worker_name": 5}, "worker_name"),
        ({"dir_name": "d", "use_gzip": "no"}, "use_gzip"),
        ({"dir_name": "d", "use_gzip": 1}, "use_gzip"),
    ],
)
def test_trace_handler_misuse_names_the_argument(kwargs: dict[str, Any], named: str) -> None:
    # SPEC 5.6, 12 (issue 22 item 3): refused when the handler is made, not
    # when the first cycle ends.
    with pytest.raises(TypeError, match=f"trace_handler: {named}"):
        aprof.trace_handler(**kwargs)


def test_step_and_options_misuse() -> None:
    # SPEC 5.4, 12
    prof = aprof.profile()
    with pytest.raises(RuntimeError, match="not running"):
        prof.step()
    with pytest.raises(TypeError, match="schedule"):
        aprof.profile(schedule=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_trace_ready"):
        aprof.profile(on_trace_ready="x")  # type: ignore[arg-type]


def test_on_trace_ready_without_a_schedule_runs_once_at_stop(tmp_path: Path) -> None:
    # SPEC 5.6 (issue 15 item 1): torch.profiler calls on_trace_ready once,
    # at stop, when there is no schedule; steps alone do not call it.
    seen: list[list[str]] = []
    with aprof.profile(on_trace_ready=lambda p: seen.append([e.name for e in p.events()])) as prof:
        with aprof.record_function("work"):
            pass
        prof.step()
        assert seen == []
    assert seen == [["work"]]

    out = tmp_path / "traces"
    with aprof.profile(on_trace_ready=aprof.trace_handler(out, worker_name="w")):
        with aprof.record_function("written"):
            pass
    (written,) = out.iterdir()
    doc = validate_trace(written)
    assert [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"] == ["written"]


@pytest.mark.parametrize("wait", [0, 1])
def test_a_failing_on_trace_ready_propagates_once_and_the_schedule_goes_on(wait: int) -> None:
    # SPEC 5.6, 12 (issue 15 item 19): a handler that fails once (a full
    # disk) raises from that step() only; later cycles are recorded and
    # handed to it as if nothing had happened, with no internal error.
    cycles: list[list[str]] = []

    def handler(prof: aprof.profile) -> None:
        cycles.append([e.name for e in prof.events()])
        if len(cycles) == 1:
            raise OSError(28, "No space left on device")

    prof = aprof.profile(schedule=aprof.schedule(wait=wait, warmup=0, active=1), on_trace_ready=handler).start()
    failed_at = 1 if wait else 0  # the step that ends the first cycle
    for step in range(6):
        with aprof.record_function(f"s{step}"):
            pass
        if step == failed_at:
            with pytest.raises(OSError, match="No space"):
                prof.step()
        else:
            prof.step()
    with aprof.record_function("last"):
        pass
    prof.stop()
    if wait:
        assert cycles == [["s1"], ["s3"], ["s5"]]
    else:
        assert cycles == [["s0"], ["s1"], ["s2"], ["s3"], ["s4"], ["s5"], ["last"]]
    assert prof.running is False


def test_a_failing_on_trace_ready_at_stop_still_stops() -> None:
    # SPEC 5.4, 12: the error propagates from stop(); the profile is stopped
    # and its results are there.
    def handler(prof: aprof.profile) -> None:
        raise OSError(28, "No space left on device")

    prof = aprof.profile(on_trace_ready=handler).start()
    with aprof.record_function("kept"):
        pass
    with pytest.raises(OSError, match="No space"):
        prof.stop()
    assert prof.running is False
    assert [e.name for e in prof.events()] == ["kept"]
    with pytest.raises(RuntimeError, match="not running"):
        prof.stop()
