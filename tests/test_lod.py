"""The HTML report past its detail budget (SPEC 9.2, issue 17 item 3): which
events it keeps, how it merges the rest, the flame graph over all of them,
the C passes against their pure-Python twins, and reading such a report
back (SPEC 10.1)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native
from aprof._export import _html
from aprof._post import _lod
from aprof._post._readers import read_profile
from aprof._post._session import Session
from aprof._post._table import EventTable

from .conftest import Backend, twin

ALWAYS = _lod.always_kept()


def mixed_profile(backend: Backend, n: int = 40) -> aprof.profile:
    """Tasks with nested ranges of many lengths, async ranges, instants and
    executor jobs: every kind of row the passes treat apart."""

    async def work(i: int) -> None:
        with aprof.record_function("work"):
            for j in range(i % 5 + 1):
                with aprof.record_function(f"step {j}"):
                    aprof.mark("tick")
                    with aprof.record_function("leaf"):
                        pass
            await backend.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            r = aprof.record_function("async one").start()
            async with backend.group() as g:
                for i in range(n):
                    g.start_soon(work, i)
            r.end()
            with aprof.record_function("top"), aprof.record_function("mid"):
                pass
        return prof

    return backend.run(main)


def _is_child(tab: EventTable, i: int) -> bool:
    return _lod._is_child(tab, i)


@pytest.mark.parametrize("budget", [1, 10, 60, 200, 10**6])
def test_kept_events_are_the_structure_then_the_longest_with_their_ancestors(backend: Backend, budget: int) -> None:
    # SPEC 9.2: tasks, executor jobs and loop blocks always; then by length.
    tab = mixed_profile(backend).session._table
    mask, rows, shortest = _lod.keep_rows(tab, ALWAYS, budget)
    assert list(rows) == [i for i in range(len(tab)) if mask[i]]
    always = [i for i in range(len(tab)) if ALWAYS[tab.scope[i]]]
    assert always
    assert all(mask[i] for i in always)
    for i in rows:  # nesting holds among the kept events
        if _is_child(tab, i):
            assert mask[tab.parent[i]], i
    dur = [tab.end[i] - tab.start[i] for i in range(len(tab))]
    by_length = [i for i in rows if not ALWAYS[tab.scope[i]]]
    if budget >= len(tab):
        assert len(rows) == len(tab)
        return
    dropped = [i for i in range(len(tab)) if not mask[i]]
    assert dropped
    if by_length:
        # Ranked by power of two: nothing dropped is twice as long as the shortest kept.
        assert shortest == min(dur[i] for i in by_length)
        assert max(dur[i] for i in dropped) < 2 * max(shortest, 1)
    # Over the budget only by the structure and the ancestors that keep nesting.
    ancestors = sum(1 for i in rows if any(_is_child(tab, k) and tab.parent[k] == i for k in rows))
    assert len(rows) <= max(budget, len(always)) + ancestors


@pytest.mark.parametrize("resolution", [1, 50_000, 10**12])
def test_merged_blocks_account_for_every_event_not_kept(backend: Backend, resolution: int) -> None:
    # SPEC 9.2: what is not in full is merged, counted, and never drawn over a kept event.
    tab = mixed_profile(backend).session._table
    mask, rows, _ = _lod.keep_rows(tab, ALWAYS, 30)
    remap = array("i", range(len(tab.tracks)))
    blocks, events, kept = _lod.merge_rows(tab, mask, 0, resolution, remap)
    assert sum(events) == len(tab)
    assert sum(kept) == len(rows)
    items = [blocks[k : k + _lod.ITEM] for k in range(0, len(blocks), _lod.ITEM)]
    assert sum(b[4] for b in items) == len(tab) - len(rows)
    depth = _lod.depths(tab)
    for t, d, s, dur, count, busy in items:
        assert count >= 1
        assert busy >= 0
        assert dur >= 0
        # No kept event of the same row starts inside a block.
        for i in rows:
            same_row = (tab.kind[i] & 4 and d == -1) or (not tab.kind[i] & 4 and depth[i] == d)
            if tab.track[i] == t and same_row:
                assert not (s < tab.start[i] < s + dur), (i, s, dur)
    if resolution == 1:
        assert len(items) >= 1
    if resolution == 10**12:  # one block per run between kept events at most
        assert len(items) <= len(tab) - len(rows)


def test_flame_by_range_over_every_event_matches_the_events(backend: Backend) -> None:
    # SPEC 9.2: the flame graph by range, merged by call path, over all events.
    tab = mixed_profile(backend).session._table
    label = array("i", tab.name)
    parent, lab, total = _lod.range_flame(tab, label)
    assert (parent[0], lab[0]) == (-1, -1)
    assert all(parent[k] < k for k in range(1, len(parent)))  # parents first
    tops = [i for i in range(len(tab)) if not tab.kind[i] & 5 and not _is_child(tab, i)]
    assert total[0] == sum(tab.end[i] - tab.start[i] for i in tops)

    def path(k: int) -> tuple[str, ...]:
        out: list[str] = []
        while k > 0:
            out.append(tab.names[lab[k]])
            k = parent[k]
        return tuple(reversed(out))

    want: dict[tuple[str, ...], int] = {}
    for i in range(len(tab)):
        if tab.kind[i] & 5:
            continue
        p: list[str] = []
        j = i
        while True:
            p.append(tab.names[tab.name[j]])
            if not _is_child(tab, j):
                break
            j = tab.parent[j]
        key = tuple(reversed(p))
        want[key] = want.get(key, 0) + tab.end[i] - tab.start[i]
    assert {path(k): total[k] for k in range(1, len(parent))} == want


def test_the_c_passes_match_their_python_twins(backend: Backend) -> None:
    # SPEC 14 (the extension and its twins): same output, to the byte.
    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1 or not built)")
    tab = mixed_profile(backend).session._table
    remap = array("i", reversed(range(len(tab.tracks))))
    for budget in (0, 5, 40, 10**6):
        got = _lod.keep_rows(tab, ALWAYS, budget)
        assert got == twin(_lod.keep_rows, tab, ALWAYS, budget)
        for resolution in (1, 10_000, 10**12):
            assert _lod.merge_rows(tab, got[0], 123, resolution, remap) == twin(_lod.merge_rows, tab, got[0], 123, resolution, remap)
    label = array("i", [k % 3 for k in tab.name])
    assert _lod.range_flame(tab, label) == twin(_lod.range_flame, tab, label)


def test_bad_arguments_are_refused_by_both(backend: Backend) -> None:
    # SPEC 12: a clear error naming what was wrong.
    tab = mixed_profile(backend, 3).session._table
    mask, _, _ = _lod.keep_rows(tab, ALWAYS, 5)
    remap = array("i", range(len(tab.tracks)))
    with pytest.raises(ValueError, match="resolution must be >= 1 ns, got 0"):
        _lod.merge_rows(tab, mask, 0, 0, remap)
    with pytest.raises(ValueError, match="resolution must be >= 1 ns, got 0"):
        twin(_lod.merge_rows, tab, mask, 0, 0, remap)
    if _native.extension is not None:
        with pytest.raises(ValueError, match="keep has 2 bytes"):
            _native.extension.lod_merge(tab, b"\1\1", 0, 1, remap)
        with pytest.raises(ValueError, match="labels for"):
            _native.extension.lod_flame(tab, array("i", [0]))


def _doc(path: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="aprof-data">(.*?)</script>', path.read_text(), re.S)
    assert m is not None
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def test_under_the_budget_the_report_is_as_before(backend: Backend, tmp_path: Path) -> None:
    # SPEC 9.2: at or below the budget every event is in the page, and no "lod".
    session = mixed_profile(backend).session
    session.export_html(tmp_path / "a.html", budget=len(session._table))
    session.export_html(tmp_path / "b.html")
    a, b = _doc(tmp_path / "a.html"), _doc(tmp_path / "b.html")
    assert "lod" not in a
    assert a["events"] == b["events"]
    assert len(a["events"]) == 8 * len(session._table)


def test_past_the_budget_the_report_says_what_it_merged(backend: Backend, tmp_path: Path) -> None:
    # SPEC 9.2: the budget, the counts and the merged blocks are in the page.
    session = mixed_profile(backend).session
    n = len(session._table)
    out = tmp_path / "r.html"
    session.export_html(out, budget=30)
    doc = _doc(out)
    lod = doc["lod"]
    assert (lod["budget"], lod["events"]) == (30, n)
    assert lod["kept"] == len(doc["events"]) // 8
    assert lod["kept"] + lod["merged"] == n
    assert lod["merged"] > 0
    assert sum(doc["lod"]["blocks"][4::6]) == lod["merged"]
    assert sum(lod["track_events"]) == n
    assert sum(lod["track_kept"]) == lod["kept"]
    # Tasks are all there, and the summary counts every event.
    tasks = sum(1 for k in range(0, len(doc["events"]), 8) if doc["scopes"][doc["events"][k + 5]] == "task")
    assert tasks == sum(1 for e in session.events() if e.scope is aprof.RecordScope.TASK)
    assert {r[0]: r[1] for r in doc["summary"]}["leaf"] == sum(1 for e in session.events() if e.name == "leaf")
    # The flame graph by range counts merged ranges too (nodes under a
    # thousandth of the whole are left out, as the page would not draw them).
    ranges = lod["ranges"]
    assert ranges[0][0] == "all"
    assert ranges[0][1] == sum(e.duration_ns for e in session.events() if not e.is_async and not e.is_instant and (e.parent is None or e.parent.thread_id != e.thread_id))
    assert sum(r[1] for r in ranges if r[0] == "work") == sum(e.duration_ns for e in session.events() if e.name == "work")
    assert all(r[1] * 1000 >= ranges[0][1] for r in ranges)


def test_a_budgeted_report_reads_back_as_what_it_holds(backend: Backend, tmp_path: Path) -> None:
    # SPEC 10.1: `aprof report`/`convert` get the events in full and are told how many were merged.
    session = mixed_profile(backend).session
    out = tmp_path / "r.html"
    session.export_html(out, budget=30)
    back = read_profile(out)
    lod = back.metadata["html_lod"]
    assert lod["kept"] == len(back.events()) < len(session._table)
    assert lod["merged"] == len(session._table) - lod["kept"]
    assert "html_lod" not in session.metadata


def test_a_budgeted_report_with_damaged_counts_is_refused(backend: Backend, tmp_path: Path) -> None:
    # SPEC 12: a report whose counts disagree is refused, naming the file.
    session = mixed_profile(backend, 3).session
    out = tmp_path / "r.html"
    session.export_html(out, budget=5)
    text = out.read_text()
    bad = tmp_path / "bad.html"
    bad.write_text(re.sub(r'"merged":\d+', '"merged":1', text, count=1))
    with pytest.raises(ValueError, match=r"bad\.html.*level-of-detail counts disagree"):
        read_profile(bad)
    bad.write_text(re.sub(r'"kept":\d+', '"kept":"x"', text, count=1))
    with pytest.raises(ValueError, match=r"level-of-detail field 'kept' is 'x'"):
        read_profile(bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True, None])
def test_budget_must_be_a_positive_int(bad: Any, tmp_path: Path) -> None:
    # SPEC 12.
    with aprof.profile() as prof, aprof.record_function("r"):
        pass
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        prof.export_html(tmp_path / "r.html", budget=bad)
    assert not (tmp_path / "r.html").exists()


def test_the_default_budget_is_the_same_everywhere() -> None:
    import inspect

    for fn in (aprof.profile.export_html, Session.export_html, _html.export_html, _html.html_chunks):
        assert inspect.signature(fn).parameters["budget"].default == _html.DEFAULT_BUDGET, fn


def test_cli_writes_budgeted_reports_and_says_what_reading_one_lacks(tmp_path: Path) -> None:
    # SPEC 10.1: --html-budget on convert (and run), a note on report/convert of such a report.
    def go(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "aprof", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)

    with aprof.profile() as prof:
        for i in range(60):
            with aprof.record_function("r"), aprof.record_function(f"x{i % 3}"):
                pass
    prof.save(tmp_path / "s.aprof")
    ok = go("convert", "s.aprof", "r.html", "--html-budget", "20")
    assert ok.returncode == 0, ok.stderr
    assert _doc(tmp_path / "r.html")["lod"]["budget"] == 20
    rep = go("report", "r.html")
    assert rep.returncode == 0, rep.stderr
    assert re.search(r"r\.html is an HTML report past its detail budget: it holds \d+ of 120 events", rep.stderr), rep.stderr
    back = go("convert", "r.html", "t.json")
    assert back.returncode == 0, back.stderr
    assert "are not in t.json" in back.stderr
    refused = go("convert", "s.aprof", "t.json", "--html-budget", "20")
    assert refused.returncode == 2
    assert "--html-budget applies to HTML reports" in refused.stderr
    (tmp_path / "p.py").write_text("import aprof\nfor i in range(30):\n    with aprof.record_function('w'):\n        pass\n")
    run = go("run", "--html-budget", "5", "-o", "p.html", "--no-summary", "p.py")
    assert run.returncode == 0, run.stderr
    assert _doc(tmp_path / "p.html")["lod"]["budget"] == 5
    wrong = go("run", "--html-budget", "5", "-o", "p.json", "p.py")
    assert wrong.returncode == 2
    assert "--html-budget applies to HTML reports (-o x.html), not 'p.json'" in wrong.stderr

