"""Merging sessions of several processes into one (SPEC 15.4, issue 20).

A process pool's children, the workers of a server, or separate runs each
produce a session. :func:`merge_sessions` joins them into one, on the
columns (no ``FunctionEvent`` is made), so eight sessions of a million
events each merge in a few seconds.

What changes on the way:

* **Clocks.** Times are ``perf_counter_ns`` values, which on Linux count
  from boot: two processes of one boot share them, and their times are
  kept as they are. Sessions of different boots (other machines, or a
  reboot between) are placed on the first session's clock through their
  wall-clock offsets (``unix_offset_ns``): a time ``t`` of session ``s``
  becomes ``t + s.offset - first.offset``. A session without an offset
  that is not of the first one's boot cannot be placed: an error says so.
* **Processes.** Each input process keeps its own node id when it is free;
  a node id that another process already holds (two separate runs both
  use node 0) is given the next free one. ``metadata["pids"]`` maps each
  node to its process id.
* **Tracks.** A track id is a logical thread id, unique within one
  process: tracks of one process in several sessions (a pool worker that
  ran many jobs) become one track; tracks of different processes that
  share an id get fresh ids. The first session keeps its ids, so its
  events' ``thread_id`` stays ``aprof.current_thread_id()`` of that time.
  ``forward_thread_id`` and ``end_thread_id`` follow the same map.
* **Links.** A child's session recorded under a process pool carries the
  submits' links in its metadata (``parent_link``: one job's ``seq`` and
  ``fwd``, or a pool worker's ``links``, ``[seq, fwd]`` per job): the
  merge points each job's ``EXECUTOR`` range at the submitting logical
  thread of the parent, so exports draw the arrow across processes.
* **Samples.** The inputs' stack samples (SPEC 8.4) become one
  :class:`aprof.Samples`, on the merged clock and track ids: a process's
  samples stay on its own tracks (a pool job's on its ``EXECUTOR``
  range's), in time order, their stack tries joined by frame name.
* **Metadata.** Start is the earliest start, stop the latest stop,
  ``dropped`` the sum; ``lost`` (work that never came back, see
  ``Session.lost``) is the list of all inputs' losses.

A session given twice (the same ``session_id``, or for older files the
same node, pid, times and size) is refused: its events would be counted
twice.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Any, Final

from .._core._callbacks import RecordScope
from ._events import EventTable, Track
from ._memory import Memory, recharge
from ._samples import Samples
from ._session import Session
from ._table import COLUMNS, SCOPE_INDEX, X_EXTRA

__all__ = ["boot_id", "merge", "merge_sessions"]

#: Extra fields that hold times (shifted with the clock); "steps" is a list of them.
_TIME_FIELDS: Final = ("spawn_ns", "submit_ns")
_MAX_ID: Final = 10**8  # as aprof._post._validate.MAX_TRACK_ID

_boot: list[str | None] = []


def boot_id() -> str | None:
    """This machine's boot id (Linux), or None: processes of one boot share
    ``perf_counter_ns``'s clock."""
    if not _boot:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _boot.append(f.read().strip() or None)
        except OSError:
            _boot.append(None)
    return _boot[0]


def _identity(s: Session) -> tuple[Any, ...]:
    md = s.metadata
    sid = md.get("session_id")
    if isinstance(sid, str):
        return ("id", sid)
    pids = md.get("pids")
    return ("shape", md.get("node_id"), repr(pids), md.get("start_ns"), md.get("stop_ns"), len(s._table), len(s._tracks))


def _shift_of(s: Session, first: Session, name: str, first_name: str) -> int:
    """What to add to ``s``'s times to put them on ``first``'s clock."""
    boot, boot0 = s.metadata.get("boot_id"), first.metadata.get("boot_id")
    if boot is not None and boot == boot0:
        return 0
    off, off0 = s.metadata.get("unix_offset_ns"), first.metadata.get("unix_offset_ns")
    if s is first:
        return 0
    if type(off) is not int or type(off0) is not int:
        missing = name if type(off) is not int else first_name
        raise ValueError(
            f"merge: cannot place {name} on the clock of {first_name}: {missing} has no wall-clock offset "
            "(unix_offset_ns) and they are not known to come from one boot of one machine; "
            "merge sessions or traces written by aprof"
        )
    return off - off0


def _shift_extra(extra: Any, d: int) -> Any:
    if type(extra) is not dict:
        return extra
    out = dict(extra)
    for k in _TIME_FIELDS:
        v = out.get(k)
        if type(v) is int:
            out[k] = v + d
    steps = out.get("steps")
    if type(steps) is list:
        out["steps"] = [x + d for x in steps]
    return out


def _proc_of(s: Session, k: int, node: int) -> tuple[Any, ...]:
    """What identifies the process that recorded ``node``'s tracks in session ``k``."""
    pid = (s.metadata.get("pids") or {}).get(str(node))
    if type(pid) is int:
        return ("pid", s.metadata.get("boot_id") or ("session", k), pid, node)
    return ("session", k, node)


def _links(link: dict[str, Any]) -> dict[int, int]:
    """A child session's links to its submits: sequence number -> the
    submitting logical thread. One job (``seq``, ``fwd``), or a pool
    worker's many (``seqs`` and ``fwds``: two ``array("q")``, straight
    from the worker; ``links``: ``[seq, fwd]`` pairs)."""
    seqs, fwds = link.get("seqs"), link.get("fwds")
    if type(seqs) is array and type(fwds) is array and seqs.typecode == fwds.typecode == "q":
        return dict(zip(seqs, fwds, strict=False))
    pairs = link.get("links")
    if pairs is None:
        pairs = [(link.get("seq"), link.get("fwd"))]
    try:
        out = dict(pairs)
    except (TypeError, ValueError):
        return {}
    if all(type(k) is int for k in out) and all(type(v) is int for v in out.values()):
        return out
    return {k: v for k, v in out.items() if type(k) is int and type(v) is int}


def merge_children(session: Session, children: list[Session], lost: list[dict[str, Any]]) -> Session:
    """``session`` with the sessions its child processes sent back merged
    in (in the order they started), and what the children lost named in
    its ``lost`` (process pools, ``aprof run`` following children)."""
    if lost:
        session.metadata["lost"] = [*(session.metadata.get("lost") or ()), *lost]
    if not children:
        return session
    children.sort(key=lambda s: s.metadata["start_ns"])
    return merge_sessions([session, *children])


def merge_sessions(sessions: Sequence[Session], names: Sequence[str] | None = None) -> Session:
    """One session holding the events of ``sessions`` (see the module's docstring).

    Args:
        sessions: The sessions; the first one's clock, node and track ids are kept.
        names: How to name each in errors (file names); by default "session N".

    Raises:
        ValueError: no sessions, a session given twice, or clocks that cannot
            be aligned; the message names the sessions.
    """
    if not sessions:
        raise ValueError("merge: no sessions to merge")
    labels = list(names) if names is not None else [f"session {i + 1}" for i in range(len(sessions))]
    seen: dict[tuple[Any, ...], int] = {}
    for k, s in enumerate(sessions):
        key = _identity(s)
        if key in seen:
            raise ValueError(
                f"merge: {labels[k]} is the same session as {labels[seen[key]]}; merging it twice would count its events twice"
            )
        seen[key] = k
    first = sessions[0]
    shifts = [_shift_of(s, first, labels[k], labels[0]) for k, s in enumerate(sessions)]

    # -- nodes and tracks ------------------------------------------------------
    node_map: dict[tuple[Any, ...], int] = {}  # process key -> merged node id
    used_nodes: set[int] = set()
    pids: dict[str, int] = {}
    commands: dict[str, str] = {}

    def node_for(k: int, s: Session, node: int) -> int:
        key = _proc_of(s, k, node)
        got = node_map.get(key)
        if got is None:
            got = node
            if got in used_nodes:
                got = max(used_nodes) + 1
            node_map[key] = got
            used_nodes.add(got)
            pid = (s.metadata.get("pids") or {}).get(str(node))
            if type(pid) is int:
                pids[str(got)] = pid
            command = (s.metadata.get("commands") or {}).get(str(node))
            if type(command) is str:  # a followed child program's command line
                commands[str(got)] = command
        return got

    track_map: dict[tuple[Any, ...], Track] = {}  # (process key, old id) -> merged track
    used_ids: set[int] = set()
    next_id = [max((max(s._tracks, default=0) for s in sessions), default=0) + 1]

    def fresh(old: int, keep: bool) -> int:
        if keep or old not in used_ids:  # the first session keeps its ids
            return old
        while next_id[0] in used_ids:
            next_id[0] += 1
        if next_id[0] >= _MAX_ID:
            raise ValueError(f"merge: more than {_MAX_ID:,} tracks")
        return next_id[0]

    # The first session's submitters of linked child jobs keep their ids,
    # even when they recorded nothing (the thread that waits for the pool).
    for s in sessions[1:]:
        link = s.metadata.get("parent_link")
        if type(link) is dict and link.get("node_id") == first.metadata.get("node_id"):
            used_ids.update(_links(link).values())
    id_maps: list[dict[int, int]] = []  # per session: old logical thread id -> merged id
    mem_nodes: dict[int, int] = {}  # profile_memory: merged id of a thread with no track -> its node
    track_maps: list[array[int]] = []  # per session: old track index -> merged track index
    out = EventTable()
    shared: set[int] = set()  # merged track indexes that more than one session adds to
    owner: dict[int, int] = {}
    for k, s in enumerate(sessions):
        ids: dict[int, int] = {0: 0, -1: -1}
        home = s.metadata.get("node_id", 0)
        for node in sorted({t.node_id for t in s._table.tracks} | ({home} if type(home) is int else set())):
            node_for(k, s, node)  # every process of every input, with its pid, even without tracks
        for t in _tracks_of(s):
            pkey = _proc_of(s, k, t.node_id)
            mt = track_map.get((pkey, t.id))
            if mt is None:
                new_id = fresh(t.id, k == 0)
                used_ids.add(new_id)
                mt = track_map[(pkey, t.id)] = Track(new_id, t.name, t.kind, t.os_thread_id, node_for(k, s, t.node_id))
                mt.steps = None if t.steps is None else [x + shifts[k] for x in t.steps]
            elif t.steps:
                mt.steps = sorted([*(mt.steps or ()), *(x + shifts[k] for x in t.steps)])
            ids[t.id] = mt.id
        tmap = array("i")
        for t in s._table.tracks:
            mt = track_map[(_proc_of(s, k, t.node_id), t.id)]
            ti = out.add_track(mt)
            tmap.append(ti)
            prev = owner.setdefault(ti, k)
            if prev != k:
                shared.add(ti)
        for t in _tracks_of(s)[len(s._table.tracks) :]:  # a thread only samples know: a track without rows
            out.add_track(track_map[(_proc_of(s, k, t.node_id), t.id)])
        # Thread ids with no track of their own (a spawner that recorded
        # nothing): of the session's own process.
        tab = s._table
        pkey_home = _proc_of(s, k, home if type(home) is int else 0)
        mem = s.memory
        for col in (tab.fwd, tab.end_lt, () if mem is None else mem.threads):
            for v in set(col):
                if v not in ids:
                    # profile_memory: a thread that allocated and recorded
                    # no event may be of another process of a merged input.
                    mnode = mem.nodes.get(v) if mem is not None else None
                    pkey = pkey_home if mnode is None else _proc_of(s, k, mnode)
                    mt = track_map.get((pkey, v))
                    if mt is not None:
                        ids[v] = mt.id
                    else:
                        new_id = fresh(v, k == 0)
                        used_ids.add(new_id)
                        ids[v] = new_id
                        if mem is not None and v in mem.threads:
                            mem_nodes[new_id] = node_for(k, s, mnode if mnode is not None else home if type(home) is int else 0)
        id_maps.append(ids)
        track_maps.append(tmap)

    # -- rows ------------------------------------------------------------------
    start_at: list[int] = []
    for k, s in enumerate(sessions):
        tab = s._table
        base = len(out)
        start_at.append(base)
        d = shifts[k]
        ids = id_maps[k]
        identity_ids = all(a == b for a, b in ids.items())
        if d:
            out.start.extend(x + d for x in tab.start)
            out.end.extend(x + d for x in tab.end)
        else:
            out.start.extend(tab.start)
            out.end.extend(tab.end)
        if identity_ids:
            out.end_lt.extend(tab.end_lt)
            out.fwd.extend(tab.fwd)
        else:
            out.end_lt.extend(map(ids.__getitem__, tab.end_lt))
            out.fwd.extend(map(ids.__getitem__, tab.fwd))
        out.seq.extend(tab.seq)
        nmap = array("i", map(out.intern, tab.names))
        if list(nmap) == list(range(len(nmap))):
            out.name.extend(tab.name)
        else:
            out.name.extend(map(nmap.__getitem__, tab.name))
        tmap = track_maps[k]
        if list(tmap) == list(range(len(tmap))):
            out.track.extend(tab.track)
        else:
            out.track.extend(map(tmap.__getitem__, tab.track))
        if base:
            out.parent.extend(p + base if p >= 0 else -1 for p in tab.parent)
        else:
            out.parent.extend(tab.parent)
        out.scope.extend(tab.scope)
        out.kind.extend(tab.kind)
        for i, x in tab.rare.items():
            row = list(x)
            if d:
                row[X_EXTRA] = _shift_extra(row[X_EXTRA], d)
            out.rare[base + i] = row

    # -- cross-process links ---------------------------------------------------
    executor = SCOPE_INDEX[RecordScope.EXECUTOR]
    linked_to: set[int] = set()
    for k, s in enumerate(sessions):
        link = s.metadata.get("parent_link")
        if type(link) is not dict or k == 0 or type(link.get("node_id")) is not int:
            continue
        # The parent is the first session (process pools): its ids are kept.
        if first.metadata.get("node_id") != link["node_id"]:
            continue
        targets = {seq: id_maps[0].get(fwd, fwd) for seq, fwd in _links(link).items()}
        if not targets:
            continue
        lo, hi = start_at[k], start_at[k] + len(s._table)
        for i in range(lo, hi):
            if out.scope[i] == executor and out.fwd[i] == 0:
                target = targets.get(out.seq[i])
                if target is not None:
                    out.fwd[i] = target
                    linked_to.add(target)

    if shared:
        _group_tracks(out, shared)
    # A submitter that recorded nothing itself (a plain thread that waits
    # for the pool) has no track: give it an empty one in its process, so
    # exports start the arrow there, not in the child's process.
    have = {t.id for t in out.tracks}
    st0 = first.metadata.get("start_thread")
    home0 = first.metadata.get("node_id", 0)
    for tid in sorted(linked_to - have):
        name, kind = f"logical thread {tid}", "thread"
        if type(st0) is dict and st0.get("id") == tid:
            name, kind = str(st0.get("name")), str(st0.get("kind", "thread"))
        out.add_track(Track(tid, name, kind, 0, node_map.get(_proc_of(first, 0, home0), home0) if type(home0) is int else 0))

    # -- metadata --------------------------------------------------------------
    md = dict(first.metadata)
    starts = [s.metadata["start_ns"] + shifts[k] for k, s in enumerate(sessions)]
    stops = [s.metadata["stop_ns"] + shifts[k] for k, s in enumerate(sessions)]
    md["start_ns"] = min(starts)
    md["stop_ns"] = max(stops)
    md["dropped"] = sum(int(s.metadata.get("dropped", 0)) for s in sessions)
    by_kind: dict[str, int] = {}
    for s in sessions:  # the memory budget's counts, where the inputs have them
        kinds = s.metadata.get("dropped_by_kind")
        if type(kinds) is dict:
            for kind, n in kinds.items():
                if type(n) is int:
                    by_kind[kind] = by_kind.get(kind, 0) + n
    if by_kind:
        md["dropped_by_kind"] = by_kind
    md["pids"] = pids or dict(first.metadata.get("pids") or {})
    if commands:
        md["commands"] = commands
    md.pop("parent_link", None)
    lost: list[Any] = []
    for s in sessions:
        lost.extend(s.metadata.get("lost") or ())
    if lost:
        md["lost"] = lost
    else:
        md.pop("lost", None)
    if len(sessions) > 1:
        md["session_id"] = os.urandom(8).hex()
        md["merged_from"] = len(sessions) + int(first.metadata.get("merged_from", 1)) - 1
    st = md.get("start_thread")
    if type(st) is dict and type(st.get("id")) is int:
        md["start_thread"] = {**st, "id": id_maps[0].get(st["id"], st["id"])}
    tracks = {t.id: t for t in out.tracks}
    samples = _merge_samples(sessions, shifts, id_maps)
    if samples is not None and samples is not first.samples:
        idle = 0
        for s in sessions:
            if s.samples is not None:  # the sampler's count where the input has it (it counts what it dropped too)
                info = s.metadata.get("samples")
                n = info.get("idle") if type(info) is dict else None
                idle += n if type(n) is int else s.samples.idle_count
        md["samples"] = {"count": len(samples), "idle": idle, "dropped": samples.dropped, "interval_ns": samples.interval_ns}
    merged = Session(out, tracks, md, samples)
    memory = _merge_memory(sessions, shifts, id_maps, mem_nodes, out)
    if memory is not None:
        merged.memory = memory
    return merged


def _tracks_of(s: Session) -> list[Track]:
    """``s``'s tracks: its table's (those its rows are on, by index), then
    any the session has beside them (a thread only its samples know)."""
    tracks = list(s._table.tracks)
    if len(s._tracks) > len(tracks) or any(s._tracks.get(t.id) is not t for t in tracks):
        have = {id(t) for t in tracks}
        tracks += [t for t in s._tracks.values() if id(t) not in have]
    return tracks


def _merge_samples(sessions: Sequence[Session], shifts: list[int], id_maps: list[dict[int, int]]) -> Samples | None:
    """The inputs' stack samples (SPEC 8.4) on the merged clock and track
    ids, in time order, or None when no input sampled. The stack tries are
    joined (a stack of frames of the same names is one node); each sample
    keeps its weight, so a process's sampled time stays its own.
    ``interval_ns`` is the largest of the inputs', ``dropped`` their sum."""
    have = [(k, s.samples) for k, s in enumerate(sessions) if s.samples is not None]
    if not have:
        return None
    if len(have) == 1 and have[0][0] == 0:
        return have[0][1]  # the first session's, as it was (its clock and ids are kept)
    frames: list[str] = []
    frame_index: dict[str, int] = {}
    parents, frame_ids = [-1], [-1]
    node_index: dict[tuple[int, int], int] = {}
    time_ns: list[int] = []
    weight_ns: list[int] = []
    thread_id: list[int] = []
    node: list[int] = []
    idle: list[int] = []
    for k, smp in have:
        fmap = []
        for f in smp.frames:
            j = frame_index.get(f)
            if j is None:
                j = frame_index[f] = len(frames)
                frames.append(f)
            fmap.append(j)
        nmap = [0] * len(smp.parents)
        for i in range(1, len(smp.parents)):
            key = (nmap[smp.parents[i]], fmap[smp.frame_ids[i]])
            got = node_index.get(key)
            if got is None:
                got = node_index[key] = len(parents)
                parents.append(key[0])
                frame_ids.append(key[1])
            nmap[i] = got
        d = shifts[k]
        ids = id_maps[k]
        time_ns.extend([t + d for t in smp.time_ns] if d else smp.time_ns)
        weight_ns.extend(smp.weight_ns)
        thread_id.extend([ids.get(t, t) for t in smp.thread_id])
        node.extend(map(nmap.__getitem__, smp.node))
        idle.extend(smp.idle)
    # In time order; stable, so one thread's samples keep their order.
    order = sorted(range(len(time_ns)), key=time_ns.__getitem__)
    time_ns, weight_ns, thread_id, node, idle = (list(map(c.__getitem__, order)) for c in (time_ns, weight_ns, thread_id, node, idle))
    return Samples(
        frames, parents, frame_ids, time_ns, weight_ns, thread_id, node, idle,
        max(smp.interval_ns for _, smp in have), sum(smp.dropped for _, smp in have),
    )  # fmt: skip


def _merge_memory(
    sessions: Sequence[Session], shifts: list[int], id_maps: list[dict[int, int]], nodes: dict[int, int], out: EventTable
) -> Memory | None:
    """profile_memory (issue 21): the inputs' allocations on the merged
    clock and thread ids, charged again to the merged events (each is the
    same event it was, so each keeps its figures), or None when no input
    tracked memory. An input without memory adds nothing to it.

    Each allocation keeps its weight, so sums stay unbiased when inputs
    sampled at different intervals; ``interval`` is then the largest (0
    only when every input was exact)."""
    have = [(k, s.memory) for k, s in enumerate(sessions) if s.memory is not None]
    if not have:
        return None
    m = Memory(max(mm.interval for _, mm in have))
    for k, mm in have:
        d = shifts[k]
        ids = id_maps[k]
        m.time.extend(t + d for t in mm.time) if d else m.time.extend(mm.time)
        m.freed.extend(f + d if f > 0 else 0 for f in mm.freed) if d else m.freed.extend(mm.freed)
        m.size.extend(mm.size)
        m.weight.extend(mm.weight)
        m.thread_id.extend(ids.get(t, t) for t in mm.thread_id)
        for tid, named in mm.threads.items():
            m.threads[ids.get(tid, tid)] = named
        m.other_bytes += mm.other_bytes
        m.other_count += mm.other_count
        m.dropped += mm.dropped
    have_track = {t.id for t in out.tracks}
    m.nodes = {tid: node for tid, node in nodes.items() if tid in m.threads and tid not in have_track}
    m.event = array("i", [-1]) * len(m.time)
    recharge(m, out)
    return m


def _group_tracks(tab: EventTable, shared: set[int]) -> None:
    """Make each shared track's rows contiguous and in start order.

    Every input session holds each of its tracks as one contiguous run in
    start order; only the runs of tracks several sessions add to need
    moving. Runs that do not overlap in time keep their order and are
    placed one after another; a track whose runs overlap is sorted by start.
    """
    n = len(tab)
    track = tab.track
    start = tab.start
    # Runs: (track index, lo, hi), in row order.
    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < n:
        t = track[i]
        j = i + 1
        while j < n and track[j] == t:
            j += 1
        runs.append((t, i, j))
        i = j
    by_track: dict[int, list[tuple[int, int]]] = {}
    order_tracks: list[int] = []
    for t, lo, hi in runs:
        if t not in by_track:
            by_track[t] = []
            order_tracks.append(t)
        by_track[t].append((lo, hi))
    order = array("i")
    moved = False
    for t in order_tracks:
        spans = by_track[t]
        if len(spans) == 1:
            lo, hi = spans[0]
            order.extend(range(lo, hi))
            continue
        spans.sort(key=lambda sp: start[sp[0]])
        ok = all(start[a_hi - 1] <= start[b_lo] for (_, a_hi), (b_lo, _) in zip(spans, spans[1:], strict=False))
        rows = [r for lo, hi in spans for r in range(lo, hi)]
        if not ok:
            rows.sort(key=start.__getitem__)
        order.extend(rows)
        moved = True
    if not moved or list(order) == list(range(n)):
        return
    inv = array("i", bytes(4 * n))
    for j, r in enumerate(order):
        inv[r] = j
    for attr, code in COLUMNS:
        col = getattr(tab, attr)
        setattr(tab, attr, array(code, map(col.__getitem__, order)))
    tab.parent = array("i", [-1 if p < 0 else inv[p] for p in tab.parent])
    tab.rare = {inv[i]: x for i, x in tab.rare.items()}
    tab.links_changed()


def merge(sessions: Iterable[Session | str | PathLike[str]]) -> Session:
    """Merge the sessions of several processes (or runs) into one (SPEC 15.4).

    Each input is a :class:`aprof.Session` or the path of a file
    ``aprof report`` reads (a saved session, an aprof Chrome trace, an HTML
    report). The first input's clock, node id and track ids are kept; each
    other process gets its own tracks under its own node id; times of
    other machines are aligned through their wall-clock offsets
    (``unix_offset_ns``). See docs/reference.md, "Merging sessions".

    Args:
        sessions: Two or more sessions or paths (one is returned as it is read).

    Returns:
        A new :class:`aprof.Session`; the inputs are not changed.

    Raises:
        TypeError: an input is neither a session nor a path.
        FileNotFoundError: a path does not exist.
        ValueError: no inputs, a file that is not a profile, a session given
            twice, or a session whose clock cannot be aligned with the
            first's (a trace of another tool, without a wall-clock offset);
            the message names the input.

    Example:
        >>> import aprof
        >>> with aprof.profile() as a:
        ...     aprof.mark("a")
        >>> with aprof.profile() as b:
        ...     aprof.mark("b")
        >>> sorted(e.name for e in aprof.merge([a.session, b.session]).events())
        ['a', 'b']
    """
    from ._readers import read_profile

    if isinstance(sessions, (str, PathLike, Session)):
        raise TypeError("merge: expected a list of sessions or paths, got a single one")
    items = list(sessions)
    loaded: list[Session] = []
    names: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, Session):
            loaded.append(item)
            names.append(f"session {i + 1}")
        elif isinstance(item, (str, PathLike)):
            loaded.append(read_profile(item))
            names.append(repr(os.fspath(item)))
        else:
            raise TypeError(f"merge: input {i + 1} is a {type(item).__name__}, not an aprof.Session or a path")
    return merge_sessions(loaded, names)
