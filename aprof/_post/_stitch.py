"""Who awaits whom: task timelines stitched along spawn links and waits.

A flame graph by range shows each task on its own, so a parent that spent
900 ms waiting for a child shows 900 ms of "waiting" and the child's ranges
show elsewhere. This module charges a task's waiting time to what it waited
on, as far as the recording tells:

- A recorded task knows when it ran (its steps) and so when it waited (the
  gaps). For each wait, the work it spawned or submitted that *ended inside
  the wait*, the latest such, and *right before the task woke* is what woke
  it: its own stitched timeline hangs under the parent's open ranges for the
  part of the wait it covers. "Right before" means the task woke within
  ``WAKE_SLACK_NS`` or a quarter of the child's time in the wait, whichever
  is more (a thread's result reaches the loop through a wake-up of its own,
  a millisecond or two on a busy machine), or the loop had no idle time in
  between (the parent was ready, behind other work). A child that ended
  long before its parent woke did not wake it (the parent was sleeping or
  waiting on something else).
- An executor job under a wait shows its queueing (``(queued)``, submit to
  start) and then the worker thread's ranges.
- What is left of a wait is ``(waiting)``: a sleep, I/O, a lock, or a child
  that does not meet the rule above. After the child that woke it, a task
  that resumed more than ``WAKE_SLACK_NS`` later with the loop busy all the
  while shows ``(ready, loop busy)``: it could run, other work held the
  loop (CPU starvation).
- A logical thread with no recorded steps (an OS thread, or the task that
  started an in-code profile) has no known waits; for each of its ranges,
  work it spawned inside the range is chained back from the range's end:
  the job that ended last, then the one that ended last before that job
  was spawned, and so on (the critical path).

Each child is charged to one wait of its spawner at most; children that did
not hold a task up do not appear (their own time is in the flame graph by
range). Roots are the ranges and tasks with no recorded spawner, and the
work a logical thread without steps spawned outside its ranges (where its
waits are unknown).
The result is a list of timelines, one per root track, of contiguous
``(start, end, frames)`` segments: the HTML report merges them into a flame
graph, and speedscope gets one evented profile per root.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import FLAG_ASYNC, KIND_INSTANT
from ._table import SCOPES, X_EXTRA

if TYPE_CHECKING:
    from ._events import FunctionEvent, Track
    from ._session import Session
    from ._table import EventTable

__all__ = [
    "MAX_FRAMES", "QUEUED", "READY", "STITCHED_SUFFIX", "WAITING", "Segment", "merge_tree", "stitched_timelines", "stitched_tree",
]  # fmt: skip

WAITING: Final = "(waiting)"
READY: Final = "(ready, loop busy)"
# What a speedscope profile of a stitched timeline is called after its track's
# name (aprof._export._speedscope writes it; the reader skips such profiles).
STITCHED_SUFFIX: Final = " [who awaits whom]"
QUEUED: Final = "(queued)"
WAKE_SLACK_NS: Final = 1_000_000
MAX_DEPTH: Final = 100  # a chain of awaits deeper than this is not followed

Segment = tuple[int, int, tuple[str, ...]]


def _label(ev: FunctionEvent) -> str:
    # The summary's names (aprof._export._labels.frame_label, kept here too so
    # post-processing does not import the exporters). Read from the columns:
    # this runs once per range of the flame graph.
    tab, i = ev._tab, ev._i
    scope = SCOPES[tab.scope[i]]
    if scope is RecordScope.TASK:
        x = tab.rare.get(i)
        extra = x[X_EXTRA] if x is not None else None
        coro = extra.get("coro") if extra else None
        if coro:
            return f"task {coro}"
    elif scope is RecordScope.EXECUTOR:
        return f"executor {tab.names[tab.name[i]]}"
    return tab.names[tab.name[i]]


class _Link:
    """Work a logical thread spawned or submitted: a TASK or EXECUTOR range."""

    __slots__ = ("ev", "link_ns", "start", "end", "track")

    def __init__(self, ev: FunctionEvent) -> None:
        extra = ev.extra or {}
        self.ev = ev
        self.start = ev.start_ns
        self.end = ev.end_ns
        self.link_ns = int(extra.get("spawn_ns", extra.get("submit_ns", ev.start_ns)))
        self.track = ev.thread_id


_Rows = Sequence[int]  # rows of the table: a list, or an array("i") from the extension


def setup_rows(
    tab: EventTable, known: set[int]
) -> tuple[dict[int, _Rows], dict[int, _Rows], dict[int, _Rows], dict[int, _Rows]]:
    """The stitcher's pass over every event: per track id, the rows of its
    ranges (not async, not instants), of its top-level ones, and of those
    that are roots; per spawner id (one of ``known``), the top-level rows
    that are its links (tasks and executor jobs with a sequence number).
    Rows in table order; each dict in order of its keys' first use.
    ``stitch_setup`` in aprof/_cevents.c is the C twin."""
    track_ids = [t.id for t in tab.tracks]
    ext = _native.extension
    if ext is not None:
        out: list[dict[int, _Rows]] = []
        for part, pairs in enumerate(ext.stitch_setup(tab, _LINKED, array("q", sorted(known)))):
            got: dict[int, _Rows] = {}
            for key, data in pairs:
                rows = array("i")
                rows.frombytes(data)
                got[track_ids[key] if part < 3 else key] = rows
            out.append(got)
        return out[0], out[1], out[2], out[3]
    nested: dict[int, list[int]] = {}
    tops: dict[int, list[int]] = {}
    roots: dict[int, list[int]] = {}
    links: dict[int, list[int]] = {}
    skip = FLAG_ASYNC | KIND_INSTANT
    kind, track, parent, fwds, seqs, scope = tab.kind, tab.track, tab.parent, tab.fwd, tab.seq, tab.scope
    lst: list[int] = []
    last = -1
    for i in range(len(tab)):  # track by track, each in start order
        if kind[i] & skip:
            continue
        ti = track[i]
        tid = track_ids[ti]
        if ti != last:
            last = ti
            lst = nested.setdefault(tid, [])
        lst.append(i)
        p = parent[i]
        if p >= 0 and track[p] == ti and not kind[p] & FLAG_ASYNC:
            continue  # nested on its track
        tops.setdefault(tid, []).append(i)
        fwd = fwds[i]
        if fwd and _LINKED[scope[i]] and seqs[i] > 0 and fwd in known:
            links.setdefault(fwd, []).append(i)
        else:
            roots.setdefault(tid, []).append(i)
    return dict(nested), dict(tops), dict(roots), dict(links)


#: Scopes that link to a spawner (tasks, executor jobs), a byte per scope index.
_LINKED: Final = bytes(1 if s in (RecordScope.TASK, RecordScope.EXECUTOR) else 0 for s in SCOPES).ljust(256, b"\0")


class _Stitcher:
    def __init__(self, session: Session) -> None:
        self.tracks = {t.id: t for t in session.tracks()}
        self.tab = tab = session._table
        self.labels = relabelled(tab)
        # One pass over the columns (in C with the extension): this runs
        # over every event of the session. Rows, not views: a view per
        # top-level range cost more than the walk itself.
        self.nested, self.tops, self.roots, link_rows = setup_rows(tab, set(self.tracks))
        # Work each spawner spawned, sorted by end.
        self.links: dict[int, list[_Link]] = {fwd: [_Link(tab.view(i)) for i in rows] for fwd, rows in link_rows.items()}
        self._top_bounds: dict[int, tuple[list[int], list[int]]] = {}
        for spawned in self.links.values():
            spawned.sort(key=lambda lk: lk.end)
        self.link_ends = {k: [lk.end for lk in v] for k, v in self.links.items()}
        self.charged: set[int] = set()
        self.spliced = 0  # timelines that got charges: a root's count changes when anything was stitched
        self._busy: dict[int, tuple[list[int], list[int]]] = {}

    # -- the loop's idle time, from the steps of every task on one OS thread

    def _busy_of(self, os_tid: int) -> tuple[list[int], list[int]]:
        got = self._busy.get(os_tid)
        if got is None:
            pairs = sorted(
                (s[i], s[i + 1])
                for t in self.tracks.values()
                if t.os_thread_id == os_tid and t.steps
                for s in (t.steps,)
                for i in range(0, len(s) - 1, 2)
            )
            flat: list[int] = []
            for a, b in pairs:  # merge into disjoint busy intervals
                if flat and a <= flat[-1]:
                    flat[-1] = max(flat[-1], b)
                else:
                    flat += (a, b)
            cum = [0]
            for i in range(0, len(flat), 2):
                cum.append(cum[-1] + flat[i + 1] - flat[i])
            got = self._busy[os_tid] = (flat, cum)
        return got

    def _idle(self, os_tid: int, a: int, b: int) -> int:
        flat, cum = self._busy_of(os_tid)
        return (b - a) - (_covered(flat, cum, b) - _covered(flat, cum, a))

    def _woke(self, track: Track, child_from: int, child_end: int, woke_at: int) -> bool:
        if woke_at - child_end <= max(WAKE_SLACK_NS, (child_end - child_from) // 4):
            return True
        return bool(track.os_thread_id) and self._idle(track.os_thread_id, child_end, woke_at) <= WAKE_SLACK_NS

    def _after_wake(self, track: Track, child_end: int, woke_at: int) -> str:
        """What a task did between its waker's end and its own next step."""
        if woke_at - child_end > WAKE_SLACK_NS and track.os_thread_id and self._idle(track.os_thread_id, child_end, woke_at) <= WAKE_SLACK_NS:
            return READY  # ready to run, behind other work on a busy loop
        return WAITING

    # -- timelines

    def timeline(self, tid: int, a: int, b: int, depth: int, only: _Rows | None = None) -> list[Segment]:
        """Track ``tid``'s stitched segments within [a, b] (of the ranges in
        ``only`` and their descendants, or of every range there)."""
        only, nested = self._ranges(tid, a, b, only)
        segs = range_segments(self.tab, nested, a, b, self.labels)
        track = self.tracks.get(tid)
        if track is None or depth >= MAX_DEPTH:
            return segs
        charges = self._charges(track, only, a, b, depth)
        if not charges:
            return segs
        self.spliced += 1
        return _splice(segs, charges)

    def root_paths(self, tid: int, a: int, b: int, only: _Rows, per_path: dict[tuple[str, ...], int]) -> int:
        """``timeline(tid, a, b, 0, only)``'s time added into ``per_path`` by
        call path as :func:`path_totals` adds it; the time it covers. A
        timeline nothing was charged in (most, in a big profile) is added
        up without making its segments."""
        only, nested = self._ranges(tid, a, b, only)
        track = self.tracks.get(tid)
        charges = self._charges(track, only, a, b, 0) if track is not None else []
        if not charges:
            return range_paths(self.tab, nested, a, b, self.labels, per_path)
        self.spliced += 1
        return path_totals(per_path, _splice(range_segments(self.tab, nested, a, b, self.labels), charges))

    def _ranges(self, tid: int, a: int, b: int, only: _Rows | None) -> tuple[_Rows, _Rows]:
        """The top-level ranges of a timeline (``only``, or those of the track
        in [a, b]) and the rows of them and their descendants, sorted."""
        tops = self.tops.get(tid, [])
        if only is None:
            only = tops
            if len(tops) > 1:  # the top-level ranges in [a, b]
                # They do not overlap: their starts and ends are both sorted.
                bounds = self._top_bounds.get(tid)
                if bounds is None:
                    tab = self.tab
                    bounds = self._top_bounds[tid] = (
                        list(map(tab.start.__getitem__, tops)),
                        list(map(tab.end.__getitem__, tops)),
                    )
                only = tops[bisect_right(bounds[1], a) : bisect_left(bounds[0], b)]
        # Every top-level range of the track (a task's one range, mostly): its
        # nested list is already sorted.
        nested = self.nested.get(tid, []) if len(only) == len(tops) else _with_descendants(self.tab, only)
        return only, nested

    def _charges(self, track: Track, tops: _Rows, a: int, b: int, depth: int) -> list[tuple[int, int, list[Segment]]]:
        """Intervals of [a, b] charged to something the track waited on,
        each with the segments (frames below the track's own) to show there."""
        out: list[tuple[int, int, list[Segment]]] = []
        start, end = self.tab.start, self.tab.end
        links = self.links.get(track.id, [])
        ends = self.link_ends.get(track.id, [])
        steps = track.steps
        if steps:
            scope = self.tab.scope
            task = next((i for i in tops if scope[i] == _TASK), None)
            lo, hi = (start[task], end[task]) if task is not None else (steps[0], steps[-1])
            for w0, w1 in _gaps(steps, max(a, lo), min(b, hi)):
                i = bisect_right(ends, w1) - 1
                lk = links[i] if i >= 0 else None
                if lk is not None and lk.end > w0 and lk.link_ns <= w0 and id(lk) not in self.charged and self._woke(track, max(w0, lk.link_ns), lk.end, w1):
                    self.charged.add(id(lk))
                    out.append((w0, lk.end, self._link_segments(lk, w0, depth)))
                    if lk.end < w1:
                        out.append((lk.end, w1, [(lk.end, w1, (self._after_wake(track, lk.end, w1),))]))
                else:
                    out.append((w0, w1, [(w0, w1, (WAITING,))]))
            return out
        # No steps: chain back from the end of each top-level range (when
        # the track spawned anything: most ranges of a big profile did not).
        if not links:
            return out
        for r in tops:
            r0, r1 = max(a, start[r]), min(b, end[r])
            if r1 <= r0:
                continue
            t = r1
            i = bisect_right(ends, t) - 1
            chain: list[tuple[int, int, list[Segment]]] = []
            while i >= 0:
                lk = links[i]
                if lk.end <= r0:
                    break
                if lk.end <= t and lk.link_ns >= r0 and id(lk) not in self.charged:
                    self.charged.add(id(lk))
                    c0 = max(lk.link_ns, r0)
                    chain.append((c0, lk.end, self._link_segments(lk, c0, depth)))
                    t = c0
                    i = bisect_right(ends, t, 0, i) - 1
                    continue
                i -= 1
            out += reversed(chain)
        return out

    def _link_segments(self, lk: _Link, c0: int, depth: int) -> list[Segment]:
        ev = lk.ev
        if ev.scope is RecordScope.EXECUTOR:
            label = _label(ev)
            segs: list[Segment] = []
            q0 = max(c0, lk.link_ns)
            if lk.start > q0:
                segs.append((q0, lk.start, (label, QUEUED)))
            return segs + self.timeline(lk.track, lk.start, lk.end, depth + 1, only=[ev._i])
        return self.timeline(lk.track, max(c0, lk.start), lk.end, depth + 1)


def _covered(flat: list[int], cum: list[int], t: int) -> int:
    """Busy time before ``t``."""
    i = bisect_right(flat, t)
    k = i // 2
    total = cum[k]
    if i % 2:  # inside a busy interval
        total += t - flat[i - 1]
    return total


def _gaps(steps: list[int], a: int, b: int) -> list[tuple[int, int]]:
    """The parts of [a, b] outside the (start, end) pairs in ``steps``."""
    out: list[tuple[int, int]] = []
    t = a
    i = max(0, bisect_left(steps, a) - 1)
    i -= i % 2
    while i + 1 < len(steps) and t < b:
        s0, s1 = steps[i], steps[i + 1]
        if s1 <= t:
            i += 2
            continue
        if s0 >= b:
            break
        if s0 > t:
            out.append((t, s0))
        t = max(t, s1)
        i += 2
    if t < b:
        out.append((t, b))
    return out


def _with_descendants(tab: EventTable, rows: _Rows) -> list[int]:
    """``rows`` and their descendants, by start then longest first."""
    out: list[int] = []
    for i in rows:
        out.append(i)
        out.extend(d._i for d in tab.view(i).iter_descendants())
    if out:
        start, end = tab.start, tab.end
        out.sort(key=lambda i: (start[i], -end[i]))
    return out


def relabelled(tab: EventTable) -> dict[int, str]:
    """The frame names of the rows not named by their name: tasks by
    coroutine, executor jobs as ``executor <fn>`` (:func:`_label`)."""
    rows = tab.rows_of_scope(RecordScope.TASK) + tab.rows_of_scope(RecordScope.EXECUTOR)
    return {i: _label(tab.view(i)) for i in rows}


MAX_FRAMES: Final = 256  # frames kept per call path, outermost first


_TASK: Final = SCOPES.index(RecordScope.TASK)

#: Scopes whose frame is not the range's name (see _label), as a byte per scope index.
_RELABELLED: Final = bytes(1 if s in (RecordScope.TASK, RecordScope.EXECUTOR) else 0 for s in SCOPES).ljust(256, b"\0")


def range_segments(tab: EventTable, rows: Sequence[int], a: int, b: int, labels: dict[int, str]) -> list[Segment]:
    """Segments of [a, b] by the innermost open range, from ``rows`` (nested
    ranges of ``tab``, sorted by start then longest first); times with no
    range open are left out. ``labels`` names the task and executor rows'
    frames (:func:`relabelled`). With the extension, ``stitch_segments`` in
    aprof/_cevents.c does the walk (a million ranges cost a Python loop
    iteration and a label each here)."""
    ext = _native.extension
    if ext is not None:
        return ext.stitch_segments(tab, rows, a, b, labels, _RELABELLED, MAX_FRAMES)  # type: ignore[no-any-return]
    view = tab.view
    return _range_segments([view(i) for i in rows], a, b)


def range_paths(
    tab: EventTable, rows: Sequence[int], a: int, b: int, labels: dict[int, str], per_path: dict[tuple[str, ...], int]
) -> int:
    """:func:`range_segments`' time added into ``per_path`` by call path
    (:func:`path_totals`); the time they cover. The extension adds it up
    as it walks, without making the segments."""
    ext = _native.extension
    if ext is not None:
        return ext.stitch_segments(tab, rows, a, b, labels, _RELABELLED, MAX_FRAMES, per_path)  # type: ignore[no-any-return]
    return path_totals(per_path, range_segments(tab, rows, a, b, labels))


def path_totals(per_path: dict[tuple[str, ...], int], segs: list[Segment]) -> int:
    """``per_path[frames] += end - start`` for each segment, a path entering
    the dict when first seen; the segments' summed duration
    (``path_totals`` in aprof/_cevents.c adds by the paths' identity, no
    tuple hash per segment)."""
    ext = _native.extension
    if ext is not None:
        return ext.path_totals(per_path, segs)  # type: ignore[no-any-return]
    total = 0
    for s0, s1, frames in segs:
        per_path[frames] = per_path.get(frames, 0) + s1 - s0
        total += s1 - s0
    return total


def _range_segments(evs: list[FunctionEvent], a: int, b: int) -> list[Segment]:
    """:func:`range_segments` over views (the pure-Python twin)."""
    out: list[Segment] = []
    stack: list[tuple[int, tuple[str, ...]]] = []  # (end, frames)
    t = a
    for ev in evs:
        tab, i = ev._tab, ev._i
        s, e = tab.start[i], tab.end[i]
        if e <= a or s >= b:
            continue
        while stack and stack[-1][0] <= s:
            end, frames = stack.pop()
            t1 = end if end < b else b
            if t1 > t:
                out.append((t, t1, frames))
            if end > t:
                t = end
        if stack and s > t:
            out.append((t, s if s < b else b, stack[-1][1]))
        if s > t:
            t = s
        up = stack[-1][1] if stack else ()
        # Past MAX_FRAMES frames, time counts in the deepest kept one: paths
        # stay short, so a chain of 20,000 nested ranges is not quadratic.
        stack.append((e, up + (_label(ev),) if len(up) < MAX_FRAMES else up))
    while stack:
        end, frames = stack.pop()
        t1 = end if end < b else b
        if t1 > t:
            out.append((t, t1, frames))
        if end > t:
            t = end
    return out


def _splice(segs: list[Segment], charges: list[tuple[int, int, list[Segment]]]) -> list[Segment]:
    """Replace the charged parts of ``segs`` with the charges' segments, under
    the frames open there."""
    out: list[Segment] = []
    charges.sort(key=lambda c: c[0])
    starts = [c[0] for c in charges]
    for s0, s1, frames in segs:
        t = s0
        i = max(0, bisect_right(starts, s0) - 1)
        while i < len(charges) and charges[i][0] < s1:
            c0, c1, sub = charges[i]
            i += 1
            if c1 <= t:
                continue
            lo, hi = max(c0, t), min(c1, s1)
            if lo > t:
                out.append((t, lo, frames))
            for x0, x1, f in sub:
                x0, x1 = max(x0, lo), min(x1, hi)
                if x1 > x0:
                    out.append((x0, x1, (frames + f)[:MAX_FRAMES]))
            t = hi
        if t < s1:
            out.append((t, s1, frames))
    return out


def stitched_timelines(session: Session, *, changed_only: bool = False) -> list[tuple[Track, list[Segment]]]:
    """The who-awaits-whom timeline of every root track, longest first.

    Args:
        changed_only: Leave out roots where nothing was stitched in (no wait
            was charged to anything), whose timeline is their ranges alone.

    Returns:
        ``(track, segments)`` pairs; segments are sorted, do not overlap, and
        give the frames (outermost first) open at each time.
    """
    out: list[tuple[Track, list[Segment]]] = []

    def add(st: _Stitcher, track: Track, a: int, b: int, roots: _Rows) -> None:
        before = st.spliced
        segs = st.timeline(track.id, a, b, 0, only=roots)
        if segs and not (changed_only and st.spliced == before):
            out.append((track, segs))

    _each_root(session, add)
    if len(out) > 1:
        out.sort(key=lambda ts: -_span(ts[1]))
    return out


def stitched_tree(session: Session) -> dict[str, Any]:
    """``merge_tree(stitched_timelines(session))``, the same to the order of
    equal children, without the timelines' segments where nothing was
    charged (the HTML report's flame graph)."""
    got: list[tuple[int, dict[tuple[str, ...], int]]] = []

    def add(st: _Stitcher, track: Track, a: int, b: int, roots: _Rows) -> None:
        per_path: dict[tuple[str, ...], int] = {}
        span = st.root_paths(track.id, a, b, roots, per_path)
        if span:  # segments are never empty: no time, no segments
            got.append((span, per_path))

    _each_root(session, add)
    if len(got) > 1:
        got.sort(key=lambda sp: -sp[0])  # stable, as stitched_timelines sorts
    merged: dict[tuple[str, ...], int] = {}
    for _, per_path in got:
        for frames, d in per_path.items():
            merged[frames] = merged.get(frames, 0) + d
    return _tree(merged)


def _each_root(session: Session, add: Callable[[_Stitcher, Track, int, int, _Rows], None]) -> None:
    """Call ``add(stitcher, track, a, b, rows)`` for each root timeline in
    order: the roots of each track, then the orphans (see below)."""
    st = _Stitcher(session)
    start, end = session._table.start, session._table.end

    def root(tid: int, roots: _Rows) -> None:
        track = st.tracks.get(tid)
        if track is None:
            return
        add(st, track, min(map(start.__getitem__, roots)), max(map(end.__getitem__, roots)), roots)

    for tid, roots in st.roots.items():
        root(tid, roots)
    # Work spawned by a logical thread with no steps, outside any of its
    # ranges, was charged nowhere (its spawner's waits are unknown): it is a
    # root of its own. (Uncharged work of a task with steps did not hold the
    # task up, and stays out.)
    while True:
        orphans = [
            lk
            for spawner, links in st.links.items()
            if not st.tracks[spawner].steps
            for lk in links
            if id(lk) not in st.charged
        ]
        if not orphans:
            break
        for lk in orphans:
            st.charged.add(id(lk))
            root(lk.track, [lk.ev._i])


def _span(segs: list[Segment]) -> int:
    """The time ``segs`` cover (they do not overlap)."""
    ext = _native.extension
    if ext is not None:
        return ext.path_totals({}, segs)  # type: ignore[no-any-return]
    return sum(s[1] - s[0] for s in segs)


def merge_tree(timelines: Iterable[tuple[Any, list[Segment]]]) -> dict[str, Any]:
    """Segments merged by call path: ``{"name", "total", "children": [...]}``
    nodes under a root named ``all``, children sorted by total, largest first."""
    # Time per distinct call path first: far fewer paths than segments.
    per_path: dict[tuple[str, ...], int] = {}
    for _, segs in timelines:
        path_totals(per_path, segs)
    return _tree(per_path)


def _tree(per_path: dict[tuple[str, ...], int]) -> dict[str, Any]:
    """The tree of :func:`merge_tree` from the time per call path."""
    root: dict[str, Any] = {"name": "all", "total": 0, "kids": {}}
    for frames, d in per_path.items():
        root["total"] += d
        node = root
        for f in frames:
            kid = node["kids"].get(f)
            if kid is None:
                kid = node["kids"][f] = {"name": f, "total": 0, "kids": {}}
            kid["total"] += d
            node = kid
    todo = [root]
    while todo:
        node = todo.pop()
        kids = sorted(node.pop("kids").values(), key=lambda k: -k["total"])
        node["children"] = kids
        todo += kids
    return root
