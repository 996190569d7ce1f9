"""The HTML report's document built fast (SPEC 9.2, issue 17): the C passes
that print it from the columns against their pure-Python twins (SPEC 14),
and the page's JSON as it was built before them."""

from __future__ import annotations

import json
from array import array

import pytest

from aprof._core import _native
from aprof._export import _html
from aprof._post import _compact
from aprof._post._session import Session, _first_start
from aprof._post._table import EventTable

from .conftest import Backend, twin
from .test_formats import nested_profile
from .test_lod import mixed_profile


def _needs_c() -> None:
    if _native.extension is None:
        pytest.skip("the C extension is not active (APROF_PURE_PYTHON=1 or not built)")


def _sessions(backend: Backend) -> list[Session]:
    return [mixed_profile(backend).session, nested_profile(backend).session]


def test_the_event_array_text_is_the_documents_event_array(backend: Backend) -> None:
    # SPEC 9.2: the text the page embeds is json.dumps of compact_document's
    # events, and the details are the same, on both paths.
    for session in _sessions(backend):
        doc = _compact.compact_document(session)
        for parts in (_compact.compact_parts(session), twin(_compact.compact_parts, session)):
            head, text = parts
            assert text == json.dumps(doc["events"], separators=(",", ":"))
            assert head["events"] is None
            assert {k: v for k, v in head.items() if k != "events"} == {k: v for k, v in doc.items() if k != "events"}
            assert list(head) == list(doc)  # the keys in the same order
        assert any(doc["events"][7::8].count(j) for j in range(len(doc["details"])))


def test_the_c_document_passes_match_their_twins(backend: Backend) -> None:
    # SPEC 14: compact_detail_rows, compact_events and first_starts give
    # what the Python loops give, to the byte.
    _needs_c()
    for session in _sessions(backend):
        tab = session._table
        assert _compact._detail_rows(tab) == twin(_compact._detail_rows, tab)
        rows, _ = _compact._details_of(tab)
        remap = array("i", reversed(range(len(tab.tracks))))
        for base in (0, 123, tab.start[0]):
            flags = _compact._FLAGS
            want = json.dumps(_compact._flat_events(tab, remap, base, rows), separators=(",", ":"))
            assert _native.extension.compact_events(tab, base, remap, flags, rows) == want
        tracks = list(session._tracks.values())
        assert sorted(tracks, key=_first_start(tab)) == sorted(tracks, key=twin(_first_start, tab))


def test_the_c_document_passes_refuse_bad_arguments(backend: Backend) -> None:
    # SPEC 12: an index outside the table is an error, not a wild read.
    _needs_c()
    tab = mixed_profile(backend, 3).session._table
    ext = _native.extension
    with pytest.raises(IndexError, match="track index"):
        ext.compact_events(tab, 0, array("i"), _compact._FLAGS, array("i"))
    with pytest.raises(ValueError, match="not ascending"):
        ext.compact_events(tab, 0, array("i", [0]) * len(tab.tracks), _compact._FLAGS, array("i", [1, 0]))
    with pytest.raises(IndexError, match="track index"):
        ext.compact_detail_rows(tab, array("q"))
    with pytest.raises(IndexError, match="track index"):
        ext.first_starts(tab, 0)


def test_an_empty_sessions_document() -> None:
    # The smallest document: no events, no tracks; both paths agree.
    session = Session(EventTable(), {}, {"start_ns": 0})
    for parts in (_compact.compact_parts(session), twin(_compact.compact_parts, session)):
        assert parts[1] == "[]"
    text = _html._data_json(session, _html.DEFAULT_BUDGET)
    assert json.loads(text)["events"] == []


def _stitch_profile(backend: Backend) -> Session:
    """Tasks that wait on children and on threads, with nested ranges and
    async ranges: every kind of row the stitcher sorts."""
    import aprof

    def blocking(x: int) -> int:
        with aprof.record_function("in thread"):
            return x

    async def child(i: int) -> None:
        with aprof.record_function(f"child {i % 3}"):
            await backend.sleep(0.001 * (i % 2))
        await backend.to_thread(blocking, i)

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            r = aprof.record_function("async one").start()
            with aprof.record_function("outer"):
                async with backend.group() as g:
                    for i in range(6):
                        g.start_soon(child, i)
            r.end()
        return prof

    return backend.run(main).session


def test_the_c_stitching_passes_match_their_twins(backend: Backend) -> None:
    # SPEC 14: stitch_setup, stitch_segments over array rows (one tuple per
    # call path) and path_totals give what the Python loops give.
    _needs_c()
    from aprof._post import _stitch

    for session in (_stitch_profile(backend), *_sessions(backend)):
        tab = session._table
        known = set(session._tracks)
        got = _stitch.setup_rows(tab, known)
        want = twin(_stitch.setup_rows, tab, known)
        assert [{k: list(v) for k, v in d.items()} for d in got] == list(want)
        assert [list(d) for d in got] == [list(d) for d in want]  # the same key order
        assert got[3], "links were there to compare"
        labels = _stitch.relabelled(tab)
        per_path: dict[tuple[str, ...], int] = {}
        py_path: dict[tuple[str, ...], int] = {}
        for rows in got[0].values():
            a, b = min(tab.start[i] for i in rows), max(tab.end[i] for i in rows)
            segs = _stitch.range_segments(tab, rows, a, b, labels)
            assert segs == _stitch.range_segments(tab, list(rows), a, b, labels)
            assert segs == _stitch._range_segments([tab.view(i) for i in rows], a, b)
            span = _native.extension.path_totals(per_path, segs)
            assert span == sum(s1 - s0 for s0, s1, _ in segs)
            for s0, s1, frames in segs:
                py_path[frames] = py_path.get(frames, 0) + s1 - s0
            totals: dict[tuple[str, ...], int] = {}
            assert _stitch.range_paths(tab, rows, a, b, labels, totals) == span  # no segments made
            py_totals: dict[tuple[str, ...], int] = {}
            assert twin(_stitch.range_paths, tab, rows, a, b, labels, py_totals) == span
            assert list(totals.items()) == list(py_totals.items())
            assert list(totals) == list(dict.fromkeys(f for _, _, f in segs))
        assert list(per_path.items()) == list(py_path.items())
        timelines = _stitch.stitched_timelines(session)
        assert timelines == twin(_stitch.stitched_timelines, session)
        tree = _stitch.merge_tree(timelines)
        assert tree == twin(_stitch.merge_tree, timelines)
        # The report's flame graph, made without the segments, is the same
        # tree, children in the same order.
        assert json.dumps(_stitch.stitched_tree(session)) == json.dumps(tree)
        assert json.dumps(twin(_stitch.stitched_tree, session)) == json.dumps(tree)


def test_path_totals_sums_past_64_bits_and_refuses_bad_segments() -> None:
    # Python ints do not overflow: neither do the C sums.
    _needs_c()
    big = 2**62
    segs = [(0, big, ("a",)), (0, big, ("a",)), (0, big, ("b",)), (0, big, ("a",))]
    per_path: dict[tuple[str, ...], int] = {("b",): 1}
    assert _native.extension.path_totals(per_path, segs) == 4 * big
    assert list(per_path.items()) == [(("b",), big + 1), (("a",), 3 * big)]
    with pytest.raises(TypeError, match="segment 0"):
        _native.extension.path_totals({}, [(0, 1)])


def test_take_and_many_children_match_their_twins(backend: Backend) -> None:
    # SPEC 14: EventTable.take (take_columns) and the summary's rows with
    # many children (many_children) as the Python loops give them.
    _needs_c()
    from aprof._post._analysis import _many_children

    for session in (_stitch_profile(backend), *_sessions(backend)):
        tab = session._table
        n = len(tab)
        for keep in (array("i", range(0, n, 3)), array("i", range(n)), array("i"), array("i", sorted(tab.rare))):
            got, want = tab.take(keep), twin(tab.take, keep)
            assert got.columns() == want.columns()
            assert list(got.rare.items()) == list(want.rare.items())
        for k in (0, 1, 2, 10):
            assert list(_many_children(tab, k)) == list(twin(_many_children, tab, k))
    with pytest.raises(ValueError, match="not an ascending row"):
        _native.extension.take_columns(tab, array("i", [1, 0]))
    with pytest.raises(ValueError, match="not an ascending row"):
        _native.extension.take_columns(tab, array("i", [n]))


def test_the_c_event_array_prints_every_integer_as_json_does() -> None:
    # SPEC 14: the C printer's digits, at the ends of the int64 range too.
    _needs_c()
    import random

    rng = random.Random(17)
    starts = [0, 1, 9, 10, 99, 100, 101, 12345, -1, -10, -99, -100, 2**63 - 1, -(2**63), 10**18, -(10**18)]
    starts += [rng.randint(-(2**63), 2**63 - 1) for _ in range(5000)]
    n = len(starts)
    tab = EventTable()
    tab.start = array("q", starts)
    tab.end = array("q", starts)
    for col, value in (("end_lt", -1), ("seq", -1), ("fwd", 0)):
        setattr(tab, col, array("q", [value]) * n)
    tab.name, tab.track, tab.parent = array("i", [0]) * n, array("i", [0]) * n, array("i", [-1]) * n
    tab.scope, tab.kind = array("B", [0]) * n, array("B", [0]) * n
    remap, rows = array("i", [0]), array("i")
    want = json.dumps(_compact._flat_events(tab, remap, 0, rows), separators=(",", ":"))
    assert _native.extension.compact_events(tab, 0, remap, _compact._FLAGS, rows) == want
