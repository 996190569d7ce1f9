"""Work in other processes: process pools, merged back at stop (SPEC 11.4, 15.4; issue 20)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

import aprof
from aprof._integrations import _processes

from . import procjobs
from .conftest import Backend

METHODS = ["fork", "spawn", "forkserver"]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=METHODS)
def pool(request: pytest.FixtureRequest) -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    ex = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(request.param))
    ex.submit(procjobs.pid_of).result()  # started before the tests time anything
    yield ex
    ex.shutdown()


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir aprof's per-profile directories go to, and the working
    directory, both watched: nothing may be left in either."""
    tmp = tmp_path / "tmp"
    cwd = tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.chdir(cwd)
    return tmp_path


def _left(root: Path) -> list[str]:
    """What is left in the watched directories (multiprocessing's own
    ``pymp-*`` directories, a forkserver's socket, aside)."""
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.name not in ("tmp", "cwd") and "pymp-" not in str(p)
    )


def _children(prof: aprof.profile) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is aprof.RecordScope.EXECUTOR]


def test_pool_work_is_profiled_in_the_child_and_merged(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # SPEC 11.4, 15.4: each submitted call is an EXECUTOR range in the child,
    # with what it did inside, on the child's track under the child's node
    # id (its pid), linked to the submitting point; nothing is left in the
    # temp dir or the working directory.
    ppool = aprof.propagating(pool)
    with aprof.profile() as prof:
        me = aprof.current_thread_id()
        with aprof.record_function("parent work"):
            futs = [ppool.submit(procjobs.work, 1000) for _ in range(4)]
            results = [f.result() for f in futs]
            pids = {ppool.submit(procjobs.pid_of).result() for _ in range(2)}
    assert results == [sum(range(1000))] * 4
    assert _left(private_tmp) == []
    s = prof.session
    assert s.lost == []
    jobs = _children(prof)
    assert sorted(e.name for e in jobs) == ["pid_of"] * 2 + ["work"] * 4
    parent = [e for e in prof.events() if e.name == "parent work"]
    assert len(parent) == 1
    assert parent[0].node_id == 0
    assert parent[0].thread_id == me
    for e in jobs:
        assert e.node_id != 0
        assert e.node_id == s.metadata["pids"][str(e.node_id)]
        assert e.node_id != os.getpid()
        assert e.forward_thread_id == me  # the arrow starts at the submitter
        assert e.sequence_nr > 0
        assert e.extra is not None
        assert e.extra["submit_ns"] <= e.start_ns
        assert e.track != parent[0].track or e.thread_id != me
    assert pids <= {e.node_id for e in jobs}
    inner = [e for e in prof.events() if e.name == "inner"]
    assert len(inner) == 4
    assert all(e.parent is not None and e.parent.name == "work" and e.node_id == e.parent.node_id for e in inner)
    # A worker that ran several jobs is one track, not one per job.
    per_node: dict[int, set[int]] = {}
    for e in jobs:
        per_node.setdefault(e.node_id, set()).add(e.thread_id)
    assert all(len(tids) == 1 for tids in per_node.values())


def test_a_job_costs_a_range_not_a_session(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # SPEC 15.6; issue 20 target (1,000 jobs at most 1.2x a plain pool):
    # the program gets the pool's own future, a job pickles as its
    # function and about 100 bytes (not the profile's options), and a
    # worker keeps one profile for all the jobs of a parent profile.
    ppool = aprof.propagating(pool)
    with aprof.profile() as prof:
        fut = ppool.submit(procjobs.work, 10)
        assert type(fut) is concurrent.futures.Future
        assert fut.result() == 45
        call, _ = _processes.process_call(procjobs.work, aprof.current_thread_id(), 10**9, time.perf_counter_ns(), pool=True)
        # The function, the profile's private directory (its path: here
        # under pytest's long tmp_path), and the link.
        assert len(pickle.dumps(call)) <= len(pickle.dumps(procjobs.work)) + len(call.dir.encode()) + 110  # type: ignore[attr-defined]
        assert pool.submit(call, 10).result() == 45  # what the worker gets works
        assert [f.result() for f in [ppool.submit(procjobs.work, 10) for _ in range(20)]] == [45] * 20
    assert prof.session.lost == []
    assert len([e for e in _children(prof) if e.name == "work"]) == 22
    # One profile per worker: one session per worker came back, whatever
    # the number of jobs.
    assert 1 <= len(prof.session.metadata["pids"]) - 1 <= 2
    assert _left(private_tmp) == []


@pytest.mark.parametrize("method", METHODS)
def test_workers_that_exit_before_stop_leave_their_profile(method: str, private_tmp: Path) -> None:
    # SPEC 11.4, 15.4: a worker that ends before the parent's stop (the
    # pool shut down inside the profile; max_tasks_per_child) leaves its
    # profile on its way out; nothing is lost and nothing is left behind.
    ctx = multiprocessing.get_context(method)
    # max_tasks_per_child cannot be used with fork.
    extra = {} if method == "fork" else {"max_tasks_per_child": 1}
    with aprof.profile() as prof:
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx, **extra) as ex:  # type: ignore[arg-type]
            ppool = aprof.propagating(ex)
            assert [f.result() for f in [ppool.submit(procjobs.work, 10) for _ in range(4)]] == [45] * 4
    jobs = _children(prof)
    assert [e.name for e in jobs] == ["work"] * 4
    assert len([e for e in prof.events() if e.name == "inner"]) == 4
    nodes = {e.node_id for e in jobs}
    assert len(nodes) == (4 if extra else len(nodes))
    assert 0 not in nodes
    assert prof.session.lost == []
    assert _left(private_tmp) == []


def test_the_childs_profile_has_the_parents_options(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # SPEC 8.3, 11.4: the child records with the submitting profile's options.
    ppool = aprof.propagating(pool)
    with aprof.profile(with_stack=True, tasks=False) as prof:
        assert ppool.submit(procjobs.stack_depth).result() == 0
    [e] = [e for e in prof.events() if e.name == "with a stack"]
    assert e.node_id != 0
    assert e.stack
    assert any(frame[2] == "stack_depth" for frame in e.stack)


@pytest.mark.parametrize("method", METHODS)
def test_a_jobs_context_reaches_the_next_job_as_without_aprof(method: str) -> None:
    # SPEC 15.6: what a job sets in its context, the next job in that
    # worker sees, with or without a profile.
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method))
    try:
        plain = [ex.submit(procjobs.set_var, "a").result(), ex.submit(procjobs.get_var).result()]
        ppool = aprof.propagating(ex)
        with aprof.profile() as prof:
            profiled = [ppool.submit(procjobs.set_var, "b").result(), ppool.submit(procjobs.get_var).result()]
    finally:
        ex.shutdown()
    assert plain == ["a", "a"]
    assert profiled == ["b", "b"]
    assert [e.name for e in _children(prof)] == ["set_var", "get_var"]


def test_chrome_trace_puts_each_child_in_its_process_with_an_arrow(pool: concurrent.futures.ProcessPoolExecutor, tmp_path: Path) -> None:
    # SPEC 9.1, 15.4: a process per node (named by pid), flow arrows from
    # the submit in the parent's process to the job in the child's.
    import json

    ppool = aprof.propagating(pool)
    with aprof.profile() as prof:
        ppool.submit(procjobs.work, 10).result()
    out = tmp_path / "t.json"
    prof.export_chrome_trace(out)
    events = json.loads(out.read_text())["traceEvents"]
    job = next(e for e in events if e.get("cat") == "executor" and e["ph"] == "X")
    assert job["pid"] != os.getpid()
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 1
    assert starts[0]["pid"] == os.getpid()
    assert ends[0]["pid"] == job["pid"]


def test_run_in_executor_and_to_thread_on_every_backend(backend: Backend, pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # SPEC 11.1, 11.4: submitting from a task, and loop.run_in_executor on
    # asyncio and uvloop; waiting for the result in a worker thread.
    ppool = aprof.propagating(pool)

    async def main() -> tuple[list[int], int]:
        async with aprof.profile() as prof:
            out = []
            if not backend.is_trio and not backend.is_anyio:
                loop = asyncio.get_running_loop()
                out.append(await loop.run_in_executor(ppool, procjobs.work, 10))
                out.append(await loop.run_in_executor(pool, aprof.wrap(procjobs.work), 10))
            fut = ppool.submit(procjobs.work, 10)
            out.append(await backend.to_thread(fut.result))
            me = aprof.current_thread_id()
        jobs = _children(prof)
        assert prof.session.lost == []
        assert all(e.forward_thread_id == me and e.node_id != 0 for e in jobs if e.name == "work")
        return out, len([e for e in jobs if e.name == "work"])

    out, n = backend.run(main)
    assert out == [45] * len(out)
    assert n == len(out)


def test_wrap_into_a_process_pool(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # SPEC 2.5, 11.4: aprof.wrap(fn) handed to a plain ProcessPoolExecutor
    # is the same profiled call; with no profile running it is just fn.
    with aprof.profile() as prof:
        assert pool.submit(aprof.wrap(procjobs.work), 10).result() == 45
    assert [e.name for e in _children(prof)] == ["work"]
    assert pool.submit(aprof.wrap(procjobs.work), 10).result() == 45
    plain = pickle.loads(pickle.dumps(aprof.wrap(procjobs.work)))
    assert plain is procjobs.work
    assert _left(private_tmp) == []


def test_no_profile_means_no_trace_of_aprof(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # SPEC 15.6: without a profile the call goes to the pool as it is.
    ppool = aprof.propagating(pool)
    assert ppool.submit(procjobs.work, 10).result() == 45
    call, _ = _processes.process_call(procjobs.work, 1, 1, 0)
    assert call is procjobs.work
    assert _left(private_tmp) == []


def test_exception_in_the_child_is_recorded_and_raised(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # SPEC 4.2, 11.4: the job's exception propagates as without aprof; its
    # range records it.
    ppool = aprof.propagating(pool)
    with aprof.profile() as prof:
        with pytest.raises(ValueError, match="job failed"):
            ppool.submit(procjobs.fail).result()
    [job] = _children(prof)
    assert job.exception == "ValueError"
    assert [c.name for c in job.children] == ["failing inner"]
    assert prof.session.lost == []


def test_unpicklable_callable_fails_as_without_aprof(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # Issue 20 "Bad input": pickling failures raise what the executor raises without aprof.
    def local() -> int:
        return 1

    with pytest.raises(Exception) as plain:  # noqa: PT011 - compared below
        pool.submit(local).result()
    with aprof.profile() as prof:
        with pytest.raises(type(plain.value)) as wrapped:
            aprof.propagating(pool).submit(local).result()
    assert str(wrapped.value) == str(plain.value)
    assert prof.session.lost == []  # it never ran: nothing was lost
    assert _left(private_tmp) == []


@pytest.mark.parametrize("method", METHODS)
def test_a_killed_child_loses_only_its_own_work(method: str, private_tmp: Path) -> None:
    # Issue 20 "Bad input": SIGKILL mid-range. A pool worker keeps its
    # profile until the parent's stop, so the killed worker takes the
    # profile of every job it ran with it: each is named in session.lost
    # with its pid; the parent's events are intact, and the other worker
    # (which the broken pool terminates) is asked for its profile first.
    ex = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method))
    flag = private_tmp / "cwd" / "started"
    try:
        ppool = aprof.propagating(ex)
        with aprof.profile() as prof:
            with aprof.record_function("parent work"):
                # One worker busy with slow: the next jobs go to the other.
                slow = ppool.submit(procjobs.slow, str(flag), 60.0)
                while not flag.exists():
                    time.sleep(0.01)
                assert ppool.submit(procjobs.work, 10).result() == 45
                victim = ppool.submit(procjobs.pid_of).result()
                with pytest.raises(BrokenProcessPool):
                    ppool.submit(procjobs.die).result()
                with pytest.raises(BrokenProcessPool):
                    slow.result()
    finally:
        ex.shutdown()
    names = [e.name for e in prof.events()]
    assert names.count("parent work") == 1
    assert "work" not in names
    assert "pid_of" not in names
    assert "about to die" not in names
    # The survivor's profile came back, its job cut where it was asked.
    [survivor] = [e for e in prof.events() if e.name == "slow"]
    assert survivor.unfinished
    assert survivor.node_id not in (0, victim)
    lost = {x["name"]: x for x in prof.session.lost}
    assert sorted(lost) == ["die", "pid_of", "slow", "work"]
    for name in ("die", "pid_of", "work"):
        assert lost[name]["pid"] == victim
        assert lost[name]["node_id"] == victim
        assert "crashed or was killed" in lost[name]["reason"]
    assert lost["slow"]["pid"] == victim  # the pool broke because of the victim
    flag.unlink()
    assert _left(private_tmp) == []


def test_a_child_still_running_at_stop_is_named_and_its_job_finishes(pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path) -> None:
    # Issue 20 "Bad input", SPEC 5.5: a job that outlives the profile is
    # named as still running; stop does not wait for it; what it did up to
    # the stop is there, its ranges ended at the stop and unfinished (as
    # in one process); the job still succeeds.
    flag = private_tmp / "cwd" / "started"
    ppool = aprof.propagating(pool)
    with aprof.profile() as prof:
        fut = ppool.submit(procjobs.slow, str(flag), 1.0)
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert fut.result(timeout=60) == "done"
    [lost] = prof.session.lost
    assert lost["name"] == "slow"
    assert "running in another process when the profile stopped" in lost["reason"]
    [job] = _children(prof)
    assert job.name == "slow"
    assert job.unfinished
    assert [(c.name, c.unfinished) for c in job.children] == [("slow inner", True)]
    assert job.end_ns <= prof.session.metadata["stop_ns"]
    flag.unlink()
    assert _left(private_tmp) == []


def test_a_parent_that_exits_while_its_child_runs(tmp_path: Path) -> None:
    # Issue 20 "Bad input": the parent saves its session and exits with a
    # job still running; the file holds the parent's events and names the
    # job as lost; the child ends without an error and leaves nothing.
    script = tmp_path / "parent.py"
    out = tmp_path / "out.aprof"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script.write_text(
        f"""
import concurrent.futures, os, sys, time
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
import aprof
from tests import procjobs

if __name__ == "__main__":
    ex = concurrent.futures.ProcessPoolExecutor(1)
    with aprof.profile() as prof:
        with aprof.record_function("parent work"):
            aprof.propagating(ex).submit(procjobs.slow, {str(tmp_path / "flag")!r}, 0.5)
            while not os.path.exists({str(tmp_path / "flag")!r}):
                time.sleep(0.01)
    prof.save({str(out)!r})
    ex.shutdown(wait=False)
"""
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    s = aprof.load(out)
    # The job's range and what it did up to the stop, ended there (SPEC 5.5).
    assert sorted((e.name, e.unfinished) for e in s.events()) == [("parent work", False), ("slow", True), ("slow inner", True)]
    [lost] = s.lost
    assert lost["name"] == "slow"
    assert "running in another process when the profile stopped" in lost["reason"]
    deadline = time.monotonic() + 10
    while list(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp.iterdir()) == []


def test_a_child_that_cannot_profile_runs_the_job_with_one_warning() -> None:
    # Issue 20 "Bad input": aprof failing in the child never fails the job.
    job = _processes._Job(1, "/nonexistent-dir-for-aprof", {}, 0, 1, 1, 0)
    call = _processes.ProcessCall(procjobs.work, job)
    # The directory is gone: the parent stopped; quietly unprofiled.
    assert call(10) == 45
    with tempfile.TemporaryDirectory() as d:
        job.dir = d
        job.options = {"no_such_option": True}  # aprof cannot start a profile here
        _processes._warned.clear()
        with pytest.warns(aprof.AprofWarning, match="runs unprofiled"):
            assert call(10) == 45
        assert call(10) == 45  # once per process
        assert os.listdir(d) == []


def test_process_call_pickles_small() -> None:
    # What crosses to the child: the callable and a small job record.
    job = _processes._Job(7, "/tmp/x", {"tasks": True}, 0, 3, 9, 123)
    call = pickle.loads(pickle.dumps(_processes.ProcessCall(procjobs.work, job)))
    assert call.__wrapped__ is procjobs.work
    assert (call._job.id, call._job.fwd, call._job.seq, call._job.submit_ns) == (7, 3, 9, 123)
    assert repr(call) == repr(procjobs.work)


def _pool_scenario(with_stack: bool) -> list[tuple[object, ...]]:
    """Jobs to a fresh fork pool under a profile (a function, a partial,
    one that fails, one that sets a context variable the next one reads),
    and what came back, with the counters that differ from run to run
    (sequence numbers, thread and node ids, pids in names) made relative."""
    import functools
    import re

    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    try:
        ppool = aprof.propagating(ex)
        with aprof.profile(with_stack=with_stack) as prof:
            assert ppool.submit(procjobs.work, 10).result() == 45
            assert ppool.submit(functools.partial(procjobs.work, 3)).result() == 3
            with pytest.raises(ValueError, match="job failed"):
                ppool.submit(procjobs.fail).result()
            assert ppool.submit(procjobs.set_var, "v").result() == "v"
            assert ppool.submit(procjobs.get_var).result() == "v"
    finally:
        ex.shutdown()
    assert prof.session.lost == []
    events = sorted(prof.events(), key=lambda e: (e.node_id != 0, e.start_ns))
    seqs = sorted({e.sequence_nr for e in events if e.sequence_nr > 0})
    tids: dict[int, int] = {}
    for e in events:
        tids.setdefault(e.thread_id, len(tids))
    aprof_dir = os.path.dirname(aprof.__file__)
    return [
        (
            e.name, e.scope, e.args, re.sub(r"\d+", "N", e.track), e.node_id != 0, tids[e.thread_id], e.exception,
            e.unfinished, seqs.index(e.sequence_nr) if e.sequence_nr > 0 else e.sequence_nr,
            tids.get(e.forward_thread_id, e.forward_thread_id), sorted(e.extra or {}), [c.name for c in e.children],
            # aprof's own frames inside a stack are the implementation's;
            # the worker's stack ends at its loop (beyond: the fork's caller).
            e.stack and [f for f in _until_worker_loop(e.stack) if not f[0].startswith(aprof_dir)],
        )
        for e in events
    ]  # fmt: skip


def _until_worker_loop(stack: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    names = [f[2] for f in stack]
    return stack[: names.index("_process_worker") + 1] if "_process_worker" in names else stack


@pytest.mark.parametrize("with_stack", [False, True])
def test_pool_call_in_c_matches_the_python_twin(with_stack: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 20, SPEC 15.2: a pool job is built, pickled and run in the
    # worker in C when the extension is active (PoolCallCore and
    # _executor_range, aprof/_cranges.c); the pure-Python twins
    # (_PyPoolCallCore, _run_executor_range_py) record the same events:
    # names, tracks, nodes, links (flow ids), exceptions, stacks.
    from aprof._core import _native, _propagation

    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1)")
    assert _processes._PoolCall.__mro__[1] is _native.extension.PoolCallCore
    got = _pool_scenario(with_stack)

    class _PoolCall(_processes._PyPoolCallCore):  # the twin, pickled by the same name
        __slots__ = ()

    _PoolCall.__module__ = _processes.__name__
    _PoolCall.__qualname__ = "_PoolCall"
    monkeypatch.setattr(_processes, "_PoolCall", _PoolCall)
    monkeypatch.setattr(_propagation, "_run_executor_range", _propagation._run_executor_range_py)
    want = _pool_scenario(with_stack)  # the fork pool's worker inherits the twins
    assert got == want
    executors = [r for r in got if r[1] is aprof.RecordScope.EXECUTOR]
    assert [r[0] for r in executors] == ["work", "work", "fail", "set_var", "get_var"]
    assert all(r[4] for r in executors)  # in the worker, under its node
    assert [r[6] for r in executors] == [None, None, "ValueError", None, None]
    assert len({r[9] for r in executors}) == 1  # each linked to the submitting thread
    assert executors[0][9]
    assert all(r[12] is not None for r in executors) == with_stack


def test_pool_call_pickles_as_its_fields() -> None:
    # What crosses to a pool's worker: the callable and the link, read
    # back as they went (the C class and its twin alike).
    for cls in (_processes._PoolCall, _processes._PyPoolCallCore):
        call = pickle.loads(pickle.dumps(cls(procjobs.work, "/tmp/x", 9, 3, 123)))
        assert type(call) is cls
        assert (call.fn, call.dir, call.seq, call.fwd, call.submit_ns) == (procjobs.work, "/tmp/x", 9, 3, 123)
    assert repr(_processes._PoolCall(procjobs.work, "/tmp/x", 9, 3, 123)) == repr(procjobs.work)


def test_one_pending_future_per_pool_is_watched_for_a_broken_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 20: a broken pool is heard of through one watched future per
    # pool, not a done callback on every job's future; whatever order the
    # jobs complete in, a pending one is watched while any is pending, so
    # the pool breaking (which fails every pending future before it
    # terminates the workers) still asks the survivors for their profiles.
    broken: list[object] = []
    monkeypatch.setattr(_processes, "_pool_broken", lambda run, pool: broken.append(pool))
    run = _processes._Run({})
    pool, other = object(), object()
    futs = [concurrent.futures.Future[int]() for _ in range(5)]
    for f in futs:
        run.tell_pool([None, None, 0], f, pool)
    mine = concurrent.futures.Future[int]()
    run.tell_pool([None, None, 0], mine, other)

    def watched() -> list[int]:
        return [i for i, f in enumerate(futs) if f._done_callbacks]  # type: ignore[attr-defined]

    assert watched() == [0]  # the first, pending when the others came: not one callback each
    futs[4].set_result(1)  # out of order: the newest first
    futs[0].set_result(1)  # the watched one: the watch moves to the newest still pending
    assert run.watches[id(pool)].watched is futs[3]
    futs[3].set_result(1)
    futs[1].set_result(1)
    assert run.watches[id(pool)].watched is futs[2]
    assert broken == []
    futs[2].set_exception(BrokenProcessPool("a worker died"))
    assert broken == [pool]
    # All done: nothing watched until the next job, which is.
    assert run.watches[id(pool)].watched is None
    late = concurrent.futures.Future[int]()
    run.tell_pool([None, None, 0], late, pool)
    assert run.watches[id(pool)].watched is late
    # The other pool's watch is its own.
    assert run.watches[id(other)].watched is mine
    mine.cancel()
    assert run.watches[id(other)].watched is None
    assert broken == [pool]


# ---------------------------------------------------------------------------
# install_propagation(processes=True): multiprocessing (issue 20 item 2)
# ---------------------------------------------------------------------------


@pytest.fixture
def processes_installed() -> Iterator[None]:
    aprof.install_propagation(processes=True)
    try:
        yield
    finally:
        aprof.uninstall_propagation()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.usefixtures("processes_installed")
def test_multiprocessing_process_and_pool(method: str, private_tmp: Path) -> None:
    # SPEC 11.4, 15.4: with install_propagation(processes=True), a Process
    # started and Pool calls made under a profile are profiled in the
    # child and merged, each under its process's node id, linked to the
    # starting point.
    ctx = multiprocessing.get_context(method)
    with aprof.profile() as prof:
        me = aprof.current_thread_id()
        p = ctx.Process(target=procjobs.work, args=(10,))
        p.start()
        p.join(60)
        with ctx.Pool(1) as mp_pool:
            assert mp_pool.map(procjobs.work, [10, 20]) == [45, 190]
            assert mp_pool.apply_async(procjobs.work, (10,)).get(60) == 45
            assert mp_pool.apply(procjobs.pid_of) > 0
            assert list(mp_pool.imap(procjobs.work, [10])) == [45]
            assert mp_pool.starmap(procjobs.work, [(10,)]) == [45]
            worker = mp_pool.apply(procjobs.pid_of)
    assert p.exitcode == 0
    jobs = _children(prof)
    by_node: dict[int, list[str]] = {}
    for e in jobs:
        by_node.setdefault(e.node_id, []).append(e.name)
        assert e.forward_thread_id == me
    assert by_node[p.pid] == ["work"]
    assert sorted(by_node[worker]) == ["pid_of", "pid_of", "work", "work", "work", "work", "work"]
    assert prof.session.lost == []
    assert len([e for e in prof.events() if e.name == "inner"]) == 6
    assert _left(private_tmp) == []


@pytest.mark.usefixtures("processes_installed")
def test_a_killed_process_is_named_with_its_signal(private_tmp: Path) -> None:
    # Issue 20 "Bad input": SIGKILL mid-range in a multiprocessing.Process.
    ctx = multiprocessing.get_context("spawn")
    with aprof.profile() as prof:
        with aprof.record_function("parent work"):
            p = ctx.Process(target=procjobs.die)
            p.start()
            p.join(60)
    assert p.exitcode == -9
    [lost] = prof.session.lost
    assert lost["name"] == "die"
    assert lost["pid"] == p.pid
    assert "killed by signal 9" in lost["reason"]
    assert [e.name for e in prof.events()] == ["parent work"]
    assert _left(private_tmp) == []


@pytest.mark.usefixtures("processes_installed")
def test_installed_process_pool_submit_without_propagating(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # SPEC 2.5, 11.4: installed, a plain ProcessPoolExecutor (so
    # run_in_executor) carries the profile; propagating() on top does not
    # profile twice.
    with aprof.profile() as prof:
        assert pool.submit(procjobs.work, 10).result() == 45
        assert aprof.propagating(pool).submit(procjobs.work, 10).result() == 45
    assert [e.name for e in _children(prof)] == ["work", "work"]


def test_multiprocessing_is_left_alone_unless_asked(private_tmp: Path) -> None:
    # SPEC 15.6: without processes=True, nothing of multiprocessing changes
    # and nothing is profiled in the child; uninstall restores everything.
    import multiprocessing.pool
    import multiprocessing.process

    originals = (
        multiprocessing.process.BaseProcess.start,
        multiprocessing.pool.Pool.apply_async,
        multiprocessing.pool.Pool._map_async,  # type: ignore[attr-defined]
        concurrent.futures.ProcessPoolExecutor.submit,
    )
    aprof.install_propagation()
    try:
        assert multiprocessing.process.BaseProcess.start is originals[0]
        ctx = multiprocessing.get_context("fork")
        with aprof.profile() as prof:
            p = ctx.Process(target=procjobs.work, args=(10,))
            p.start()
            p.join(60)
        assert _children(prof) == []
        aprof.install_propagation(processes=True)
        assert multiprocessing.process.BaseProcess.start is not originals[0]
    finally:
        aprof.uninstall_propagation()
    assert (
        multiprocessing.process.BaseProcess.start,
        multiprocessing.pool.Pool.apply_async,
        multiprocessing.pool.Pool._map_async,  # type: ignore[attr-defined]
        concurrent.futures.ProcessPoolExecutor.submit,
    ) == originals
    with pytest.raises(TypeError, match="processes"):
        aprof.install_propagation(processes=1)  # type: ignore[arg-type]
    assert _left(private_tmp) == []


@pytest.mark.parametrize("method", METHODS)
def test_pure_python_twins_in_parent_and_children(method: str, tmp_path: Path) -> None:
    # Issue 20 "Bad input", SPEC 14: without the C extension (the twins
    # only, in the parent and in every child) pool work is profiled the
    # same, its stack samples too (the twin sampler in the worker).
    script = tmp_path / "pure.py"
    script.write_text(
        f"""
import concurrent.futures, multiprocessing, sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
import aprof
from aprof._core import _native
from tests import procjobs

if __name__ == "__main__":
    assert _native.extension is None
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context({method!r}))
    with aprof.profile() as prof:
        assert aprof.propagating(ex).submit(procjobs.work, 10).result() == 45
    ex.shutdown()
    names = sorted(e.name for e in prof.events())
    assert names == ["inner", "work"], names
    assert prof.session.lost == []
    # The twin sampler, in the worker too: the job's samples come back.
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context({method!r}))
    with aprof.profile(sample_interval=0.001) as prof:
        assert aprof.propagating(ex).submit(procjobs.burn, 0.1).result() > 0
    ex.shutdown()
    s = prof.session
    [job] = [e for e in s.events() if e.name == "burn"]
    smp = s.samples
    hot = [i for i in range(len(smp)) if smp.stack(i)[-1:] and smp.stack(i)[-1].endswith(": burn")]
    assert hot and {{smp.thread_id[i] for i in hot}} == {{job.thread_id}}, (hot, job)
    assert job.node_id != 0 and s.lost == []
    print("ok")
"""
    )
    env = {**os.environ, "APROF_PURE_PYTHON": "1"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "Warning" not in proc.stderr


def test_a_cancelled_job_is_not_lost(private_tmp: Path) -> None:
    # SPEC 15.6: cancelling the future the program got cancels the job;
    # a job that never ran is not named as lost.
    flag = private_tmp / "cwd" / "started"
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    try:
        ppool = aprof.propagating(ex)
        with aprof.profile() as prof:
            first = ppool.submit(procjobs.slow, str(flag), 0.5)
            queued = [ppool.submit(procjobs.work, 10) for _ in range(5)]
            cancelled = [f for f in queued if f.cancel()]
            assert first.result(timeout=60) == "done"
            for f in queued:
                if f not in cancelled:
                    assert f.result(timeout=60) == 45
        assert cancelled  # the last ones at least were still waiting
        assert all(f.cancelled() for f in cancelled)
        with pytest.raises(concurrent.futures.CancelledError):
            cancelled[0].result()
    finally:
        ex.shutdown()
    assert prof.session.lost == []
    assert len([e for e in _children(prof) if e.name == "work"]) == 5 - len(cancelled)


CHUNK = 64 * 1024
SLACK = 4096  # a bytes object's header, the range's own bookkeeping


def test_a_jobs_allocations_are_charged_to_its_range_in_its_process(
    pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path
) -> None:
    # SPEC 15.4, 15.5; issue 20: profile_memory goes to the workers with
    # the other options. A job's allocations are its range's, in its
    # worker's process (exact with memory_interval=0); the parent's stay
    # the parent's, and key_averages(group_by="node") keeps each process's
    # bytes on its own row.
    ppool = aprof.propagating(pool)
    with aprof.profile(profile_memory=True, memory_interval=0) as prof:
        with aprof.record_function("parent allocates"):
            assert len(bytes(3 * CHUNK)) == 3 * CHUNK
        sizes = [ppool.submit(procjobs.alloc, k * CHUNK).result() for k in (1, 2, 4)]
    assert sizes == [CHUNK, 2 * CHUNK, 4 * CHUNK]
    assert _left(private_tmp) == []
    s = prof.session
    assert s.lost == []
    m = s.memory
    assert m is not None
    assert m.exact
    jobs = sorted((e for e in _children(prof) if e.name == "alloc"), key=lambda e: e.start_ns)
    assert len(jobs) == 3
    for k, e in zip((1, 2, 4), jobs, strict=True):
        assert e.node_id != 0
        assert e.memory is not None
        assert k * CHUNK <= e.memory.allocated <= k * CHUNK + SLACK
        assert e.memory.freed >= k * CHUNK  # freed inside the job
    [mine] = [e for e in prof.events() if e.name == "parent allocates"]
    assert mine.node_id == 0
    assert mine.memory is not None
    assert 3 * CHUNK <= mine.memory.allocated <= 3 * CHUNK + SLACK
    rows = {r.key: r for r in prof.key_averages()}
    assert 7 * CHUNK <= rows["executor alloc"].allocated_bytes <= 7 * CHUNK + 3 * SLACK
    # One row per process: the parent's bytes are not its workers', and
    # each worker's row holds the jobs it ran.
    nodes = {r.key: r for r in prof.key_averages(group_by="node")}
    parent = [r for k, r in nodes.items() if k.startswith("node 0 ")]
    assert len(parent) == 1
    assert parent[0].allocated_bytes >= 3 * CHUNK
    per_worker: dict[int, int] = {}
    for e in jobs:
        assert e.memory is not None
        per_worker[e.node_id] = per_worker.get(e.node_id, 0) + e.memory.allocated
    for node, allocated in per_worker.items():
        [row] = [r for k, r in nodes.items() if k.startswith(f"node {node} ")]
        assert allocated <= row.allocated_bytes < allocated + 3 * CHUNK  # the jobs, and nothing of the parent's
    assert sum(r.allocated_bytes for r in nodes.values()) == m.total().allocated


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.usefixtures("processes_installed")
def test_allocations_come_back_from_exiting_workers_and_processes(method: str, private_tmp: Path) -> None:
    # SPEC 15.4, 15.5: a worker that exits before the parent's stop leaves
    # its allocations with its profile, and a multiprocessing.Process's
    # call of its own carries them in its session too.
    ctx = multiprocessing.get_context(method)
    extra = {} if method == "fork" else {"max_tasks_per_child": 1}
    with aprof.profile(profile_memory=True, memory_interval=0) as prof:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx, **extra) as ex:  # type: ignore[arg-type]
            assert aprof.propagating(ex).submit(procjobs.alloc, 2 * CHUNK).result() == 2 * CHUNK
        p = ctx.Process(target=procjobs.alloc, args=(3 * CHUNK,))
        p.start()
        p.join(60)
    assert p.exitcode == 0
    assert prof.session.lost == []
    got = {}
    for e in _children(prof):
        assert e.memory is not None
        got[e.node_id] = e.memory.allocated
    assert len(got) == 2
    assert 0 not in got
    assert 3 * CHUNK <= got.pop(p.pid) <= 3 * CHUNK + SLACK
    [job] = got.values()
    assert 2 * CHUNK <= job <= 2 * CHUNK + SLACK
    assert _left(private_tmp) == []


def test_a_worker_tracking_memory_itself_still_profiles_the_jobs(private_tmp: Path) -> None:
    # The allocator hooks are one per process: a worker whose own profile
    # tracks memory runs the jobs profiled, without their allocations,
    # rather than unprofiled.
    ex = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=procjobs.track_memory_here
    )
    try:
        with aprof.profile(profile_memory=True, memory_interval=0) as prof:
            assert aprof.propagating(ex).submit(procjobs.work, 10).result() == 45
    finally:
        ex.shutdown()
    [job] = _children(prof)
    assert job.node_id != 0
    assert job.memory is not None  # the parent's profile tracks memory: every event has figures
    assert job.memory.allocated == 0
    assert [e.name for e in prof.events() if e.name == "inner"] == ["inner"]
    assert prof.session.lost == []
    assert _left(private_tmp) == []


def test_a_child_that_cannot_track_memory_profiles_the_job_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 20 "Bad input": a child where the allocator cannot be hooked (no
    # C extension there) profiles the job without its allocations, with
    # one warning, rather than not at all.
    from aprof._core import _memory

    monkeypatch.setattr(_memory, "unavailable_reason", lambda: "no C extension in this test")
    with tempfile.TemporaryDirectory() as d:
        job = _processes._Job(1, d, {"profile_memory": True, "memory_interval": 0}, 0, 1, 1, 0)
        _processes._warned.clear()
        with pytest.warns(aprof.AprofWarning, match="cannot track memory"):
            assert _processes.ProcessCall(procjobs.work, job)(10) == 45
        [saved] = os.listdir(d)
        child = aprof.load(os.path.join(d, saved))
    assert sorted(e.name for e in child.events()) == ["inner", "work"]
    assert child.memory is None


# ---------------------------------------------------------------------------
# sample_interval: a job's stack samples, in its process (issue 20, SPEC 8.4)
# ---------------------------------------------------------------------------

SAMPLE = 0.001  # seconds between samples
BURN = 0.2  # seconds a job burns CPU in procjobs.burn


def _burn_samples(s: aprof.Session) -> list[int]:
    """The indexes of the samples taken in procjobs.burn."""
    smp = s.samples
    assert smp is not None
    return [i for i in range(len(smp)) if smp.stack(i) and smp.stack(i)[-1].endswith(": burn")]


def _assert_samples_on(s: aprof.Session, job: aprof.FunctionEvent) -> list[int]:
    """The job's samples of procjobs.burn: some, each on the job's track,
    in its process, while the job ran."""
    smp = s.samples
    assert smp is not None
    hot = [i for i in _burn_samples(s) if smp.thread_id[i] == job.thread_id]
    assert hot, "no sample of the job's burn came back"
    assert {s._tracks[smp.thread_id[i]].node_id for i in _burn_samples(s)} == {job.node_id}
    for i in hot:
        assert job.start_ns <= smp.time_ns[i] <= job.end_ns
    return hot


def test_a_jobs_samples_are_charged_to_its_range_in_its_process(
    pool: concurrent.futures.ProcessPoolExecutor, private_tmp: Path
) -> None:
    # SPEC 8.4, 15.4; issue 20: sample_interval goes to the workers with the
    # other options, and the worker's samples come back with its session:
    # a job's samples are on its EXECUTOR range's track, in its process,
    # in key_averages' sampled columns, the flame graph's (HTML), folded
    # stacks, speedscope and the session file. The parent's own samples
    # stay the parent's.
    ppool = aprof.propagating(pool)
    with aprof.profile(sample_interval=SAMPLE) as prof:
        assert ppool.submit(procjobs.burn, BURN).result() > 0
    assert _left(private_tmp) == []
    s = prof.session
    assert s.lost == []
    [job] = [e for e in _children(prof) if e.name == "burn"]
    assert job.node_id not in (0, None)
    hot = _assert_samples_on(s, job)
    smp = s.samples
    assert smp is not None
    assert s.metadata["samples"]["count"] == len(smp)
    # The parent's samples (it waited for the result) are on its own tracks.
    parent = [i for i in range(len(smp)) if s._tracks[smp.thread_id[i]].node_id == 0]
    assert parent
    assert not [i for i in parent if i in set(hot)]
    # key_averages: the job's row and the function's have the samples.
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["executor burn"].samples >= len(hot)
    assert rows["executor burn"].sampled_ns > 0
    [fn] = [r for k, r in rows.items() if k.endswith(": burn")]
    assert fn.samples == len(hot)
    assert fn.self_sampled_ns > 0
    nodes = {r.key: r for r in prof.key_averages(group_by="node")}
    [worker] = [r for k, r in nodes.items() if k.startswith(f"node {job.node_id} ")]
    assert worker.samples >= len(hot)
    # Exports: each shows the samples in the worker's process.
    label = f"pid {job.node_id} \u00b7 "
    out = private_tmp / "out"
    out.mkdir()
    prof.export_folded(out / "t.folded")
    folded = [  # names keep no space there: the value follows the last one
        line.replace("\u00a0", " ") for line in (out / "t.folded").read_text().splitlines() if line.startswith("[sampled];")
    ]
    assert any(label in line and line.rsplit(" ", 1)[0].endswith(": burn") for line in folded)
    prof.export_speedscope(out / "t.speedscope.json")
    doc = json.loads((out / "t.speedscope.json").read_text())
    frames = [f["name"] for f in doc["shared"]["frames"]]
    [sp] = [p for p in doc["profiles"] if p["type"] == "sampled" and p["name"].startswith(label)]
    assert sum(1 for stack in sp["samples"] if stack and frames[stack[-1]].endswith(": burn")) == len(hot)
    prof.save(out / "t.aprof")
    back = aprof.load(out / "t.aprof")
    [bjob] = [e for e in back.events() if e.scope is aprof.RecordScope.EXECUTOR and e.name == "burn"]
    assert len(_assert_samples_on(back, bjob)) == len(hot)
    from aprof._post._readers import read_profile

    prof.export_html(out / "t.html")
    html = read_profile(str(out / "t.html"))
    [hjob] = [e for e in html.events() if e.scope is aprof.RecordScope.EXECUTOR and e.name == "burn"]
    assert len(_assert_samples_on(html, hjob)) == len(hot)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.usefixtures("processes_installed")
def test_samples_come_back_from_exiting_workers_and_processes(method: str, private_tmp: Path) -> None:
    # SPEC 8.4, 15.4: a pool worker that exits before the parent's stop
    # leaves its samples with its profile, and a multiprocessing.Process's
    # call of its own carries them in its session file.
    ctx = multiprocessing.get_context(method)
    extra = {} if method == "fork" else {"max_tasks_per_child": 1}
    with aprof.profile(sample_interval=SAMPLE) as prof:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx, **extra) as ex:  # type: ignore[arg-type]
            assert aprof.propagating(ex).submit(procjobs.burn, BURN).result() > 0
        p = ctx.Process(target=procjobs.burn, args=(BURN,))
        p.start()
        p.join(60)
    assert p.exitcode == 0
    s = prof.session
    assert s.lost == []
    jobs = [e for e in _children(prof) if e.name == "burn"]
    assert len(jobs) == 2
    assert len({e.node_id for e in jobs}) == 2
    assert p.pid in {e.node_id for e in jobs}
    smp = s.samples
    assert smp is not None
    for job in jobs:
        hot = [i for i in _burn_samples(s) if s._tracks[smp.thread_id[i]].node_id == job.node_id]
        assert hot
        assert {smp.thread_id[i] for i in hot} == {job.thread_id}
        assert all(job.start_ns <= smp.time_ns[i] <= job.end_ns for i in hot)
    assert _left(private_tmp) == []


def test_a_worker_whose_sampler_cannot_start_still_profiles_the_jobs(
    private_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Issue 20 "Bad input": a worker where the sampler cannot start (no
    # thread for it) runs the jobs profiled, without samples, with one
    # warning, rather than unprofiled.
    ex = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=procjobs.break_sampler
    )
    try:
        with aprof.profile(sample_interval=SAMPLE) as prof:
            ppool = aprof.propagating(ex)
            assert [ppool.submit(procjobs.work, 10).result() for _ in range(2)] == [45, 45]
    finally:
        ex.shutdown()
    s = prof.session
    assert s.lost == []
    jobs = _children(prof)
    assert [e.name for e in jobs] == ["work", "work"]
    assert [e.name for e in prof.events() if e.name == "inner"] == ["inner", "inner"]
    smp = s.samples
    assert smp is not None  # the parent's
    assert {s._tracks[t].node_id for t in smp.thread_id} <= {0}
    err = capfd.readouterr().err
    assert err.count("cannot sample stacks") == 1, err
    assert "runs unprofiled" not in err
    assert _left(private_tmp) == []


def test_a_call_whose_sampler_cannot_start_is_profiled_without_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same for a call profiled on its own (multiprocessing), seen from
    # inside the child: one warning, the job's profile without samples.
    from aprof._core import _sampler

    monkeypatch.setattr(_sampler, "_forced", procjobs.BrokenSamplerModule)
    with tempfile.TemporaryDirectory() as d:
        job = _processes._Job(1, d, {"sample_interval": SAMPLE}, 0, 1, 1, 0)
        _processes._warned.clear()
        with pytest.warns(aprof.AprofWarning, match="cannot sample stacks"):
            assert _processes.ProcessCall(procjobs.work, job)(10) == 45
        [saved] = os.listdir(d)
        child = aprof.load(os.path.join(d, saved))
    assert sorted(e.name for e in child.events()) == ["inner", "work"]
    assert child.samples is None


def test_a_session_payload_of_the_previous_version_still_loads() -> None:
    # A worker of an aprof from before the samples (payload version 2)
    # still gives its session; an unknown version is refused clearly.
    with aprof.profile(sample_interval=SAMPLE) as prof:
        with aprof.record_function("job"):
            procjobs.burn(0.02)
    s = prof.session
    assert s.samples is not None
    payload = _processes.dump_session(s)
    version, *fields = pickle.loads(payload)
    assert version == 3
    back = _processes.load_session(payload)
    assert back.samples is not None
    assert back.samples.to_json() == s.samples.to_json()
    v2 = pickle.dumps((2, *fields[:-1]))  # version 2: no samples
    old = _processes.load_session(v2)
    assert [e.name for e in old.events()] == ["job"]
    assert old.samples is None
    with pytest.raises(ValueError, match="version 99"):
        _processes.load_session(pickle.dumps((99, *fields)))


def test_a_worker_that_cannot_profile_runs_the_jobs_and_is_not_named_dead(
    private_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Issue 20 "Bad input": a worker where aprof cannot start a profile runs
    # the jobs unprofiled with one warning; the parent does not take it for
    # a worker that died with its jobs' profile (nothing was lost).
    ex = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=procjobs.break_profiles
    )
    try:
        with aprof.profile() as prof:
            ppool = aprof.propagating(ex)
            assert [ppool.submit(procjobs.work, 10).result() for _ in range(2)] == [45, 45]
    finally:
        ex.shutdown()
    assert prof.session.lost == []
    assert _children(prof) == []
    err = capfd.readouterr().err
    assert err.count("runs unprofiled") == 1, err
    assert _left(private_tmp) == []
