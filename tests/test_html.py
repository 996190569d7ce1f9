"""The HTML report (SPEC 9.2) in a real browser, and reading reports and
Chrome traces back (SPEC 10.1).

The browser tests run Debian's headless Chromium and assert on the DOM the
page's script built (``--dump-dom``), so they fail if the script throws, draws
nothing or misses a track. ``.ci/run`` installs Chromium and sets
``APROF_REQUIRE_BROWSER=1``, which turns a missing browser into a failure
instead of a skip.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import aprof
from aprof._post._readers import read_profile

from .test_formats import nested_profile

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = os.environ.get("APROF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("APROF_REQUIRE_BROWSER") == "1":
            pytest.fail("APROF_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH: the HTML report's browser tests need Debian's chromium (.ci/run installs it)")
    return path


def render(chromium: str, page: Path, tmp_path: Path) -> str:
    """The DOM of ``page`` after its scripts ran, as Chromium serialises it."""
    proc = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def attr(dom: str, element_id: str, name: str) -> str | None:
    m = re.search(rf'<[^>]*\bid="{element_id}"[^>]*>', dom)
    assert m is not None, f"no element #{element_id} in the rendered page"
    a = re.search(rf'\b{name}="([^"]*)"', m.group(0))
    return a.group(1) if a else None


def table_cells(dom: str, table_id: str) -> list[list[str]]:
    m = re.search(rf'<table id="{table_id}">(.*?)</table>', dom, re.S)
    assert m is not None, f"no table #{table_id}"
    rows = re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)
    cells = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)] for r in rows]
    return [c for c in cells if c]  # the header row has <th> cells only


def test_report_is_self_contained(tmp_path: Path) -> None:
    # SPEC 9.2: opens offline: no external script, style, image or font.
    with aprof.profile() as prof, aprof.record_function("work"):
        pass
    out = tmp_path / "r.html"
    prof.export_html(out)
    text = out.read_text()
    assert text.startswith("<!doctype html>")
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text)
    assert "@import" not in text
    assert "url(" not in text


def test_report_renders_tracks_flame_and_summary(backend, chromium: str, tmp_path: Path) -> None:
    # SPEC 9.2: timeline of tracks, flame graph, summary; drawn by the page's script.
    prof = nested_profile(backend)
    out = tmp_path / "r.html"
    prof.export_html(out)
    dom = render(chromium, out, tmp_path)
    assert attr(dom, "errors", "data-error") is None, re.search(r'<div id="errors">(.*?)</div>', dom, re.S)
    assert 'data-ready="1"' in dom
    assert int(attr(dom, "tl", "data-drawn") or 0) >= 4  # outer, inner, leaf, async one at least
    flame = set(re.findall(r'class="fl"[^>]*data-name="([^"]*)"', dom))
    assert {"all", "outer", "inner", "leaf"} <= flame
    summary = {row[0]: row for row in table_cells(dom, "summary-table")}
    assert {"outer", "inner", "leaf"} <= set(summary)
    assert summary["outer"][1] == "1"
    tracks = [row[0] for row in table_cells(dom, "tracks-table")]
    leaf_track = next(e.track for e in prof.events() if e.name == "leaf")
    assert any(t.startswith(leaf_track) for t in tracks)  # the spawned task has its own track
    assert len(tracks) == len(prof.session.tracks())


def test_report_with_hostile_names_stays_intact(chromium: str, tmp_path: Path) -> None:
    # SPEC 9.2, 12: a name holding markup cannot end the data tag or inject script.
    evil = "</script><script>document.body.setAttribute('data-pwned','1')</script><!--"
    with aprof.profile() as prof, aprof.record_function(evil):
        pass
    out = tmp_path / "r.html"
    prof.export_html(out)
    dom = render(chromium, out, tmp_path)
    assert 'data-ready="1"' in dom
    assert not re.search(r"<body[^>]*data-pwned", dom)  # shown as text, never run
    assert [row[0] for row in table_cells(dom, "summary-table")] == [evil]


def test_report_stays_usable_at_100k_events(chromium: str, tmp_path: Path) -> None:
    # SPEC 9.2: usable at 100k events: the page loads and draws within the budget.
    with aprof.profile() as prof:
        for i in range(25_000):
            with aprof.record_function("outer"), aprof.record_function(f"inner {i % 50}"):
                aprof.mark("tick")
                with aprof.record_function("leaf"):
                    pass
    assert len(prof.events()) == 100_000
    out = tmp_path / "big.html"
    prof.export_html(out)
    dom = render(chromium, out, tmp_path)
    assert 'data-ready="1"' in dom
    assert attr(dom, "errors", "data-error") is None
    assert 0 < int(attr(dom, "tl", "data-drawn") or 0) < 100_000  # sub-pixel ranges merged
    assert "inner 7" in set(re.findall(r'class="fl"[^>]*data-name="([^"]*)"', dom))


def test_report_reads_back_as_the_same_session(backend, tmp_path: Path) -> None:
    # SPEC 9.2, 10.1: `aprof report trace.html` sees what the profile saw.
    prof = nested_profile(backend)
    out = tmp_path / "r.html"
    prof.export_html(out)
    back = read_profile(out)
    assert [e.to_dict() for e in back.events()] == [e.to_dict() for e in prof.events()]
    assert [(t.id, t.name, t.kind, t.steps) for t in back.tracks()] == [(t.id, t.name, t.kind, t.steps) for t in prof.session.tracks()]


def test_chrome_trace_reads_back_with_nesting_tasks_and_steps(backend, tmp_path: Path) -> None:
    # SPEC 10.1: `aprof report trace.json` on aprof's own Chrome trace.
    prof = nested_profile(backend)
    out = tmp_path / "t.json.gz"
    prof.export_chrome_trace(out)
    back = read_profile(out)
    original = {r.key: r for r in prof.key_averages()}
    again = {r.key: r for r in back.key_averages()}
    assert set(again) == set(original)
    for key, row in original.items():
        # Chrome traces keep microseconds with three decimals: nanoseconds survive.
        assert (again[key].count, again[key].total_ns, again[key].self_ns) == (row.count, row.total_ns, row.self_ns), key
        assert again[key].running_ns == row.running_ns, key
    inner = next(e for e in back.events() if e.name == "inner")
    assert inner.parent is not None
    assert inner.parent.name == "outer"
    assert sorted((e.name, e.is_async, e.is_instant) for e in back.events()) == sorted(
        (e.name, e.is_async, e.is_instant) for e in prof.events()
    )


def test_foreign_chrome_trace_is_read(tmp_path: Path) -> None:
    # SPEC 10.1: another tool's trace (array form, B/E-free, arbitrary categories).
    out = tmp_path / "foreign.json"
    out.write_text(
        '[{"ph":"M","name":"thread_name","pid":7,"tid":3,"args":{"name":"worker"}},'
        '{"ph":"X","name":"a","cat":"cpu_op","pid":7,"tid":3,"ts":0,"dur":10},'
        '{"ph":"X","name":"b","cat":"cpu_op","pid":7,"tid":3,"ts":2,"dur":5},'
        '{"ph":"i","name":"m","pid":7,"tid":3,"ts":3},'
        '{"ph":"b","name":"req","cat":"net","id":1,"pid":7,"tid":3,"ts":1},'
        '{"ph":"e","name":"req","cat":"net","id":1,"pid":7,"tid":3,"ts":20},'
        '{"ph":"b","name":"lost","cat":"net","id":2,"pid":7,"tid":3,"ts":4}]'
    )
    session = read_profile(out)
    a, req, b, m, lost = session.events()
    assert (a.name, a.duration_ns, b.parent, m.parent) == ("a", 10_000, a, b)
    assert (req.is_async, req.duration_ns, req.unfinished) == (True, 19_000, False)
    assert (lost.is_async, lost.unfinished, lost.end_ns) == (True, True, req.end_ns)  # closed at the last time seen
    assert session.tracks()[0].name == "worker"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is not a session, a Chrome trace or an HTML report"),
        (b"<!doctype html><p>hello</p>", "is an HTML page but not an aprof report"),
        (b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "is damaged"),
        (b"\x1f\x8b\x08garbage", "truncated or corrupt gzip"),
    ],
)
def test_unreadable_files_name_themselves(tmp_path: Path, content: bytes, message: str) -> None:
    # SPEC 12: a clear error naming the file.
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        read_profile(bad)
    assert str(bad) in str(info.value)
