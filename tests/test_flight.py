"""The flight recorder (issue 19 item 2): always on, dumps its last seconds.

``aprof.flight_recorder`` records into a ring and, on a call, a signal, a
slow request or a remote command, writes the last ``window`` seconds as a
normal file without stopping: only complete events of that window, with the
tracks they need; atomically, reporting a failure once and recording on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._post._readers import read_profile

from .conftest import Backend
from .tracecheck import validate_trace


def _wait_for(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _user(session: aprof.Session) -> list[str]:
    return [e.name for e in session.events() if e.scope == aprof.RecordScope.USER_SCOPE]


def test_a_dump_holds_the_window_complete_events_only_and_recording_goes_on(tmp_path: Path) -> None:
    # SPEC 15.2
    with aprof.flight_recorder(window=0.2, max_bytes=4_000_000, signal=None) as rec:
        with aprof.record_function("old"):
            pass
        time.sleep(0.3)
        with aprof.record_function("open"):  # still open at the dump
            with aprof.record_function("recent"):
                pass
            out = rec.dump(tmp_path / "d.json")
        with aprof.record_function("after"):
            pass
        second = rec.snapshot()
    trace = validate_trace(out)
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert "recent" in names
    assert "old" not in names
    assert "open" not in names
    meta = trace["otherData"]
    assert meta["dropped"] == 0
    assert "after" in _user(second)
    assert "open" in _user(second)
    assert set(_user(rec.session)) >= {"old", "open", "recent", "after"}  # the profile recorded on


def test_every_format_by_suffix_opens(tmp_path: Path) -> None:
    # SPEC 15.2
    with aprof.flight_recorder(signal=None) as rec:
        with aprof.record_function("x"):
            pass
        paths = [rec.dump(tmp_path / f"d.{ext}") for ext in ("json.gz", "aprof", "html", "speedscope.json")]
    assert [e.name for e in aprof.load(paths[1]).events()] == ["x"]
    assert "x" in _user(read_profile(paths[0]))
    assert paths[2].read_text().lower().startswith("<!doctype html>")
    assert read_profile(paths[3]).events()


def test_a_dump_of_the_whole_ring_leaves_out_only_the_events_still_open() -> None:
    # SPEC 15.2: a window longer than the ring keeps every ended event and
    # drops the open ones (EventTable.drop); a child of an open range loses
    # its parent, an ended range keeps its args, the metadata counts all.
    with aprof.flight_recorder(window=3600.0, max_bytes=4_000_000, signal=None) as rec:
        with aprof.record_function("before", args="b=1"):
            pass
        with aprof.record_function("open"):  # still open at the dump
            with aprof.record_function("inner", args="i=2"):
                pass
            with aprof.record_function("open too"):
                snap = rec.snapshot()
                with aprof.record_function("inside"):
                    pass
        with aprof.record_function("after", args="a=3"):
            pass
        second = rec.snapshot()
    events = {e.name: e for e in snap.events()}
    assert set(_user(snap)) == {"before", "inner"}
    assert not [e for e in snap.events() if e.unfinished]
    assert events["before"].args == "b=1"
    assert events["inner"].args == "i=2"
    assert events["inner"].parent is None  # its parent was open: not in the dump
    assert snap.metadata["flight_recorder"]["events_in_ring"] == len(snap._table) + 2
    assert set(_user(second)) == {"before", "open", "inner", "open too", "inside", "after"}
    assert {e.name: e.args for e in second.events() if e.args} == {"before": "b=1", "inner": "i=2", "after": "a=3"}


def test_on_every_backend_a_dump_shows_tasks_on_their_tracks(backend: Backend, tmp_path: Path) -> None:
    # SPEC 15.2
    async def child(i: int) -> None:
        with aprof.record_function(f"work{i}"):
            await backend.sleep(0.001)

    async def main() -> Path:
        async with aprof.flight_recorder(window=5.0, max_bytes=4_000_000, signal=None) as rec:
            async with backend.group() as g:
                for i in range(5):
                    g.start_soon(child, i)
            return rec.dump(tmp_path / "d.aprof")

    s = aprof.load(backend.run(main))
    work = [e for e in s.events() if e.name.startswith("work")]
    assert len(work) == 5
    tasks = {e.thread_id for e in s.events() if e.scope == aprof.RecordScope.TASK}
    assert {e.thread_id for e in work} <= tasks


def test_the_recorder_is_invisible_to_the_program(tmp_path: Path) -> None:
    # SPEC 15.6: no thread the program can see (its dump thread is a bare
    # one), and none left after stop.
    before = threading.enumerate()
    with aprof.flight_recorder(signal=None, dump_dir=tmp_path) as rec:
        assert rec.trigger("test") is True  # the dump thread runs
        _wait_for(lambda: len(rec.dumps) == 1)
        assert threading.enumerate() == before
        assert threading.active_count() == len(before)
    assert threading.enumerate() == before


def test_only_one_flight_recorder_runs_at_a_time() -> None:
    # SPEC 15.2
    with aprof.flight_recorder(signal=None):
        with pytest.raises(RuntimeError, match="already running"):
            aprof.flight_recorder(signal=None).start()
    with aprof.flight_recorder(signal=None):  # the first one's stop freed the place
        pass


def test_bad_options_name_the_option() -> None:
    # SPEC 15.2
    for kwargs, message in [
        ({"window": 0}, "window"),
        ({"slow_request": -1}, "slow_request"),
        ({"dump_format": "xml"}, "dump_format"),
        ({"max_dumps_per_minute": 0}, "max_dumps_per_minute"),
        ({"max_bytes": 10}, "max_bytes"),
    ]:
        with pytest.raises(ValueError, match=message):
            aprof.flight_recorder(**kwargs)


def test_a_failed_dump_keeps_the_previous_file_and_the_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 15.2: Atomic write: a full disk (the rename of the finished temporary file
    # fails) leaves the file already there as it was, and no temporary file.
    from aprof._export import _files

    target = tmp_path / "d.json"
    with aprof.flight_recorder(signal=None) as rec:
        with aprof.record_function("first"):
            pass
        rec.dump(target)
        before = target.read_bytes()

        def full_disk(src: str, dst: str) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(_files.os, "replace", full_disk)
            with aprof.record_function("second"):
                pass
            with pytest.raises(OSError, match="No space left"):
                rec.dump(target)
        assert target.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]
        with aprof.record_function("later"):
            pass
        assert "later" in _user(rec.snapshot())


def test_an_automatic_dump_that_fails_warns_once_and_records_on(tmp_path: Path) -> None:
    # SPEC 15.2
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with aprof.flight_recorder(signal=None, dump_dir=blocker / "sub", max_dumps_per_minute=10) as rec:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert rec.trigger("test")
            _wait_for(lambda: rec.last_error is not None)
            assert rec.trigger("test")
            _wait_for(lambda: not rec._pending)
            time.sleep(0.2)
        failed = [w for w in caught if issubclass(w.category, aprof.AprofWarning) and "failed" in str(w.message)]
        assert len(failed) == 1
        assert isinstance(rec.last_error, OSError)
        with aprof.record_function("still"):
            pass
        assert "still" in _user(rec.snapshot())


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 here")
def test_sigusr2_dumps_into_dump_dir_and_restores_the_handler(tmp_path: Path) -> None:
    # SPEC 15.2
    before = signal.getsignal(signal.SIGUSR2)
    with aprof.flight_recorder(dump_dir=tmp_path / "dumps") as rec:
        with aprof.record_function("before the signal"):
            pass
        os.kill(os.getpid(), signal.SIGUSR2)
        _wait_for(lambda: len(rec.dumps) == 1)
        # a second signal while the first dump may still be running
        os.kill(os.getpid(), signal.SIGUSR2)
        _wait_for(lambda: len(rec.dumps) + rec.skipped == 2)
    assert signal.getsignal(signal.SIGUSR2) == before
    files = sorted((tmp_path / "dumps").iterdir())
    assert files
    assert all(f.name.startswith(f"aprof-flight-{os.getpid()}-") for f in files)
    assert oct((tmp_path / "dumps").stat().st_mode & 0o777) == oct(0o700)
    trace = validate_trace(files[0])
    assert trace["otherData"]["producer"] == "aprof"
    assert "before the signal" in {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}


def test_the_rate_limit_counts_what_it_skips(tmp_path: Path) -> None:
    # SPEC 15.2
    with aprof.flight_recorder(signal=None, dump_dir=tmp_path, max_dumps_per_minute=2) as rec:
        queued = [rec.trigger("test") for _ in range(5)]
        _wait_for(lambda: len(rec.dumps) == 2)
    assert queued == [True, True, False, False, False]
    assert rec.skipped == 3


def test_dumps_from_two_threads_at_once_and_while_stopping(tmp_path: Path) -> None:
    # SPEC 15.2
    errors: list[BaseException] = []
    written: list[Path] = []
    rec = aprof.flight_recorder(signal=None, scope="global").start()
    stop = threading.Event()

    def dumper(k: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                written.append(rec.dump(tmp_path / f"t{k}-{i}.json"))
            except RuntimeError as exc:  # stopped under it: said clearly
                if "not running" not in str(exc):
                    errors.append(exc)
                return
            except BaseException as exc:
                errors.append(exc)
                return
            i += 1

    def work() -> None:
        for _ in range(2_000):
            with aprof.record_function("w"):
                pass

    threads = [threading.Thread(target=dumper, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    work()
    _wait_for(lambda: len(written) >= 2)
    rec.stop()
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors
    for p in written:
        validate_trace(p)
    with pytest.raises(RuntimeError, match="not running"):
        rec.dump(tmp_path / "late.json")


def test_a_slow_request_through_the_middleware_dumps_the_ring(backend: Backend, tmp_path: Path) -> None:
    # SPEC 15.2
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        with aprof.record_function("handler"):
            await backend.sleep(0.08 if scope["path"] == "/slow" else 0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = aprof.ProfilerMiddleware(app, for_flight_recorder=True)

    async def call(path: str) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            pass

        await mw({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}, receive, send)

    async def main() -> aprof.flight_recorder:
        async with aprof.flight_recorder(signal=None, slow_request=0.05, dump_dir=tmp_path, dump_format="aprof") as rec:
            await call("/fast")
            assert not rec.dumps
            await call("/slow")
            await backend.sleep(0)
            _wait_for(lambda: len(rec.dumps) == 1)
        return rec

    rec = backend.run(main)
    s = aprof.load(rec.dumps[0])
    names = [e.name for e in s.events()]
    assert "GET /slow" in names
    assert "GET /fast" in names
    assert names.count("handler") == 2
    trigger = s.metadata["flight_recorder"]["trigger"]
    assert trigger["reason"] == "slow request"
    assert trigger["request"] == "GET /slow"
    assert trigger["duration_ns"] > 50_000_000


def test_a_loop_block_longer_than_the_threshold_dumps_the_ring(backend: Backend, tmp_path: Path) -> None:
    # SPEC 15.2
    async def main() -> aprof.flight_recorder:
        async with aprof.flight_recorder(signal=None, slow_loop_block=0.05, dump_dir=tmp_path, dump_format="aprof") as rec:
            with aprof.record_function("before"):
                await backend.sleep(0.03)
            assert not rec.dumps
            time.sleep(0.2)  # holds the loop
            for _ in range(50):
                await backend.sleep(0.01)  # the heartbeat comes back
                if rec.dumps:
                    break
            _wait_for(lambda: len(rec.dumps) == 1)
        return rec

    rec = backend.run(main)
    s = aprof.load(rec.dumps[0])
    trigger = s.metadata["flight_recorder"]["trigger"]
    assert trigger["reason"] == "loop block"
    assert trigger["duration_ns"] > 150_000_000
    assert "before" in _user(s)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 here")
def test_a_signal_during_a_dump_waits_its_turn(tmp_path: Path) -> None:
    # SPEC 15.2: The handler takes no lock: a signal that arrives while a dump holds
    # the recorder (here: held by hand) is written after it, and the
    # program is not held up.
    with aprof.flight_recorder(dump_dir=tmp_path) as rec:
        with aprof.record_function("r"):
            pass
        with rec._dump_lock:  # a dump in progress
            os.kill(os.getpid(), signal.SIGUSR2)
            t0 = time.monotonic()
            for _ in range(10):
                with aprof.record_function("meanwhile"):
                    time.sleep(0.02)
            assert time.monotonic() - t0 < 5
            assert not rec.dumps
        _wait_for(lambda: len(rec.dumps) == 1)
    assert "meanwhile" in {e["name"] for e in validate_trace(rec.dumps[0])["traceEvents"] if e.get("ph") == "X"}


def test_a_snapshot_of_many_tasks_leaves_the_cyclic_gc_little_to_walk() -> None:
    # SPEC 15.6: a dump runs beside the program. The session it builds holds
    # a track, steps, a spawn site and a record per task: on the cyclic GC's
    # lists, tens of thousands of them set off full collections of the
    # program's whole heap while it dumps. Plain data is taken off them.
    import asyncio
    import gc

    from .conftest import require_c_extension

    require_c_extension()
    from aprof._core import _native

    if _native.extension is None:
        pytest.skip("APROF_PURE_PYTHON=1: taking plain data off the GC's lists is the extension's (untrack_acyclic)")
    tasks = 3000

    async def request() -> None:
        with aprof.record_function("handle"):
            with aprof.record_function("step"):
                pass

    async def main() -> tuple[int, aprof.Session]:
        async with aprof.flight_recorder(window=60.0, max_bytes=20_000_000, signal=None) as rec:
            await asyncio.gather(*(request() for _ in range(tasks)))
            gc.collect()
            before = len(gc.get_objects())
            s = rec.snapshot()
            return len(gc.get_objects()) - before, s

    grown, s = asyncio.run(main())
    assert sum(1 for e in s.events() if e.scope == aprof.RecordScope.TASK) == tasks
    assert sum(1 for e in s.events() if e.name == "handle") == tasks
    assert gc.isenabled()
    assert grown < tasks // 4, f"the snapshot of {tasks} tasks left {grown} objects on the GC's lists"


def test_untrack_acyclic_takes_off_plain_data_only() -> None:
    # The helper behind the test above: an object goes off the cyclic GC's
    # lists only when nothing it refers to is on them.
    import gc

    from .conftest import require_c_extension

    ext = require_c_extension()
    ints = [1, 2, 3]
    names = {"a": "x", "steps": ints}
    holder = [object.__new__(type("Held", (), {}))]  # refers to a tracked object
    cycle: list[Any] = []
    cycle.append(cycle)
    ext.untrack_acyclic(ints, names, holder, cycle)
    assert not gc.is_tracked(ints)
    assert not gc.is_tracked(names)  # its list went first
    assert gc.is_tracked(holder)
    assert gc.is_tracked(cycle)
    names["later"] = [holder]  # a dict re-tracks itself when given a tracked value
    assert gc.is_tracked(names)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def early_burn() -> None:
    _burn(0.15)


def late_burn() -> None:
    _burn(0.15)


def _stacks(session: aprof.Session) -> list[str]:
    samples = session.samples
    assert samples is not None
    return [" ".join(samples.stack(i)) for i in range(len(samples))]


def test_a_sampling_recorders_dump_holds_the_windows_samples_and_sampling_goes_on() -> None:
    # Issue 19 item 2 with SPEC 8.4: a flight recorder can sample too; a dump
    # holds the samples of its window (whole, oldest first), and the sampler
    # runs on after it.
    with aprof.flight_recorder(window=0.3, sample_interval=0.001, signal=None) as rec:
        early_burn()
        time.sleep(0.4)
        late_burn()
        first = rec.snapshot()
        late_burn()
        second = rec.snapshot(window=10.0)
    stacks = _stacks(first)
    assert any("late_burn" in s for s in stacks)
    assert not any("early_burn" in s for s in stacks)
    samples = first.samples
    assert samples is not None
    assert samples.time_ns == sorted(samples.time_ns)
    assert first.metadata["samples"]["count"] == len(samples)
    later = _stacks(second)
    assert any("early_burn" in s for s in later)
    assert sum("late_burn" in s for s in later) > sum("late_burn" in s for s in stacks)
    final = rec.session.samples
    assert final is not None
    assert len(final) >= len(later)  # the profile's own samples, at stop


def test_on_every_backend_a_dumps_samples_are_charged_to_their_task(backend: Backend, tmp_path: Path) -> None:
    # Issue 19: what a slow request did, from its dump: the samples of a
    # task's CPU-bound stretch are on that task's track.
    async def hot_handler() -> None:
        with aprof.record_function("hot"):
            _burn(0.2)
        await backend.sleep(0)

    async def main() -> Path:
        async with aprof.flight_recorder(window=5.0, sample_interval=0.001, signal=None) as rec:
            async with backend.group() as g:
                g.start_soon(hot_handler)
            return rec.dump(tmp_path / "d.aprof")

    s = aprof.load(backend.run(main))
    samples = s.samples
    assert samples is not None
    hot_task = {e.thread_id for e in s.events() if e.name == "hot"}
    assert len(hot_task) == 1
    charged = {samples.thread_id[i] for i in range(len(samples)) if "hot_handler" in " ".join(samples.stack(i))}
    assert charged == hot_task


def test_a_sampling_recorder_checks_its_interval() -> None:
    with pytest.raises(ValueError, match="sample_interval"):
        aprof.flight_recorder(sample_interval=0)


def traced_early() -> int:
    return 1


def traced_late() -> int:
    return 2


def _calls(session: aprof.Session, name: str) -> list[aprof.FunctionEvent]:
    return [e for e in session.events() if e.scope == aprof.RecordScope.PYTHON_FUNCTION and e.name.endswith(f": {name}")]


def test_a_tracing_recorders_dump_holds_the_windows_calls_and_tracing_goes_on() -> None:
    # Issue 19 with SPEC 8.1: a flight recorder can trace Python calls; a
    # dump holds the ended calls of its window, the tracer runs on.
    with aprof.flight_recorder(window=0.2, python_tracer=True, signal=None) as rec:
        traced_early()
        time.sleep(0.3)
        for _ in range(3):
            traced_late()
        first = rec.snapshot()
        traced_late()
        second = rec.snapshot(window=10.0)
    assert len(_calls(first, "traced_late")) == 3
    assert not _calls(first, "traced_early")
    assert not [e for e in first.events() if e.unfinished]
    assert len(_calls(second, "traced_late")) == 4
    assert len(_calls(second, "traced_early")) == 1
    assert len(_calls(rec.session, "traced_late")) == 4  # the recorder's own session, at stop


def test_on_every_backend_a_dumps_calls_are_on_their_tasks_tracks(backend: Backend, tmp_path: Path) -> None:
    async def child(i: int) -> None:
        with aprof.record_function(f"work{i}"):
            traced_late()
            await backend.sleep(0.001)

    async def main() -> Path:
        async with aprof.flight_recorder(window=5.0, python_tracer=True, signal=None) as rec:
            async with backend.group() as g:
                for i in range(3):
                    g.start_soon(child, i)
            return rec.dump(tmp_path / "d.aprof")

    s = aprof.load(backend.run(main))
    calls = _calls(s, "traced_late")
    assert len(calls) == 3
    work = {e.thread_id for e in s.events() if e.name.startswith("work")}
    assert {e.thread_id for e in calls} == work
    assert len(work) == 3
    # Nested as a stop nests them: in the task's coroutine step.
    assert {e.parent.name.rsplit(".", 1)[-1] for e in calls if e.parent is not None} == {"child"}


def test_the_task_table_built_in_c_matches_the_python_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    # A snapshot turns every kept task record into its track and its TASK
    # record; the finished ones (a request's task: most of a server's ring)
    # go through the extension's task_events, the running ones through the
    # Python loop, in one order. Both must give the same objects: the same
    # fields, extra keys in the same order (they are the Chrome args' order),
    # the same steps list shared by the track and the extra, and the same
    # containers off the cyclic GC's lists.
    import gc
    from array import array

    from aprof._core import _native
    from aprof._post import _events

    from .conftest import require_c_extension

    ext = require_c_extension()
    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1)")
    assert ext.task_events is not None

    class Running:  # the fields _task_events reads from a running task's TaskThread
        def __init__(self, tid: int) -> None:
            self.id, self.kind, self.os_thread_id, self.coro_name = tid, "asyncio", 7, "serve"
            self.spawn_ns, self.seq, self.fwd = 100, tid, 1
            self.steps = [100, 150, 900, 1200]
            self.waits = None
            self.spawn_site = ("app.py", 3, "main")

        def current_name(self) -> str:
            return f"Task-{self.id}"

        def waiting_on(self) -> None:
            return None

        def stopped(self) -> None:
            pass

    def finished(tid: int, steps: Any, waits: Any, site: Any, exc: str | None = None) -> tuple[Any, ...]:
        return (tid, f"Task-{tid}", "asyncio", 7, "handle", 10 * tid, tid, 1, 10 * tid + 500, "returned", exc, steps, waits, site)

    def records() -> list[Any]:
        return [
            finished(2, array("q", [20, 30, 40, 50]), None, ("app.py", 9, "main")),
            finished(3, [30, 40, 60], [[35, 38, "sleep"], [2000, 2100, "late"]], None, "ValueError"),  # mid-step; a wait past stop
            Running(4),
            finished(5, [], [], ("app.py", 10, "main")),  # no steps, an empty waits list (no key)
            Running(6),
            Running(8),
            finished(9, (90, 95), [[91, 92, "q"]], ["a.py", 1, "f"]),
        ]

    def build(mode: str) -> tuple[dict[int, Any], dict[int, Any]]:
        with monkeypatch.context() as m:
            if mode == "python loop":  # the extension's untracking, without its task_events
                m.setattr(_events, "_c_task_runs", lambda ext, recs, *_: iter(range(len(recs))))
            elif mode == "pure":
                m.setattr(_native, "extension", None)
            return _events._task_events(records(), 1000)

    got, want, pure = build("c"), build("python loop"), build("pure")
    assert list(got[0]) == list(want[0]) == list(pure[0]) == [2, 3, 4, 5, 6, 8, 9]
    assert got[1] == pure[1]
    assert [t.to_dict() for t in got[0].values()] == [t.to_dict() for t in pure[0].values()]
    assert list(got[1]) == list(want[1])
    for tid in want[0]:
        gt, wt = got[0][tid], want[0][tid]
        assert (type(gt), gt.to_dict(), gt.steps) == (type(wt), wt.to_dict(), wt.steps)
        g, w = got[1][tid], want[1][tid]
        assert g == w
        assert list(g[-1]) == list(w[-1])  # the extra's key order
        assert g[-1]["steps"] is gt.steps  # one list, shared
        assert g[1] is aprof.RecordScope.TASK
        for a, b in ((g, w), (g[-1], w[-1]), (gt, wt), (gt.steps, wt.steps), *zip(g[-1].values(), w[-1].values(), strict=True)):
            assert gc.is_tracked(a) == gc.is_tracked(b), (tid, a)
    assert got[1][3][-1]["waits"] == [[35, 38, "sleep"]]
    assert got[0][3].steps == [30, 40, 60, 530]  # finished mid-step: closed at its end


def test_the_tracks_consolidated_in_one_c_call_match_the_per_track_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # A snapshot finds every track's first start (track_rows) and
    # consolidates every track (consolidate_tracks) in one call each of the
    # extension (a task per request: tens of thousands of tracks); the
    # session must be the one the per-track loops build: the same events,
    # tracks, links across tracks and rare fields.
    import asyncio
    import threading

    from aprof._core import _native

    from .conftest import require_c_extension

    ext = require_c_extension()
    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1)")

    async def request(i: int) -> None:
        with aprof.record_function("handle", args=f"r{i}" if i % 3 == 0 else None):
            await asyncio.sleep(0)
            with aprof.record_function("step"):
                pass
            if i % 4 == 0:
                await asyncio.gather(request(i + 1001) if i < 1000 else asyncio.sleep(0))

    def worker() -> None:
        with aprof.record_function("in a thread"):
            pass

    async def main() -> tuple[aprof.Session, aprof.Session]:
        async with aprof.flight_recorder(window=60.0, max_bytes=2_000_000, signal=None) as rec:
            with aprof.record_function("outer"):
                await asyncio.gather(*(request(i) for i in range(200)))
            t = threading.Thread(target=worker)
            t.start()
            t.join()
            one_call = rec.snapshot()
            with monkeypatch.context() as m:
                m.delattr(_native.extension, "consolidate_tracks")
                m.delattr(_native.extension, "track_rows")
                per_track = rec.snapshot()
            with monkeypatch.context() as m:
                m.delattr(_native.extension, "consolidate_tracks")
                assert [e.to_dict() for e in rec.snapshot().events()] == [e.to_dict() for e in per_track.events()]
            return one_call, per_track

    got, want = asyncio.run(main())
    assert ext.consolidate_tracks is not None
    assert len(got.events()) == len(want.events()) > 600
    assert [e.to_dict() for e in got.events()] == [e.to_dict() for e in want.events()]
    assert [e.parent.start_ns if e.parent else None for e in got.events()] == [
        e.parent.start_ns if e.parent else None for e in want.events()
    ]
    assert [t.to_dict() for t in got.tracks()] == [t.to_dict() for t in want.tracks()]
    assert sum(1 for e in got.events() if e.scope == aprof.RecordScope.TASK and e.parent is not None) >= 200


def test_a_tracing_recorders_dump_counts_the_calls_its_ring_let_go() -> None:
    # Issue 19 item 1 in a dump: the tracer's ring (64 KiB: 4,096 events)
    # lets the oldest calls go, and the dump's metadata says how many.
    with aprof.flight_recorder(window=60.0, max_bytes=65_536, python_tracer=True, signal=None) as rec:
        for _ in range(5_000):
            traced_late()
        snap = rec.snapshot()
    dropped = snap.metadata["dropped_by_kind"]["tracer_events"]
    assert dropped >= 2 * 5_000 - 4_096
    assert 0 < len(_calls(snap, "traced_late")) < 5_000


@pytest.mark.parametrize("budget", [{}, {"max_bytes": 50_000_000, "keep": "latest"}], ids=["unbounded", "ring"])
def test_finished_request_tasks_leave_nothing_on_the_cyclic_gc(budget: dict[str, Any]) -> None:
    # SPEC 15.6, issue 19 (the always-on server): a server records a task
    # per request. Each finished task's record, steps, raw list and
    # TaskThread are plain data: left on the cyclic GC's lists they were the
    # survivors that set off full collections of the program's heap, each
    # walking all of them (a tenth of what the profile cost a request).
    import asyncio
    import gc

    from .conftest import require_c_extension

    require_c_extension()
    from aprof._core import _native

    if _native.extension is None:
        pytest.skip("APROF_PURE_PYTHON=1: taking plain data off the GC's lists is the extension's")
    tasks = 2000

    async def request(i: int) -> int:
        with aprof.record_function("handle"):
            await asyncio.sleep(0)
        return i

    async def serve() -> int:  # the connection's task: each request a task spawned in its step
        gc.collect()
        before = len(gc.get_objects())
        for i in range(tasks):
            assert await asyncio.create_task(request(i)) == i
        return len(gc.get_objects()) - before

    async def main() -> tuple[int, aprof.Session]:
        async with aprof.profile(tasks=True, **budget) as prof:
            grown = await asyncio.create_task(serve())
        return grown, prof.session

    grown, s = asyncio.run(main())
    assert grown < tasks // 20, f"{tasks} finished tasks left {grown} objects on the GC's lists"
    handled = [e for e in s.events() if e.scope == aprof.RecordScope.TASK and e.name.startswith("Task-")]
    assert len(handled) >= tasks
    assert sum(1 for e in s.events() if e.name == "handle") == tasks
    assert {e.extra.get("outcome") for e in handled} == {"returned"}
