"""The HTML report (SPEC 9.2) in a real browser, and reading reports and
Chrome traces back (SPEC 10.1).

The browser tests run Debian's headless Chromium and assert on the DOM the
page's script built (``--dump-dom``), so they fail if the script throws, draws
nothing or misses a track. ``.ci/run`` installs Chromium and sets
``APROF_REQUIRE_BROWSER=1``, which turns a missing browser into a failure
instead of a skip.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native
from aprof._post._readers import read_profile

from .browser import Page, png_pixels
from .synthetic import synthetic_session
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


def test_a_foreign_traces_sampled_category_is_kept(tmp_path: Path) -> None:
    # SPEC 10.1, 8.4: only aprof's own sampled rows are skipped on reading
    # (their samples come back whole from otherData); another tool's slices
    # in a category named "sampled" are ranges like any other.
    out = tmp_path / "foreign.json"
    out.write_text('[{"ph":"X","name":"tick","cat":"sampled","pid":7,"tid":3,"ts":0,"dur":10}]')
    [tick] = read_profile(out).events()
    assert (tick.name, tick.duration_ns) == ("tick", 10_000)


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


# ---------------------------------------------------------------------------
# The first screen (issue 16 items 2-4), driven through the DevTools protocol:
# real input events, screenshots checked for drawing, no console errors.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with Page(chromium, tmp_path_factory.mktemp("chromium-cdp")) as p:
        yield p


def open_report(page: Page, path: Path, fragment: str = "") -> dict[str, Any]:
    """Load a report and return what its script recorded; fail on errors."""
    page.events.clear()
    page.open(path.as_uri() + fragment)
    state = page.eval(
        "({ready: document.body.dataset.ready, error: document.body.dataset.error || null,"
        " errors: document.getElementById('errors').textContent,"
        " loadMs: +document.body.dataset.loadMs, drawMs: +document.getElementById('tl').dataset.drawMs,"
        " drawn: +document.getElementById('tl').dataset.drawn, arrows: +document.getElementById('tl').dataset.arrows,"
        " groups: JSON.parse(document.getElementById('tl').dataset.groups || '[]'),"
        " foldNs: +document.getElementById('tl').dataset.foldNs,"
        " paint: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null,"
        " box: (function (r) { return [r.x, r.y, r.width, r.height]; })(document.getElementById('tl').getBoundingClientRect())})"
    )
    assert state["ready"] == "1", state
    assert state["error"] is None, state["errors"]
    assert page.console_errors() == []
    return state  # type: ignore[no-any-return]


def assert_timeline_drawn(page: Page, box: list[float]) -> None:
    """A screenshot of the timeline holds drawing: many colours, not a blank canvas."""
    x, y, w, h = box
    png = page.screenshot({"x": x, "y": y, "width": w, "height": h, "scale": 0.25})
    width, height, rows = png_pixels(png)
    pixels = [row[i : i + 3] for row in rows for i in range(0, len(row), 3)]
    colours = set(pixels)
    inked = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert len(colours) > 8, f"the timeline looks blank: {len(colours)} colours"
    assert inked > width * height // 50, f"the timeline looks blank: {inked} of {width * height} pixels drawn"


def detail_lines(page: Page) -> list[tuple[str, str]]:
    return [tuple(x) for x in page.eval("Array.from(document.getElementById('detail').children).map(d => [d.textContent, d.className])")]


def _stdlib_heavy_formatting() -> str:
    # Blocks the loop inside the standard library, called from user code.
    import textwrap

    return textwrap.fill("word " * 80_000, width=40)


def test_loop_block_detail_names_the_culprit_outermost_first(backend, page: Page, tmp_path: Path) -> None:
    # SPEC 7.5, 9.2 (issue 16 item 2, HTML side): the report opens on the
    # longest loop block; its stack reads outermost first, trimmed to user
    # code with library frames folded, the innermost user frame marked, as
    # file:line lines, not a raw JSON array.
    async def handler() -> None:
        await backend.sleep(0.01)
        _stdlib_heavy_formatting()

    async def main() -> aprof.profile:
        async with aprof.profile(loop_block_threshold=0.03) as prof:
            async with backend.group() as g:
                g.start_soon(handler)
            await backend.sleep(0.05)  # the heartbeat comes back: the block is recorded
        return prof

    prof = backend.run(main)
    # The hog's block; a loaded machine may add shorter ones.
    block = max((e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK), key=lambda e: e.duration_ns)
    out = tmp_path / "r.html"
    prof.export_html(out)
    state = open_report(page, out)
    assert_timeline_drawn(page, state["box"])
    lines = detail_lines(page)
    text = [t for t, _ in lines]
    assert text[1].startswith("The event loop was blocked for "), text
    assert not any("[[" in t or '", ' in t for t in text), text  # no JSON arrays
    [culprit] = [t for t, cls in lines if cls == "culprit"]
    assert "_stdlib_heavy_formatting" in culprit
    assert re.search(r"test_html\.py:\d+\s+_stdlib_heavy_formatting\s+\u2190 here$", culprit), culprit
    frames = text[text.index(next(t for t in text if t.startswith("What was running"))) + 1 :]
    assert frames.index(next(t for t in frames if "handler" in t)) < frames.index(culprit)  # outermost first
    folded = [t for t, cls in lines if cls == "lib" and "frames in" in t]
    assert any("textwrap" in t for t in folded), text  # the stdlib frames it was in, one line
    assert block.stack is not None
    assert len(frames) < len(block.stack)  # trimmed
    # Above the timeline, a table of the blocks: duration, task, and the
    # innermost line of the user's code; a click selects the block.
    assert page.eval("document.getElementById('blocks').hidden") is False
    rows = page.eval("Array.from(document.querySelectorAll('#blocks-table tbody tr')).map(tr => Array.from(tr.children).map(td => td.textContent))")
    assert len(rows) == len([e for e in prof.events() if e.scope is aprof.RecordScope.LOOP_BLOCK])
    _, _, task_cell, where = rows[0]  # the longest first
    assert re.search(r"(^|/)test_html\.py:\d+\s+_stdlib_heavy_formatting$", where), where
    if not backend.is_trio:
        assert task_cell.startswith(str(block.extra["blocked_task"]))
    page.eval("document.getElementById('detail').textContent = ''")
    page.eval("document.querySelector('#blocks-table tbody tr').click()")
    assert any(cls == "culprit" for _, cls in detail_lines(page))


def test_report_selects_what_the_url_names(backend, page: Page, tmp_path: Path) -> None:
    # SPEC 9.2: '#select=NAME' opens the range's group, scrolls to it and
    # shows its details (a link to one range of a report).
    prof = nested_profile(backend)
    out = tmp_path / "r.html"
    prof.export_html(out)
    open_report(page, out, "#select=leaf")
    assert page.eval("document.getElementById('detail').dataset.selected") == "leaf"
    leaf = next(e for e in prof.events() if e.name == "leaf")
    assert any(leaf.track in t for t, _ in detail_lines(page))


def test_track_names_agree_with_the_summary(backend, page: Page, tmp_path: Path) -> None:
    # SPEC 9.2 (issue 16 item 4): the summary's rows ("task <coro>") name the
    # timeline's groups and appear in every task's track label; the summary
    # has the CLI's Min and Max columns.
    async def child(i: int) -> None:
        with aprof.record_function("child work"):
            await backend.sleep(0.001 * i)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                for i in range(4):
                    g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    out = tmp_path / "r.html"
    prof.export_html(out)
    state = open_report(page, out)
    head = page.eval("Array.from(document.querySelectorAll('#summary-table th')).map(th => th.textContent.replace(/ [\\u25be\\u25b4]$/, ''))")
    assert head == ["Name", "Count", "Total", "Self", "Mean", "Min", "Max", "Running", "Waiting"]
    rows = page.eval("Array.from(document.querySelectorAll('#summary-table tbody tr')).map(tr => Array.from(tr.children).map(td => td.textContent))")
    summary = {r[0]: r for r in rows}
    task_key = f"task {child.__qualname__}"
    assert task_key in summary
    assert summary[task_key][1] == "4"
    expected = next(r for r in prof.key_averages() if r.key == task_key)
    assert summary[task_key][5] != summary[task_key][6]  # min and max of four different tasks
    assert expected.min_ns < expected.max_ns
    [(key, count, _)] = state["groups"]
    assert (key, count) == (task_key, 4)
    labels = page.eval("Array.from(document.querySelectorAll('#tracks-table tbody tr td:first-child')).map(td => td.textContent)")
    tasks = [t for t in prof.session.tracks() if t.steps]
    for t in tasks:
        [label] = [x for x in labels if x.endswith(f"#{t.id}")]
        assert label.startswith(t.name)
        assert task_key in label or child.__qualname__ in t.name


def test_startup_is_folded_into_one_labelled_band(page: Page, tmp_path: Path) -> None:
    # SPEC 9.2, 10.1 (issue 16 item 4): under `aprof run`, the time before
    # the program's first event (imports; here a sleep at import time) is
    # folded, so the timeline opens on the program's work.
    script = tmp_path / "slow_start.py"
    script.write_text(
        "import asyncio, time\n"
        "time.sleep(0.3)  # a slow import\n"
        "async def work(i):\n"
        "    await asyncio.sleep(0.01)\n"
        "async def main():\n"
        "    await asyncio.gather(*(work(i) for i in range(3)))\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", "r.html", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    state = open_report(page, tmp_path / "r.html")
    session = read_profile(tmp_path / "r.html")
    first = min(e.start_ns for e in session.events()) - session.metadata["start_ns"]
    assert state["foldNs"] == first >= 0.3e9
    assert "folded" in page.eval("document.getElementById('meta').textContent")
    assert_timeline_drawn(page, state["box"])
    # Zooming out past the fold and back keeps drawing without errors.
    x, y, w, h = state["box"]
    page.wheel(x + w / 2, y + h / 2, dy=300, ctrl=True)
    page.call("Input.dispatchMouseEvent", {"type": "mousePressed", "x": x + w / 2, "y": y + h / 2, "button": "left", "clickCount": 2})
    page.call("Input.dispatchMouseEvent", {"type": "mouseReleased", "x": x + w / 2, "y": y + h / 2, "button": "left", "clickCount": 2})
    assert page.console_errors() == []


def _parent_and_a_slow_child(backend) -> aprof.profile:
    """A task ("fan out") that spawns a fast and a slow child ("fast work",
    "slow work") and waits for both, profiled."""

    async def fast() -> None:  # wide enough to be drawn, done before the slow one
        with aprof.record_function("fast work"):
            await backend.sleep(0.01)

    async def slow() -> None:
        with aprof.record_function("slow work"):
            await backend.sleep(0.04)

    async def parent() -> None:
        with aprof.record_function("fan out"):
            async with backend.group() as g:
                g.start_soon(fast)
                g.start_soon(slow)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            async with backend.group() as g:
                g.start_soon(parent)
        return prof

    return backend.run(main)  # type: ignore[no-any-return]


def test_stitched_flame_graph_hangs_the_slow_child_under_its_parent(backend, page: Page, tmp_path: Path) -> None:
    # SPEC 9.2 (issue 16 item 3, HTML side): the "who awaits whom" flame graph
    # shows the child that held its parent up, under the parent's range; the
    # flame graph by range has every range.
    prof = _parent_and_a_slow_child(backend)
    out = tmp_path / "r.html"
    prof.export_html(out)
    open_report(page, out)
    assert page.eval("document.getElementById('flame').dataset.showing") == "stitched"

    def nodes(box: str) -> list[tuple[str, int]]:
        return [tuple(x) for x in page.eval(f"Array.from(document.querySelectorAll('#{box} .fl')).map(d => [d.dataset.name, +d.dataset.depth])")]

    stitched = nodes("stitched-box")
    depth = {name: d for name, d in stitched}
    q = "task _parent_and_a_slow_child.<locals>."  # the coroutines' qualified names
    chain = [f"{q}parent", "fan out", f"{q}slow", "slow work"]
    assert [depth.get(n) for n in chain] == [depth[chain[0]] + k for k in range(4)], stitched
    assert f"{q}fast" not in depth
    by_range = {name for name, _ in nodes("flame-box")}
    assert {"fan out", "fast work", "slow work", f"{q}fast"} <= by_range
    page.eval("document.getElementById('tab-ranges').click()")
    assert page.eval("document.getElementById('flame').dataset.showing") == "ranges"
    assert page.console_errors() == []


def test_fifty_thousand_tasks_stay_responsive(page: Page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # SPEC 9.2 (issue 16 item 4): 50k tasks load, draw and scroll. Tasks of
    # one coroutine are one closed group; opened, only the tracks on screen
    # draw, with their arrows. Timings are recorded (junit properties and
    # the test item's user_properties), never asserted. A scale test of the page, so one
    # runtime (asyncio) is enough: the data has the same shape on all.
    n = 50_000

    async def work(i: int) -> None:
        with aprof.record_function("work"):
            await asyncio.sleep(0)

    async def spawner() -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(work(i))

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            await asyncio.create_task(spawner())
        return prof

    def record_property(name: str, value: object) -> None:
        # What record_property does, without its warning under --junitxml xunit2.
        request.node.user_properties.append((name, value))

    prof = asyncio.run(main())
    out = tmp_path / "big.html"
    prof.export_html(out)
    record_property("html_bytes", out.stat().st_size)
    state = open_report(page, out)
    record_property("load_ms", state["loadMs"])
    record_property("first_contentful_paint_ms", state["paint"])
    record_property("first_draw_ms", state["drawMs"])
    groups = {key: (count, opened) for key, count, opened in state["groups"]}
    assert groups[f"task {work.__qualname__}"] == (n, False)
    assert_timeline_drawn(page, state["box"])
    x, y, w, h = state["box"]
    # Open the group: click its header (the second row, under the spawner's track).
    spawner_h = 16 + 5 + 2 + 15 + 6  # header, running row, one range row, gap
    page.click(x + 200, y + 18 + spawner_h + 8)
    opened = page.eval("JSON.parse(document.getElementById('tl').dataset.groups)")
    assert [g[2] for g in opened] == [True]
    draw_ms = [float(page.eval("document.getElementById('tl').dataset.drawMs"))]
    drawn = int(page.eval("document.getElementById('tl').dataset.drawn"))
    arrows = int(page.eval("document.getElementById('tl').dataset.arrows"))
    assert 0 < arrows < 100  # only the tracks on screen, not 50k
    assert drawn < 2000
    for _ in range(5):  # scroll deep into the group, then zoom
        page.wheel(x + w / 2, y + h / 2, dy=400_000)
        draw_ms.append(float(page.eval("document.getElementById('tl').dataset.drawMs")))
    page.wheel(x + w / 2, y + h / 2, dy=-300, ctrl=True)
    draw_ms.append(float(page.eval("document.getElementById('tl').dataset.drawMs")))
    record_property("scroll_zoom_draw_ms", draw_ms)
    assert_timeline_drawn(page, state["box"])
    assert int(page.eval("document.getElementById('tl').dataset.arrows")) < 100
    rows = page.eval("document.querySelectorAll('#tracks-table tbody tr').length")
    assert rows == 1000
    assert "of 50001 rows" in page.eval("document.getElementById('tracks-note').textContent")
    assert page.console_errors() == []


def _table_rows(page: Page, table_id: str) -> list[list[str]]:
    return page.eval(f"Array.from(document.querySelectorAll('#{table_id} tbody tr')).map(tr => Array.from(tr.children).map(td => td.textContent))")  # type: ignore[no-any-return]


def test_summary_sections_are_tables_that_say_what_the_text_says(backend, page: Page, tmp_path: Path) -> None:
    # SPEC 9.2 (issue 16 item 1, HTML side): the slowest tasks and the
    # longest waits are tables under the timeline, from the same records as
    # the text summary; a section with nothing to say stays hidden.
    prof = _parent_and_a_slow_child(backend)
    out = tmp_path / "r.html"
    prof.export_html(out)
    open_report(page, out)
    summary = prof.summary(limit=20)
    slowest = _table_rows(page, "slowest-table")
    assert [(r[0], r[1]) for r in slowest] == [(t.name, t.coro) for t in summary.slowest_tasks]
    assert slowest[0][1].endswith("parent")
    waits = {r[1].rsplit(".", 1)[-1]: r for r in _table_rows(page, "waits-table")}
    assert waits["parent"][3].startswith("task ")
    assert waits["parent"][3].rstrip(")").endswith("slow")
    assert page.eval("document.getElementById('queueing').hidden") is True  # no executor jobs
    assert page.eval("document.getElementById('slowest').hidden") is False


def test_executor_queueing_is_a_table(page: Page, tmp_path: Path) -> None:
    # SPEC 9.2 (issue 16 item 1, HTML side): the scenario with a slow
    # executor job, under `aprof run -o report.html`: the page shows the
    # jobs that queued behind it, as the text does.
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "-o", str(out), "examples/slow_executor_job.py"],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    open_report(page, out)
    queueing = {r[0]: r for r in _table_rows(page, "queueing-table")}
    assert queueing["resize"][1] == "12"
    assert "resize: 12 jobs" in proc.stderr
    waits = _table_rows(page, "waits-table")
    assert any(r[0] == "request-3" and r[3] == "executor job render_report" for r in waits), waits


def _lod_state(page: Page) -> dict[str, Any]:
    return page.eval(  # type: ignore[no-any-return]
        "({banner: document.getElementById('lod-banner').hidden ? null : document.getElementById('lod-banner').textContent,"
        " merged: +document.getElementById('lod-banner').dataset.merged,"
        " blocks: +document.getElementById('tl').dataset.blocksDrawn, drawn: +document.getElementById('tl').dataset.drawn,"
        " drawMs: +document.getElementById('tl').dataset.drawMs, meta: document.getElementById('meta').textContent})"
    )


def test_a_report_past_its_budget_says_so_and_draws_merged_blocks(page: Page, tmp_path: Path) -> None:
    # SPEC 9.2 (issue 17 item 3): past the detail budget, a banner states the
    # budget and what was merged; merged events are grey blocks, with a tooltip.
    with aprof.profile() as prof:
        for i in range(400):
            with aprof.record_function("outer"), aprof.record_function(f"inner {i % 4}"):
                with aprof.record_function("leaf"):
                    pass
    out = tmp_path / "r.html"
    prof.export_html(out, budget=100)
    state = open_report(page, out)
    lod = _lod_state(page)
    assert lod["banner"] is not None
    assert "1200 events, more than its detail budget of 100" in lod["banner"]
    assert lod["merged"] > 1000
    assert f"The other {lod['merged']} are merged" in lod["banner"]
    assert lod["meta"].startswith("1200 events (")
    assert lod["blocks"] > 0
    assert_timeline_drawn(page, state["box"])
    # The flame graph by range counts every event, merged ones too.
    page.eval("document.getElementById('tab-ranges').click()")
    flame = page.eval("Array.from(document.querySelectorAll('#flame-box .fl')).map(d => [d.dataset.name, d.textContent])")
    assert {"outer", "leaf"} <= {name for name, _ in flame}
    # Under the budget: no banner.
    prof.export_html(out)
    open_report(page, out)
    assert _lod_state(page)["banner"] is None
    assert page.console_errors() == []


def test_ten_million_events_open_and_stay_responsive(page: Page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # SPEC 9.2 (issue 17 item 3): a 10M-event report, at the default budget,
    # loads without errors, shows its banner, and pans and zooms drawing a
    # bounded number of shapes. Timings are recorded (the test item's
    # user_properties), never asserted. The session is built as columns
    # (tests/synthetic.py): recording 10M ranges would take minutes.
    if _native.extension is None:
        pytest.skip("the 10M-event report is the C passes' scale test; the twins are checked against them in test_lod.py")
    t0 = time.perf_counter()
    session = synthetic_session(20, 50_000)
    n = len(session._table)
    assert n == 10_000_020
    out = tmp_path / "ten-million.html"
    t1 = time.perf_counter()
    session.export_html(out)
    request.node.user_properties += [("build_s", t1 - t0), ("export_s", time.perf_counter() - t1), ("html_bytes", out.stat().st_size)]
    del session
    state = open_report(page, out)
    request.node.user_properties += [("load_ms", state["loadMs"]), ("first_draw_ms", state["drawMs"])]
    lod = _lod_state(page)
    assert lod["banner"] is not None
    assert f"This report holds {n} events, more than its detail budget of 1000000" in lod["banner"]
    assert 0 < lod["merged"] < n
    assert lod["meta"].startswith(f"{n} events (")
    assert_timeline_drawn(page, state["box"])
    x, y, w, h = state["box"]
    draw_ms = [state["drawMs"]]
    shapes = [state["drawn"]]
    for _ in range(6):  # zoom in on the middle, then pan, then back out
        page.wheel(x + w / 2, y + 60, dy=-300, ctrl=True)
        draw_ms.append(_lod_state(page)["drawMs"])
        shapes.append(_lod_state(page)["drawn"])
    for key in ("d", "d", "a"):
        page.call("Input.dispatchKeyEvent", {"type": "keyDown", "key": key, "text": key})
        page.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key})
        draw_ms.append(_lod_state(page)["drawMs"])
        shapes.append(_lod_state(page)["drawn"])
    page.wheel(x + w / 2, y + 60, dy=400, ctrl=True)
    draw_ms.append(_lod_state(page)["drawMs"])
    request.node.user_properties.append(("zoom_pan_draw_ms", draw_ms))
    # Sub-pixel ranges and blocks are merged per pixel column: a draw is
    # bounded by the screen, not by the ten million events.
    assert max(shapes) < 200_000, shapes
    assert_timeline_drawn(page, state["box"])
    counts = [r[2] for r in _table_rows(page, "tracks-table")]
    assert len(counts) == 20
    assert set(counts) == {"500001"}  # every event of the track, merged ones too
    assert page.console_errors() == []


def test_tracks_of_a_merged_session_say_their_process(page: Page, tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 6: in a report of several processes, every
    # track is labelled with its process's pid; one process: no label.
    import concurrent.futures

    from . import procjobs

    ex = concurrent.futures.ProcessPoolExecutor(1)
    try:
        with aprof.profile() as prof:
            with aprof.record_function("parent work"):
                aprof.propagating(ex).submit(procjobs.work, 10).result()
    finally:
        ex.shutdown()
    pids = prof.session.metadata["pids"]
    assert len(pids) == 2
    out = tmp_path / "r.html"
    prof.export_html(out)
    open_report(page, out)
    labels = page.eval("Array.from(document.querySelectorAll('#tracks-table tbody tr td:first-child')).map(td => td.textContent)")
    assert len(labels) == len(prof.session.tracks())
    for t in prof.session.tracks():
        [label] = [x for x in labels if x.endswith(f"#{t.id}")]
        assert label.startswith(f"pid {pids[str(t.node_id)]} \u00b7 {t.name}")
    with aprof.profile() as one:
        aprof.mark("x")
        with aprof.record_function("only"):
            pass
    one.export_html(out)
    open_report(page, out)
    labels = page.eval("Array.from(document.querySelectorAll('#tracks-table tbody tr td:first-child')).map(td => td.textContent)")
    assert not any(x.startswith("pid ") for x in labels)


def _process_groups(page: Page) -> list[list[Any]]:
    return page.eval("JSON.parse(document.getElementById('tl').dataset.processes || '[]')")  # type: ignore[no-any-return]


def test_processes_of_a_merged_session_are_groups_of_the_timeline(page: Page, tmp_path: Path) -> None:
    # SPEC 15.4, issue 20 item 6: each process of a merged session is a
    # group of the timeline: a header named by its pid (and command line,
    # when the session knows it), its tracks under it, closed and opened by
    # a click on the header; with profile_memory, each process has its own
    # memory counter under its header, not one summed over the processes.
    import textwrap

    script = """
    import subprocess, sys
    import aprof
    code = "import aprof\\nwith aprof.record_function('child work'):\\n    keep = [bytearray(300_000) for _ in range(4)]"
    with aprof.record_function("parent work"):
        keep = [bytearray(200_000) for _ in range(5)]
        subprocess.run([sys.executable, "-c", code], check=True)
    """
    (tmp_path / "parent.py").write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k not in ("APROF_FOLLOW", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "--memory", "-o", "out.aprof", "parent.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    session = aprof.load(tmp_path / "out.aprof")
    pids = session.metadata["pids"]
    assert len(pids) == 2
    commands = session.metadata["commands"]
    commands.pop(next(n for n in commands if n != "0"))  # a process whose command line is not known
    out = tmp_path / "r.html"
    session.export_html(out)
    state = open_report(page, out)
    procs = _process_groups(page)
    assert [(p[0], p[1]) for p in procs] == sorted(((int(n), pid) for n, pid in pids.items()), key=lambda x: x[0] != 0)
    parent, child = procs
    assert parent[2] == f"pid {pids['0']}: parent.py"
    assert child[2] == f"pid {child[1]}"  # no command line known: the pid
    by_node: dict[int, int] = {}
    for t in session.tracks():
        by_node[t.node_id] = by_node.get(t.node_id, 0) + 1
    assert [p[3] for p in procs] == [by_node[p[0]] for p in procs]  # each process's tracks
    assert [p[4] for p in procs] == [True, True]  # open
    assert parent[5] >= 2  # a memory counter of its own...
    assert child[5] >= 2
    assert int(page.eval("document.getElementById('tl').dataset.memoryDrawn")) >= 4  # ...both drawn
    assert_timeline_drawn(page, state["box"])
    drawn_open = int(page.eval("document.getElementById('tl').dataset.drawn"))
    # The first item is the parent's header, just under the time axis.
    x, y, w, h = state["box"]
    page.click(x + 200, y + 18 + 8)
    procs = _process_groups(page)
    assert [p[4] for p in procs] == [False, True]
    assert int(page.eval("document.getElementById('tl').dataset.drawn")) < drawn_open
    # A second click opens it again.
    page.click(x + 200, y + 18 + 8)
    assert [p[4] for p in _process_groups(page)] == [True, True]
    assert page.console_errors() == []
    # One process: no process groups, one memory counter under the axis.
    with aprof.profile(profile_memory=True) as one:
        with aprof.record_function("only"):
            keep = [bytearray(100_000) for _ in range(3)]
    del keep
    one.export_html(out)
    open_report(page, out)
    assert _process_groups(page) == []
    assert int(page.eval("document.getElementById('tl').dataset.memoryDrawn")) >= 2
