"""EventTable: a session's events as columns (issue 17).

After stop, a session holds its events as ten typed arrays, one value per
event, plus the few fields most events do not have in a side table::

    start   int64   start time (perf_counter_ns)
    end     int64   end time (the stop time if it was still open)
    end_lt  int64   the logical thread it ended on, -1 for its own track
    seq     int64   sequence number (-1 if none)
    fwd     int64   the logical thread that spawned or submitted it (0 if none)
    name    int32   index into ``names`` (each distinct name once)
    track   int32   index into ``tracks``
    parent  int32   index of its parent event, -1 for none
    scope   uint8   index into ``SCOPES``
    kind    uint8   flags: 1 instant, 2 unfinished, 4 async

    rare    {index: [exception, args, inputs, stack, extra]} for the events
            that have any of these

That is 54 bytes an event where a linked object per event cost about 330.
The columns are the binary session file's (aprof/_post/_binary.py), so
saving and loading move arrays, not objects. ``children`` are not stored:
they are derived from ``parent`` once, when first asked for, as a
compressed index (each event's children contiguous, in start order).

:class:`~aprof._post._events.FunctionEvent` is a view of one row, made
when it is asked for. The table keeps the view it made while anything
else holds it, so ``a.parent is b`` holds for views the caller kept; the
extension's ``ViewCache`` does this with one pointer an event and no
reference cycle, the pure-Python twin with a dict.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, overload

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import (
    FLAG_ASYNC,
    R_ARGS,
    R_END,
    R_END_LT,
    R_EXC,
    R_EXTRA,
    R_FWD,
    R_INPUTS,
    R_KIND,
    R_NAME,
    R_SCOPE,
    R_SEQ,
    R_STACK,
    R_START,
)

if TYPE_CHECKING:
    from ._events import FunctionEvent, Track
    from ._memory import Memory

__all__ = ["COLUMNS", "SCOPES", "EventTable"]

#: The scopes, in the order the ``scope`` column counts them.
SCOPES: Final = tuple(RecordScope)
SCOPE_INDEX: Final = {s: i for i, s in enumerate(SCOPES)}
#: (attribute, array type code): the columns, in the binary file's order.
COLUMNS: Final = (
    ("start", "q"),
    ("end", "q"),
    ("end_lt", "q"),
    ("seq", "q"),
    ("fwd", "q"),
    ("name", "i"),
    ("track", "i"),
    ("parent", "i"),
    ("scope", "B"),
    ("kind", "B"),
)
# The rare fields' places in a rare row.
X_EXC: Final = 0
X_ARGS: Final = 1
X_INPUTS: Final = 2
X_STACK: Final = 3
X_EXTRA: Final = 4


class _PyViews:
    """The views of one table (the extension's ``ViewCache``): kept for the
    table's life here, where the extension keeps each only while it is
    held elsewhere."""

    __slots__ = ("_cls", "_made")

    def __init__(self, cls: type[FunctionEvent]) -> None:
        self._cls = cls
        self._made: dict[int, FunctionEvent] = {}

    def get(self, tab: EventTable, i: int) -> FunctionEvent:
        v = self._made.get(i)
        if v is None:
            v = self._made[i] = self._cls.__new__(self._cls)
            v._tab = tab
            v._i = i
        return v


#: Set by aprof._post._events once FunctionEvent exists.
view_class: type[FunctionEvent] | None = None


class EventTable(Sequence["FunctionEvent"]):
    """A session's events as columns; indexing gives FunctionEvent views."""

    __slots__ = (
        "__weakref__",
        "_csr",
        "_name_ids",
        "_track_ids",
        "_views",
        "end",
        "end_lt",
        "fwd",
        "kind",
        "memory",
        "name",
        "names",
        "parent",
        "rare",
        "scope",
        "seq",
        "start",
        "track",
        "tracks",
    )

    def __init__(self) -> None:
        self.start = array("q")
        self.end = array("q")
        self.end_lt = array("q")
        self.seq = array("q")
        self.fwd = array("q")
        self.name = array("i")
        self.track = array("i")
        self.parent = array("i")
        self.scope = array("B")
        self.kind = array("B")
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.tracks: list[Track] = []
        self._track_ids: dict[int, int] = {}
        self.rare: dict[int, list[Any]] = {}
        self._views: Any = None
        self._csr: tuple[array[int], array[int]] | None = None
        #: The session's memory figures (profile_memory), or None.
        self.memory: Memory | None = None

    # -- building ---------------------------------------------------------------

    def columns(self) -> tuple[array[int], ...]:
        """The ten columns, in :data:`COLUMNS` order."""
        return (
            self.start, self.end, self.end_lt, self.seq, self.fwd,
            self.name, self.track, self.parent, self.scope, self.kind,
        )  # fmt: skip

    def add_track(self, track: Track) -> int:
        """``track``'s index in ``tracks``, adding it on first use."""
        ti = self._track_ids.get(id(track))
        if ti is None:
            ti = self._track_ids[id(track)] = len(self.tracks)
            self.tracks.append(track)
        return ti

    def intern(self, name: str) -> int:
        """``name``'s index in ``names``, adding it on first use."""
        ni = self._name_ids.get(name)
        if ni is None:
            ni = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return ni

    def append(self, rec: list[Any], track: int, parent: int = -1) -> int:
        """Add the event of a consolidated record (layout R_*); its index."""
        i = len(self.kind)
        self.start.append(rec[R_START])
        self.end.append(rec[R_END])
        end_lt = rec[R_END_LT]
        self.end_lt.append(-1 if end_lt is None else end_lt)
        self.seq.append(rec[R_SEQ])
        self.fwd.append(rec[R_FWD])
        self.name.append(self.intern(rec[R_NAME]))
        self.track.append(track)
        self.parent.append(parent)
        self.scope.append(SCOPE_INDEX[rec[R_SCOPE]])
        self.kind.append(rec[R_KIND])
        if (
            rec[R_EXC] is not None
            or rec[R_ARGS] is not None
            or rec[R_INPUTS] is not None
            or rec[R_STACK] is not None
            or rec[R_EXTRA] is not None
        ):
            self.rare[i] = [rec[R_EXC], rec[R_ARGS], rec[R_INPUTS], rec[R_STACK], rec[R_EXTRA]]
        return i

    def links_changed(self) -> None:
        """Forget the children index (after ``parent`` or ``kind`` changed)."""
        self._csr = None

    # -- reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.kind)

    @overload
    def __getitem__(self, i: int) -> FunctionEvent: ...
    @overload
    def __getitem__(self, i: slice) -> list[FunctionEvent]: ...
    def __getitem__(self, i: int | slice) -> FunctionEvent | list[FunctionEvent]:
        n = len(self.kind)
        if isinstance(i, slice):
            return list(map(self.view, range(*i.indices(n))))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("event index out of range")
        return self.view(i)

    def __iter__(self) -> Iterator[FunctionEvent]:
        return map(self.view, range(len(self.kind)))

    def view(self, i: int) -> FunctionEvent:
        """The FunctionEvent of row ``i`` (``0 <= i < len``, unchecked)."""
        views = self._views
        if views is None:
            assert view_class is not None
            ext = _native.extension
            views = self._views = _PyViews(view_class) if ext is None else ext.ViewCache(view_class)
        return views.get(self, i)  # type: ignore[no-any-return]

    def children_index(self) -> tuple[array[int], array[int]]:
        """(offsets, children): event i's children are ``children[offsets[i]:
        offsets[i + 1]]``, in start order. A child is an event with a parent
        on its own track that is not async (spawned work and async ranges
        have a parent but are nobody's child)."""
        csr = self._csr
        if csr is None:
            ext = _native.extension
            if ext is not None:
                off_b, kids_b = ext.children_index(self.parent, self.track, self.kind)
                off, kids = array("i"), array("i")
                off.frombytes(off_b)
                kids.frombytes(kids_b)
            else:
                off, kids = _py_children_index(self.parent, self.track, self.kind)
            csr = self._csr = (off, kids)
        return csr

    def rows_of_scope(self, scope: RecordScope) -> list[int]:
        """The indexes of the events of one scope, in order."""
        data = self.scope.tobytes()
        k = bytes([SCOPE_INDEX[scope]])
        out: list[int] = []
        i = data.find(k)
        while i >= 0:
            out.append(i)
            i = data.find(k, i + 1)
        return out

    def take(self, keep: Sequence[int]) -> EventTable:
        """A table of the rows ``keep`` (ascending indexes), sharing names
        and tracks; a parent that is not kept becomes -1."""
        out = self._take_columns(keep)
        # The rare rows (far fewer than the kept ones) found among the kept,
        # in ascending order as before.
        rare = self.rare
        n_keep = len(keep)
        for i in sorted(rare):
            j = bisect_left(keep, i)
            if j < n_keep and keep[j] == i:
                out.rare[j] = rare[i]
        return out

    def drop(self, rows: Sequence[int]) -> EventTable:
        """``take`` of every row but ``rows`` (ascending indexes, a few of
        many: a flight recorder's dump leaves out the events still open).
        The kept indexes are cut from one ``array`` of them all, and a rare
        row's new index is found among the few dropped, not the many kept."""
        n = len(self)
        every = array("i", range(n))
        keep = array("i")
        at = 0
        for r in rows:
            if not at <= r < n:
                after = f" after {at - 1}" if at else ""
                raise ValueError(f"EventTable.drop: rows must be ascending indexes below {n}, got {r}{after}")
            keep += every[at:r]
            at = r + 1
        keep += every[at:]
        out = self._take_columns(keep)
        gone = set(rows)
        rare = self.rare
        for i in sorted(rare):
            if i not in gone:
                out.rare[i - bisect_left(rows, i)] = rare[i]
        return out

    def _take_columns(self, keep: Sequence[int]) -> EventTable:
        """The columns of ``take(keep)``, its names and tracks; no rare rows yet."""
        out = EventTable()
        ext = _native.extension
        if ext is not None:  # take_columns in aprof/_cevents.c (ValueError unless keep ascends)
            for (attr, code), data in zip(COLUMNS, ext.take_columns(self, array("i", keep)), strict=True):
                col = array(code)
                col.frombytes(data)
                setattr(out, attr, col)
        else:
            for (attr, code), col in zip(COLUMNS, self.columns(), strict=True):
                setattr(out, attr, array(code, map(col.__getitem__, keep)))
            new = array("i", [-1]) * len(self)
            for j, i in enumerate(keep):
                new[i] = j
            out.parent = array("i", [-1 if p < 0 else new[p] for p in out.parent])
        out.names = self.names
        out._name_ids = self._name_ids
        out.tracks = list(self.tracks)  # what add_track gives them in order, copied in C
        out._track_ids = dict(self._track_ids)
        out.rare = {}
        return out

    def children_of(self, i: int) -> list[FunctionEvent]:
        off, kids = self.children_index()
        lo, hi = off[i], off[i + 1]
        if lo == hi:
            return []
        return list(map(self.view, kids[lo:hi]))

    def record(self, i: int) -> list[Any]:
        """Row ``i`` as a consolidated record (layout R_*): a new list."""
        x = self.rare.get(i)
        end_lt = self.end_lt[i]
        return [
            self.names[self.name[i]], SCOPES[self.scope[i]], self.start[i], self.end[i],
            None if end_lt == -1 else end_lt,
            None if x is None else x[X_EXC], None if x is None else x[X_ARGS],
            self.seq[i], self.fwd[i],
            None if x is None else x[X_INPUTS], None if x is None else x[X_STACK],
            self.kind[i], None if x is None else x[X_EXTRA],
        ]  # fmt: skip

    def nbytes(self) -> int:
        """Bytes held by the columns (not the names, tracks and rare rows)."""
        return sum(c.itemsize * len(c) for c in self.columns())

    def __repr__(self) -> str:
        return f"<EventTable {len(self)} events, {len(self.names)} names, {len(self.tracks)} tracks>"


def _py_children_index(parent: array[int], track: array[int], kind: array[int]) -> tuple[array[int], array[int]]:
    """:meth:`EventTable.children_index` in Python (a counting sort)."""
    n = len(parent)
    counts = array("i", bytes(4 * (n + 1)))
    child = [p >= 0 and not k & FLAG_ASYNC and track[p] == t for p, t, k in zip(parent, track, kind, strict=True)]
    for i in range(n):
        if child[i]:
            counts[parent[i] + 1] += 1
    for i in range(n):
        counts[i + 1] += counts[i]
    fill = array("i", counts)
    kids = array("i", bytes(4 * counts[n]))
    for i in range(n):  # in index order: a track's events are in start order
        if child[i]:
            p = parent[i]
            kids[fill[p]] = i
            fill[p] += 1
    return counts, kids
