"""Self-contained HTML report (SPEC 9.2).

One file, no network: the page carries its own styles and script, and the
profile as a compact document (``aprof._post._compact``) in a
``<script type="application/json">`` tag. It draws a timeline of tracks on a
canvas (nested ranges by depth, async ranges in lanes, each task's running
slices, flow arrows from spawn and submit points), two flame graphs (who
awaits whom, from ``aprof._post._stitch``, and ranges merged by call path),
and sortable summary and track tables. Drawing skips what is off screen and
merges ranges narrower than a pixel; tasks of one coroutine are grouped, and
large groups start collapsed, so 100k events and 50k tasks stay interactive.
``aprof report`` and ``aprof convert`` read the embedded document back.

Besides the compact document, the page gets what only Python knows or what
is cheaper to compute here: the summary rows (``key_averages``, with the
CLI's columns), the stitched flame graph, and the directories of the
standard library and installed packages, so stacks can be trimmed to the
user's own code.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator
from importlib import resources
from os import PathLike
from typing import TYPE_CHECKING, Any

from .._post._compact import compact_document
from .._post._stitch import merge_tree, stitched_timelines
from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from .._post._session import Session

__all__ = ["export_html", "html_chunks"]

SUFFIXES = (".html", ".htm")
_PLACEHOLDER = "{{APROF_DATA}}"
_SUMMARY_ROWS = 500
_SECTION_ROWS = 20  # rows of each summary section the page shows (the text shows 5)
_FLAME_NODES = 20_000  # the stitched flame graph keeps its largest nodes
_APROF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _template() -> str:
    return resources.files(__package__).joinpath("_report.html").read_text(encoding="utf-8")


def _library_dirs() -> list[str]:
    """Where the standard library and installed packages live: their frames
    are not the user's code."""
    out = {_APROF_DIR}
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):  # scripts: console entry points
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(os.path.join(p, ""))
    return sorted(out, key=len, reverse=True)


def _stitched(session: Session) -> list[Any]:
    """The who-awaits-whom flame graph, flat: ``[name, total_ns, parent]``
    per node, parents first (the root's parent is -1), the shallowest
    ``_FLAME_NODES`` kept.

    Flat, not nested: a deep chain of awaits must neither hit the recursion
    limit here nor nest the page's JSON deeper than a reader accepts.
    """
    tree = merge_tree(stitched_timelines(session))
    out: list[Any] = [[tree["name"], tree["total"], -1]]
    queue = [tree]
    i = 0
    while i < len(queue) and len(out) < _FLAME_NODES:  # breadth first
        for kid in queue[i]["children"]:
            if len(out) >= _FLAME_NODES:
                break
            out.append([kid["name"], kid["total"], i])
            queue.append(kid)
        i += 1
    return out


def _sections(session: Session) -> dict[str, list[list[Any]]]:
    """The summary's sections that the page shows as tables, from the same
    records as the text (``Session.summary``), so both say the same."""
    s = session.summary(limit=_SECTION_ROWS)
    return {
        "slowest_tasks": [
            [t.name, t.coro, t.track_id, t.total_ns, t.running_ns, t.waiting_ns, t.max_step_ns, t.outcome, t.spawned_at or ""]
            for t in s.slowest_tasks
        ],
        "longest_waits": [
            [w.task, w.coro, w.track_id, w.duration_ns, w.what, w.where, w.blocked_ns, w.blocked_by] for w in s.longest_waits
        ],
        "executor_queueing": [
            [q.function, q.jobs, q.queued_mean_ns, q.queued_max_ns, q.run_mean_ns] for q in s.executor_queueing
        ],
    }


def _data_json(session: Session) -> str:
    doc = compact_document(session)
    rows = sorted(session.key_averages(), key=lambda r: (r.total_ns, r.sampled_ns), reverse=True)[:_SUMMARY_ROWS]
    # The CLI's columns; min, max and the sampled ones come last so older
    # readers' indexes hold.
    doc["summary"] = [
        [r.key, r.count, r.total_ns, r.self_ns, r.running_ns, r.waiting_ns, r.min_ns, r.max_ns, r.samples, r.sampled_ns]
        for r in rows
    ]
    doc["stitched"] = _stitched(session)
    doc["sections"] = _sections(session)
    doc["library_dirs"] = _library_dirs()
    try:
        doc["cwd"] = os.path.join(os.getcwd(), "")
    except OSError:
        doc["cwd"] = ""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=repr)
    # '<' only occurs inside JSON strings; escaped, no '</script>' or '<!--'
    # in a name can end the data tag early.
    return text.replace("<", "\\u003c")


def html_chunks(session: Session) -> Iterator[str]:
    """The report page as text chunks."""
    page = _template()
    head, sep, tail = page.partition(_PLACEHOLDER)
    if not sep:  # pragma: no cover - the template ships with the package
        raise RuntimeError("aprof: the HTML report template has no data placeholder")
    yield head
    yield _data_json(session)
    yield tail


def export_html(session: Session, path: str | PathLike[str]) -> None:
    """Write ``session`` as a self-contained HTML report (``.html``)."""
    p = check_output_path(path, "export_html", SUFFIXES)
    atomic_write_text(p, html_chunks(session), compress=False, what="export_html")
