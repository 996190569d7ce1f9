"""Folded stacks for flame graphs (SPEC 9.2).

One line per distinct stack: ``track;outer;inner <self time in us>``, as
Brendan Gregg's flamegraph.pl, speedscope and inferno read them. Only ranges
nested on their track are stacked; the value is each frame's self time.
Frames are named as the summary names its rows: a task's range is
``task <coroutine>``, an executor job's ``executor <function>``.

The file is UTF-8. A name holding a lone surrogate (``os.fsdecode`` of bytes
that are not UTF-8, such as a file name) is written with Python's escape for
it, ``\\udce9``: the surrogate itself has no UTF-8 encoding, and writing its
bytes anyway makes a file that other tools refuse.

Stack samples (SPEC 8.4) follow under a ``[sampled]`` root, so a flame
graph keeps traced and sampled time apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from os import PathLike
from typing import TYPE_CHECKING

from ._files import atomic_write_text, check_output_path
from ._labels import frame_label, process_labels

if TYPE_CHECKING:
    from .._post._events import FunctionEvent
    from .._post._session import Session

__all__ = ["export_folded", "folded_lines"]

SUFFIXES = (".folded", ".folded.txt")


def _frame(name: str) -> str:
    # ';' separates frames and the last space the value: keep both out of names.
    name = name.replace(";", ":").replace("\n", " ").replace(" ", "\u00a0") or "<empty>"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: write it as \udcXX
            name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name


def folded_lines(session: Session) -> Iterator[str]:
    """The session as folded-stack lines (self time in microseconds)."""
    totals: dict[str, int] = {}
    procs = process_labels(session)  # several processes: each track's root frame says its pid
    names = {t.id: _frame(procs.get(t.node_id, "") + t.name) for t in session.tracks()}

    def walk(root: FunctionEvent, prefix: str) -> None:
        # Depth first with an explicit stack (call trees can nest deeper
        # than Python's recursion limit), in the order recursion would take.
        todo = [(root, prefix)]
        while todo:
            ev, up = todo.pop()
            stack = f"{up};{_frame(frame_label(ev))}"
            totals[stack] = totals.get(stack, 0) + ev.self_duration_ns
            todo.extend((c, stack) for c in reversed(ev.children) if not c.is_instant)

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
    procs = process_labels(session)
    names = {t.id: procs.get(t.node_id, "") + t.name for t in session._tracks.values()}
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
