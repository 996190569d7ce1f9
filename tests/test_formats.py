"""speedscope and folded-stack exports (SPEC 9.2), and the CLI picking them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aprof

from .speedscopecheck import validate_speedscope


def nested_profile(backend) -> aprof.profile:
    async def child() -> None:
        with aprof.record_function("leaf"):
            await backend.sleep(0.002)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("outer"):
                with aprof.record_function("inner"):
                    await backend.sleep(0.002)
                async with backend.group() as g:
                    g.start_soon(child)
            r = aprof.record_function("async one").start()
            aprof.mark("instant")
            r.end()
        return prof

    return backend.run(main)


def test_speedscope_follows_the_schema(backend, tmp_path: Path) -> None:
    # SPEC 9.2: speedscope's file format, one evented profile per track, O/C nested.
    prof = nested_profile(backend)
    out = tmp_path / "p.speedscope.json"
    prof.export_speedscope(out)
    doc = validate_speedscope(out)  # the published schema and the importer's rules
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = [f["name"] for f in doc["shared"]["frames"]]
    assert {"outer", "inner", "leaf"} <= set(frames)
    tracks = {e.thread_id for e in prof.events() if not e.is_async}
    plain = [p for p in doc["profiles"] if not p["name"].endswith(" [who awaits whom]")]
    assert len(plain) == len(tracks)
    for p in doc["profiles"]:
        assert p["type"] == "evented"
        assert p["unit"] == "nanoseconds"
        stack: list[int] = []
        last = p["startValue"]
        for ev in p["events"]:
            assert ev["at"] >= last
            last = ev["at"]
            if ev["type"] == "O":
                stack.append(ev["frame"])
            else:
                assert stack.pop() == ev["frame"]
        assert not stack
        assert p["endValue"] == last
    outer = next(p for p in doc["profiles"] if any(frames[e["frame"]] == "outer" for e in p["events"]))
    opened = [frames[e["frame"]] for e in outer["events"] if e["type"] == "O"]
    assert opened[:2] == ["outer", "inner"]


def test_folded_stacks_sum_self_times(tmp_path: Path) -> None:
    # SPEC 9.2: one line per stack, value = self time in microseconds.
    with aprof.profile() as prof:
        with aprof.record_function("a;b"):
            with aprof.record_function("c d"):
                sum(range(20000))
    out = tmp_path / "p.folded"
    prof.export_folded(out)
    lines = out.read_text().splitlines()
    by_stack = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines}
    events = {e.name: e for e in prof.events()}
    track = events["a;b"].track.replace(" ", "\u00a0")
    inner_key = f"{track};a:b;c\u00a0d"
    assert by_stack[inner_key] == events["c d"].self_duration_ns // 1000
    assert all(len(line.rsplit(" ", 1)) == 2 for line in lines)


@pytest.mark.parametrize("name", ["t.speedscope.json", "t.folded"])
def test_cli_picks_the_format_from_the_name(tmp_path: Path, name: str) -> None:
    # SPEC 10.1, 9.2
    script = tmp_path / "s.py"
    script.write_text("import aprof\nwith aprof.record_function('x'):\n    sum(range(100000))\n")
    proc = subprocess.run(
        [sys.executable, "-m", "aprof", "run", "--no-summary", "-o", name, str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / name).read_text()
    if name.endswith(".folded"):
        assert text.split(";")[-1].startswith("x ")
    else:
        assert json.loads(text)["shared"]["frames"] == [{"name": "x"}]


def test_wrong_extension_is_refused(tmp_path: Path) -> None:
    # SPEC 12, BI-06
    with aprof.profile() as prof:
        pass
    with pytest.raises(ValueError, match="speedscope"):
        prof.export_speedscope(tmp_path / "x.json")
    with pytest.raises(ValueError, match="folded"):
        prof.export_folded(tmp_path / "x.txt")


@pytest.mark.parametrize("name", ["p.folded", "p.speedscope.json", "p.json", "p.json.gz", "p.html"])
def test_names_with_lone_surrogates_are_written_as_valid_utf8(tmp_path: Path, name: str) -> None:
    # SPEC 9.2, 12 (issue 15 item 24): a name from os.fsdecode of non-UTF-8
    # bytes holds a lone surrogate; every export must stay valid UTF-8 (other
    # tools reject the file otherwise) and still show where the odd byte was.
    import gzip
    import os

    odd = "read " + os.fsdecode(b"caf\xe9.txt")  # 'read caf\udce9.txt'
    with aprof.profile() as prof:
        with aprof.record_function(odd):
            sum(range(20000))
    out = tmp_path / name
    {
        "folded": prof.export_folded,
        "speedscope.json": prof.export_speedscope,
        "json": prof.export_chrome_trace,
        "json.gz": prof.export_chrome_trace,
        "html": prof.export_html,
    }[name.split(".", 1)[1]](out)
    raw = out.read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8")  # strict: raises on a lone surrogate's bytes
    if name.endswith(".folded"):
        # The odd byte is written as Python writes it, \udce9, in valid UTF-8.
        [line] = [line for line in text.splitlines() if "caf" in line]
        assert "read\u00a0caf\\udce9.txt" in line
    else:
        assert "\\udce9" in text  # JSON's escape; json.loads gives the name back


def test_speedscope_of_an_empty_profile_still_opens(tmp_path: Path) -> None:
    # SPEC 9.2: speedscope opens the file on a profile; an empty list leaves
    # it nothing to show.
    with aprof.profile() as prof:
        pass
    out = tmp_path / "p.speedscope.json"
    prof.export_speedscope(out)
    doc = validate_speedscope(out)
    assert len(doc["profiles"]) == 1
    assert doc["profiles"][0]["events"] == []


def _speedscope(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "a"}, {"name": "b"}]},
        "profiles": [
            {
                "type": "evented",
                "name": "p",
                "unit": "nanoseconds",
                "startValue": 0,
                "endValue": 10,
                "events": [
                    {"type": "O", "frame": 0, "at": 0},
                    {"type": "O", "frame": 1, "at": 2},
                    {"type": "C", "frame": 1, "at": 3},
                    {"type": "C", "frame": 0, "at": 10},
                ],
            }
        ],
    }
    profile = doc["profiles"][0]
    for key, value in changes.items():
        if key in profile:
            profile[key] = value
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"$schema": "https://example.com/schema.json"}, "is not"),
        ({"unit": "parsecs"}, "not one of"),
        ({"type": "timed"}, "matches none of anyOf"),
        ({"events": [{"type": "O", "frame": 0}]}, "matches none of anyOf"),
        ({"shared": {}}, "missing ['frames']"),
        ({"events": [{"type": "O", "frame": 5, "at": 0}, {"type": "C", "frame": 5, "at": 1}]}, "out of range"),
        ({"events": [{"type": "O", "frame": 0, "at": 5}, {"type": "C", "frame": 0, "at": 4}]}, "before"),
        ({"events": [{"type": "O", "frame": 0, "at": -1}, {"type": "C", "frame": 0, "at": 4}]}, "before"),
        ({"events": [{"type": "O", "frame": 0, "at": 1}, {"type": "O", "frame": 1, "at": 2}, {"type": "C", "frame": 0, "at": 3}]}, "on top"),
        ({"events": [{"type": "O", "frame": 0, "at": 1}]}, "never closed"),
        ({"endValue": -1}, "endValue before startValue"),
        ({"activeProfileIndex": 1}, "names no profile"),
        ({"profiles": []}, "no profiles"),
    ],
)
def test_speedscopecheck_refuses_what_speedscope_would(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    # The validator the speedscope tests rely on catches each rule it lists.
    good = tmp_path / "good.speedscope.json"
    good.write_text(json.dumps(_speedscope()))
    validate_speedscope(good)
    bad = tmp_path / "bad.speedscope.json"
    bad.write_text(json.dumps(_speedscope(**changes)))
    with pytest.raises(AssertionError, match=re.escape(message)):
        validate_speedscope(bad)


# ---------------------------------------------------------------------------
# SPEC 10.1: `aprof report` reads aprof's own speedscope and folded files
# ---------------------------------------------------------------------------


def _rows(session: Any) -> dict[str, tuple[int, int, int]]:
    return {r.key: (r.count, r.total_ns, r.self_ns) for r in session.key_averages()}


def test_speedscope_reads_back_as_the_same_call_trees(backend, tmp_path: Path) -> None:
    # SPEC 10.1, 9.2: every range nested on its track comes back, with its
    # track, its nesting and its time to the nanosecond; tasks stay tasks.
    from aprof._post._readers import read_profile

    prof = nested_profile(backend)
    out = tmp_path / "p.speedscope.json"
    prof.export_speedscope(out)
    back = read_profile(out)
    nested = [e for e in prof.events() if not e.is_async and not e.is_instant]
    assert not any(e.is_async for e in prof.events())  # all of them have a place in a call tree
    assert _rows(back) == _rows(prof)
    assert {(t.id, t.name) for t in back.tracks()} == {(e.thread_id, e.track) for e in nested}
    inner = next(e for e in back.events() if e.name == "inner")
    assert inner.parent is not None
    assert inner.parent.name == "outer"
    leaf = next(e for e in back.events() if e.name == "leaf")
    assert leaf.parent is not None
    assert leaf.parent.scope is aprof.RecordScope.TASK


def test_folded_reads_back_with_self_times(backend, tmp_path: Path) -> None:
    # SPEC 10.1, 9.2: folded stacks keep each call path's self time (in whole
    # microseconds) under its track; tasks stay tasks.
    from aprof._post._readers import read_profile

    prof = nested_profile(backend)
    out = tmp_path / "p.folded"
    prof.export_folded(out)
    back = read_profile(out)
    original = {r.key: r for r in prof.key_averages()}
    again = {r.key: r for r in back.key_averages()}
    assert set(again) == set(original)
    for key, row in original.items():
        assert again[key].count == row.count, key
        assert 0 <= row.self_ns - again[key].self_ns < 1000 * row.count, key  # floored to the microsecond
    assert {t.name for t in back.tracks()} == {e.track for e in prof.events() if not e.is_async and not e.is_instant}
    assert all(e.scope is aprof.RecordScope.TASK for e in back.events() if e.name.startswith("task "))


@pytest.mark.parametrize("name", ["t.speedscope.json", "t.folded"])
def test_cli_reports_speedscope_and_folded_files(tmp_path: Path, name: str) -> None:
    # SPEC 10.1: `aprof report FILE` on what `aprof run -o FILE` wrote.
    script = tmp_path / "s.py"
    script.write_text("import aprof\nwith aprof.record_function('work'):\n    sum(range(300000))\n")
    run = [sys.executable, "-m", "aprof"]
    proc = subprocess.run([*run, "run", "--no-summary", "-o", name, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([*run, "report", name], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("work ")]
    assert row.split()[1] == "1"  # count


def test_foreign_speedscope_and_folded_files_are_read(tmp_path: Path) -> None:
    # SPEC 10.1: another tool's files: a sampled speedscope profile in
    # milliseconds, and folded stacks from a sampling profiler.
    from aprof._post._readers import read_profile

    sampled = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "main"}, {"name": "work"}, {"name": "io"}]},
        "profiles": [
            {"type": "sampled", "name": "py-spy", "unit": "milliseconds", "startValue": 0, "endValue": 6,
             "samples": [[0, 1], [0, 1], [0, 2]], "weights": [1, 2, 3]},
        ],
    }  # fmt: skip
    (tmp_path / "s.speedscope.json").write_text(json.dumps(sampled))
    s = read_profile(tmp_path / "s.speedscope.json")
    assert _rows(s) == {"main": (1, 6_000_000, 0), "work": (1, 3_000_000, 3_000_000), "io": (1, 3_000_000, 3_000_000)}
    assert [t.name for t in s.tracks()] == ["py-spy"]

    (tmp_path / "perf.txt").write_text("python;main;work 30\npython;main;io 12\npython;main 3\n")
    f = read_profile(tmp_path / "perf.txt")  # sniffed: no .folded suffix
    assert _rows(f) == {"main": (1, 45_000, 3_000), "work": (1, 30_000, 30_000), "io": (1, 12_000, 12_000)}
    assert [t.name for t in f.tracks()] == ["python"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("x.folded", "a;b notanumber\n", "line 1 is not"),
        ("x.folded", "a;b 10\n\xff\n", "not valid folded stacks"),
        (
            "x.speedscope.json",
            json.dumps({"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": [{"name": "a"}]},
                        "profiles": [{"type": "evented", "name": "p", "unit": "nanoseconds", "startValue": 0, "endValue": 1,
                                      "events": [{"type": "O", "frame": 0, "at": 0}]}]}),
            "leaves 1 frame(s) open",
        ),
        ("x.speedscope.json", json.dumps({"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {}, "profiles": []}), "is damaged"),
    ],
)  # fmt: skip
def test_damaged_speedscope_and_folded_files_name_themselves(tmp_path: Path, name: str, content: str, message: str) -> None:
    # SPEC 12: a clear error naming the file and what is wrong.
    from aprof._post._readers import read_profile

    bad = tmp_path / name
    bad.write_bytes(content.encode("utf-8", "surrogateescape") if "\xff" not in content else content.encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        read_profile(bad)
    assert str(bad) in str(info.value)


def test_the_html_reports_document_is_the_same_from_c_and_python(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 9.2 (issue 17): the report's compact event array, built from the
    # extension's columns, says for every event what the event-by-event
    # path says: track, times, parent, name, scope, flags and details.
    from aprof._core import _native
    from aprof._post._compact import compact_document

    from .conftest import require_c_extension

    require_c_extension()

    def work(x: int) -> int:
        with aprof.record_function("in-thread", args=f"x={x}"):
            return x

    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}"):
            await backend.sleep(0.001)
        await backend.to_thread(work, i)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("outer"):
                aprof.mark("here")
                async with backend.group() as g:
                    for i in range(3):
                        g.start_soon(child, i)
            try:
                with aprof.record_function("fails"):
                    raise KeyError("x")
            except KeyError:
                pass
        return prof

    session = backend.run(main).session

    def rows(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
        flat, names, scopes, details = doc["events"], doc["names"], doc["scopes"], doc["details"]
        return [
            (*flat[i : i + 4], names[flat[i + 4]], scopes[flat[i + 5]], flat[i + 6], details[flat[i + 7]] if flat[i + 7] >= 0 else None)
            for i in range(0, len(flat), 8)
        ]

    from_c = compact_document(session)
    monkeypatch.setattr(_native, "extension", None)
    from_python = compact_document(session)
    assert rows(from_c) == rows(from_python)
    assert any(r[7] is not None for r in rows(from_c))  # details were there to compare
    assert any(r[6] for r in rows(from_c))  # and flags
