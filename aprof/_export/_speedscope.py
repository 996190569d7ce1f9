"""speedscope export (SPEC 9.2): one evented profile per track.

Follows speedscope's published file format
(https://www.speedscope.app/file-format-schema.json): shared frames, and per
track an ``evented`` profile of open/close events in nanoseconds. Only ranges
nested on their track are included; async slices and instants have no place
in a call tree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from os import PathLike
from typing import TYPE_CHECKING, Any

from .. import _version
from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["export_speedscope", "speedscope_document"]

SUFFIXES = (".speedscope.json",)
SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _walk(ev: FunctionEvent, frame_of: dict[str, int], out: list[dict[str, Any]]) -> None:
    frame = frame_of.setdefault(ev.name, len(frame_of))
    out.append({"type": "O", "frame": frame, "at": ev.start_ns})
    for child in ev.children:
        if not child.is_instant:
            _walk(child, frame_of, out)
    out.append({"type": "C", "frame": frame, "at": ev.end_ns})


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
                "name": f"{track.name} ({track.id})",
                "unit": "nanoseconds",
                "startValue": events[0]["at"],
                "endValue": max(e["at"] for e in events),
                "events": events,
            }
        )
    profiles += _sampled_profiles(session, frame_of)
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": name} for name in frame_of]},
        "profiles": profiles,
        "name": "aprof",
        "activeProfileIndex": 0,
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
    for track in session.tracks():
        got = per_track.get(track.id)
        if got is None:
            continue
        stacks, weights, times = got
        out.append(
            {
                "type": "sampled",
                "name": f"{track.name} ({track.id}) [sampled]",
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
