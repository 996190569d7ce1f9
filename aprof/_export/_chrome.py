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
from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from os import PathLike

    from .._post._events import FunctionEvent
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


def _event_args(ev: FunctionEvent) -> str:
    args: dict[str, Any] = {}
    if ev.args is not None:
        args["args"] = ev.args
    if ev.exception is not None:
        args["exception"] = ev.exception
    if ev.unfinished:
        args["unfinished"] = True
    if ev.inputs is not None:
        args["inputs"] = list(ev.inputs)
    if ev.sequence_nr >= 0:
        args["sequence_nr"] = ev.sequence_nr
    if ev.forward_thread_id:
        args["forward_thread_id"] = ev.forward_thread_id
    if ev.end_thread_id != ev.thread_id:
        args["end_thread_id"] = ev.end_thread_id
    if ev.stack is not None:
        args["stack"] = [f"{f}:{line} {fn}" for f, line, fn in ev.stack]
    if ev.running_ns is not None:
        args["running_ns"] = ev.running_ns
        args["waiting_ns"] = ev.waiting_ns
    if ev.extra:
        args.update((k, v) for k, v in ev.extra.items() if k != "steps")
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
    spawners = {(ev.node_id, ev.forward_thread_id) for ev in session.events() if ev.forward_thread_id and ev.sequence_nr > 0}
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
    for ev in session.events():
        name = names.get(ev.name)
        if name is None:
            name = names[ev.name] = _dumps(ev.name)
        pid = pids.get(ev.node_id, ev.node_id)
        cat = ev.scope.value
        ts = (ev.start_ns - base) / 1000.0
        args = _event_args(ev)
        args_part = f',"args":{args}' if args else ""
        if ev.is_instant:
            yield sep() + f'{{"ph":"i","s":"t","name":{name},"cat":"{cat}","pid":{pid},"tid":{ev.thread_id},"ts":{ts:.3f}{args_part}}}'
        elif ev.is_async:
            async_id += 1
            te = (ev.end_ns - base) / 1000.0
            yield sep() + (
                f'{{"ph":"b","name":{name},"cat":"{cat}","id2":{{"local":"0x{async_id:x}"}},'
                f'"pid":{pid},"tid":{ev.thread_id},"ts":{ts:.3f}{args_part}}}'
            )
            yield sep() + (
                f'{{"ph":"e","name":{name},"cat":"{cat}","id2":{{"local":"0x{async_id:x}"}},'
                f'"pid":{pid},"tid":{ev.thread_id},"ts":{te:.3f}}}'
            )
        else:
            dur = ev.duration_ns / 1000.0
            yield sep() + (
                f'{{"ph":"X","name":{name},"cat":"{cat}","pid":{pid},"tid":{ev.thread_id},'
                f'"ts":{ts:.3f},"dur":{dur:.3f}{args_part}}}'
            )
        if ev.forward_thread_id and ev.sequence_nr > 0:
            # A flow arrow from the spawn/submit point to the start of the work.
            flow_id += 1
            link_ns = ev.start_ns
            if ev.extra:
                link_ns = int(ev.extra.get("spawn_ns", ev.extra.get("submit_ns", link_ns)))
            ts0 = (link_ns - base) / 1000.0
            yield sep() + (
                f'{{"ph":"s","name":"spawn","cat":"{cat}","id":{flow_id},"pid":{track_pids.get(ev.forward_thread_id, pid)},'
                f'"tid":{ev.forward_thread_id},"ts":{ts0:.3f}}}'
            )
            yield sep() + (
                f'{{"ph":"f","bp":"e","name":"spawn","cat":"{cat}","id":{flow_id},"pid":{pid},'
                f'"tid":{ev.thread_id},"ts":{ts:.3f}}}'
            )
        if ev.scope is RecordScope.TASK and ev.extra:
            steps = ev.extra.get("steps") or ()
            rid = _RUNNING_TID_BASE + ev.thread_id
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
