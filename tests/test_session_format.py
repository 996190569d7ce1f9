"""The binary session format, version 2 (SPEC 6.5, 12; issue 17 item 2):
round trips, every truncation and byte flip refused, crafted values named.

``aprof.load`` reads a session file as hostile input: whatever the bytes,
the outcome is a session or a ``ValueError`` naming the file, never another
exception, a hang, or an allocation the file's size does not justify.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._post import _binary

from .sessionfiles import v2_bytes, v2_parts


def _profile() -> aprof.profile:
    """A small session with every kind of field: nested and async ranges,
    instants, args, inputs, stacks, exceptions, tasks with extras."""

    async def child(i: int) -> None:
        with aprof.record_function(f"child-{i}", args="k=v"):
            await asyncio.sleep(0)

    async def main() -> aprof.profile:
        async with aprof.profile(record_inputs=True, with_stack=True) as prof:
            with aprof.record_function("outer"):
                with aprof.record_function("inner"):
                    aprof.mark("here")
                await asyncio.gather(child(1), child(2))
            try:
                with aprof.record_function("fails"):
                    raise KeyError("x")
            except KeyError:
                pass
            aprof.record_function("taken").__enter__()  # still open at stop: unfinished
        return prof

    return asyncio.run(main())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[aprof.profile, bytes]:
    prof = _profile()
    path = tmp_path_factory.mktemp("format") / "s.aprof"
    prof.save(path)
    return prof, path.read_bytes()


def test_a_session_round_trips_field_for_field(saved: tuple[aprof.profile, bytes], tmp_path: Path) -> None:
    # SPEC 6.5: every field of every event, the links, tracks and metadata
    # come back as they were; saving the loaded session writes the same bytes.
    prof, raw = saved
    path = tmp_path / "s.aprof"
    path.write_bytes(raw)
    loaded = aprof.load(path)
    before, after = prof.events(), loaded.events()
    assert [e.to_dict() for e in after] == [e.to_dict() for e in before]
    index = {id(e): i for i, e in enumerate(before)}
    index2 = {id(e): i for i, e in enumerate(after)}
    assert [index.get(id(e.parent)) for e in before] == [index2.get(id(e.parent)) for e in after]
    assert [[index[id(c)] for c in e.children] for e in before] == [[index2[id(c)] for c in e.children] for e in after]
    assert [t.to_dict() for t in loaded.tracks()] == [t.to_dict() for t in prof.session.tracks()]
    assert loaded.metadata == prof.session.metadata
    assert any(e.unfinished for e in after)
    assert any(e.exception == "KeyError" for e in after)
    assert any(e.stack for e in after)
    assert any(e.inputs is not None for e in after)
    assert loaded.key_averages().table() == prof.key_averages().table()
    loaded.save(tmp_path / "again.aprof")
    assert (tmp_path / "again.aprof").read_bytes() == raw


def test_an_empty_session_round_trips(tmp_path: Path) -> None:
    with aprof.profile() as prof:
        pass
    prof.save(tmp_path / "e.aprof")
    assert aprof.load(tmp_path / "e.aprof").events() == []


def _refused(path: Path) -> str:
    with pytest.raises(ValueError, match=re.escape(str(path))) as info:
        aprof.load(path)
    return str(info.value)


def test_every_truncation_is_refused_naming_the_file(saved: tuple[aprof.profile, bytes], tmp_path: Path) -> None:
    # SPEC 6.5, 12 (issue 17 item 2): a file cut at any byte is a ValueError
    # naming it, never another exception or a partial session.
    _, raw = saved
    path = tmp_path / "cut.aprof"
    for n in range(len(raw)):
        path.write_bytes(raw[:n])
        _refused(path)


def test_every_flipped_byte_is_refused_naming_the_file(saved: tuple[aprof.profile, bytes], tmp_path: Path) -> None:
    # SPEC 6.5, 12: the header and every block carry a checksum, so a byte
    # changed anywhere (a bad disk, a bad copy) is found, not loaded as
    # different numbers.
    _, raw = saved
    path = tmp_path / "flipped.aprof"
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x5A
        path.write_bytes(bytes(bad))
        _refused(path)


def _with_column(raw: bytes, name: str, edit: Callable[[array[int]], None], typecode: str) -> bytes:
    # Decode every column, edit one, encode them all again (the end times
    # are stored as durations: an edited start must not move them).
    header, blocks = v2_parts(raw)
    n = header["count"]
    names = [c[0] for c in _binary._COLUMNS]
    starts = _binary._decode(blocks["start_ns"], 0, n, None)
    cols = [_binary._decode(blocks[c], i, n, starts) for i, c in enumerate(names)]
    col = cols[names.index(name)]
    assert col.typecode in (typecode, "B")
    edit(col)
    for i, c in enumerate(names):
        blocks[c] = _binary._encode(cols[i], i, cols[0])
    return v2_bytes(header, blocks)


def _with_json(raw: bytes, name: str, edit: Callable[[Any], Any]) -> bytes:
    header, blocks = v2_parts(raw)
    blocks[name] = json.dumps(edit(json.loads(blocks[name]))).encode()
    return v2_bytes(header, blocks)


def _with_header(raw: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    header, blocks = v2_parts(raw)
    edit(header)
    return v2_bytes(header, blocks)


def _set(col: array[int], i: int, v: int) -> None:
    col[i] = v


# Files whose checksums and lengths are right but whose values are not: the
# loader must name what is wrong.
CRAFTED: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "name index past the names": (
        lambda r: _with_column(r, "name", lambda c: _set(c, 0, 10**6), "i"),
        "name index 1000000",
    ),
    "negative name index": (lambda r: _with_column(r, "name", lambda c: _set(c, 0, -5), "i"), "name index -5"),
    "track index past the tracks": (
        lambda r: _with_column(r, "track", lambda c: _set(c, 0, 999), "i"),
        "track index 999",
    ),
    "parent index past the events": (
        lambda r: _with_column(r, "parent", lambda c: _set(c, 0, 10**6), "i"),
        "parent index 1000000",
    ),
    "its own parent": (lambda r: _with_column(r, "parent", lambda c: _set(c, 0, 0), "i"), "own"),
    "ends before it starts": (
        lambda r: _with_column(r, "end_ns", lambda c: _set(c, 0, 0), "q"),
        "ends before it starts",
    ),
    "unknown kind flags": (lambda r: _with_column(r, "kind", lambda c: _set(c, 0, 64), "B"), "kind flags"),
    "scope index past the scopes": (
        lambda r: _with_column(r, "scope", lambda c: _set(c, 0, 200), "B"),
        "scope index 200",
    ),
    "a column short of the count": (lambda r: _with_header(r, lambda h: h.update(count=h["count"] + 1)), "events need"),
    "a count no file can hold": (lambda r: _with_header(r, lambda h: h.update(count=2**31 - 1)), "more than its"),
    "a negative count": (lambda r: _with_header(r, lambda h: h.update(count=-1)), "count -1"),
    "an unknown scope": (lambda r: _with_header(r, lambda h: h.update(scopes=["nope"])), "scopes"),
    "an unknown compression": (lambda r: v2_bytes(*v2_parts(r), compression="zstd"), "compression 'zstd'"),
    "a missing block": (
        lambda r: v2_bytes(v2_parts(r)[0], {k: v for k, v in v2_parts(r)[1].items() if k != "parent"}),
        "no 'parent' block",
    ),
    "names that are not strings": (
        lambda r: _with_json(r, "names", lambda n: [1] * len(n)),
        "name that is not a string",
    ),
    "a rare entry out of order": (lambda r: _with_json(r, "rare", lambda rows: rows[::-1]), "'rare' entry"),
    "a rare entry of the wrong shape": (lambda r: _with_json(r, "rare", lambda rows: [[0, None]]), "'rare' entry"),
    "an extra that is not an object": (
        lambda r: _with_json(r, "rare", lambda rows: [[0, None, None, None, None, [1]]]),
        "extra",
    ),
    "metadata that is not an object": (lambda r: _with_header(r, lambda h: h.update(metadata=[])), "metadata"),
    "a track without a name": (
        lambda r: _with_header(r, lambda h: h["tracks"][0].pop("name")),
        "track entry is incomplete",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_values_are_refused_naming_what_is_wrong(
    case: str, saved: tuple[aprof.profile, bytes], tmp_path: Path
) -> None:
    # SPEC 6.5, 12: lengths and checksums that match but values that do not
    # make a session: a ValueError naming the file and the problem.
    craft, message = CRAFTED[case]
    path = tmp_path / "crafted.aprof"
    path.write_bytes(craft(saved[1]))
    assert re.search(re.escape(message), _refused(path)), _refused(path)


def test_a_file_claiming_a_huge_block_allocates_nothing_for_it(
    saved: tuple[aprof.profile, bytes], tmp_path: Path
) -> None:
    # SPEC 12 (issue 17 item 2): a block whose entry claims a billion bytes
    # is refused before anything that size is allocated.
    header, blocks = v2_parts(saved[1])
    raw = v2_bytes(header, blocks)
    size = struct.unpack_from("<I", raw, 12)[0]
    doc = json.loads(raw[20 : 20 + size])
    doc["compression"] = "zlib"
    for b in doc["blocks"]:
        if b["name"] == "names":
            b["raw_size"] = 10**9
    text = json.dumps(doc).encode()
    import zlib

    bad = struct.pack("<8sIII", b"\x89APROF\r\n", 2, len(text), zlib.crc32(text)) + text + raw[20 + size :]
    path = tmp_path / "huge.aprof"
    path.write_bytes(bad)
    tracemalloc.start()
    try:
        _refused(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * len(bad) + (1 << 20), peak


def test_parents_listed_after_their_children_round_trip(backend: Any, tmp_path: Path) -> None:
    # SPEC 6.5: a spawned task's or a submitted job's parent is a range on
    # another track, which may come later in the event list than the
    # child. Saving finds such parents too (the writer's walk back through
    # the previous events' parents must not follow a parent index it has
    # not written yet: that read uninitialised memory, and crashed on 3.13).
    def job() -> None:
        with aprof.record_function("in-job"):
            time.sleep(0.001)

    async def child(i: int) -> None:
        with aprof.record_function(f"in-task-{i}"):
            await backend.to_thread(aprof.wrap(job))

    async def main() -> aprof.profile:
        async with aprof.profile() as prof:
            for _ in range(3):
                with aprof.record_function("spawner"):
                    async with backend.group() as g:
                        for i in range(4):
                            g.start_soon(child, i)
        return prof

    prof = backend.run(main)
    events = prof.events()
    index = {id(e): i for i, e in enumerate(events)}
    parents = [index.get(id(e.parent), -1) for e in events]
    assert any(p > i for i, p in enumerate(parents)), parents  # the case under test is there
    prof.save(tmp_path / "s.aprof")
    loaded = aprof.load(tmp_path / "s.aprof").events()
    index2 = {id(e): i for i, e in enumerate(loaded)}
    assert [index2.get(id(e.parent), -1) for e in loaded] == parents
