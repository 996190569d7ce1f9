"""Level of detail: a session too big to show event by event (issue 17).

The HTML report embeds every event up to a budget. Past it, the report gets
three things computed here from the columns, each one linear pass:

- :func:`keep_rows`: which events stay in full detail. Tasks, executor
  jobs and loop blocks always (the structure that arrows, groups and the
  summary hang on), then the longest of the rest up to the budget, and
  every nested event's ancestors, so the kept events nest as they did (a
  parent is never shorter than its child, so that adds few).
- :func:`merge_rows`: the events not kept, merged per track and row (depth
  of nesting; one row for async ranges) into blocks: consecutive dropped
  events of a row join while the gap between them is under ``resolution``
  and no kept event of the row comes between. Each block says how many
  events it holds and their summed duration. Also each track's event count
  and how many of them are kept.
- :func:`range_flame`: the flame graph by range, merged by call path over
  every event (the page would otherwise build it from the events it has).

The C extension has the same three functions (``aprof/_cevents.c``,
``lod_keep``, ``lod_merge``, ``lod_flame``); the twins here are what
``APROF_PURE_PYTHON=1`` runs, and the tests hold the two to the same output.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Final

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import FLAG_ASYNC, KIND_INSTANT
from ._table import SCOPES

if TYPE_CHECKING:
    from ._table import EventTable

__all__ = ["ITEM", "KEPT_SCOPES", "always_kept", "depths", "keep_rows", "longest_rows", "merge_rows", "range_flame"]

#: Scopes a budgeted HTML report or a capped Chrome trace always keeps
#: whole: the structure that groups, arrows, the tables and the summary
#: hang on.
KEPT_SCOPES: Final = frozenset({RecordScope.TASK, RecordScope.EXECUTOR, RecordScope.LOOP_BLOCK})

#: Integers per merged block: track, depth (-1: the async row), start,
#: duration, events merged, their summed duration.
ITEM: Final = 6


def _is_child(tab: EventTable, i: int) -> bool:
    """Nested on its track: what gives an event a depth (the report's rule:
    neither it nor its parent is async)."""
    p = tab.parent[i]
    return p >= 0 and tab.track[p] == tab.track[i] and not (tab.kind[i] | tab.kind[p]) & FLAG_ASYNC


def depths(tab: EventTable) -> array[int]:
    """Each event's depth of nesting on its track (0: top level)."""
    parent, track, kind = tab.parent, tab.track, tab.kind
    n = len(parent)
    depth = array("i", [-1]) * n
    for i in range(n):
        if depth[i] >= 0:
            continue
        chain = []
        j = i
        while depth[j] < 0:
            p = parent[j]
            if p < 0 or track[p] != track[j] or (kind[j] | kind[p]) & FLAG_ASYNC:
                depth[j] = 0
                break
            chain.append(j)
            j = p
        d = depth[j]
        for k in reversed(chain):
            d += 1
            depth[k] = d
    return depth


def always_kept() -> bytes:
    """The translate table of the scopes a budgeted or capped output keeps
    whole (:data:`KEPT_SCOPES`): 256 bytes, 1 at their scope indexes."""
    return bytes(1 if sc in KEPT_SCOPES else 0 for sc in SCOPES).ljust(256, b"\0")


def longest_rows(tab: EventTable, alw: bytes, budget: int) -> tuple[bytearray, int]:
    """The rows marked in ``alw`` (a byte per row) and, of the others, the
    longest, ``budget`` in all (or the marked ones alone, if more): a byte
    per row (1: kept) and the shortest duration kept by length (0 if none).

    Linear: durations are counted by their power of two; the longest powers
    are kept whole, and of the first power that does not fit, the first
    events in table order. Instants (duration 0) go first.
    """
    n = len(tab)
    start, end = tab.start, tab.end
    buckets = [0] * 66
    for i in range(n):
        if not alw[i]:
            buckets[(end[i] - start[i]).bit_length()] += 1
    room = max(0, budget - (n - sum(buckets)))
    cut = len(buckets)
    while cut > 0 and buckets[cut - 1] <= room:
        cut -= 1
        room -= buckets[cut]
    partial = cut - 1  # the bucket kept in part (room of its events)
    keep = bytearray(n)
    shortest = -1
    for i in range(n):
        if not alw[i]:
            d = end[i] - start[i]
            b = d.bit_length()
            if b < partial or (b == partial and room <= 0):
                continue
            if b == partial:
                room -= 1
            if shortest < 0 or d < shortest:
                shortest = d
        keep[i] = 1
    return keep, max(shortest, 0)


def keep_rows(tab: EventTable, always: bytes, budget: int) -> tuple[bytes, array[int], int]:
    """The events kept in full detail: ``(mask, rows, shortest_ns)``.

    Args:
        always: 256 bytes, nonzero at the scope indexes always kept.
        budget: events to keep; the always-kept ones count against it, and
            the ancestors added to keep nesting can take the total past it.

    Returns:
        A byte per event (1: kept), the kept indexes in order, and the
        shortest duration kept by length (0 when none was).

    Ranking by length is linear: durations are counted by their power of
    two; the longest powers are kept whole, and of the first power that
    does not fit, the first events in table order.
    """
    ext = _native.extension
    if ext is not None:
        mask, rows_b, shortest = ext.lod_keep(tab, always, budget)
        rows = array("i")
        rows.frombytes(rows_b)
        return mask, rows, shortest
    n = len(tab)
    keep, shortest = longest_rows(tab, tab.scope.tobytes().translate(always), budget)
    for i in range(n):  # ancestors: each set once, so linear in all
        if keep[i]:
            j = i
            while _is_child(tab, j) and not keep[tab.parent[j]]:
                j = tab.parent[j]
                keep[j] = 1
    return bytes(keep), array("i", [i for i in range(n) if keep[i]]), shortest


def merge_rows(
    tab: EventTable, keep: bytes, base: int, resolution: int, remap: array[int]
) -> tuple[array[int], array[int], array[int]]:
    """The events not kept, merged into blocks (see the module's docstring).

    Args:
        keep: :func:`keep_rows`' mask.
        base: subtracted from the blocks' starts (the profile's start).
        resolution: the largest gap (ns) a block spans.
        remap: each table track's index in the output.

    Returns:
        ``(blocks, events, kept)``: :data:`ITEM` integers per block, and per
        table track its event count and how many of them are kept.
    """
    ext = _native.extension
    nt = len(tab.tracks)
    if ext is not None:
        items_b, events_b, kept_b = ext.lod_merge(tab, keep, base, resolution, remap)
        out = (array("q"), array("q"), array("q"))
        for a, b in zip(out, (items_b, events_b, kept_b), strict=True):
            a.frombytes(b)
        return out
    if resolution < 1:
        raise ValueError(f"merge_rows: resolution must be >= 1 ns, got {resolution}")
    depth = depths(tab)
    start, end, track, kind = tab.start, tab.end, tab.track, tab.kind
    items = array("q")
    events = array("q", bytes(8 * nt))
    kept = array("q", bytes(8 * nt))
    blocks: dict[int, list[int]] = {}  # slot (0: async, depth + 1) -> [start, end, count, busy]
    cur = -1

    def flush(slot: int) -> None:
        s, e, c, busy = blocks.pop(slot)
        items.extend((remap[cur], slot - 1, s - base, e - s, c, busy))

    for i in range(len(tab)):
        t = track[i]
        if t != cur:
            for slot in sorted(blocks):
                flush(slot)
            cur = t
        events[t] += 1
        slot = 0 if kind[i] & FLAG_ASYNC else depth[i] + 1
        if keep[i]:
            kept[t] += 1
            if slot in blocks:
                flush(slot)
            continue
        s, e = start[i], end[i]
        blk = blocks.get(slot)
        if blk is not None and s - blk[1] < resolution:
            if e > blk[1]:
                blk[1] = e
            blk[2] += 1
            blk[3] += e - s
            continue
        if blk is not None:
            flush(slot)
        blocks[slot] = [s, e, 1, e - s]
    for slot in sorted(blocks):
        flush(slot)
    return items, events, kept


def range_flame(tab: EventTable, label: array[int]) -> tuple[array[int], array[int], array[int]]:
    """Ranges merged by call path over every event: ``(parent, label,
    total)`` per node, node 0 the root (parent -1, label -1), parents
    before their children. ``label`` gives each event's frame name id.

    As the report's own flame graph: async ranges and instants are left out;
    a range nested on its track hangs under its parent's node, any other
    under the root; a node's total is the summed duration of its ranges
    (the root's, of the top-level ones).
    """
    ext = _native.extension
    if ext is not None:
        out = (array("i"), array("i"), array("q"))
        for a, b in zip(out, ext.lod_flame(tab, label), strict=True):
            a.frombytes(b)
        return out
    start, end, parent, kind = tab.start, tab.end, tab.parent, tab.kind
    n = len(tab)
    node_of = array("i", [-1]) * n
    par, lab, tot = array("i", [-1]), array("i", [-1]), array("q", [0])
    ids: dict[tuple[int, int], int] = {}
    skip = FLAG_ASYNC | KIND_INSTANT
    for i in range(n):
        if kind[i] & skip:
            continue
        p = parent[i]
        up = node_of[p] if p >= 0 and p < i and _is_child(tab, i) and node_of[p] >= 0 else 0
        key = (up, label[i])
        nd = ids.get(key)
        if nd is None:
            nd = ids[key] = len(par)
            par.append(up)
            lab.append(label[i])
            tot.append(0)
        d = end[i] - start[i]
        tot[nd] += d
        if up == 0:
            tot[0] += d
        node_of[i] = nd
    return par, lab, tot
