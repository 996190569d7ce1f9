"""aprof.merge and ``aprof merge``: sessions of several processes in one (SPEC 15.4; issue 20 item 5)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

import aprof
from aprof._cli._main import main as cli_main

from .conftest import Backend

_RUN = """
import sys, aprof
with aprof.profile() as prof:
    with aprof.record_function(sys.argv[2]):
        with aprof.record_function("inner"):
            pass
prof.save(sys.argv[1])
if len(sys.argv) > 3:
    prof.export_chrome_trace(sys.argv[3])
"""


def _saved_in_another_process(tmp_path: Path, name: str, chrome: bool = False) -> Path:
    out = tmp_path / f"{name}.aprof"
    argv = [sys.executable, "-c", _RUN, str(out), name]
    if chrome:
        argv.append(str(tmp_path / f"{name}.json"))
    subprocess.run(argv, check=True, timeout=60)
    return out


def test_merge_of_two_processes_keeps_each_on_its_own_tracks(tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 5: two runs, both node 0, merge into two
    # processes (node ids made distinct, pids kept), every event once,
    # times unchanged within one boot; the result saves and loads.
    a = _saved_in_another_process(tmp_path, "first")
    b = _saved_in_another_process(tmp_path, "second")
    sa, sb = aprof.load(a), aprof.load(b)
    merged = aprof.merge([a, b])
    names = sorted(e.name for e in merged.events())
    assert names == ["first", "inner", "inner", "second"]
    by_name = {e.name: e for e in merged.events()}
    assert by_name["first"].node_id == 0
    assert by_name["second"].node_id != 0
    assert by_name["first"].thread_id != by_name["second"].thread_id
    pids = merged.metadata["pids"]
    assert pids["0"] == sa.metadata["pids"]["0"]
    assert pids[str(by_name["second"].node_id)] == sb.metadata["pids"]["0"]
    orig = {e.name: e for e in [*sa.events(), *sb.events()]}
    assert by_name["first"].start_ns == orig["first"].start_ns
    assert by_name["second"].start_ns == orig["second"].start_ns  # one boot: one clock
    assert merged.metadata["start_ns"] == min(sa.metadata["start_ns"], sb.metadata["start_ns"])
    assert merged.metadata["stop_ns"] == max(sa.metadata["stop_ns"], sb.metadata["stop_ns"])
    assert [c.name for c in by_name["second"].children] == ["inner"]
    out = tmp_path / "merged.aprof"
    merged.save(out)
    again = aprof.load(out)
    assert sorted(e.name for e in again.events()) == names
    # Exports take the processes as they are.
    merged.export_chrome_trace(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    procs = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {sa.metadata["pids"]["0"], sb.metadata["pids"]["0"]}
    merged.export_html(tmp_path / "m.html")
    merged.export_speedscope(tmp_path / "m.speedscope.json")
    merged.export_folded(tmp_path / "m.folded")


def test_merging_the_same_session_twice_is_refused(tmp_path: Path) -> None:
    # Issue 20 item 5: the same file twice would count its events twice.
    a = _saved_in_another_process(tmp_path, "first")
    with pytest.raises(ValueError, match=r"'.*first.aprof' is the same session as '.*first.aprof'"):
        aprof.merge([a, a])
    s = aprof.load(a)
    with pytest.raises(ValueError, match="session 2 is the same session as session 1"):
        aprof.merge([s, s])


def test_sessions_of_other_machines_are_aligned_by_their_wall_clocks() -> None:
    # Issue 20 item 5: another boot (another machine) has another
    # perf_counter; its times move by the difference of the offsets.
    with aprof.profile() as p:
        aprof.mark("here")
    here = p.session
    with aprof.profile() as q:
        aprof.mark("there")
    there = q.session
    there.metadata = copy.deepcopy(there.metadata)
    there.metadata["boot_id"] = "another-machine"
    there.metadata["unix_offset_ns"] = here.metadata["unix_offset_ns"] + 5_000_000
    there.metadata["pids"] = {"0": 1}
    merged = aprof.merge([here, there])
    [ev] = [e for e in merged.events() if e.name == "there"]
    assert ev.start_ns == q.events()[0].start_ns + 5_000_000
    assert ev.node_id != 0
    assert merged.metadata["stop_ns"] == q.session.metadata["stop_ns"] + 5_000_000


def test_a_trace_of_another_tool_cannot_be_placed_on_the_clock(tmp_path: Path) -> None:
    # Issue 20 item 5: a foreign trace has no wall-clock offset: a clear
    # error naming it, not a silently misplaced timeline.
    a = _saved_in_another_process(tmp_path, "first")
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}))
    with pytest.raises(ValueError, match=r"cannot place '.*other.json' on the clock.*wall-clock offset"):
        aprof.merge([a, foreign])
    not_a_profile = tmp_path / "notes.txt"
    not_a_profile.write_text("hello")
    with pytest.raises(ValueError, match="notes.txt"):
        aprof.merge([a, not_a_profile])


def test_bad_arguments() -> None:
    # SPEC 12: clear errors.
    with pytest.raises(ValueError, match="no sessions"):
        aprof.merge([])
    with pytest.raises(TypeError, match="input 1 is a int"):
        aprof.merge([3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="single one"):
        aprof.merge("a.aprof")  # type: ignore[arg-type]


def test_chrome_traces_of_aprof_merge_with_sessions(tmp_path: Path) -> None:
    # Issue 20 item 5: aprof's Chrome traces carry the clock and the pid.
    a = _saved_in_another_process(tmp_path, "first")
    _saved_in_another_process(tmp_path, "second", chrome=True)
    merged = aprof.merge([a, tmp_path / "second.json"])
    by_name = {e.name: e for e in merged.events()}
    assert by_name["first"].node_id != by_name["second"].node_id
    assert by_name["second"].start_ns == aprof.load(tmp_path / "second.aprof").events()[0].start_ns


def test_tasks_and_links_survive_a_merge(backend: Backend) -> None:
    # SPEC 7.2, 15.4: each session's spawn links point at its own
    # spawners after the merge, even when the ids of the two collide.
    async def child() -> None:
        with aprof.record_function("in child"):
            await backend.checkpoint()

    async def main() -> aprof.Session:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(child)
        return prof.session

    s1 = backend.run(main)
    s2 = backend.run(main)
    s2.metadata = {**s2.metadata, "pids": {"0": 1}}  # as if another process
    merged = aprof.merge([s1, s2])
    tasks = [e for e in merged.events() if e.scope is aprof.RecordScope.TASK and e.name != "" and "child" in (e.extra or {}).get("coro", "")]
    assert len(tasks) == 2
    spawners = [t.forward_thread_id for t in tasks]
    assert len(set(spawners)) == 2  # not merged into one spawner
    nodes = {t.node_id for t in tasks}
    assert len(nodes) == 2
    inner = [e for e in merged.events() if e.name == "in child"]
    assert sorted(e.thread_id for e in inner) == sorted(t.thread_id for t in tasks)


def test_one_thread_in_two_sessions_is_one_track_in_start_order(tmp_path: Path) -> None:
    # Issue 20 item 5: two global profiles of one process both record its
    # main thread, interleaved in time: the merge keeps one track, its
    # events in start order (a session file requires it).
    p1 = aprof.profile(scope="global")
    p2 = aprof.profile(scope="global")
    p1.start()
    with aprof.record_function("a"):
        pass
    p2.start()
    with aprof.record_function("b"):
        pass
    p1.stop()
    with aprof.record_function("c"):
        pass
    p2.stop()
    merged = aprof.merge([p1.session, p2.session])
    evs = merged.events()
    assert [e.name for e in evs] == ["a", "b", "b", "c"]
    assert len({e.thread_id for e in evs}) == 1
    merged.save(tmp_path / "m.aprof")
    assert [e.name for e in aprof.load(tmp_path / "m.aprof").events()] == ["a", "b", "b", "c"]


def test_cli_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SPEC 10.1, issue 20 item 5: `aprof merge A B -o OUT`.
    a = _saved_in_another_process(tmp_path, "first")
    b = _saved_in_another_process(tmp_path, "second")
    out = tmp_path / "out.aprof"
    assert cli_main(["merge", str(a), str(b), "-o", str(out)]) == 0
    assert "merged 2 files" in capsys.readouterr().err
    assert sorted(e.name for e in aprof.load(out).events()) == ["first", "inner", "inner", "second"]
    assert cli_main(["merge", str(a), str(a), "-o", str(tmp_path / "x.json")]) == 2
    assert "same session" in capsys.readouterr().err
    assert cli_main(["merge", str(a), str(tmp_path / "missing.aprof"), "-o", str(tmp_path / "x.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli_main(["merge", str(a), "-o", str(tmp_path / "x.unknown")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_reports_group_by_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SPEC 6.4, 15.4, issue 20 item 6: key_averages(group_by="node") has a
    # row per process; the Chrome trace has a process per node, at its
    # pid, and reads back with its nodes.
    a = _saved_in_another_process(tmp_path, "first")
    b = _saved_in_another_process(tmp_path, "second")
    merged = aprof.merge([a, b])
    pids = merged.metadata["pids"]
    rows = {r.key: r.count for r in merged.key_averages(group_by="node")}
    assert rows == {f"node {n} (pid {p})": 2 for n, p in pids.items()}
    merged.export_chrome_trace(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {p: f"aprof node {n}" for n, p in pids.items()}
    back = aprof.merge([tmp_path / "m.json"])
    assert sorted({e.node_id for e in back.events()}) == sorted(map(int, pids))
    assert cli_main(["report", str(tmp_path / "m.json"), "--group-by", "node", "--no-sections"]) == 0
    out = capsys.readouterr().out
    assert all(f"(pid {p})" in out for p in pids.values())
    with pytest.raises(ValueError, match="node"):
        merged.key_averages(group_by="process")


def test_drop_counts_add_up() -> None:
    # Issue 20 item 5: what each input dropped is counted in the merge.
    with aprof.profile() as p:
        aprof.mark("a")
    with aprof.profile() as q:
        aprof.mark("b")
    a, b = p.session, q.session
    a.metadata = {**a.metadata, "dropped": 2, "dropped_by_kind": {"ranges": 2}}
    b.metadata = {**b.metadata, "dropped": 3, "dropped_by_kind": {"ranges": 1, "tasks": 2}, "pids": {"0": 1}}
    merged = aprof.merge([a, b])
    assert merged.metadata["dropped"] == 5
    assert merged.metadata["dropped_by_kind"] == {"ranges": 3, "tasks": 2}


_RUN_SAMPLED = """
import sys, threading, time, aprof

def burn_first(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def burn_second(seconds):
    burn_first(seconds)

with aprof.profile(sample_interval=0.001, scope="global") as prof:
    with aprof.record_function("ranged"):
        {"first": burn_first, "second": burn_second}[sys.argv[2]](0.05)
    # A thread that records no range: only its samples know it.
    t = threading.Thread(target=burn_first, args=(0.05,), name="unranged")
    t.start()
    t.join()
prof.save(sys.argv[1])
"""


def test_merge_keeps_every_processs_samples_on_its_tracks(tmp_path: Path) -> None:
    # SPEC 8.4, 15.4: the samples of every input are in the merged session,
    # each on its process's tracks (a thread only its samples know too),
    # with its times and weights, and they survive saving.
    paths = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.aprof"
        subprocess.run([sys.executable, "-c", _RUN_SAMPLED, str(out), name], check=True, timeout=60)
        paths.append(out)
    inputs = [aprof.load(p) for p in paths]
    merged = aprof.merge(paths)
    smp = merged.samples
    assert smp is not None
    assert len(smp) == sum(len(s.samples or ()) for s in inputs)
    assert merged.metadata["samples"]["count"] == len(smp)
    tracks = {t.id: t for t in merged.tracks()}
    assert set(smp.thread_id) <= set(tracks)
    nodes = {e.node_id for e in merged.events()}
    assert len(nodes) == 2
    for s, node in zip(inputs, sorted(nodes), strict=True):
        got = sorted(
            (smp.time_ns[i], smp.weight_ns[i], smp.stack(i), tracks[smp.thread_id[i]].name)
            for i in range(len(smp))
            if tracks[smp.thread_id[i]].node_id == node
        )
        src = s.samples
        assert src is not None
        own = {t.id: t for t in s.tracks()}
        want = sorted((src.time_ns[i], src.weight_ns[i], src.stack(i), own[src.thread_id[i]].name) for i in range(len(src)))
        assert got == want
        assert len({name for *_, name in got}) == 2  # the main thread's, and the thread's of no range
    second = [i for i in range(len(smp)) if [f.rsplit(": ", 1)[-1] for f in smp.stack(i)[-2:]] == ["burn_second", "burn_first"]]
    assert second
    assert {tracks[smp.thread_id[i]].node_id for i in second} == {max(nodes)}
    assert smp.time_ns == sorted(smp.time_ns)
    merged.save(tmp_path / "merged.aprof")
    back = aprof.load(tmp_path / "merged.aprof")
    assert back.samples is not None
    assert back.samples.to_json() == smp.to_json()
