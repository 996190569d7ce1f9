"""What the viewers call things, so that every view agrees with the summary.

The summary (``key_averages``) groups tasks by coroutine (``task fetch``) and
executor jobs by function (``executor render``). The flame graphs, speedscope
profiles and folded stacks name those frames the same way, so a row of the
summary can be found in every view. A track keeps the task's own name, and
adds the summary's name for it when the task's name does not say it:
``Task-7 (task fetch)`` (the HTML report's track labels do the same).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope

if TYPE_CHECKING:
    from .._post._events import FunctionEvent, Track

__all__ = ["PROCESS_LABEL", "frame_label", "process_labels", "split_process_label", "task_coroutines", "track_label"]

#: A track's name in a session of several processes, in the folded stacks
#: and speedscope profiles: ``pid 4711 · MainThread`` (the HTML report's track
#: labels say the same). Readers take the pid back as the track's node id.
PROCESS_LABEL: Final = re.compile(r"^pid (\d+) \u00b7 (.*)$", re.S)


def frame_label(ev: FunctionEvent) -> str:
    """The name of ``ev``'s frame in a call tree: the summary's key."""
    scope = ev.scope
    if scope is RecordScope.TASK:
        extra = ev.extra
        coro = extra.get("coro") if extra else None
        if coro:
            return f"task {coro}"
    elif scope is RecordScope.EXECUTOR:
        return f"executor {ev.name}"
    return ev.name


def task_coroutines(events: Iterable[FunctionEvent]) -> dict[int, str]:
    """Each task track's coroutine, from its TASK range."""
    out: dict[int, str] = {}
    for ev in events:
        if ev.scope is RecordScope.TASK and ev.extra:
            parent = ev.parent
            if parent is not None and parent.thread_id == ev.thread_id:
                continue
            coro = ev.extra.get("coro")
            if coro:
                out[ev.thread_id] = str(coro)
    return out


def process_labels(session: Any) -> dict[int, str]:
    """Node id -> ``"pid N \u00b7 "`` for a session of several processes (a
    merged one, SPEC 15.4); empty for one process, whose names stay bare."""
    nodes = {t.node_id for t in session._table.tracks}
    if len(nodes) < 2:
        return {}
    pids = session.metadata.get("pids") or {}
    return {n: f"pid {pids.get(str(n), n)} \u00b7 " for n in nodes}


def split_process_label(name: str) -> tuple[int, str]:
    """``(pid, name)`` of a track name :func:`process_labels` prefixed; ``(0, name)`` otherwise."""
    m = PROCESS_LABEL.match(name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


def track_label(track: Track, coro: str | None) -> str:
    """A track's name in a viewer: ``Task-7 (task fetch) [asyncio]``."""
    name = track.name
    if coro and coro not in name:
        name = f"{name} (task {coro})"
    return name if track.kind == "thread" else f"{name} [{track.kind}]"
