"""The HTML report's document built fast (SPEC 9.2, issue 17): the C passes
that print it from the columns against their pure-Python twins (SPEC 14),
and the page's JSON as it was built before them."""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest

from aprof._core import _native
from aprof._export import _html
from aprof._post import _compact
from aprof._post._session import Session, _first_start
from aprof._post._table import EventTable

from .conftest import Backend
from .test_formats import nested_profile
from .test_lod import mixed_profile


def _twin(fn: Any, *args: Any) -> Any:
    ext = _native.extension
    _native.extension = None
    try:
        return fn(*args)
    finally:
        _native.extension = ext


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
        for parts in (_compact.compact_parts(session), _twin(_compact.compact_parts, session)):
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
        assert _compact._detail_rows(tab) == _twin(_compact._detail_rows, tab)
        rows, _ = _compact._details_of(tab)
        remap = array("i", reversed(range(len(tab.tracks))))
        for base in (0, 123, tab.start[0]):
            flags = _compact._FLAGS
            want = json.dumps(_compact._flat_events(tab, remap, base, rows), separators=(",", ":"))
            assert _native.extension.compact_events(tab, base, remap, flags, rows) == want
        tracks = list(session._tracks.values())
        assert sorted(tracks, key=_first_start(tab)) == sorted(tracks, key=_twin(_first_start, tab))


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
    for parts in (_compact.compact_parts(session), _twin(_compact.compact_parts, session)):
        assert parts[1] == "[]"
    text = _html._data_json(session, _html.DEFAULT_BUDGET)
    assert json.loads(text)["events"] == []
