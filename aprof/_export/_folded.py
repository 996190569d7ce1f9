"""Folded stacks for flame graphs (SPEC 9.2).

One line per distinct stack: ``track;outer;inner <self time in us>``, as
Brendan Gregg's flamegraph.pl, speedscope and inferno read them. Only ranges
nested on their track are stacked; the value is each frame's self time.
Stack samples (SPEC 8.4) follow under a ``[sampled]`` root, so a flame
graph keeps traced and sampled time apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from os import PathLike
from typing import TYPE_CHECKING

from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["export_folded", "folded_lines"]

SUFFIXES = (".folded", ".folded.txt")


def _frame(name: str) -> str:
    # ';' separates frames and the last space the value: keep both out of names.
    return name.replace(";", ":").replace("\n", " ").replace(" ", "\u00a0") or "<empty>"


def folded_lines(session: Session) -> Iterator[str]:
    """The session as folded-stack lines (self time in microseconds)."""
    totals: dict[str, int] = {}
    names = {t.id: _frame(t.name) for t in session.tracks()}

    def walk(ev: FunctionEvent, prefix: str) -> None:
        stack = f"{prefix};{_frame(ev.name)}"
        totals[stack] = totals.get(stack, 0) + ev.self_duration_ns
        for child in ev.children:
            if not child.is_instant:
                walk(child, stack)

    for ev in session.events():
        if ev.is_async or ev.is_instant:
            continue
        if ev.parent is None or ev.parent.thread_id != ev.thread_id:
            walk(ev, names.get(ev.thread_id, str(ev.thread_id)))
    for stack, ns in totals.items():
        us = ns // 1000
        if us > 0:
            yield f"{stack} {us}\n"
    yield from sampled_folded_lines(session)


def sampled_folded_lines(session: Session) -> Iterator[str]:
    """The session's stack samples (SPEC 8.4) as folded lines, apart from the
    ranges: under a ``[sampled]`` root, then the tasks that spawned the
    sample's task, its track, and the frames; the value is the sampled time
    in microseconds."""
    from .._post._samples import SAMPLED_ROOT, sampled_stacks, spawn_chains

    if session.samples is None:
        return
    chains = spawn_chains(session)
    names = {t.id: t.name for t in session._tracks.values()}
    totals: dict[str, int] = {}
    for tid, stack, ns in sampled_stacks(session):
        line = ";".join(_frame(f) for f in (SAMPLED_ROOT, *chains.get(tid, ()), names.get(tid, str(tid)), *stack))
        totals[line] = totals.get(line, 0) + ns
    for line, ns in totals.items():
        us = ns // 1000
        if us > 0:
            yield f"{line} {us}\n"


def export_folded(session: Session, path: str | PathLike[str]) -> None:
    """Write ``session`` as folded stacks (``.folded``)."""
    p = check_output_path(path, "export_folded", SUFFIXES)
    atomic_write_text(p, folded_lines(session), compress=False, what="export_folded")
