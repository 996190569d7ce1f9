"""The Chrome trace writer's C path for tasks (``chrome_rows`` in
aprof/_cevents.c) against its pure-Python twin, the exporter's loop in
aprof/_export/_chrome.py: the same text, byte for byte (SPEC 9.1), for
tasks of every backend and for task records the C path leaves to Python.
"""

from __future__ import annotations

import contextlib
import json
import math
from array import array
from typing import Any

import pytest

import aprof
from aprof._export._chrome import _task_coroutines, chrome_trace_chunks
from aprof._export._labels import task_coroutines
from aprof._post._table import SCOPES, X_EXTRA

from .conftest import Backend, named_group, require_c_extension, twin
from .tracecheck import validate_trace

TASK = aprof.RecordScope.TASK




def _task_session(backend: Backend) -> aprof.Session:
    """Tasks with awkward names, nested spawns, a failing task, ranges in
    tasks and between their steps."""
    names = ["plain", 'quote " and \\ backslash', "caf\u00e9 \u2603", "line\nbreak", "\x7f del"]

    async def leaf(i: int) -> None:
        with aprof.record_function(f"leaf {i}"):
            await backend.checkpoint()

    async def child(i: int) -> None:
        with aprof.record_function(names[i % len(names)]):
            await backend.checkpoint()
            with aprof.record_function("inner"):
                pass
        async with named_group(backend) as spawn:
            spawn(leaf, i, name=f"leaf-{i}")
        await backend.checkpoint()

    async def fails() -> None:
        await backend.checkpoint()
        raise KeyError("x")

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            with aprof.record_function("parent"):
                async with named_group(backend) as spawn:
                    for i in range(7):
                        spawn(child, i, name=names[i % len(names)] + f" {i}")
            with contextlib.suppress(KeyError, BaseException):
                async with named_group(backend) as spawn:
                    spawn(fails, name="fails")
        return prof

    return backend.run(main).session


def _both(session: aprof.Session, batch: int = 4096) -> tuple[str, str]:
    c_text = "".join(chrome_trace_chunks(session, batch))
    py_text = twin(lambda: "".join(chrome_trace_chunks(session, batch)))
    return c_text, py_text


def test_task_rows_are_the_same_text_on_the_c_and_python_paths(backend: Backend, tmp_path: Any) -> None:
    # SPEC 9.1, 7.2, 7.4: a task's row (its args), its spawn slice and flow
    # arrow and its running row are written in C to the same bytes as the
    # pure-Python loop, at any batch size; the trace validates.
    require_c_extension()
    session = _task_session(backend)
    assert len([e for e in session.events() if e.scope is TASK]) >= 15
    for batch in (1, 2, 5, 4096):
        c_text, py_text = _both(session, batch)
        assert c_text == py_text
    out = tmp_path / "t.json"
    out.write_text(c_text)
    doc = validate_trace(out)
    phases = {e["ph"] for e in doc["traceEvents"]}
    assert {"X", "s", "f", "M"} <= phases
    names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "task"}
    assert 'quote " and \\ backslash 1' in names
    assert "caf\u00e9 \u2603 2" in names


def test_the_c_writer_writes_task_rows_itself() -> None:
    # SPEC 9.1: chrome_rows goes past a finished task's row (it does not stop
    # there for the Python loop), writing its line, arrow and steps.
    ext = require_c_extension()
    session = _task_session(Backend("asyncio"))
    tab = session._table
    task_rows = [i for i in tab.rows_of_scope(TASK) if tab.seq[i] > 0 and tab.fwd[i] and not tab.kind[i]]
    assert task_rows
    i = task_rows[0]
    t = tab.tracks[tab.track[i]]
    wheres = [f'"pid":1,"tid":{u.id}' for u in tab.tracks]
    text, nxt, flow = ext.chrome_rows(
        tab, i, 0, wheres, {}, tuple(s.value for s in SCOPES), json.dumps, 1, array("i", sorted(tab.rare)),
        [u.steps for u in tab.tracks], tab.rare, [1] * len(tab.tracks), [u.id for u in tab.tracks],
        {}, {}, 1000, SCOPES.index(TASK), 41,
    )  # fmt: skip
    assert (nxt, flow) == (i + 1, 42)
    lines = [json.loads(line) for line in text.split(",\n")]
    head = lines[0]
    assert (head["ph"], head["cat"], head["tid"], head["name"]) == ("X", "task", t.id, t.name)
    assert head["args"]["sequence_nr"] == tab.seq[i]
    assert "running_ns" in head["args"]
    assert "steps" not in head["args"]
    assert [ln["ph"] for ln in lines[1:4]] == ["X", "s", "f"]
    assert lines[1]["name"] == f"spawn {t.name}"
    assert lines[2]["id"] == lines[3]["id"] == 42
    running = lines[4:]
    assert running
    assert len(running) == len(t.steps) // 2
    assert all(ln["name"] == "running" and ln["tid"] == 1000 + t.id for ln in running)


def _odd_extras() -> list[dict[str, Any]]:
    """Task extras the C path must leave to Python, or write as json.dumps does."""
    return [
        {"coro": "c", "running_ns": 5},  # would replace the computed one (dict.update)
        {"coro": "caf\u00e9", "outcome": 'q"uote', "spawn_ns": 2**70},  # escapes, a big int
        {"coro": "c", "spawn_ns": 1.5},  # int() of a float
        {"coro": "c", "ratio": math.nan, "inf": math.inf},  # strict JSON: their repr
        {"coro": "c", "nested": {(1, 2): [1, "a"]}, "flag": True, "none": None},
        {"coro": "c", "steps": (10, 20, 30)},  # a tuple, odd length
        {"coro": "c", "steps": [10.0, 20.5]},  # not ints
        {"coro": "c", "steps": None},
        {"coro": "c", "site": ["a\\b", 3, ["deep", 1.0]], "t": ("x", True)},
        {"coro": type("S", (str,), {})("sub")},  # a str subclass
        {"coro": "c", 7: "an int key"},
        {"coro": "c", "submit_ns": 5},
    ]


@pytest.mark.parametrize("which", range(len(_odd_extras())))
def test_unusual_task_records_are_the_same_text_on_both_paths(which: int) -> None:
    # SPEC 9.1: whatever a task's record holds, the C path writes it as the
    # Python loop does, or leaves it to that loop.
    require_c_extension()
    session = _task_session(Backend("asyncio"))
    tab = session._table
    rows = [i for i in tab.rows_of_scope(TASK) if tab.rare.get(i)]
    assert rows
    for i in rows[::2]:
        extra = tab.rare[i][X_EXTRA]
        extra.update(_odd_extras()[which])
    c_text, py_text = _both(session)
    assert c_text == py_text
    json.loads(c_text)


def test_task_coroutines_from_the_columns_match_the_event_walk(backend: Backend) -> None:
    # SPEC 9.1: the track labels name each task's coroutine, as the summary
    # does; the exporter's column scan agrees with _labels.task_coroutines.
    session = _task_session(backend)
    tab = session._table
    expected = task_coroutines(map(tab.view, tab.rows_of_scope(TASK)))
    assert expected
    assert _task_coroutines(tab) == expected
    assert twin(_task_coroutines, tab) == expected


def test_task_coroutines_are_read_in_c_unless_an_extra_is_not_a_dict() -> None:
    # The column scan runs in C (task_coroutines: a loop per task in Python
    # before); a damaged session's TASK row whose extra is not a dict is
    # left to the Python loop, which reads it as before.
    ext = require_c_extension()
    session = _task_session(Backend("asyncio"))
    tab = session._table
    task = SCOPES.index(TASK)
    got = ext.task_coroutines(tab, task)
    assert got
    assert got == twin(_task_coroutines, tab)
    assert all(type(k) is int and type(v) is str for k, v in got.items())
    row = next(i for i in tab.rows_of_scope(TASK) if tab.rare.get(i))
    tab.rare[row][X_EXTRA] = [("coro", "odd")]
    assert ext.task_coroutines(tab, task) is None
    with pytest.raises(AttributeError):  # the Python loop's own error, as before
        _task_coroutines(tab)


def test_the_tracks_lines_are_written_in_c_as_the_python_loop_writes_them(backend: Backend) -> None:
    # SPEC 9.1: every track's thread_name and sort index (and a task's
    # running row) are written by chrome_tracks, one string for all tracks
    # (a task per request makes tens of thousands), byte for byte as the
    # Python loop; a track whose fields are not plain is left to that loop.
    ext = require_c_extension()
    session = _task_session(backend)
    tracks = session.tracks()
    text = ext.chrome_tracks(tracks, {}, _task_coroutines(session._table), 10**6, json.encoder.encode_basestring_ascii)
    assert type(text) is str
    lines = [json.loads(line) for line in text.split(",\n")]
    with_steps = [t for t in tracks if t.steps]
    assert with_steps
    assert len(lines) == 2 * len(tracks) + 2 * len(with_steps)
    assert [ln["args"]["sort_index"] for ln in lines if ln["name"] == "thread_sort_index"] == sorted(
        [2 * k for k in range(len(tracks))] + [2 * k + 1 for k, t in enumerate(tracks) if t.steps]
    )
    c_text, py_text = _both(session)
    assert c_text == py_text
    odd = tracks[-1]
    odd.name = type("Named", (str,), {})(odd.name + ' "odd"')  # a str subclass: the Python loop's
    assert ext.chrome_tracks(tracks, {}, {}, 10**6, json.encoder.encode_basestring_ascii) is None
    c_text, py_text = _both(session)
    assert c_text == py_text
    assert '"odd\\"' in c_text
