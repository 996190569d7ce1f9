"""The binary session format: ``.aprof`` version 2 (SPEC 6.5).

A session is written as columns, one typed array per field, not as one
JSON object per event: the blocks are the session's own columns
(:mod:`._table`), encoded (``encode_column`` in ``_cevents.c``) and read
back into columns (``decode_column``), with no object per event, where
version 1 (gzip-compressed JSON, still read) built and parsed a dict per
event. :func:`_encode` and :func:`_decode` are the pure-Python twins.

Layout (every integer little-endian)::

    offset  size  field
    0       8     magic b"\\x89APROF\\r\\n"
    8       4     version: 2
    12      4     H: the header's length in bytes
    16      4     CRC-32 of the header
    20      H     header: UTF-8 JSON (below)
    20+H          the blocks, back to back, each where the header says

The header is ``{"count": N, "compression": "zlib" | "none", "scopes":
[...], "metadata": {...}, "tracks": [...], "blocks": [{"name", "offset",
"size", "raw_size", "crc32"}, ...]}``: ``offset`` counts from the end of
the header, ``size`` is the stored (maybe compressed) length, ``raw_size``
the length after inflating, ``crc32`` the stored bytes' checksum. Blocks:

=====================  ======  ==================================================
name                   type    one value per event (in the session's order)
=====================  ======  ==================================================
``start_ns``           int64   start time (``perf_counter_ns``), stored as the
                               difference from the previous event's
``end_ns``             int64   end time, stored as the duration
``end_thread_id``      int64   the logical thread it ended on, -1 for its own
``sequence_nr``        int64   sequence number
``forward_thread_id``  int64   the logical thread that spawned it
``name``               int32   index into the ``names`` block
``track``              int32   index into the header's ``tracks``
``parent``             int32   index of its parent event, -1 for none
``scope``              uint8   index into the header's ``scopes``
``kind``               uint8   flags: 1 instant, 2 unfinished, 4 async
``names``              JSON    the distinct names, each once
``rare``               JSON    ``[index, exception, args, inputs, stack, extra]``
                               for the events that have any of these
``samples``            JSON    the stack samples (only when the profile sampled)
``memory``             JSON    the sampled allocations (only with profile_memory)
=====================  ======  ==================================================

Differences are taken modulo 2**64 (any int64 values round-trip). Each
multi-byte column is then byte-shuffled, byte 0 (least significant) of
every value first, then byte 1, and so on (:func:`_encode`): the high
bytes, nearly all equal, become long runs, which zlib packs small and
fast. Each block is compressed on its own.

Reading treats the file as hostile: every length, offset and index is
checked against the file before anything is allocated for it, a block is
inflated only up to the size its column needs (``count`` times the item
size), checksums are compared, and the session is checked as
:func:`~aprof._post._validate.validate_session` checks version 1 files
(the extension checks the fixed fields and links while it builds them).
A damaged file is a ``ValueError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from .._core import _native
from .._core._callbacks import RecordScope
from ._events import EventTable, Track, stack_from_json
from ._memory import Memory
from ._samples import Samples
from ._table import COLUMNS as _TABLE_COLUMNS
from ._table import SCOPE_INDEX, SCOPES, X_ARGS, X_EXC, X_EXTRA, X_INPUTS, X_STACK
from ._validate import (
    MAX_RATIO,
    MIN_LIMIT,
    parse_json,
    validate_session,
)

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["MAGIC", "VERSION", "read_binary", "write_binary"]

MAGIC: Final = b"\x89APROF\r\n"
VERSION: Final = 2
_PREFIX: Final = struct.Struct("<8sIII")  # magic, version, header length, header CRC-32
#: The largest header a file may declare: metadata and track names, not events.
MAX_HEADER: Final = 64 << 20
#: zlib level 1: most of the size saving of level 6 (the columns are
#: repetitive), at several times the speed.
_ZLIB_LEVEL: Final = 1
#: zlib inflates a stream to at most about 1,032 times its size: what a
#: file's size can justify (the event count it declares, a block's size).
_MAX_RATIO: Final = 1100

# (block name, array type code, item size): the fixed-width columns, in file order.
_COLUMNS: Final = (
    ("start_ns", "q", 8),
    ("end_ns", "q", 8),
    ("end_thread_id", "q", 8),
    ("sequence_nr", "q", 8),
    ("forward_thread_id", "q", 8),
    ("name", "i", 4),
    ("track", "i", 4),
    ("parent", "i", 4),
    ("scope", "B", 1),
    ("kind", "B", 1),
)
_ATTRS: Final = tuple(attr for attr, _ in _TABLE_COLUMNS)  # the table's name of each column
_START: Final = 0
_END: Final = 1
_INT32_MAX: Final = 2**31 - 1
_SCOPES: Final = tuple(s.value for s in RecordScope)


# -- writing ------------------------------------------------------------------


def _le(col: array[int]) -> bytes:
    if sys.byteorder != "little":
        col = array(col.typecode, col)
        col.byteswap()
    return col.tobytes()


_MASK: Final = (1 << 64) - 1
_UNSIGNED: Final = {"q": "Q", "i": "I"}


def _encode(col: array[int], c: int, starts: array[int] | None) -> bytes:
    """Column ``c`` as the file stores it (the extension's ``encode_column``):
    start times as differences from the previous, end times less their
    start (modulo 2**64), then byte-shuffled."""
    _, typecode, width = _COLUMNS[c]
    if width == 1:
        return bytes(col)
    mask = (1 << (8 * width)) - 1
    if c == _START:
        vals = [(v - p) & mask for p, v in zip(chain((0,), col), col, strict=False)]
    elif c == _END:
        assert starts is not None
        vals = [(v - s) & mask for v, s in zip(col, starts, strict=True)]
    else:
        vals = [v & mask for v in col]
    raw = _le(array(_UNSIGNED[typecode], vals))
    return b"".join(raw[k::width] for k in range(width))


def _decode(data: bytes, c: int, n: int, starts: array[int] | None) -> array[int]:
    """:func:`_encode` undone: column ``c`` of ``n`` values."""
    _, typecode, width = _COLUMNS[c]
    if width == 1:
        return array("B", data)
    shuffled = bytearray(n * width)
    for k in range(width):
        shuffled[k::width] = data[k * n : (k + 1) * n]
    u = array(_UNSIGNED[typecode])
    u.frombytes(shuffled)
    if sys.byteorder != "little":
        u.byteswap()
    if c == _START:
        u = array("Q", [x & _MASK for x in accumulate(u)])
    elif c == _END:
        assert starts is not None
        u = array("Q", [(x + s) & _MASK for x, s in zip(u, starts, strict=True)])
    out = array(typecode)
    out.frombytes(u.tobytes())  # the same bits, read as signed
    return out


def _columns(session: Session) -> Iterator[tuple[str, bytes]]:
    """The session's blocks, (name, raw bytes), in file order: its table's
    columns, encoded (by the extension's ``encode_column`` when active)."""
    tab = session._table
    n = len(tab)
    if n > _INT32_MAX:
        raise ValueError(f"save: {n:,} events are more than the format's {_INT32_MAX:,}")
    ext = _native.extension
    encode = _encode if ext is None else ext.encode_column
    for c, ((name, _, _), col) in enumerate(zip(_COLUMNS, tab.columns(), strict=True)):
        yield name, encode(col, c, tab.start)
    yield "names", _json(tab.names)
    yield "rare", _json([_rare_row(i, x) for i, x in sorted(tab.rare.items())])
    if session.samples is not None:
        yield "samples", _json(session.samples.to_json())
    if session.memory is not None:
        yield "memory", _json(session.memory.to_json())


def _rare_row(i: int, x: list[Any]) -> list[Any]:
    inputs, stack = x[X_INPUTS], x[X_STACK]
    return [
        i,
        x[X_EXC],
        x[X_ARGS],
        None if inputs is None else list(inputs),
        None if stack is None else [list(f) for f in stack],
        x[X_EXTRA],
    ]


def _json(doc: Any) -> bytes:
    # The text escapes what UTF-8 cannot hold (\udcXX); allow_nan=False: a
    # NaN would make the file unreadable by any strict JSON reader.
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode("utf-8")


def write_binary(session: Session, compression: str = "zlib") -> Iterator[bytes]:
    """The session as a version 2 file, in chunks (prefix and header first).

    Raises:
        ValueError: the session has more events than the format holds, or a
            value JSON cannot hold (a NaN in an ``extra``).
    """
    for t in session._tracks.values():  # tracks added since (a sampled thread's): listed in the header too
        session._table.add_track(t)
    blocks: list[dict[str, Any]] = []
    stored: list[bytes] = []
    offset = 0
    for name, raw in _columns(session):
        data = zlib.compress(raw, _ZLIB_LEVEL) if compression == "zlib" else raw
        blocks.append(
            {"name": name, "offset": offset, "size": len(data), "raw_size": len(raw), "crc32": zlib.crc32(data)}
        )
        stored.append(data)
        offset += len(data)
    header = _json(
        {
            "count": len(session._table),
            "compression": compression,
            "scopes": list(_SCOPES),
            "metadata": session.metadata,
            "tracks": [t.to_dict() for t in session._table.tracks],
            "blocks": blocks,
        }
    )
    yield _PREFIX.pack(MAGIC, VERSION, len(header), zlib.crc32(header))
    yield header
    yield from stored


# -- reading ------------------------------------------------------------------


def _fail(what: str) -> ValueError:
    return ValueError(f"is a damaged aprof session: {what}")


def _header(raw: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header, and the body the blocks' offsets count from."""
    if len(raw) < _PREFIX.size:
        raise ValueError(f"is truncated: {len(raw)} bytes, shorter than the {_PREFIX.size}-byte start of a session")
    _, version, size, crc = _PREFIX.unpack_from(raw)
    if version != VERSION:
        raise ValueError(f"is an aprof session of version {version}; this aprof reads versions 1 and {VERSION}")
    if size > min(MAX_HEADER, len(raw) - _PREFIX.size):
        raise _fail(f"its header claims {size:,} bytes, but the file has {len(raw) - _PREFIX.size:,} after its start")
    text = raw[_PREFIX.size : _PREFIX.size + size]
    if zlib.crc32(text) != crc:
        raise _fail("its header's checksum does not match (the file was changed or cut)")
    header = parse_json(text, "has a header that is not JSON")
    if type(header) is not dict:
        raise _fail("its header is not an object")
    return header, memoryview(raw)[_PREFIX.size + size :]


def _blocks(header: dict[str, Any], body: memoryview, count: int) -> dict[str, bytes]:
    """Every block, checked and inflated, by name."""
    compression = header.get("compression")
    if compression not in ("zlib", "none"):
        raise _fail(f"compression {compression!r} is not 'zlib' or 'none'")
    listed = header.get("blocks")
    if type(listed) is not list:
        raise _fail("the header has no list of blocks")
    sizes = {name: count * item for name, _, item in _COLUMNS}
    out: dict[str, bytes] = {}
    for b in listed:
        if type(b) is not dict:
            raise _fail(f"a block entry is {b!r}, not an object")
        name = b.get("name")
        if type(name) is not str or name in out:
            raise _fail(f"block name {name!r} is not a string, or is listed twice")
        offset, size, raw_size, crc = (b.get(k) for k in ("offset", "size", "raw_size", "crc32"))
        if not (_is_count(offset) and _is_count(size) and _is_count(raw_size) and _is_count(crc)):
            raise _fail(f"block {name!r} has an offset, size, raw_size or crc32 that is not a count")
        if offset + size > len(body):
            raise _fail(f"block {name!r} ends at byte {offset + size:,} of {len(body):,}: the file is truncated")
        want = sizes.get(name)
        if want is not None and raw_size != want:
            raise _fail(f"block {name!r} has {raw_size:,} bytes, not the {want:,} that {count:,} events need")
        if want is None and compression == "zlib" and raw_size > max(MIN_LIMIT, MAX_RATIO * size):
            # The JSON blocks have the same bound as compressed version 1 files.
            raise _fail(f"block {name!r} claims to inflate {size:,} bytes to {raw_size:,}: refused as a likely bomb")
        data = body[offset : offset + size]
        if zlib.crc32(data) != crc:
            raise _fail(f"block {name!r}'s checksum does not match (the file was changed or cut)")
        out[name] = _inflate(name, data, raw_size) if compression == "zlib" else bytes(data)
        if len(out[name]) != raw_size:
            raise _fail(f"block {name!r} holds {len(out[name]):,} bytes, not the {raw_size:,} its entry says")
    missing = [name for name in (*sizes, "names", "rare") if name not in out]
    if missing:
        raise _fail(f"it has no {', '.join(repr(m) for m in missing)} block")
    return out


def _is_count(v: object) -> TypeGuard[int]:
    return type(v) is int and v >= 0


def _inflate(name: str, data: memoryview, raw_size: int) -> bytes:
    if raw_size > _MAX_RATIO * max(len(data), 1):
        raise _fail(f"block {name!r} claims to inflate {len(data):,} bytes to {raw_size:,}, more than zlib can")
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, raw_size)
    except zlib.error as exc:
        raise _fail(f"block {name!r} is corrupt zlib data ({exc})") from None
    if not d.eof or d.unconsumed_tail or d.unused_data:
        raise _fail(f"block {name!r} does not inflate to exactly {raw_size:,} bytes")
    return out


def _json_block(blocks: dict[str, bytes], name: str) -> Any:
    return parse_json(blocks[name], f"has a {name!r} block that is not JSON")


def read_binary(raw: bytes) -> Session:
    """The session in a version 2 file's bytes, validated whole.

    Raises:
        ValueError: the file is truncated, corrupt or not a valid session;
            the message says what is wrong (the caller adds the file name).
    """
    from ._session import Session

    header, body = _header(raw)
    count = header.get("count")
    if type(count) is not int or not 0 <= count <= _INT32_MAX:
        raise _fail(f"count {count!r} is not a number of events")
    if count * sum(item for _, _, item in _COLUMNS) > _MAX_RATIO * len(body) + 64:
        raise _fail(f"it declares {count:,} events, more than its {len(body):,} bytes can hold")
    scopes = header.get("scopes")
    if type(scopes) is not list or not scopes:
        raise _fail("the header lists no scopes")
    try:
        scope_of = [RecordScope(s) for s in scopes]
    except (ValueError, TypeError):
        raise _fail(f"scopes {scopes!r} are not all scopes this aprof knows") from None
    tracks_doc = header.get("tracks")
    if type(tracks_doc) is not list:
        raise _fail("the header lists no tracks")
    tracks: dict[int, Track] = {}
    track_list: list[Track] = []
    try:
        for t in tracks_doc:
            tid = t["id"]
            if type(tid) is not int or tid in tracks:
                raise _fail(f"track id {tid!r} is not an int, or is listed twice")
            track = tracks[tid] = Track(tid, t["name"], t["kind"], t["os_thread_id"], t["node_id"])
            track_list.append(track)
    except (KeyError, TypeError) as exc:
        raise _fail(f"a track entry is incomplete ({type(exc).__name__}: {exc})") from None
    blocks = _blocks(header, body, count)
    names = _json_block(blocks, "names")
    if type(names) is not list:
        raise _fail("the 'names' block is not a list")
    bad = next((x for x in names if type(x) is not str), None)
    if bad is not None:
        raise _fail(f"the 'names' block has a name that is not a string: {str(bad)[:80]}")
    metadata = header.get("metadata")
    tab = EventTable()
    for t in track_list:
        tab.add_track(t)
    tab.names = names
    ext = _native.extension
    for c, ((name, typecode, width), attr) in enumerate(zip(_COLUMNS, _ATTRS, strict=True)):
        data = blocks.pop(name)
        if ext is not None:
            col = array(typecode, bytes(width * count))
            ext.decode_column(data, c, col, tab.start)
        else:
            col = _decode(data, c, count, tab.start)
        del data
        setattr(tab, attr, col)
    scope = tab.scope.tobytes()
    if scope and max(scope) >= len(scope_of):  # the file's scope list, before it maps to this aprof's
        i = next(i for i, v in enumerate(scope) if v >= len(scope_of))
        raise ValueError(
            f"is not a valid aprof session: event {i} has a scope index {scope[i]} outside 0..{len(scope_of) - 1}"
        )
    tab.scope = array("B", scope.translate(_scope_map(scope_of)))
    _fill_rare(tab, _json_block(blocks, "rare"))
    for i, x in tab.rare.items():  # a task's running/waiting time comes from its steps, as at stop
        extra = x[X_EXTRA]
        if type(extra) is dict and 0 <= tab.scope[i] < len(SCOPES) and SCOPES[tab.scope[i]] is RecordScope.TASK:
            steps = extra.get("steps")
            if steps is not None and 0 <= tab.track[i] < len(track_list):
                track_list[tab.track[i]].steps = steps
    samples = None
    if "samples" in blocks:
        try:
            samples = Samples.from_json(_json_block(blocks, "samples"))
        except ValueError as exc:
            raise _fail(str(exc)) from None
        for tid in set(samples.thread_id):
            if tid not in tracks:
                raise _fail(f"samples: a sample is on track {tid}, which the session does not have")
    memory = None
    if "memory" in blocks:
        try:
            memory = Memory.from_json(_json_block(blocks, "memory"))
            memory.check_events(len(tab))
        except ValueError as exc:
            raise _fail(str(exc)) from None
    try:
        validate_session(tab, tracks, metadata)
    except ValueError as exc:
        raise ValueError(f"is not a valid aprof session: {exc}") from None
    assert type(metadata) is dict  # checked above
    return Session(tab, tracks, dict(metadata), samples, memory)


def _scope_map(scope_of: list[RecordScope]) -> bytes:
    """A bytes.translate table from the file's scope indexes to the table's."""
    table = bytearray([255]) * 256
    for i, s in enumerate(scope_of[:256]):
        table[i] = SCOPE_INDEX[s]
    return bytes(table)


def _fill_rare(tab: EventTable, rare: Any) -> None:
    """The rare fields, from the 'rare' block, into ``tab.rare``."""
    if type(rare) is not list:
        raise _fail("the 'rare' block is not a list")
    n = len(tab)
    last = -1
    out = tab.rare
    for row in rare:
        if type(row) is not list or len(row) != 6:
            raise _fail(f"a 'rare' entry is {str(row)[:80]}, not [index, exception, args, inputs, stack, extra]")
        i, exc, args, inputs, stack, extra = row
        if type(i) is not int or not last < i < n:
            raise _fail(f"a 'rare' entry names event {i!r}: not an event after {last}")
        last = i
        out[i] = [exc, args, tuple(inputs) if type(inputs) is list else inputs, stack_from_json(stack), extra]
