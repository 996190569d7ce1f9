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


def _walk(root: FunctionEvent, frame_of: dict[str, int], out: list[dict[str, Any]]) -> None:
    """Open and close events for ``root`` and its nested ranges, depth first.

    An explicit stack, not recursion: call trees can nest deeper than
    Python's recursion limit.
    """
    frame = frame_of.setdefault(root.name, len(frame_of))
    out.append({"type": "O", "frame": frame, "at": root.start_ns})
    todo = [(root, frame, iter(root.children))]
    while todo:
        ev, frame, children = todo[-1]
        for child in children:
            if child.is_instant:
                continue
            f = frame_of.setdefault(child.name, len(frame_of))
            out.append({"type": "O", "frame": f, "at": child.start_ns})
            todo.append((child, f, iter(child.children)))
            break
        else:
            todo.pop()
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
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": name} for name in frame_of]},
        "profiles": profiles,
        "name": "aprof",
        "activeProfileIndex": 0,
        "exporter": f"aprof {_version.__version__}",
    }


def export_speedscope(session: Session, path: str | PathLike[str]) -> None:
    """Write ``session`` as a ``.speedscope.json`` file."""
    p = check_output_path(path, "export_speedscope", SUFFIXES)
    atomic_write_text(p, _chunks(session), compress=False, what="export_speedscope")


def _chunks(session: Session) -> Iterator[str]:
    yield json.dumps(speedscope_document(session), allow_nan=False)
