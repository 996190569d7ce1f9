"""Reading files safely: bounded input, bounded nesting, validated sessions.

Every file aprof reads (``aprof.load``, ``aprof report``, ``aprof convert``)
may come from someone else: a colleague's trace, a bug report's
attachment, a file a server stored. Reading one must end in a
:class:`Session` that every analysis and export can walk, or in a
``ValueError`` naming the file and what is wrong. Never in a hang, a
``RecursionError``, an ``OverflowError`` three calls later, or a machine out
of memory. This module holds the three guards, for any reader to use:

* :func:`decompress` inflates gzip (and bzip2 or xz) input in a streaming
  loop with a cap proportional to the input, so a decompression bomb is
  refused after reading at most the cap.
* :func:`parse_json` refuses nesting deeper than :data:`MAX_JSON_DEPTH`
  *before* handing the text to :mod:`json`, whose decoder recurses once per
  level. On 3.11 that recursion is bounded only by ``sys.getrecursionlimit()``,
  and a program that raised the limit crashes the interpreter on a deep
  enough file. It also refuses ``NaN`` and ``Infinity``.
* :func:`validate_session` checks a session built from a file, whatever its
  format: every field's type and range, times that do not run backwards,
  parent links without cycles, children nested in their parents, tracks in
  start order. A new file format (a binary one) builds its events and calls
  it; :func:`check_count` checks a count the file declares against the bytes
  it has left, before anything is allocated for it.

The error messages here do not name the file: each reader prefixes its own
``load: '<file>' ...`` or ``'<file>' ...``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope
from .._core._recorder import FLAG_ASYNC, FLAG_UNFINISHED, KIND_INSTANT
from . import _table
from ._table import SCOPES

if TYPE_CHECKING:
    from ._events import Track
    from ._table import EventTable

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_RATIO",
    "MIN_LIMIT",
    "check_count",
    "check_parent_indexes",
    "decompress",
    "json_depth_exceeds",
    "parse_json",
    "validate_session",
]

#: A compressed input may inflate to at most this many times its own size
#: (aprof's own gzip files inflate 7 to 20 times; deflate can reach 1032).
MAX_RATIO: Final = 100
#: ... or to this many bytes, whichever is larger (small files compress well).
MIN_LIMIT: Final = 64 << 20
#: The deepest JSON nesting any reader accepts. A session nests 5 levels
#: (document, events, event, stack, frame), a Chrome trace about as many.
MAX_JSON_DEPTH: Final = 64
#: Track (logical thread) ids and node ids are below this: the Chrome
#: export gives each track two more rows, at 32-bit ids above every track's.
MAX_TRACK_ID: Final = 10**8

_CHUNK: Final = 1 << 20
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_R_LEN: Final = 13  # fields in a consolidated record (aprof._core._recorder)
_KIND_BITS: Final = KIND_INSTANT | FLAG_UNFINISHED | FLAG_ASYNC


# -- Compressed input ---------------------------------------------------------


_Errors = tuple[type[BaseException], ...]
_CORRUPT: Final[_Errors] = (EOFError, OSError, zlib.error)  # gzip's, bz2's and lzma's truncation/format errors


def _gzip(f: IO[bytes]) -> tuple[IO[bytes], _Errors]:
    return gzip.GzipFile(fileobj=f), _CORRUPT  # type: ignore[return-value]  # a BufferedIOBase, read as IO[bytes]


def _bzip2(f: IO[bytes]) -> tuple[IO[bytes], _Errors]:
    import bz2  # optional in a CPython build: imported only for bzip2 input

    return bz2.BZ2File(f), _CORRUPT


def _xz(f: IO[bytes]) -> tuple[IO[bytes], _Errors]:
    import lzma  # optional in a CPython build, as bz2

    return lzma.LZMAFile(f), (*_CORRUPT, lzma.LZMAError)


_COMPRESSIONS: Final[tuple[tuple[bytes, str, Callable[[IO[bytes]], tuple[IO[bytes], _Errors]]], ...]] = (
    (b"\x1f\x8b", "gzip", _gzip),
    (b"BZh", "bzip2", _bzip2),
    (b"\xfd7zXZ\x00", "xz", _xz),
)


def decompress(raw: bytes) -> bytes:
    """``raw`` inflated if it is gzip, bzip2 or xz data; else ``raw`` itself.

    The output is read in chunks and refused as soon as it passes
    ``max(MIN_LIMIT, MAX_RATIO * len(raw))`` bytes, so memory stays bounded
    by that limit whatever the input claims.

    Raises:
        ValueError: the data is truncated or corrupt, inflates past the
            limit, or needs a module this Python was built without.
    """
    found = next((c for c in _COMPRESSIONS if raw.startswith(c[0])), None)
    if found is None:
        return raw
    _, kind, opener = found
    limit = max(MIN_LIMIT, MAX_RATIO * len(raw))
    try:
        f, corrupt = opener(io.BytesIO(raw))
    except ImportError as exc:
        raise ValueError(f"is {kind} data, and this Python was built without the module to read it ({exc})") from None
    chunks: list[bytes] = []
    size = 0
    with f:
        while True:
            try:
                chunk = f.read(_CHUNK)
            except corrupt as exc:
                raise ValueError(f"is a truncated or corrupt {kind} file ({exc})") from None
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ValueError(
                    f"is {kind} data that inflates to more than {limit:,} bytes ({MAX_RATIO} times its "
                    f"{len(raw):,} bytes): refused as a likely decompression bomb. If the file is genuine, "
                    "decompress it yourself and read the uncompressed file"
                )
            chunks.append(chunk)
    return b"".join(chunks)


# -- JSON ---------------------------------------------------------------------

# Everything but the bytes that open and close a container or a string.
_NOT_STRUCTURE: Final = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING: Final = re.compile(rb'"[^"]*"')
_EMPTY_PAIR: Final = re.compile(rb"\[\]|\{\}")


def json_depth_exceeds(raw: bytes, depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` (UTF-8) nests deeper than ``depth``.

    No recursion and no per-byte Python loop: escapes are dropped, the text
    is cut down to its brackets and quotes, strings (with any brackets in
    them) are removed, and then each pass removes the empty pairs (``[]``,
    ``{}``) present at its start: exactly one level. A text that is not
    empty after ``depth`` passes is deeper than that; one that stops
    shrinking before is malformed, which ``json`` then reports.
    """
    # In valid JSON a backslash only starts an escape inside a string:
    # dropping escaped backslashes first, then escaped quotes, leaves every
    # remaining quote a string delimiter (most files have no backslash).
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    s = s.translate(None, _NOT_STRUCTURE)
    # Quotes alternate open/close, so removing two adjacent ones removes an
    # empty string, or joins two strings with nothing between them: either
    # way what is inside strings stays inside. The regex then has only the
    # strings that hold brackets left to remove.
    s = _STRING.sub(b"", s.replace(b'""', b""))
    for _ in range(depth):
        if not s:
            return False
        t = _EMPTY_PAIR.sub(b"", s)
        if len(t) == len(s):
            return False
        s = t
    return bool(s)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"holds the non-finite number {name}, which no aprof file contains")


def parse_json(raw: bytes, not_json: str = "is truncated or not JSON") -> Any:
    """Parse JSON text (UTF-8, -16 or -32) without recursing on its depth.

    ``not_json`` is what the message says when the text is not JSON at all
    (each reader says what it expected).

    Raises:
        ValueError: not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, or
            holding ``NaN``/``Infinity`` or an integer too long to convert.
    """
    text = raw
    encoding = json.detect_encoding(raw)
    if encoding != "utf-8":  # UTF-16/32: the depth check reads UTF-8
        try:
            text = raw.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{not_json} ({exc})") from None
    if json_depth_exceeds(text):
        raise ValueError(f"is JSON nested deeper than {MAX_JSON_DEPTH} levels, which no aprof file is")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{not_json} ({exc})") from None
    except RecursionError:  # the caller's own stack was already deep
        raise ValueError(f"is JSON nested too deeply to read here ({MAX_JSON_DEPTH} levels or fewer)") from None
    except ValueError as exc:  # our NaN hook, or an integer past sys.get_int_max_str_digits()
        msg = str(exc)
        if msg.startswith("holds"):
            raise ValueError(msg) from None
        if "digits" in msg:
            raise ValueError(
                f"holds an integer of more than {sys.get_int_max_str_digits()} digits, which no aprof file contains"
            ) from None
        raise ValueError(f"holds a number aprof cannot read ({msg})") from None


# -- Counts a file declares ---------------------------------------------------


def check_count(count: object, item_bytes: int, available: int, what: str) -> int:
    """Check a count read from a file before allocating for it.

    Args:
        count: The count the file declares.
        item_bytes: The fewest bytes one item takes in the file.
        available: The bytes left in the file for those items.
        what: What is counted, for the message ("events").

    Returns:
        ``count``, an int that ``available`` bytes can hold.

    Raises:
        ValueError: ``count`` is not a non-negative int, or needs more bytes
            than the file has.
    """
    if type(count) is not int or count < 0:
        raise ValueError(f"declares {count!r} {what}, which is not a count")
    if count * item_bytes > available:
        raise ValueError(
            f"declares {count:,} {what}, which need at least {count * item_bytes:,} bytes, "
            f"but only {available:,} bytes are left"
        )
    return count


def check_parent_indexes(parents: list[Any], n: int) -> None:
    """Check parent indexes read from a file: each -1 or an event index.

    Cycles and self-parents are :func:`validate_session`'s to find, once the
    events are linked.
    """
    for i, p in enumerate(parents):
        if type(p) is not int or not -1 <= p < n:
            raise ValueError(f"event {i} names parent {p!r}, which is not -1 or an event index below {n}")


# -- Sessions -----------------------------------------------------------------


def _is_int(v: object) -> bool:
    return type(v) is int and _I64_MIN <= v <= _I64_MAX


def _check_plain(value: object, what: str) -> None:
    """``value`` is plain JSON data (finite numbers), walked without recursion."""
    todo = [value]
    while todo:
        v = todo.pop()
        t = type(v)
        if t is str or t is bool or v is None:
            continue
        if t is int:
            if not _I64_MIN <= v <= _I64_MAX:  # type: ignore[operator]
                raise ValueError(f"{what} holds an integer outside 64 bits")
        elif t is float:
            if not math.isfinite(v):  # type: ignore[arg-type]
                raise ValueError(f"{what} holds the non-finite number {v}")
        elif t is list or t is tuple:
            todo.extend(v)  # type: ignore[arg-type]
        elif t is dict:
            for k, item in v.items():  # type: ignore[attr-defined]
                if type(k) is not str:
                    raise ValueError(f"{what} has a key {k!r} that is not a string")
                todo.append(item)
        else:
            raise ValueError(f"{what} holds a {t.__name__}, not JSON data")


def _check_steps(steps: object, what: str) -> None:
    """A task's flat (start, end) step pairs: ints, paired, in time order."""
    if type(steps) is not list:
        raise ValueError(f"{what} steps are a {type(steps).__name__}, not a list")
    if len(steps) % 2:
        raise ValueError(f"{what} steps have an odd count ({len(steps)}), not (start, end) pairs")
    # Whole-list checks in C (a sorted list sorts in one pass); the loop
    # below only runs to say what is wrong.
    if (
        all(type(s) is int for s in steps)
        and (not steps or _I64_MIN <= min(steps) <= max(steps) <= _I64_MAX)
        and steps == sorted(steps)
    ):
        return
    prev = _I64_MIN
    for s in steps:
        if not _is_int(s):
            raise ValueError(f"{what} steps hold {s!r}, not a 64-bit integer time")
        if s < prev:
            raise ValueError(f"{what} steps go back in time ({s} after {prev})")
        prev = s


def _check_track(t: Track) -> None:
    what = f"track {t.id!r}"
    if not _is_int(t.id):
        raise ValueError(f"{what} has an id that is not a 64-bit integer")
    if not 0 <= t.id < MAX_TRACK_ID:
        raise ValueError(f"{what} has an id outside 0..{MAX_TRACK_ID - 1:,}")
    if type(t.name) is not str:
        raise ValueError(f"{what} has a name that is not a string: {t.name!r}")
    if type(t.kind) is not str:
        raise ValueError(f"{what} has a kind that is not a string: {t.kind!r}")
    for field in ("os_thread_id", "node_id"):
        if not _is_int(getattr(t, field)):
            raise ValueError(f"{what} has {field} {getattr(t, field)!r}, not a 64-bit integer")
    if not 0 <= t.node_id < MAX_TRACK_ID:
        raise ValueError(f"{what} has node_id {t.node_id!r}, outside 0..{MAX_TRACK_ID - 1:,}")
    if t.steps is not None:
        _check_steps(t.steps, what)


def _check_metadata(metadata: object) -> None:
    if type(metadata) is not dict:
        raise ValueError(f"metadata is a {type(metadata).__name__}, not an object")
    for key in ("start_ns", "stop_ns"):  # every session has them; exports place times by them
        if key not in metadata:
            raise ValueError(f"metadata has no {key}")
    for key in ("start_ns", "stop_ns", "unix_offset_ns", "node_id", "dropped"):
        if key in metadata and not _is_int(metadata[key]):
            raise ValueError(f"metadata {key} is {metadata[key]!r}, not a 64-bit integer")
    _check_plain(metadata, "metadata")
    for key in ("aprof_version", "python"):
        if metadata.get(key) is not None and type(metadata[key]) is not str:
            raise ValueError(f"metadata {key} is {metadata[key]!r}, not a string")
    pids = metadata.get("pids", {})
    if type(pids) is not dict or not all(
        k.isdecimal() and k.isascii() and len(k) < 20 and _is_int(v) for k, v in pids.items()
    ):
        raise ValueError(f"metadata pids is {pids!r}, not a map of node ids to process ids")
    start_thread = metadata.get("start_thread")
    if start_thread is not None and (
        type(start_thread) is not dict
        or not _is_int(start_thread.get("id"))
        or type(start_thread.get("name")) is not str
        or type(start_thread.get("kind")) is not str
    ):
        raise ValueError(f"metadata start_thread is {start_thread!r}, not a thread's id, name and kind")
    if metadata.get("dropped", 0) < 0:
        raise ValueError(f"metadata dropped is {metadata['dropped']}, below 0")
    by_kind = metadata.get("dropped_by_kind", {})
    if type(by_kind) is not dict or not all(
        type(k) is str and len(k) < 64 and _is_int(v) and v >= 0 for k, v in by_kind.items()
    ):
        raise ValueError(f"metadata dropped_by_kind is {by_kind!r}, not a map of kinds to counts >= 0")
    start, stop = metadata.get("start_ns"), metadata.get("stop_ns")
    if start is not None and stop is not None and stop < start:
        raise ValueError(f"metadata stop_ns {stop} is before start_ns {start}")


def _check_record(i: int, r: list[Any], checked_steps: set[int]) -> None:
    """One event's raw record (``aprof._core._recorder``'s ``R_*`` layout).

    Read through the record, not the event's properties (a property call
    per field would cost more than all the checks together), and in two
    steps: one cheap expression for the fields every event has, and only
    when it fails, :func:`_record_problem` to say what is wrong.
    """
    if type(r) is not list or len(r) != _R_LEN:
        raise ValueError(f"event {i} has a record of the wrong shape")
    name, scope, start, end, end_lt, exc, args, seq, fwd, inputs, stack, kind, extra = r
    if not (
        type(name) is str
        and type(scope) is RecordScope
        and type(start) is int
        and type(end) is int
        and _I64_MIN <= start <= end <= _I64_MAX
        and type(kind) is int
        and not kind & ~_KIND_BITS
        and (not kind & KIND_INSTANT or end == start)
        and (end_lt is None or (type(end_lt) is int and _I64_MIN <= end_lt <= _I64_MAX))
        and type(seq) is int
        and _I64_MIN <= seq <= _I64_MAX
        and type(fwd) is int
        and _I64_MIN <= fwd <= _I64_MAX
        and (exc is None or type(exc) is str)
        and (args is None or type(args) is str)
    ):
        raise ValueError(_record_problem(i, r))
    if not 0 <= fwd < MAX_TRACK_ID or not (end_lt is None or 0 <= end_lt < MAX_TRACK_ID):
        raise ValueError(
            f"{_what(i, name)} names a thread outside 0..{MAX_TRACK_ID - 1:,} "
            f"(forward_thread_id {fwd!r}, end_thread_id {end_lt!r})"
        )
    if inputs is not None and (type(inputs) is not tuple or any(type(x) is not str for x in inputs)):
        raise ValueError(f"{_what(i, name)} has inputs {inputs!r}, not a list of strings")
    if stack is not None:
        if type(stack) is not tuple:
            raise ValueError(f"{_what(i, name)} has a stack that is not a list of frames: {stack!r}")
        for frame in stack:
            if (
                type(frame) is not tuple
                or len(frame) != 3
                or type(frame[0]) is not str
                or not _is_int(frame[1])
                or type(frame[2]) is not str
            ):
                raise ValueError(f"{_what(i, name)} has a stack frame {frame!r}, not [file, line, function]")
    if extra is not None:
        _check_extra(_what(i, name), extra, checked_steps)


def _what(i: int, name: str) -> str:
    return f"event {i} ({name[:80]!r})"


def _record_problem(i: int, r: list[Any]) -> str:
    """What is wrong with a record that failed :func:`_check_record`'s test."""
    name, scope, start, end, end_lt, exc, args, seq, fwd, _, _, kind, _ = r
    if type(name) is not str:
        return f"event {i} has a name that is not a string: {name!r}"
    what = _what(i, name)
    if type(scope) is not RecordScope:
        return f"{what} has scope {scope!r}, not a RecordScope"
    for field, v in (("start_ns", start), ("end_ns", end)):
        if not _is_int(v):
            return f"{what} has {field} {v!r}, not a 64-bit integer time"
    if end < start:
        return f"{what} ends before it starts (end_ns {end} < start_ns {start})"
    if type(kind) is not int or kind & ~_KIND_BITS:
        return f"{what} has kind flags {kind!r} aprof does not know"
    if kind & KIND_INSTANT and end != start:
        return f"{what} is an instant with a duration ({end - start} ns)"
    for field, v in (("end_thread_id", end_lt), ("sequence_nr", seq), ("forward_thread_id", fwd)):
        if not _is_int(v) and not (v is None and field == "end_thread_id"):
            return f"{what} has {field} {v!r}, not a 64-bit integer"
    for field, v in (("exception", exc), ("args", args)):
        if v is not None and type(v) is not str:
            return f"{what} has {field} {v!r}, not a string or null"
    return f"{what} is damaged"  # not reached: the test above has no other clause


def _check_extra(what: str, extra: object, checked_steps: set[int]) -> None:
    if type(extra) is not dict:
        raise ValueError(f"{what} has extra {extra!r}, not an object")
    steps = extra.get("steps")
    if steps is not None:
        if id(steps) not in checked_steps:  # a task's steps are its track's list, checked once
            _check_steps(steps, what)
            checked_steps.add(id(steps))
        if len(extra) > 1:
            _check_plain({k: v for k, v in extra.items() if k != "steps"}, f"{what} extra")
    else:
        _check_plain(extra, f"{what} extra")
    for key in ("spawn_ns", "submit_ns"):
        if key in extra and not _is_int(extra[key]):
            raise ValueError(f"{what} extra {key} is {extra[key]!r}, not a 64-bit integer time")


def validate_session(
    tab: EventTable, tracks: Mapping[int, Track], metadata: object, records_checked: bool = False
) -> None:
    """Check a session read from a file, so that everything can walk it.

    Checks the metadata, every track, the rare fields of the events that
    have them, and the columns: flags, ``end_ns >= start_ns``, thread ids,
    the links (each parent is an event of the session, no event is its own
    ancestor, each child lies within its parent's time) and the order
    (each track's events contiguous and in start order). The columns' types
    hold by construction: a reader checks each value's type as it fills
    them. Work is linear in the number of events and fields, without
    recursion; the extension's ``check_table`` does the columns in C.

    ``records_checked``: the reader checked every record before it went
    into the columns (version 1 files), so the rare fields are not checked
    again.

    Raises:
        ValueError: what is wrong and where (event index, name, field); the
            caller adds the file name.
    """
    from .._core import _native

    _check_metadata(metadata)
    assert type(metadata) is dict  # checked above
    checked_steps: set[int] = set()
    for t in tracks.values():
        _check_track(t)
        if t.steps is not None:
            checked_steps.add(id(t.steps))
    for t in tab.tracks:
        if tracks.get(t.id) is not t:
            raise ValueError(f"an event is on track {t.id!r}, which the file does not list")
    ext = _native.extension
    if ext is not None:
        ext.check_table(tab, metadata["start_ns"], MAX_TRACK_ID)
    else:
        _check_table(tab, metadata["start_ns"])
    if not records_checked:
        for i in sorted(tab.rare):  # the columns' indexes are checked: the records can be read
            _check_record(i, tab.record(i), checked_steps)


def _check_table(tab: EventTable, profile_start: int) -> None:
    """:func:`validate_session`'s column checks in Python (the extension's
    ``check_table``, with the same messages)."""
    n = len(tab)
    names, tracks = tab.names, tab.tracks
    start, end, end_lt, fwd, name, track, parent, kind = (
        tab.start, tab.end, tab.end_lt, tab.fwd, tab.name, tab.track, tab.parent, tab.kind
    )  # fmt: skip
    for what, col, lo, hi in (
        ("a name index", name, 0, len(names)),
        ("a track index", track, 0, len(tracks)),
        ("a parent index", parent, -1, n),
    ):
        if n and (min(col) < lo or max(col) >= hi):
            i = next(i for i, v in enumerate(col) if not lo <= v < hi)
            raise ValueError(f"event {i} has {what} {col[i]} outside {lo}..{hi - 1}")
    if n and max(tab.scope) >= len(SCOPES):
        i = next(i for i, v in enumerate(tab.scope) if v >= len(SCOPES))
        raise ValueError(f"event {i} has a scope index {tab.scope[i]} outside 0..{len(SCOPES) - 1}")
    for i in range(n):  # the fields of each event first (a file's records were checked so, whole)
        s, e, k = start[i], end[i], kind[i]
        if e < s:
            raise ValueError(f"{_what(i, names[name[i]])} ends before it starts (end_ns {e} < start_ns {s})")
        if k & ~_KIND_BITS:
            raise ValueError(f"{_what(i, names[name[i]])} has kind flags {k} aprof does not know")
        if k & KIND_INSTANT and e != s:
            raise ValueError(f"{_what(i, names[name[i]])} is an instant with a duration ({e - s} ns)")
        f, lt = fwd[i], end_lt[i]
        if not 0 <= f < MAX_TRACK_ID or not -1 <= lt < MAX_TRACK_ID:
            raise ValueError(
                f"{_what(i, names[name[i]])} names a thread outside 0..{MAX_TRACK_ID - 1} "
                f"(forward_thread_id {f}, end_thread_id {None if lt == -1 else lt})"
            )
    off, kids = _table._py_children_index(parent, track, kind)
    done_tracks: set[int] = set()
    cur = -1
    for i in range(n):  # then the order, and each event's children
        what = _what(i, names[name[i]])
        if start[i] < profile_start:
            raise ValueError(f"{what} starts before the profile started (metadata start_ns)")
        t = track[i]
        if t != cur:
            if t in done_tracks:
                raise ValueError(
                    f"{what} is on track {tracks[t].id}, whose events came earlier: "
                    "the events are not grouped by track"
                )
            if cur >= 0:
                done_tracks.add(cur)
            cur = t
        elif start[i] < start[i - 1]:
            raise ValueError(f"{what} starts before the event listed before it on its track")
        for c in kids[off[i] : off[i + 1]]:
            if start[c] < start[i] or end[c] > end[i]:
                raise ValueError(f"{_what(c, names[name[c]])} is nested in {what} but outside its time")
    _check_no_cycles(tab, parent)


def _check_no_cycles(tab: EventTable, parent_of: Sequence[int]) -> None:
    """No event is its own ancestor: each parent chain is followed once."""
    state = bytearray(len(parent_of))  # 0 unseen, 1 on the chain being walked, 2 known to end
    for i in range(len(parent_of)):
        chain: list[int] = []
        cur = i
        while cur >= 0 and state[cur] != 2:
            if state[cur] == 1:
                name = tab.names[tab.name[cur]][:80]
                if parent_of[cur] == cur:
                    raise ValueError(f"event {cur} ({name!r}) is its own parent")
                raise ValueError(f"event {cur} ({name!r}) is its own ancestor (a cycle of parent links)")
            state[cur] = 1
            chain.append(cur)
            cur = parent_of[cur]
        for k in chain:
            state[k] = 2
