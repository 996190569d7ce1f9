"""Chrome Trace Event Format export (SPEC 9.1), loadable in Perfetto.

* one process per node (``pid``), named ``aprof node N``;
* one thread per logical thread (``tid`` = its id), named after the task or
  thread (and the task's coroutine, as the summary names it:
  ``Task-7 (task fetch) [asyncio]``), ordered by first activity;
* ``X`` complete events for ranges nested on their track, ``i`` for instants;
* ``b``/``e`` nestable async slices for ``is_async`` ranges, on the track
  that started them, paired by ``id``;
* ``s``/``f`` flow arrows from a spawn or submit point to the work it started,
  each starting on a zero-length ``spawn`` slice at the spawn point;
* a ``running`` row under each task, one slice per step.

Perfetto's importer reads ``pid`` and ``tid`` as 32-bit unsigned integers
(anything else becomes 0, the process's main thread, and a ``thread_name``
for it renames that thread), and binds a flow start to the slice on top of
the thread's slice stack, which can be a slice that already ended. So every
row gets a 32-bit tid of its own (running rows: ``running_tid_base`` + the
task's id, the base written in ``otherData``), and every arrow starts on a
slice made for it: nothing else is guaranteed to be there at the spawn point
(the spawner may have no range open, or only one that ended before).

Timestamps are microseconds since the profile started, with nanosecond
decimals. Lines are built with f-strings and a cache of JSON-escaped names:
``json.dumps`` per event is several times slower at a million events. With
the C extension, runs of plain ranges (no args, flags or links) are written
by ``chrome_plain`` in aprof/_cevents.c, to the same bytes.
"""

from __future__ import annotations

import json
import math
import warnings
from array import array
from collections.abc import Callable, Iterator
from itertools import compress
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import AprofWarning, RecordScope
from .._core._recorder import (
    FLAG_ASYNC,
    FLAG_UNFINISHED,
    KIND_INSTANT,
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
from .._post._events import overlap
from .._post._lod import always_kept, longest_rows
from .._post._memory import threads_by_node as memory_threads_by_node
from .._post._table import SCOPES, X_EXTRA
from ._files import atomic_write_text, check_output_path
from ._labels import track_label

if TYPE_CHECKING:
    from os import PathLike

    from .._post._session import Session

__all__ = ["export_chrome_trace", "chrome_trace_chunks"]

SUFFIXES = (".json", ".json.gz")
UINT32_MAX = 2**32 - 1
#: Past this many events a trace is some 200 MB of JSON or more, which
#: Perfetto's UI (it parses the trace inside the browser tab) loads slowly,
#: or not at all: writing one warns, and ``max_events`` caps it.
LARGE_TRACE = 2_000_000
# The category of the zero-length slices flow arrows start on.
LINK_CATEGORY = "spawn"


def running_tid_base(tids: list[int]) -> int:
    """The offset of the running rows' tids: a power of ten (so a user reads
    task 7's row as 1000007) above every tid in the trace, at least 10**6.

    Raises:
        ValueError: the rows would not fit in 32 bits (a session whose
            thread ids are near 2**31; aprof's own count up from 1).
    """
    top = max(tids, default=0)
    base = 1_000_000
    while base <= top:
        base *= 10
    if base + top > UINT32_MAX:
        raise ValueError(f"export_chrome_trace: thread ids up to {top} leave no 32-bit room for the tasks' running rows")
    return base


def _json_default(value: object) -> str:
    return repr(value)


_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _dumps(value: Any) -> str:
    """Strict JSON: no NaN/Infinity, unknown objects as their repr."""
    if type(value) is str:  # names and labels, most calls: what json.dumps would write, in C
        return _encode_str(value)
    try:  # the common case: nothing to replace, so no walk over the value first
        return json.dumps(value, default=_json_default, allow_nan=False)
    except (ValueError, TypeError):  # a NaN or an infinity (spelled as its repr), or a key not a str
        return json.dumps(_finite(value), default=_json_default, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _event_args(r: list[Any], tid: int, steps: list[int] | None, memory: dict[str, int] | None = None) -> str:
    """The ``args`` object of one event, from its raw record ``r`` (the
    fields FunctionEvent's properties read; see aprof._core._recorder), and
    its ``memory`` figures (profile_memory) when it allocated."""
    args: dict[str, Any] = {}
    if r[R_ARGS] is not None:
        args["args"] = r[R_ARGS]
    if r[R_EXC] is not None:
        args["exception"] = r[R_EXC]
    kind = r[R_KIND]
    if kind & FLAG_UNFINISHED:
        args["unfinished"] = True
    if r[R_INPUTS] is not None:
        args["inputs"] = list(r[R_INPUTS])
    if r[R_SEQ] >= 0:
        args["sequence_nr"] = r[R_SEQ]
    if r[R_FWD]:
        args["forward_thread_id"] = r[R_FWD]
    end_tid = r[R_END_LT]
    if end_tid is not None and end_tid != tid:
        args["end_thread_id"] = end_tid
    if r[R_STACK] is not None:
        args["stack"] = [f"{f}:{line} {fn}" for f, line, fn in r[R_STACK]]
    if steps is not None and not kind & KIND_INSTANT:
        running = overlap(steps, r[R_START], r[R_END])
        args["running_ns"] = running
        args["waiting_ns"] = max(0, r[R_END] - r[R_START] - running)
    extra = r[R_EXTRA]
    if extra:
        args.update((k, v) for k, v in extra.items() if k != "steps")
    if memory is not None:
        args["memory"] = memory
    return _dumps(args) if args else ""


def _memory_args(session: Session) -> dict[int, dict[str, int]]:
    """profile_memory: each row that allocated (itself or its children) ->
    its ``args.memory`` (bytes allocated, freed, net, peak, count, with its
    children; ``self_net`` without), shown by Perfetto on the slice."""
    m = session.memory
    if m is None:
        return {}
    out = {}
    for i in m.events_with_memory():
        both = m.of_event(i)
        if both is not None:
            out[i] = {**both[0].to_dict(), "self_net": both[1].net}
    return out


def _task_coroutines(tab: Any) -> dict[int, str]:
    """``_labels.task_coroutines`` over the table's columns: each task
    track's coroutine, from its TASK range (one not nested on its own
    track), with no event view per task."""
    ext = _native.extension
    got = None if ext is None else ext.task_coroutines(tab, SCOPES.index(RecordScope.TASK))
    if got is not None:  # the loop below in C (None: a TASK row's extra is not a dict)
        return got  # type: ignore[no-any-return]
    out: dict[int, str] = {}
    parent, track, rare, tracks = tab.parent, tab.track, tab.rare, tab.tracks
    for i in tab.rows_of_scope(RecordScope.TASK):
        x = rare.get(i)
        extra = None if x is None else x[X_EXTRA]
        if not extra:
            continue
        tid = tracks[track[i]].id
        p = parent[i]
        if p >= 0 and tracks[track[p]].id == tid:
            continue
        coro = extra.get("coro")
        if coro:
            out[tid] = str(coro)
    return out


def chrome_trace_chunks(session: Session, batch: int = 4096, capped: dict[str, int] | None = None) -> Iterator[str]:
    """The trace as a stream of JSON text chunks (about ``batch`` events
    each); ``capped`` (from :func:`cap_events`) goes into ``otherData``."""
    base = session.metadata["start_ns"]
    pids = {int(k): v for k, v in session.metadata.get("pids", {}).items()}
    commands = session.metadata.get("commands") or {}
    yield '{"displayTimeUnit":"ms","otherData":'
    tracks = session.tracks()  # sorted by first activity: a walk over every event, so once
    tab = session._table
    tab_tracks = tab.tracks
    # The rows with a spawner, found in C (compress), then read one by one:
    # a tenth of the rows of a server's trace, not all of them.
    track_col, fwd_col, seq_col = tab.track, tab.fwd, tab.seq
    spawners = {(tab_tracks[track_col[i]].node_id, fwd_col[i]) for i in compress(range(len(fwd_col)), fwd_col) if seq_col[i] > 0}
    run_base = 0
    if any(t.steps for t in tracks) or session.samples is not None:
        # Rows of their own, with 32-bit tids: a task's running row is
        # run_base + its id, a track's sampled row 2 * run_base + its id.
        run_base = running_tid_base([t.id for t in tracks] + [tid for _, tid in spawners])
        if session.samples is not None and 2 * run_base + max((t.id for t in tracks), default=0) > UINT32_MAX:
            raise ValueError("export_chrome_trace: thread ids leave no 32-bit room for the sampled rows")
    other = {"producer": "aprof", "aprof_version": session.metadata.get("aprof_version"), "dropped": session.metadata.get("dropped", 0), "start_ns": base}
    if "dropped_by_kind" in session.metadata:  # what the profile's memory budget let go, by kind
        other["dropped_by_kind"] = session.metadata["dropped_by_kind"]
    # For readers: the profile's end, the wall clock; for merges, which
    # session this is and whose clock (aprof/_post/_merge.py).
    for field in ("stop_ns", "unix_offset_ns", "session_id", "boot_id"):
        if field in session.metadata:
            other[field] = session.metadata[field]
    if run_base:
        other["running_tid_base"] = run_base  # for readers: which rows are task steps
    if capped is not None:
        other["capped"] = capped
    if session.samples is not None:  # SPEC 8.4: the samples whole, for readers
        other["aprof_samples"] = session.samples.to_json()
    if session.memory is not None:  # issue 21: the figures, for readers (the counter track is below)
        other["aprof_memory"] = memory_summary(session)
    yield _dumps(other)
    yield ',"traceEvents":[\n'
    # Trace events are gathered as lines and joined with ",\n" a batch at a
    # time: one generator step per batch, not per event.
    lines: list[str] = []
    emit = lines.append
    joined = ""  # "" before the first batch, then ",\n"

    nodes = sorted({t.node_id for t in tracks})
    for node in nodes:
        pid = pids.get(node, node)
        command = commands.get(str(node))  # a program aprof run followed: its command line
        label = f"{command} (pid {pid})" if type(command) is str else f"aprof node {node}"
        emit(f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":{_dumps(label)}}}}}')
    coros = _task_coroutines(tab)
    # A track's lines are one string (joined as the batch joins them): a
    # task per request makes tens of thousands of tracks. With the
    # extension, all of them are one string, written in C (chrome_tracks),
    # unless a track's fields are not plain (None: the loop below).
    text = None if _native.extension is None else _native.extension.chrome_tracks(tracks, pids, coros, run_base, _dumps)
    if text:
        emit(text)
    for order, track in enumerate(tracks if text is None else ()):
        tid = track.id
        pid = pids.get(track.node_id, track.node_id)
        label = track_label(track, coros.get(tid))
        named = f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{_dumps(label)}}}}},\n'
        sort = f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},"args":{{"sort_index":{2 * order}}}}}'
        if track.steps:  # a task's steps, set by consolidation and by load()
            # A task's steps overlap its ranges without nesting in them, so
            # they get a row of their own, right under the task's.
            rid = run_base + tid
            emit(
                f'{named}{sort},\n{{"ph":"M","name":"thread_name","pid":{pid},"tid":{rid},"args":{{"name":{_dumps(label + " running")}}}}},\n'
                f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{rid},"args":{{"sort_index":{2 * order + 1}}}}}'
            )
        else:
            emit(named + sort)

    # Spawners that recorded nothing have no track; name their row for the
    # flow arrows that start there (the profile's starting task, mostly).
    track_pids = {t.id: pids.get(t.node_id, t.node_id) for t in tracks}
    track_names = {t.id: t.name for t in tracks}
    start = session.metadata.get("start_thread") or {}
    for node, tid in sorted(spawners):
        if tid not in track_pids:
            pid = pids.get(node, node)
            if tid == start.get("id"):
                kind = start.get("kind", "thread")
                label = str(start.get("name")) if kind == "thread" else f"{start.get('name')} [{kind}]"
            else:
                label = f"logical thread {tid}"
            emit(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{_dumps(label)}}}}}')
            emit(f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},"args":{{"sort_index":-1}}}}')
    async_id = 0
    flow_id = 0
    # One pass over the rows of the table (the fields the events'
    # properties read), so a million events cost no million property calls.
    # Per track and per (name, scope), the constant parts of a line are
    # built once: a million events then cost two float formats and one
    # f-string each.
    task_scope = RecordScope.TASK
    heads: dict[tuple[str, RecordScope], tuple[str, str]] = {}  # -> ('"name":..,"cat":..', cat)
    ev_track = -1
    tid = pid = 0
    steps: list[int] | None = None
    where = ""
    # Runs of plain ranges (no args, flags or links: most of a big trace)
    # are written in C when the extension is active; the loop below writes
    # everything else, and everything on the pure-Python path.
    # chrome_rows also writes the tasks' rows (their args, spawn arrows and
    # steps: a task per request makes them a tenth of a server's trace).
    plain = None if _native.extension is None else _native.extension.chrome_rows
    pid_of = [pids.get(t.node_id, t.node_id) for t in tab_tracks]
    tid_of = [t.id for t in tab_tracks]
    wheres = [f'"pid":{p},"tid":{t}' for p, t in zip(pid_of, tid_of, strict=True)]
    task_index = SCOPES.index(task_scope)
    track_steps = [t.steps for t in tab_tracks]  # a task track's ranges report running and waiting time
    json_names: dict[int, str] = {}
    cats = tuple(sc.value for sc in SCOPES)
    mem_args = _memory_args(session)
    # Rows with memory figures have args: the C path leaves them to the loop.
    rare = array("i", sorted(tab.rare.keys() | mem_args.keys()) if mem_args else sorted(tab.rare))
    # ... and so must chrome_rows with a task row (it writes a task's args
    # from tab.rare alone): it is handed the rare rows without memory.
    rare_map = {k: v for k, v in tab.rare.items() if k not in mem_args} if mem_args else tab.rare
    track_col = tab.track
    pending = len(lines)
    i = 0
    n = len(tab)
    while i < n:
        if pending >= batch:
            if joined:  # yielded apart: "joined + batch" copied every batch once more
                yield joined
            yield ",\n".join(lines)
            joined = ",\n"
            lines.clear()
            pending = 0
        if plain is not None:
            text, j, flow_id = plain(
                tab, i, base, wheres, json_names, cats, _dumps, batch, rare, track_steps,
                rare_map, pid_of, tid_of, track_pids, track_names, run_base, task_index, flow_id,
            )  # fmt: skip
            if j > i:
                emit(text)
                pending += j - i
                i = j
                continue
        r = tab.record(i)
        mem = mem_args.get(i) if mem_args else None
        if track_col[i] != ev_track:
            ev_track = track_col[i]
            t = tab_tracks[ev_track]
            tid = t.id
            steps = t.steps
            pid = pids.get(t.node_id, t.node_id)
            where = f'"pid":{pid},"tid":{tid}'
        i += 1
        pending += 1
        scope = r[R_SCOPE]
        key = (r[R_NAME], scope)
        head = heads.get(key)
        if head is None:
            head = heads[key] = (f'"name":{_dumps(r[R_NAME])},"cat":"{scope.value}"', scope.value)
        nc = head[0]
        start_ns = r[R_START]
        ts = (start_ns - base) / 1000.0
        kind = r[R_KIND]
        fwd = r[R_FWD]
        extra = r[R_EXTRA]
        bare = (
            r[R_ARGS] is None
            and r[R_EXC] is None
            and not kind
            and r[R_SEQ] < 0
            and not fwd
            and r[R_END_LT] is None
            and r[R_INPUTS] is None
            and r[R_STACK] is None
            and not extra
            and mem is None
        )
        if bare and steps is None:  # a plain range: the common case, and no args
            emit(f'{{"ph":"X",{nc},{where},"ts":{ts:.3f},"dur":{(r[R_END] - start_ns) / 1000.0:.3f}}}')
            continue
        if bare:  # a plain range on a task's track: its running and waiting time alone (json.dumps' spelling)
            end_ns = r[R_END]
            running = overlap(steps, start_ns, end_ns)  # type: ignore[arg-type]
            waiting = max(0, end_ns - start_ns - running)
            emit(
                f'{{"ph":"X",{nc},{where},"ts":{ts:.3f},"dur":{(end_ns - start_ns) / 1000.0:.3f},'
                f'"args":{{"running_ns": {running}, "waiting_ns": {waiting}}}}}'
            )
            continue
        args = _event_args(r, tid, steps, mem)
        args_part = f',"args":{args}' if args else ""
        if kind & KIND_INSTANT:
            emit(f'{{"ph":"i","s":"t",{nc},{where},"ts":{ts:.3f}{args_part}}}')
        elif kind & FLAG_ASYNC:
            async_id += 1
            te = (r[R_END] - base) / 1000.0
            emit(f'{{"ph":"b",{nc},"id2":{{"local":"0x{async_id:x}"}},{where},"ts":{ts:.3f}{args_part}}}')
            emit(f'{{"ph":"e",{nc},"id2":{{"local":"0x{async_id:x}"}},{where},"ts":{te:.3f}}}')
        else:
            emit(f'{{"ph":"X",{nc},{where},"ts":{ts:.3f},"dur":{(r[R_END] - start_ns) / 1000.0:.3f}{args_part}}}')
        if fwd and r[R_SEQ] > 0 and not kind & FLAG_ASYNC:
            # A flow arrow from the spawn/submit point to the start of the
            # work (an async slice, which only a hand-made file gives spawned
            # work, has no slice for the arrow's end to bind to: none).
            cat = head[1]
            flow_id += 1
            link_ns = start_ns
            if extra:
                link_ns = int(extra.get("spawn_ns", extra.get("submit_ns", link_ns)))
            ts0 = (link_ns - base) / 1000.0
            fwhere = f'"pid":{track_pids.get(fwd, pid)},"tid":{fwd}'
            # The slice the arrow starts on (see the module's docstring); it
            # comes first in the file, which orders it first at equal times.
            what = "spawn" if scope is task_scope else "submit"
            label = _dumps(f"{what} {track_names.get(tid, r[R_NAME]) if scope is task_scope else r[R_NAME]}")
            emit(f'{{"ph":"X","name":{label},"cat":"{LINK_CATEGORY}",{fwhere},"ts":{ts0:.3f},"dur":0.000}}')
            emit(f'{{"ph":"s","name":"spawn","cat":"{cat}","id":{flow_id},{fwhere},"ts":{ts0:.3f}}}')
            emit(f'{{"ph":"f","bp":"e","name":"spawn","cat":"{cat}","id":{flow_id},{where},"ts":{ts:.3f}}}')
        if scope is task_scope and extra and run_base:
            task_steps = extra.get("steps") or ()
            rwhere = f'"pid":{pid},"tid":{run_base + tid}'
            for k in range(0, len(task_steps) - 1, 2):
                s0 = (task_steps[k] - base) / 1000.0
                d = (task_steps[k + 1] - task_steps[k]) / 1000.0
                emit(f'{{"ph":"X","name":"running","cat":"step",{rwhere},"ts":{s0:.3f},"dur":{d:.3f}}}')
    _sampled_rows(session, track_pids, base, 2 * run_base, emit)
    _memory_counters(session, pids, base, emit)
    if lines:
        if joined:
            yield joined
        yield ",\n".join(lines)
    yield "\n]}\n"


def _sampled_rows(session: Session, track_pids: dict[int, Any], base: int, row_base: int, emit: Any) -> None:
    """Stack samples (SPEC 8.4) on a row of their own under each track,
    named ``<track> sampled``, category ``sampled``: a flame chart over time,
    apart from the traced ranges."""
    from .._post._samples import sampled_slices

    if session.samples is None:
        return
    named: set[int] = set()
    labels = {t.id: t.name if t.kind == "thread" else f"{t.name} [{t.kind}]" for t in session.tracks()}
    for tid, name, t0, t1 in sampled_slices(session):
        pid = track_pids.get(tid, 0)
        where = f'"pid":{pid},"tid":{row_base + tid}'
        if tid not in named:
            named.add(tid)
            emit(f'{{"ph":"M","name":"thread_name",{where},"args":{{"name":{_dumps(labels.get(tid, str(tid)) + " sampled")}}}}}')
        # Slices of one row abut or nest: written as whole nanoseconds (ts
        # and dur each exact at 3 decimals of a microsecond), the end a
        # reader computes (Perfetto: integer ns) is exactly t1, so a slice
        # never passes the next one's start or its parent's end. (Rounding
        # ts and end to microseconds first, then subtracting, let a child
        # end a nanosecond after its parent.)
        ts_ns = t0 - base
        dur_ns = max(t1 - t0, 0)
        emit(f'{{"ph":"X","name":{_dumps(name)},"cat":"sampled",{where},"ts":{ts_ns / 1000.0:.3f},"dur":{dur_ns / 1000.0:.3f}}}')


#: At most this many points of the memory counter track (the highest live
#: value of each stretch is kept, so no peak is lost).
MEMORY_COUNTER_POINTS: Final = 20_000


def memory_summary(session: Session) -> dict[str, Any]:
    """profile_memory's figures as JSON: the total, per track (each task over
    all its steps) and per range that allocated (``name``, ``thread_id``,
    ``start_ns``, its figures with children, ``self_net``)."""
    m = session.memory
    assert m is not None
    tab = session._table
    events = []
    for i in m.events_with_memory():
        both = m.of_event(i)
        if both is None:
            continue
        incl, own = both
        events.append({"name": tab.names[tab.name[i]], "thread_id": tab.tracks[tab.track[i]].id, "start_ns": tab.start[i], **incl.to_dict(), "self_net": own.net})
    return {
        "interval": m.interval,
        "total": m.total().to_dict(),
        "other_bytes": m.other_bytes,
        "tracks": {str(tid): {"name": m.threads.get(tid, ("", ""))[0], **st.to_dict()} for tid, st in m.by_thread().items()},
        "events": events,
        # The allocations whole, for aprof's readers (aprof report, merge):
        # they charge them to the events they rebuild (aprof/_post/_readers.py).
        "records": m.records_json(),
    }


def _memory_counters(session: Session, pids: dict[int, Any], base: int, emit: Any) -> None:
    """profile_memory (issue 21): the profiled work's live bytes over time as a
    counter track (``"ph":"C"``, name ``memory``), one per process."""
    m = session.memory
    if m is None:
        return
    by_node = memory_threads_by_node(session)
    for node in sorted(by_node):
        pid = pids.get(node, node)
        # Perfetto binds a tid to one process, so with several processes
        # each counter gets a tid of its own, above every row's.
        ctid = 0 if len(by_node) == 1 else UINT32_MAX - node
        points = m.timeline(None if len(by_node) == 1 else by_node[node])
        if len(points) > MEMORY_COUNTER_POINTS:
            step = -(-len(points) // MEMORY_COUNTER_POINTS)
            points = [max(points[i : i + step], key=lambda p: p[1]) for i in range(0, len(points), step)]
        if points:
            # Counters belong to the process; the row is named for readers that want one.
            emit(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{ctid},"args":{{"name":"memory (live bytes)"}}}}')
            emit(f'{{"ph":"C","name":"memory","pid":{pid},"tid":{ctid},"ts":0.000,"args":{{"live bytes":0}}}}')
        for t, live in points:
            emit(f'{{"ph":"C","name":"memory","pid":{pid},"tid":{ctid},"ts":{(t - base) / 1000.0:.3f},"args":{{"live bytes":{live}}}}}')


def cap_events(session: Session, max_events: int) -> tuple[Session, dict[str, int]]:
    """``session`` with at most ``max_events`` events, and what was dropped.

    Tasks, executor jobs and loop blocks are always kept (a session with
    more of them than ``max_events`` keeps those alone); of the rest, the
    longest: instants go first, then the shortest ranges. Durations are
    ranked by their power of two, and within the last power kept, the first
    events in the session's order, so the pass is linear.
    """
    from .._post._session import Session

    tab = session._table
    n = len(tab)
    keep, shortest = longest_rows(tab, tab.scope.tobytes().translate(always_kept()), max_events)
    kept = array("i", [i for i in range(n) if keep[i]])
    info = {"events": n, "kept": len(kept), "dropped": n - len(kept), "shortest_kept_ns": shortest}
    capped = Session(tab.take(kept), session._tracks, session.metadata, session.samples)
    m = session.memory
    if m is not None:
        from .._post._memory import Memory

        where = {old: new for new, old in enumerate(kept)}
        cm = Memory(m.interval)
        cm.time, cm.size, cm.weight, cm.freed, cm.thread_id = m.time, m.size, m.weight, m.freed, m.thread_id
        cm.threads, cm.other_bytes, cm.other_count, cm.dropped = m.threads, m.other_bytes, m.other_count, m.dropped
        cm.nodes = m.nodes
        cm.event = array("i", [where.get(r, -1) for r in m.event])
        capped.memory = cm
    return capped, info


def export_chrome_trace(session: Session, path: str | PathLike[str], max_events: int | None = None) -> None:
    """Write ``session`` as a Chrome trace; gzip when the name ends in .gz.

    With ``max_events``, a larger session is cut to that many events (see
    :func:`cap_events`), and ``otherData.capped`` says what was dropped.
    Without it, a trace of more than :data:`LARGE_TRACE` events is written
    whole with an ``AprofWarning``.

    Raises:
        TypeError, ValueError, OSError: ``max_events`` is not an int >= 1,
            or see ``check_output_path``; every message names the path.
    """
    if max_events is not None and (type(max_events) is not int or max_events < 1):
        raise ValueError(f"export_chrome_trace: max_events must be an int >= 1 or None, got {max_events!r}")
    p = check_output_path(path, "export_chrome_trace", SUFFIXES)
    capped = None
    n = len(session._table)
    if max_events is not None and n > max_events:
        session, capped = cap_events(session, max_events)
    elif max_events is None and n > LARGE_TRACE:
        warnings.warn(
            f"aprof: {str(p)!r} holds {n:,} events, more than Perfetto's UI loads comfortably "
            f"({LARGE_TRACE:,}); export_chrome_trace(path, max_events=N) or "
            "`aprof convert SESSION.aprof OUT.json --max-events N` keeps the N longest",
            AprofWarning,
            stacklevel=3,
        )
    atomic_write_text(
        p, chrome_trace_chunks(session, capped=capped), compress=p.name.lower().endswith(".gz"), what="export_chrome_trace"
    )
