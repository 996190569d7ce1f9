"""A stopped session's events as columns, read through FunctionEvent views
(issue 17 items 1 and 4; docs/how-it-works.md, "The columns").

The columns are checked against the events they hold (never hard-coded
values), the C paths against their pure-Python twins, and the memory a
session keeps against the 80 bytes an event the issue allows.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._core import _native
from aprof._post import _table, _validate
from aprof._post._events import EventTable, FunctionEvent

from .conftest import Backend

TASK = aprof.RecordScope.TASK


def spawn_session(backend: Backend) -> aprof.Session:
    """Nested ranges in the starting task and in three spawned tasks, one of
    which raises inside a range and hands work to a thread."""

    def in_thread() -> None:
        with aprof.record_function("in thread"):
            pass

    async def child(i: int) -> None:
        with aprof.record_function("child"):
            with aprof.record_function("leaf", args=f"i={i}"):
                await backend.sleep(0.001)
            if i == 2:
                await backend.to_thread(in_thread)
                try:
                    with aprof.record_function("raises"):
                        raise KeyError(i)
                except KeyError:
                    pass

    async def main() -> aprof.Session:
        async with aprof.profile() as prof:
            with aprof.record_function("outer"):
                async with backend.group() as g:
                    for i in range(3):
                        g.start_soon(child, i)
                aprof.mark("done")
        return prof.session

    session: aprof.Session = backend.run(main)
    return session


def test_events_are_views_of_the_columns_with_the_same_fields(backend: Backend) -> None:
    # SPEC 6.2: every field of every event is its row of the columns.
    session = spawn_session(backend)
    tab = session._table
    events = session.events()
    assert len(events) == len(tab)
    for i, ev in enumerate(events):
        assert isinstance(ev, FunctionEvent)
        t = tab.tracks[tab.track[i]]
        assert (ev.start_ns, ev.end_ns, ev.thread_id) == (tab.start[i], tab.end[i], t.id)
        assert ev.name == tab.names[tab.name[i]]
        assert ev.scope is _table.SCOPES[tab.scope[i]]
        assert ev.is_instant == bool(tab.kind[i] & 1)
        x = tab.rare.get(i)
        assert ev.args == (x[_table.X_ARGS] if x else None)
        assert ev.exception == (x[_table.X_EXC] if x else None)
        assert (ev.parent._i if ev.parent is not None else -1) == tab.parent[i]
    raised = [e for e in events if e.name == "raises"]
    assert len(raised) == 1
    assert raised[0].exception == "KeyError"
    assert sorted(e.args for e in events if e.name == "leaf") == ["i=0", "i=1", "i=2"]


def test_parent_and_children_agree_and_children_come_in_start_order(backend: Backend) -> None:
    # SPEC 6.2: a child's parent is the range it nests in, on its track; a
    # spawned task's parent is where it was spawned, but it is not a child.
    session = spawn_session(backend)
    events = session.events()
    for ev in events:
        kids = ev.children
        assert [k.start_ns for k in kids] == sorted(k.start_ns for k in kids)
        for k in kids:
            assert k.parent is ev
            assert k.thread_id == ev.thread_id
            assert not k.is_async
            assert ev.start_ns <= k.start_ns <= k.end_ns <= ev.end_ns
    outer = next(e for e in events if e.name == "outer")
    tasks = [e for e in events if e.scope is TASK and e.thread_id != outer.thread_id]
    assert tasks, "the spawned tasks have TASK events"
    for task in tasks:
        assert task.parent is outer  # spawned inside "outer"
        assert task not in outer.children  # runs concurrently: not part of its self time
    assert "done" in [c.name for c in outer.children]  # an instant nests like a range


def test_an_event_asked_for_twice_is_the_same_object_while_held(backend: Backend) -> None:
    # SPEC 6.2: `a.parent is b` holds for events the caller keeps.
    session = spawn_session(backend)
    tab = session._table
    first = session.events()
    again = session.events()
    assert all(a is b for a, b in zip(first, again, strict=True))
    leaf = next(e for e in first if e.name == "leaf")
    assert leaf.parent is next(e for e in first if e is leaf.parent)
    assert tab[leaf._i] is leaf
    assert tab[-1] is first[-1]
    with pytest.raises(IndexError):
        tab[len(tab)]


def test_dropping_a_session_frees_its_table_without_the_cyclic_gc() -> None:
    # SPEC 6.2, issue 17 item 4: nothing holds a view, so a session's memory
    # goes back when the last reference to it (or to one of its events) goes.
    # (The pure-Python twin keeps its views in a dict: the cyclic GC frees it.)
    with aprof.profile() as prof:
        for _ in range(100):
            with aprof.record_function("outer"), aprof.record_function("inner"):
                pass
    session = prof.session
    kept = session.events()[5]
    ref = weakref.ref(session._table)
    gc.disable()
    try:
        del prof, session
        assert ref() is not None  # an event still holds its table
        assert kept.parent is not None
        assert kept.parent.name == "outer"
        del kept
        if _native.extension is None:
            gc.collect()
        assert ref() is None
    finally:
        gc.enable()


def test_a_stopped_session_keeps_at_most_80_bytes_an_event() -> None:
    # Issue 17 item 4: after stop, the session's events cost at most 80
    # bytes each (the columns are 54), measured as everything the profile
    # still holds after stop and a collection.
    n = 30_000

    def work() -> None:
        rf = aprof.record_function
        for _ in range(n // 3):
            with rf("outer"), rf("mid"), rf("inner"):
                pass

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        prof = aprof.profile()
        prof.start()
        work()
        prof.stop()
        session = prof.session
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    count = len(session._table)
    assert count == n
    assert held / count <= 80, f"{held / count:.0f} bytes an event"
    assert session._table.nbytes() == 54 * count


def test_saved_and_loaded_columns_are_the_same(backend: Backend, tmp_path: Path) -> None:
    # SPEC 6.5: the file holds the columns; loading gives them back as they were.
    session = spawn_session(backend)
    path = tmp_path / "s.aprof"
    session.save(path)
    loaded = aprof.load(path)
    a, b = session._table, loaded._table
    assert [t.id for t in a.tracks] == [t.id for t in b.tracks]
    for (attr, _), x, y in zip(_table.COLUMNS, a.columns(), b.columns(), strict=True):
        if attr == "name":  # indexes into each table's own names
            assert [a.names[i] for i in x] == [b.names[i] for i in y]
        else:
            assert x == y, attr
    assert {i: x[:4] for i, x in a.rare.items()} == {i: x[:4] for i, x in b.rare.items()}
    assert [e.to_dict() for e in session.events()] == [e.to_dict() for e in loaded.events()]


def test_rows_of_scope_and_take_keep_what_they_say(backend: Backend) -> None:
    session = spawn_session(backend)
    tab = session._table
    tasks = tab.rows_of_scope(TASK)
    assert tasks == [i for i, e in enumerate(tab) if e.scope is TASK]
    keep = [i for i, e in enumerate(tab) if e.name != "leaf"]
    part = tab.take(keep)
    assert [e.name for e in part] == [tab[i].name for i in keep]
    for j, i in enumerate(keep):
        p = tab.parent[i]
        assert part.parent[j] == (keep.index(p) if p in keep else -1)
        assert part[j].args == tab[i].args


def test_drop_is_take_of_the_other_rows(backend: Backend) -> None:
    # SPEC 15.2: EventTable.drop (a flight recorder's dump without its open
    # events) as take() of every row it does not drop: columns, parents,
    # rare rows.
    tab = spawn_session(backend)._table
    n = len(tab)
    assert tab.rare
    for rows in ([], [0], [n - 1], sorted(tab.rare)[:3], list(range(1, n, 4)), list(range(n))):
        got = tab.drop(rows)
        want = tab.take([i for i in range(n) if i not in set(rows)])
        assert got.columns() == want.columns(), rows
        assert list(got.rare.items()) == list(want.rare.items()), rows
        assert [t.id for t in got.tracks] == [t.id for t in tab.tracks]
    for bad in ([1, 0], [n], [-1], [2, 2]):
        with pytest.raises(ValueError, match="rows must be ascending indexes below"):
            tab.drop(bad)


def _damaged(how: str) -> EventTable:
    """A small valid table, then damaged one way."""
    with aprof.profile() as prof:
        with aprof.record_function("a"), aprof.record_function("b"):
            pass
        with aprof.record_function("c"):
            pass
    tab = prof.session._table
    if how == "cycle":  # async links: only the cycle is wrong
        tab.parent[0] = 1
        tab.kind[0] = tab.kind[1] = 4
    elif how == "own parent":
        tab.parent[2] = 2
    elif how == "parent index":
        tab.parent[1] = 7
    elif how == "name index":
        tab.name[0] = 99
    elif how == "backwards":
        tab.end[1] = tab.start[1] - 1
    elif how == "instant with a duration":
        tab.kind[2] = 1
    elif how == "outside its parent":
        tab.end[1] = tab.end[0] + 1
    elif how == "start order":
        tab.start[2] = tab.start[0] - 1
    elif how == "kind":
        tab.kind[0] = 64
    elif how == "thread":
        tab.fwd[1] = 10**9
    tab.links_changed()
    return tab


DAMAGES = [
    ("cycle", "its own ancestor"),
    ("own parent", "its own parent"),
    ("parent index", "a parent index 7 outside -1..2"),
    ("name index", "a name index 99 outside"),
    ("backwards", "ends before it starts"),
    ("instant with a duration", "is an instant with a duration"),
    ("outside its parent", "but outside its time"),
    ("start order", "starts before the event listed before it"),
    ("kind", "kind flags 64"),
    ("thread", "names a thread outside"),
]


@pytest.mark.parametrize(("how", "words"), DAMAGES)
def test_a_damaged_table_is_refused_with_the_same_message_in_c_and_python(how: str, words: str) -> None:
    # SPEC 6.5, 12: a table read from a file is checked whole; the extension
    # and the pure-Python twin say the same thing.
    tab = _damaged(how)
    start = min(tab.start) - 10
    with pytest.raises(ValueError, match=words) as py:
        _validate._check_table(tab, start)
    ext: Any = _native.extension
    if ext is not None:
        with pytest.raises(ValueError, match=words) as c:
            ext.check_table(tab, start, _validate.MAX_TRACK_ID)
        assert str(c.value) == str(py.value)


def test_a_valid_table_passes_both_checks(backend: Backend) -> None:
    tab = spawn_session(backend)._table
    start = min(tab.start)
    _validate._check_table(tab, start)
    if _native.extension is not None:
        _native.extension.check_table(tab, start, _validate.MAX_TRACK_ID)


def test_summary_sums_in_c_match_the_python_twin(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC 6.4: key_averages by name from the columns, the same on both paths.
    session = spawn_session(backend)
    rows_c = [(r.key, r.count, r.total_ns, r.self_ns, r.min_ns, r.max_ns) for r in session.key_averages()]
    monkeypatch.setattr(_native, "extension", None)
    rows_py = [(r.key, r.count, r.total_ns, r.self_ns, r.min_ns, r.max_ns) for r in session.key_averages()]
    assert rows_c == rows_py
    leaf = [e for e in session.events() if e.name == "leaf"]
    row = next(r for r in rows_py if r[0] == "leaf")
    assert row[1:3] == (len(leaf), sum(e.duration_ns for e in leaf))
    child = [e for e in session.events() if e.name == "child"]
    assert next(r for r in rows_py if r[0] == "child")[3] == sum(e.self_duration_ns for e in child)


def test_children_index_in_c_matches_the_python_twin(backend: Backend) -> None:
    tab = spawn_session(backend)._table
    off, kids = _table._py_children_index(tab.parent, tab.track, tab.kind)
    if _native.extension is not None:
        c_off, c_kids = _native.extension.children_index(tab.parent, tab.track, tab.kind)
        assert c_off == off.tobytes()
        assert c_kids == kids.tobytes()
    assert sum(1 for i in range(len(tab)) if tab[i].parent is not None and not tab[i].is_async
               and tab[i].parent.thread_id == tab[i].thread_id) == len(kids)  # fmt: skip


_RSS_SCRIPT = """
import gc, os, aprof
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
before = rss()
prof = aprof.profile()
prof.start()
rf = aprof.record_function
for _ in range(N // 3):
    with rf("outer"), rf("mid"), rf("inner"):
        pass
prof.stop()
session = prof.session
gc.collect()
print(rss() - before, session._table.nbytes(), len(session._table))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc (Linux)")
def test_the_process_gives_the_consolidation_peak_back_after_stop() -> None:
    # Issue 17 item 4: after stop and a collection, the process's RSS is
    # within 1.5x of the session's own size (the raw records, several times
    # bigger, are given back), measured in a fresh interpreter.
    import subprocess
    import sys

    n = 600_000
    out = subprocess.run(
        [sys.executable, "-c", f"N = {n}\n{_RSS_SCRIPT}"], capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()
    grown, size, count = map(int, out)
    assert count == n
    assert grown <= 1.5 * size, f"RSS grew {grown / count:.0f} B an event for a session of {size / count:.0f}"
