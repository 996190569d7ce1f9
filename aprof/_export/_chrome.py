"""Chrome Trace Event Format export (SPEC 9.1), loadable in Perfetto.

* one process per node (``pid``), named ``aprof node N``;
* one thread per logical thread (``tid`` = its id), named after the task or
  thread, ordered by first activity;
* ``X`` complete events for ranges nested on their track, ``i`` for instants;
* ``b``/``e`` nestable async slices for ``is_async`` ranges, on the track
  that started them, paired by ``id``;
* ``s``/``f`` flow arrows from a spawn or submit point to the work it started.

Timestamps are microseconds since the profile started, with nanosecond
decimals. Lines are built with f-strings and a cache of JSON-escaped names:
``json.dumps`` per event is several times slower at a million events.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._core._callbacks import RecordScope
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
from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from os import PathLike

    from .._post._session import Session

__all__ = ["export_chrome_trace", "chrome_trace_chunks"]

SUFFIXES = (".json", ".json.gz")
# Rows showing when each task ran get tids above any logical thread id.
_RUNNING_TID_BASE = 1 << 40


def _json_default(value: object) -> str:
    return repr(value)


def _dumps(value: Any) -> str:
    """Strict JSON: no NaN/Infinity, unknown objects as their repr."""
    return json.dumps(_finite(value), default=_json_default, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _event_args(r: list[Any], tid: int, steps: list[int] | None) -> str:
    """The ``args`` object of one event, from its raw record ``r`` (the
    fields FunctionEvent's properties read; see aprof._core._recorder)."""
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
    return _dumps(args) if args else ""


def chrome_trace_chunks(session: Session) -> Iterator[str]:
    """The trace as a stream of JSON text chunks."""
    base = session.metadata["start_ns"]
    pids = {int(k): v for k, v in session.metadata.get("pids", {}).items()}
    names: dict[str, str] = {}
    yield '{"displayTimeUnit":"ms","otherData":'
    yield _dumps({"producer": "aprof", "aprof_version": session.metadata.get("aprof_version"), "dropped": session.metadata.get("dropped", 0), "start_ns": base})
    yield ',"traceEvents":[\n'
    first = True

    def sep() -> str:
        nonlocal first
        if first:
            first = False
            return ""
        return ",\n"

    tracks = session.tracks()  # sorted by first activity: a walk over every event, so once
    nodes = sorted({t.node_id for t in tracks})
    for node in nodes:
        pid = pids.get(node, node)
        yield sep() + f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":{_dumps(f"aprof node {node}")}}}}}'
    for order, track in enumerate(tracks):
        pid = pids.get(track.node_id, track.node_id)
        label = track.name if track.kind == "thread" else f"{track.name} [{track.kind}]"
        yield sep() + f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{track.id},"args":{{"name":{_dumps(label)}}}}}'
        yield sep() + f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{track.id},"args":{{"sort_index":{2 * order}}}}}'
        if track.steps:  # a task's steps, set by consolidation and by load()
            # A task's steps overlap its ranges without nesting in them, so
            # they get a row of their own, right under the task's.
            rid = _RUNNING_TID_BASE + track.id
            yield sep() + f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{rid},"args":{{"name":{_dumps(label + " running")}}}}}'
            yield sep() + f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{rid},"args":{{"sort_index":{2 * order + 1}}}}}'

    # Spawners that recorded nothing have no track; name their row for the
    # flow arrows that start there (the profile's starting task, mostly).
    track_pids = {t.id: pids.get(t.node_id, t.node_id) for t in tracks}
    start = session.metadata.get("start_thread") or {}
    spawners = {(ev._t.node_id, ev._r[R_FWD]) for ev in session.events() if ev._r[R_FWD] and ev._r[R_SEQ] > 0}
    for node, tid in sorted(spawners):
        if tid not in track_pids:
            pid = pids.get(node, node)
            if tid == start.get("id"):
                kind = start.get("kind", "thread")
                label = str(start.get("name")) if kind == "thread" else f"{start.get('name')} [{kind}]"
            else:
                label = f"logical thread {tid}"
            yield sep() + f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{_dumps(label)}}}}}'
            yield sep() + f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},"args":{{"sort_index":-1}}}}'
    async_id = 0
    flow_id = 0
    # One pass over the raw records behind the events (the fields their
    # properties read), so a million events cost no million property calls.
    task_scope = RecordScope.TASK
    cats = {sc: sc.value for sc in RecordScope}
    for ev in session.events():
        r = ev._r
        track = ev._t
        tid = track.id
        ev_name = r[R_NAME]
        name = names.get(ev_name)
        if name is None:
            name = names[ev_name] = _dumps(ev_name)
        node = track.node_id
        pid = pids.get(node, node)
        scope = r[R_SCOPE]
        cat = cats[scope]
        start_ns = r[R_START]
        ts = (start_ns - base) / 1000.0
        args = _event_args(r, tid, track.steps)
        args_part = f',"args":{args}' if args else ""
        kind = r[R_KIND]
        if kind & KIND_INSTANT:
            yield sep() + f'{{"ph":"i","s":"t","name":{name},"cat":"{cat}","pid":{pid},"tid":{tid},"ts":{ts:.3f}{args_part}}}'
        elif kind & FLAG_ASYNC:
            async_id += 1
            te = (r[R_END] - base) / 1000.0
            yield sep() + (
                f'{{"ph":"b","name":{name},"cat":"{cat}","id2":{{"local":"0x{async_id:x}"}},'
                f'"pid":{pid},"tid":{tid},"ts":{ts:.3f}{args_part}}}'
            )
            yield sep() + (
                f'{{"ph":"e","name":{name},"cat":"{cat}","id2":{{"local":"0x{async_id:x}"}},'
                f'"pid":{pid},"tid":{tid},"ts":{te:.3f}}}'
            )
        else:
            dur = (r[R_END] - start_ns) / 1000.0
            yield sep() + (
                f'{{"ph":"X","name":{name},"cat":"{cat}","pid":{pid},"tid":{tid},'
                f'"ts":{ts:.3f},"dur":{dur:.3f}{args_part}}}'
            )
        fwd = r[R_FWD]
        extra = r[R_EXTRA]
        if fwd and r[R_SEQ] > 0:
            # A flow arrow from the spawn/submit point to the start of the work.
            flow_id += 1
            link_ns = start_ns
            if extra:
                link_ns = int(extra.get("spawn_ns", extra.get("submit_ns", link_ns)))
            ts0 = (link_ns - base) / 1000.0
            yield sep() + (
                f'{{"ph":"s","name":"spawn","cat":"{cat}","id":{flow_id},"pid":{track_pids.get(fwd, pid)},'
                f'"tid":{fwd},"ts":{ts0:.3f}}}'
            )
            yield sep() + (
                f'{{"ph":"f","bp":"e","name":"spawn","cat":"{cat}","id":{flow_id},"pid":{pid},'
                f'"tid":{tid},"ts":{ts:.3f}}}'
            )
        if scope is task_scope and extra:
            steps = extra.get("steps") or ()
            rid = _RUNNING_TID_BASE + tid
            for i in range(0, len(steps) - 1, 2):
                s0 = (steps[i] - base) / 1000.0
                d = (steps[i + 1] - steps[i]) / 1000.0
                yield sep() + f'{{"ph":"X","name":"running","cat":"step","pid":{pid},"tid":{rid},"ts":{s0:.3f},"dur":{d:.3f}}}'
    yield "\n]}\n"


def export_chrome_trace(session: Session, path: str | PathLike[str]) -> None:
    """Write ``session`` as a Chrome trace; gzip when the name ends in .gz.

    Raises:
        TypeError, ValueError, OSError: see ``check_output_path``; every
            message names the path.
    """
    p = check_output_path(path, "export_chrome_trace", SUFFIXES)
    atomic_write_text(p, _batched(chrome_trace_chunks(session)), compress=p.name.lower().endswith(".gz"), what="export_chrome_trace")


def _batched(chunks: Iterator[str], size: int = 4096) -> Iterator[str]:
    buf: list[str] = []
    for c in chunks:
        buf.append(c)
        if len(buf) >= size:
            yield "".join(buf)
            buf.clear()
    if buf:
        yield "".join(buf)
