"""speedscope export (SPEC 9.2): one evented profile per track.

Follows speedscope's published file format
(https://www.speedscope.app/file-format-schema.json): shared frames, and per
track an ``evented`` profile of open/close events in nanoseconds, named
``track (id)``. Only ranges nested on their track are included; async slices
and instants have no place in a call tree. Frames are named as the summary
names its rows: a task's range is ``task <coroutine>``, an executor job's
``executor <function>``.

After the tracks come the "who awaits whom" profiles (named
``track (id) [who awaits whom]``, see ``aprof._post._stitch``): for each
root task or range whose waits were charged to the work it waited on, one
profile where a child task's or executor job's frames hang under the
parent's wait. The file opens on the longest of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from os import PathLike
from typing import TYPE_CHECKING, Any

from .. import _version
from .._post._stitch import STITCHED_SUFFIX, Segment, stitched_timelines
from ._files import atomic_write_text, check_output_path
from ._labels import frame_label, process_labels

if TYPE_CHECKING:
    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["export_speedscope", "speedscope_document"]

SUFFIXES = (".speedscope.json",)
SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _walk(root: FunctionEvent, frame_of: dict[str, int], out: list[dict[str, Any]]) -> None:
    """Open and close events for ``root`` and its nested ranges, depth first.

    An explicit stack, not recursion: call trees can nest deeper than
    Python's recursion limit.
    """
    frame = frame_of.setdefault(frame_label(root), len(frame_of))
    out.append({"type": "O", "frame": frame, "at": root.start_ns})
    todo = [(root, frame, iter(root.children))]
    while todo:
        ev, frame, children = todo[-1]
        for child in children:
            if child.is_instant:
                continue
            f = frame_of.setdefault(frame_label(child), len(frame_of))
            out.append({"type": "O", "frame": f, "at": child.start_ns})
            todo.append((child, f, iter(child.children)))
            break
        else:
            todo.pop()
            out.append({"type": "C", "frame": frame, "at": ev.end_ns})


def _segment_events(segs: list[Segment], frame_of: dict[str, int]) -> list[dict[str, Any]]:
    """Open/close events for contiguous (start, end, frames) segments."""
    out: list[dict[str, Any]] = []
    stack: list[int] = []
    last = segs[0][0]
    for s0, s1, frames in segs:
        if s0 > last:  # a gap: nothing open
            while stack:
                out.append({"type": "C", "frame": stack.pop(), "at": last})
        ids = [frame_of.setdefault(f, len(frame_of)) for f in frames]
        keep = 0
        while keep < len(stack) and keep < len(ids) and stack[keep] == ids[keep]:
            keep += 1
        while len(stack) > keep:
            out.append({"type": "C", "frame": stack.pop(), "at": s0})
        for f in ids[keep:]:
            out.append({"type": "O", "frame": f, "at": s0})
            stack.append(f)
        last = s1
    while stack:
        out.append({"type": "C", "frame": stack.pop(), "at": last})
    return out


def speedscope_document(session: Session) -> dict[str, Any]:
    """The session as a speedscope file (a JSON-ready dict)."""
    frame_of: dict[str, int] = {}
    roots: dict[int, list[FunctionEvent]] = {}
    for ev in session.events():
        if ev.is_async or ev.is_instant:
            continue  # no place in a call tree
        if ev.parent is None or ev.parent.thread_id != ev.thread_id:
            roots.setdefault(ev.thread_id, []).append(ev)
    profiles = []
    procs = process_labels(session)  # several processes: each profile's name says its pid
    for track in session.tracks():
        evs = roots.get(track.id)
        if not evs:
            continue
        events: list[dict[str, Any]] = []
        for root in evs:
            _walk(root, frame_of, events)
        profiles.append(
            {
                "type": "evented",
                "name": f"{procs.get(track.node_id, '')}{track.name} ({track.id})",
                "unit": "nanoseconds",
                "startValue": events[0]["at"],
                "endValue": max(e["at"] for e in events),
                "events": events,
            }
        )
    profiles += _sampled_profiles(session, frame_of)
    active = 0
    for track, segs in stitched_timelines(session, changed_only=True):
        if not active:
            active = len(profiles)  # open on the longest root's stitched view
        profiles.append(
            {
                "type": "evented",
                "name": f"{procs.get(track.node_id, '')}{track.name} ({track.id}){STITCHED_SUFFIX}",
                "unit": "nanoseconds",
                "startValue": segs[0][0],
                "endValue": segs[-1][1],
                "events": _segment_events(segs, frame_of),
            }
        )
    if not profiles:  # speedscope opens on a profile: give it an empty one
        stop = int(session.metadata.get("stop_ns", session.metadata.get("start_ns", 0)))
        profiles.append({"type": "evented", "name": "aprof (no ranges)", "unit": "nanoseconds", "startValue": stop, "endValue": stop, "events": []})
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": name} for name in frame_of]},
        "profiles": profiles,
        "name": "aprof",
        "activeProfileIndex": active,
        "exporter": f"aprof {_version.__version__}",
    }


def _sampled_profiles(session: Session, frame_of: dict[str, int]) -> list[dict[str, Any]]:
    """One ``sampled`` profile per track with stack samples (SPEC 8.4),
    named ``<track> (<id>) [sampled]``: apart from the traced ``evented``
    ones. Weights are the sampled time in nanoseconds."""
    samples = session.samples
    if samples is None:
        return []
    per_track: dict[int, tuple[list[list[int]], list[int], list[int]]] = {}
    for i in range(len(samples)):
        if samples.idle[i]:
            continue
        stacks, weights, times = per_track.setdefault(samples.thread_id[i], ([], [], []))
        stacks.append([frame_of.setdefault(name, len(frame_of)) for name in samples.stack(i)])
        weights.append(samples.weight_ns[i])
        times.append(samples.time_ns[i])
    out = []
    procs = process_labels(session)
    for track in session.tracks():
        got = per_track.get(track.id)
        if got is None:
            continue
        stacks, weights, times = got
        out.append(
            {
                "type": "sampled",
                "name": f"{procs.get(track.node_id, '')}{track.name} ({track.id}) [sampled]",
                "unit": "nanoseconds",
                "startValue": times[0] - weights[0],
                "endValue": times[-1],
                "samples": stacks,
                "weights": weights,
            }
        )
    return out


def export_speedscope(session: Session, path: str | PathLike[str]) -> None:
    """Write ``session`` as a ``.speedscope.json`` file."""
    p = check_output_path(path, "export_speedscope", SUFFIXES)
    atomic_write_text(p, _chunks(session), compress=False, what="export_speedscope")


def _chunks(session: Session) -> Iterator[str]:
    yield json.dumps(speedscope_document(session), allow_nan=False)
