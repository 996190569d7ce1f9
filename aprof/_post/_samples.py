"""Sampled data (SPEC 8.4): raw samples -> a session's :class:`Samples`, and
what analysis and the exports read from it.

The sampler (``aprof/_csampler.c`` or its twin) hands over, at stop, the raw
samples (three words each: time, stack node and weight, logical thread and
flags), its stack trie (node -> parent node, code) and its object table.
:func:`attach_samples` names the frames as the tracer names its calls
(``file.py(12): qualname``, SPEC 8.2), maps each logical thread to its track
(adding tracks that only samples know) and stores the columns in
``session.samples``.

Samples are kept apart from ranges everywhere: ``key_averages`` has its own
columns for them, flame graphs and folded stacks put them under a
``[sampled]`` root, speedscope has a ``sampled`` profile per track.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from types import CodeType
from typing import TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope
from .._core._threads import LogicalThread, _thread_lt
from ._events import Track
from ._replay import _describe, _prefixes

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["SAMPLED_ROOT", "Samples", "attach_samples", "sampled_stacks", "spawn_chains"]

OWN_LT: Final = 1 << 31
SAMPLE_IDLE: Final = 1
LEFT_OUT: Final = "<frames left out>"  # a stack deeper than the sampler keeps
#: The root frame of sampled stacks in flame graphs and folded stacks.
SAMPLED_ROOT: Final = "[sampled]"


class Samples:
    """A session's stack samples (SPEC 8.4), in columns.

    One sample per profiled thread per interval. Each has a time, a weight
    (the time since the sampler's previous tick, so the weights of one
    thread add up to the wall-clock time it was sampled), the logical
    thread that was running (its track id), and a stack: the Python frames
    of the running code, outermost first, cut at the task's coroutine in a
    task. An *idle* sample is a thread outside any task waiting where a loop
    waits for I/O: counted, with no stack, charged to nobody.

    Attributes:
        frames: Frame names (``file.py(12): qualname``), by frame id.
        parents, frame_ids: The stack trie: node ``i`` is frame
            ``frame_ids[i]`` called from node ``parents[i]``; node 0 is the
            empty stack.
        time_ns, weight_ns, thread_id, node, idle: One entry per sample.
        interval_ns: The interval asked for.
        dropped: Samples not kept (``max_events``).
    """

    __slots__ = ("_stacks", "dropped", "frame_ids", "frames", "idle", "interval_ns", "node", "parents", "thread_id", "time_ns", "weight_ns")

    def __init__(
        self,
        frames: list[str],
        parents: list[int],
        frame_ids: list[int],
        time_ns: list[int],
        weight_ns: list[int],
        thread_id: list[int],
        node: list[int],
        idle: list[int],
        interval_ns: int,
        dropped: int = 0,
    ) -> None:
        self.frames = frames
        self.parents = parents
        self.frame_ids = frame_ids
        self.time_ns = time_ns
        self.weight_ns = weight_ns
        self.thread_id = thread_id
        self.node = node
        self.idle = idle
        self.interval_ns = interval_ns
        self.dropped = dropped
        self._stacks: dict[int, tuple[str, ...]] = {0: ()}

    def __len__(self) -> int:
        return len(self.time_ns)

    def node_stack(self, node: int) -> tuple[str, ...]:
        """The frame names of trie node ``node``, outermost first."""
        stack = self._stacks.get(node)
        if stack is None:
            path = []
            n = node
            while n > 0 and n not in self._stacks:
                path.append(n)
                n = self.parents[n]
            stack = self._stacks[n]
            for m in reversed(path):
                stack = self._stacks[m] = (*stack, self.frames[self.frame_ids[m]])
        return stack

    def stack(self, i: int) -> tuple[str, ...]:
        """Sample ``i``'s frame names, outermost first (empty for an idle one)."""
        return self.node_stack(self.node[i])

    @property
    def idle_count(self) -> int:
        """How many samples were idle."""
        return sum(self.idle)

    @property
    def idle_ns(self) -> int:
        """Their total weight."""
        return sum(w for w, i in zip(self.weight_ns, self.idle, strict=True) if i)

    def to_json(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "parents": self.parents,
            "frame_ids": self.frame_ids,
            "time_ns": self.time_ns,
            "weight_ns": self.weight_ns,
            "thread_id": self.thread_id,
            "node": self.node,
            "idle": self.idle,
            "interval_ns": self.interval_ns,
            "dropped": self.dropped,
        }

    @classmethod
    def from_json(cls, doc: object) -> Samples:
        """Read :meth:`to_json`'s output back, checking it whole.

        Raises:
            ValueError: anything a session's samples cannot be; the message says what.
        """
        if not isinstance(doc, dict):
            raise ValueError("samples: not an object")
        cols: dict[str, list[int]] = {}
        for key in ("parents", "frame_ids", "time_ns", "weight_ns", "thread_id", "node", "idle"):
            col = doc.get(key)
            if not isinstance(col, list) or not all(type(v) is int for v in col):
                raise ValueError(f"samples: {key!r} is not a list of integers")
            cols[key] = col
        frames = doc.get("frames")
        if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
            raise ValueError("samples: 'frames' is not a list of strings")
        n_nodes = len(cols["parents"])
        if n_nodes < 1 or len(cols["frame_ids"]) != n_nodes:
            raise ValueError("samples: the stack trie's columns differ in length or are empty")
        for i in range(1, n_nodes):
            if not 0 <= cols["parents"][i] < i:  # parents come first: no cycle is possible
                raise ValueError(f"samples: node {i} has parent {cols['parents'][i]}, not an earlier node")
            if not 0 <= cols["frame_ids"][i] < len(frames):
                raise ValueError(f"samples: node {i} names frame {cols['frame_ids'][i]}, which does not exist")
        n = len(cols["time_ns"])
        if any(len(cols[k]) != n for k in ("weight_ns", "thread_id", "node", "idle")):
            raise ValueError("samples: the sample columns differ in length")
        if any(not 0 <= v < n_nodes for v in cols["node"]):
            raise ValueError("samples: a sample names a stack node that does not exist")
        if any(w < 0 for w in cols["weight_ns"]) or any(v not in (0, 1) for v in cols["idle"]):
            raise ValueError("samples: a weight is negative or an idle flag not 0 or 1")
        interval, dropped = doc.get("interval_ns"), doc.get("dropped", 0)
        if type(interval) is not int or interval <= 0 or type(dropped) is not int or dropped < 0:
            raise ValueError("samples: 'interval_ns' or 'dropped' is not a valid count")
        return cls(
            frames, cols["parents"], cols["frame_ids"], cols["time_ns"], cols["weight_ns"], cols["thread_id"],
            cols["node"], cols["idle"], interval, dropped,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"<aprof.Samples {len(self)} samples, {len(self.frames)} frames>"


def _thread_track(session: Session, ident: int, node_id: int, made: dict[int, Track]) -> Track:
    """The track of OS thread ``ident``'s own logical thread: the one its
    ranges were recorded on, else a new one named after the thread."""
    track = made.get(ident)
    if track is not None:
        return track
    for t in session._tracks.values():
        if t.kind == "thread" and t.os_thread_id == ident:
            made[ident] = t
            return t
    if ident == threading.get_ident():
        lt = _thread_lt()  # the stopping thread's own logical thread
    else:
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        lt = LogicalThread("thread", thread.name if thread is not None else f"thread {ident}")
        lt.os_thread_id = ident
    track = made[ident] = Track(lt.id, lt.current_name(), "thread", ident, node_id)
    session._tracks[track.id] = track
    return track


def attach_samples(
    session: Session,
    taken: tuple[bytes, bytes, list[Any], list[int]],
    interval: float,
    dropped: int,
    idle: int,
    node_id: int,
    since_ns: int = 0,
) -> None:
    """Store a sampler's raw samples in ``session.samples`` (see the
    module's docstring): those taken at ``since_ns`` or later."""
    data, nodes_raw, objs, idents = taken
    words = memoryview(data).cast("Q")
    nodes = memoryview(nodes_raw).cast("I")
    prefixes = _prefixes()
    frame_of_obj: dict[int, int] = {}
    frames: list[str] = []
    parents, frame_ids = [-1], [-1]
    for i in range(1, len(nodes) // 2):
        parents.append(nodes[2 * i])
        o = nodes[2 * i + 1]
        f = frame_of_obj.get(o)
        if f is None:
            obj = objs[o]
            f = frame_of_obj[o] = len(frames)
            frames.append(_describe(obj, prefixes) if isinstance(obj, CodeType) else LEFT_OUT)
        frame_ids.append(f)
    track_of: dict[int, int] = {}
    made: dict[int, Track] = {}
    time_ns, weight_ns, thread_id, node_col, idle_col = [], [], [], [], []
    for j in range(0, len(words), 3):
        t, w1, w2 = words[j], words[j + 1], words[j + 2]
        if t < since_ns:
            continue
        lt_word = w2 & 0xFFFFFFFF
        tid = track_of.get(lt_word)
        if tid is None:
            if lt_word & OWN_LT:
                tid = _thread_track(session, idents[lt_word & 0xFFFF], node_id, made).id
            else:
                lt = objs[lt_word]
                assert isinstance(lt, LogicalThread)
                tid = lt.id
                if tid not in session._tracks:
                    session._tracks[tid] = Track(tid, lt.current_name(), lt.kind, lt.os_thread_id, node_id)
            track_of[lt_word] = tid
        time_ns.append(t)
        weight_ns.append(w1 >> 32)
        node_col.append(w1 & 0xFFFFFFFF)
        thread_id.append(tid)
        idle_col.append((w2 >> 48) & SAMPLE_IDLE)
    if since_ns:  # a window's idle samples, not the whole run's
        idle = sum(1 for v in idle_col if v)
    session.samples = Samples(
        frames, parents, frame_ids, time_ns, weight_ns, thread_id, node_col, idle_col, int(interval * 1e9), dropped
    )
    session.metadata["samples"] = {"count": len(time_ns), "idle": idle, "dropped": dropped, "interval_ns": int(interval * 1e9)}


def spawn_chains(session: Session) -> dict[int, tuple[str, ...]]:
    """Per track, the names of the tracks that spawned it, outermost first
    (a task's spawner, its spawner's spawner, ...; from the TASK ranges)."""
    spawner: dict[int, int] = {}
    tab = session._table
    for e in map(tab.view, tab.rows_of_scope(RecordScope.TASK)):
        if e.scope is RecordScope.TASK and e.forward_thread_id and e.thread_id not in spawner:
            spawner[e.thread_id] = e.forward_thread_id
    names = {t.id: t.name for t in session._tracks.values()}
    start = session.metadata.get("start_thread")
    if isinstance(start, dict) and isinstance(start.get("id"), int):
        names.setdefault(start["id"], str(start.get("name")))  # spawns, may record nothing itself
    chains: dict[int, tuple[str, ...]] = {}
    for tid in names:
        chain: list[str] = []
        seen = {tid}
        cur = spawner.get(tid)
        while cur is not None and cur not in seen and len(chain) < 64:
            seen.add(cur)
            chain.append(names.get(cur, str(cur)))
            cur = spawner.get(cur)
        chains[tid] = tuple(reversed(chain))
    return chains


def sampled_stacks(session: Session) -> Iterator[tuple[int, tuple[str, ...], int]]:
    """``(track id, stack, total weight ns)`` per distinct (track, stack) of
    the non-idle samples; the stack is the frames, outermost first."""
    s = session.samples
    if s is None:
        return
    totals: dict[tuple[int, int], int] = {}
    for tid, node, w, idle in zip(s.thread_id, s.node, s.weight_ns, s.idle, strict=True):
        if not idle:
            totals[tid, node] = totals.get((tid, node), 0) + w
    for (tid, node), w in totals.items():
        yield tid, s.node_stack(node), w


class SampledTotals:
    """What ``key_averages`` adds per row: sample counts and time."""

    __slots__ = ("by_name", "by_track", "ranges")

    def __init__(self) -> None:
        self.by_name: dict[str, list[int]] = {}  # frame name -> [samples, ns, self samples, self ns]
        self.by_track: dict[int, list[int]] = {}  # track id -> [samples, ns]
        self.ranges: dict[int, tuple[list[int], list[int]]] = {}  # track id -> (times, prefix sums of weights)


def sampled_totals(session: Session) -> SampledTotals | None:
    """Aggregate the non-idle samples by frame (inclusive and self) and by track."""
    s = session.samples
    if s is None or not len(s):
        return None
    out = SampledTotals()
    per_track: dict[int, list[tuple[int, int]]] = {}
    node_totals: dict[int, list[int]] = {}
    for tid, node, w, idle, t in zip(s.thread_id, s.node, s.weight_ns, s.idle, s.time_ns, strict=True):
        if idle:
            continue
        row = out.by_track.setdefault(tid, [0, 0])
        row[0] += 1
        row[1] += w
        nt = node_totals.setdefault(node, [0, 0])
        nt[0] += 1
        nt[1] += w
        per_track.setdefault(tid, []).append((t, w))
    for node, (count, ns) in node_totals.items():
        stack = s.node_stack(node)
        for name in set(stack):
            row = out.by_name.setdefault(name, [0, 0, 0, 0])
            row[0] += count
            row[1] += ns
        if stack:
            row = out.by_name[stack[-1]]
            row[2] += count
            row[3] += ns
    for tid, pairs in per_track.items():
        pairs.sort()
        times = [t for t, _ in pairs]
        sums = [0]
        for _, w in pairs:
            sums.append(sums[-1] + w)
        out.ranges[tid] = (times, sums)
    return out


def samples_within(totals: SampledTotals, track_id: int, start_ns: int, end_ns: int) -> tuple[int, int]:
    """(count, ns) of the samples on a track between two times, inclusive."""
    r = totals.ranges.get(track_id)
    if r is None:
        return 0, 0
    times, sums = r
    i, j = bisect_left(times, start_ns), bisect_right(times, end_ns)
    return j - i, sums[j] - sums[i]




def sampled_slices(session: Session) -> Iterator[tuple[int, str, int, int]]:
    """The samples as a flame chart over time, per track: ``(track id, frame
    name, start ns, end ns)``. A sample stands for the time since the
    sampler's previous tick; consecutive samples sharing the outer part of
    their stacks extend the same slices. For viewers that draw slices
    (Perfetto), on a row of their own, apart from the traced ranges."""
    s = session.samples
    if s is None:
        return
    per_track: dict[int, list[int]] = {}
    for i in range(len(s)):
        if not s.idle[i]:
            per_track.setdefault(s.thread_id[i], []).append(i)
    for tid, idxs in per_track.items():
        idxs.sort(key=lambda i: s.time_ns[i])
        open_: list[tuple[str, int]] = []
        prev_end = None
        for i in idxs:
            end = s.time_ns[i]
            start = max(end - s.weight_ns[i], prev_end) if prev_end is not None else end - s.weight_ns[i]
            if prev_end is not None and start > prev_end + s.interval_ns:  # a gap: not sampled there
                while open_:
                    name, t0 = open_.pop()
                    yield tid, name, t0, prev_end
            stack = s.stack(i)
            keep = 0
            while keep < len(open_) and keep < len(stack) and open_[keep][0] == stack[keep]:
                keep += 1
            at = prev_end if prev_end is not None and open_ else start
            while len(open_) > keep:
                name, t0 = open_.pop()
                yield tid, name, t0, at
            for name in stack[keep:]:
                open_.append((name, at))
            prev_end = end
        while open_ and prev_end is not None:
            name, t0 = open_.pop()
            yield tid, name, t0, prev_end
