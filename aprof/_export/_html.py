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

A session of more events than the detail budget (``budget``, default
:data:`DEFAULT_BUDGET`) is shown at a level of detail
(``aprof._post._lod``): the document holds the budget's worth of events in
full (tasks, executor jobs and loop blocks always, then the longest, with
their ancestors), and under ``"lod"`` the rest merged into blocks per track
and row, each track's event counts and the flame graph by range over every
event. The page says so in a banner. The summary rows count every event;
the stitched flame graph is computed from the kept events (a dropped
range's time counts in its parent's frame).

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
from array import array
from collections.abc import Iterator
from importlib import resources
from os import PathLike
from typing import TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope
from .._post._compact import compact_parts
from .._post._lod import ITEM, always_kept, keep_rows, merge_rows, range_flame
from .._post._memory import threads_by_node as memory_threads_by_node
from .._post._stitch import stitched_tree
from ._files import atomic_write_text, check_output_path
from ._labels import frame_label

if TYPE_CHECKING:
    from .._post._session import Session

__all__ = ["DEFAULT_BUDGET", "check_budget", "export_html", "html_chunks"]

SUFFIXES = (".html", ".htm")
_PLACEHOLDER = "{{APROF_DATA}}"
_SUMMARY_ROWS = 500
_SECTION_ROWS = 20  # rows of each summary section the page shows (the text shows 5)
_FLAME_NODES = 20_000  # the stitched flame graph keeps its largest nodes
#: Events a report holds in full by default. Chromium loads a report of a
#: million events in about a third of a second and pans and zooms it in
#: tens of milliseconds (bench/scale.py, tests/test_html.py); past that,
#: the JSON alone is hundreds of megabytes.
DEFAULT_BUDGET: Final = 1_000_000
#: Merged blocks: the resolution starts at the profile's span over this many
#: columns (a screen's width zoomed in some eightfold) and is coarsened
#: fourfold until the blocks number at most half the budget (or it passes
#: the span).
_LOD_COLUMNS = 10_000
_APROF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _template() -> str:
    # Next to this file when aprof is installed as files (the usual case):
    # importlib.resources' first use imports its readers and zipfile, a few
    # milliseconds, a third of a 10k-event report's time.
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_report.html"), encoding="utf-8") as f:
            return f.read()
    except OSError:  # pragma: no cover - a zipped install
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


def _flat_tree(parent: Any, names: list[str], total: Any) -> list[Any]:
    """Flame graph nodes (parents before children, node 0 the root) as the
    page takes them: ``[name, total, parent]``, the largest
    ``_FLAME_NODES`` of those the page can draw (a thousandth of the root or
    more), parents still before children."""
    top = total[0]
    keep = [0]
    new = {0: 0}
    for nd in range(1, len(parent)):
        if parent[nd] in new and total[nd] * 1000 >= top:
            new[nd] = len(keep)
            keep.append(nd)
    if len(keep) > _FLAME_NODES:  # a parent is never smaller than its child: the largest keep their parents
        chosen = set(sorted(keep, key=lambda nd: -total[nd])[:_FLAME_NODES])
        keep = [nd for nd in keep if nd in chosen]
        new = {nd: j for j, nd in enumerate(keep)}
    return [[names[nd], total[nd], new[parent[nd]] if nd else -1] for nd in keep]


def _level_of_detail(session: Session, budget: int) -> tuple[Session, dict[str, Any]]:
    """The session cut to ``budget`` events in full, and the document's
    ``"lod"`` part for the rest (see the module's docstring)."""
    from .._post._session import Session

    tab = session._table
    n = len(tab)
    always = always_kept()
    mask, rows, shortest = keep_rows(tab, always, budget)
    detail = Session(tab.take(rows), session._tracks, session.metadata, session.samples)
    order = {id(t): i for i, t in enumerate(detail.tracks())}  # the document's track order
    remap = array("i", [order[id(t)] for t in tab.tracks])
    base = int(session.metadata.get("start_ns", 0))
    stop = session.metadata.get("stop_ns")
    span = int(stop) - base if stop is not None else (max(tab.end) - base if n else 0)
    resolution = max(1, span // _LOD_COLUMNS)
    while True:
        blocks, events, kept = merge_rows(tab, mask, base, resolution, remap)
        # Past the span, a coarser resolution joins nothing more: what is
        # left apart is kept events, rows and tracks.
        if len(blocks) // ITEM <= max(1, budget // 2) or resolution > span:
            break
        resolution *= 4
    track_events = [0] * len(remap)
    track_kept = [0] * len(remap)
    for ti, j in enumerate(remap):
        track_events[j] = events[ti]
        track_kept[j] = kept[ti]
    # Frame names as the flame graphs name them: tasks by coroutine,
    # executor jobs as "executor <fn>".
    labels = list(tab.names)
    label = array("i", tab.name)
    ids: dict[str, int] = {}
    for i in tab.rows_of_scope(RecordScope.TASK) + tab.rows_of_scope(RecordScope.EXECUTOR):
        text = frame_label(tab.view(i))
        if text != labels[label[i]]:
            if text not in ids:
                ids[text] = len(labels)
                labels.append(text)
            label[i] = ids[text]
    parent, lab, total = range_flame(tab, label)
    names = ["all"] + [labels[k] for k in lab[1:]]
    lod = {
        "budget": budget,
        "events": n,
        "kept": len(rows),
        "merged": n - len(rows),
        "shortest_kept_ns": shortest,
        "resolution_ns": resolution,
        "blocks": blocks.tolist(),
        "track_events": track_events,
        "track_kept": track_kept,
        "ranges": _flat_tree(parent, names, total),
    }
    return detail, lod


#: The most points of the memory counter in a page (the highest live value
#: of each stretch is kept).
_MEMORY_POINTS: Final = 4000


def _memory_doc(session: Session) -> dict[str, Any]:
    m = session.memory
    assert m is not None
    base = int(session.metadata.get("start_ns", 0))

    def counter(threads: set[int] | None) -> list[int]:
        points = m.timeline(threads)
        if len(points) > _MEMORY_POINTS:
            step = -(-len(points) // _MEMORY_POINTS)
            points = [max(points[i : i + step], key=lambda p: p[1]) for i in range(0, len(points), step)]
        flat: list[int] = []
        for t, live in points:
            flat += (t - base, live)
        return flat

    # "records": the allocations whole, for aprof's readers (aprof report,
    # merge), which charge them to the events they rebuild (issue 21).
    doc: dict[str, Any] = {"interval": m.interval, "other_bytes": m.other_bytes, "counter": counter(None), "records": m.records_json()}
    by_node = memory_threads_by_node(session)
    if len(by_node) > 1:
        # A merged session (SPEC 15.4): each process's own counter, drawn
        # under its group's header; "counter" stays the sum, for readers.
        doc["counters"] = [[node, counter(by_node[node])] for node in sorted(by_node)]
    return doc


def _stitched(session: Session) -> list[Any]:
    """The who-awaits-whom flame graph, flat: ``[name, total_ns, parent]``
    per node, parents first (the root's parent is -1), the shallowest
    ``_FLAME_NODES`` kept.

    Flat, not nested: a deep chain of awaits must neither hit the recursion
    limit here nor nest the page's JSON deeper than a reader accepts.
    """
    tree = stitched_tree(session)
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


def _data_chunks(session: Session, budget: int) -> Iterator[str]:
    """The page's data, the compact document with the summary, the stitched
    flame graph and what else the page needs, as JSON text in chunks."""
    detail, lod = (session, None) if len(session._table) <= budget else _level_of_detail(session, budget)
    doc, events = compact_parts(detail)
    if lod is not None:
        doc["lod"] = lod
    rows = sorted(session.key_averages(), key=lambda r: (r.total_ns, r.sampled_ns), reverse=True)[:_SUMMARY_ROWS]
    # The CLI's columns; min, max and the sampled ones come last so older
    # readers' indexes hold.
    doc["summary"] = [
        [r.key, r.count, r.total_ns, r.self_ns, r.running_ns, r.waiting_ns, r.min_ns, r.max_ns, r.samples, r.sampled_ns]
        for r in rows
    ]
    if session.memory is not None:
        # profile_memory: memory columns after the sampled ones, and the
        # counter track (time from the profile's start, live bytes), flat.
        for row, r in zip(doc["summary"], rows, strict=True):
            row += [r.allocated_bytes, r.cpu_memory_usage, r.self_cpu_memory_usage, r.peak_memory, r.allocation_count]
        doc["memory"] = _memory_doc(session)
    doc["stitched"] = _stitched(detail)
    doc["sections"] = _sections(session)
    doc["library_dirs"] = _library_dirs()
    try:
        doc["cwd"] = os.path.join(os.getcwd(), "")
    except OSError:
        doc["cwd"] = ""
    return _dumps(doc, {"events": events})


def _data_json(session: Session, budget: int) -> str:
    """The page's data: the JSON text of the document (see :func:`_data_chunks`)."""
    return "".join(_data_chunks(session, budget))


def _dumps(doc: dict[str, Any], texts: dict[str, str]) -> Iterator[str]:
    """``doc`` as JSON, in chunks (joined, one text), the keys in ``texts``
    given as JSON text already (the event array: printing it from the
    columns beats a list of millions of ints through json.dumps), in
    ``doc``'s order. The chunks are not joined here: at a million events
    the array is 30 MB, and each copy of it costs tens of milliseconds.

    '<' only occurs inside JSON strings; escaped, no '</script>' or '<!--'
    in a name can end the data tag early. (The texts given are numbers.)
    """
    sep = "{"
    for k, v in doc.items():
        text = texts.get(k)
        if text is None:
            yield sep + json.dumps({k: v}, separators=(",", ":"), allow_nan=False, default=repr)[1:-1].replace("<", "\\u003c")
        else:
            yield sep + json.dumps(k) + ":"
            yield text
        sep = ","
    yield "{}" if sep == "{" else "}"


def html_chunks(session: Session, budget: int = DEFAULT_BUDGET) -> Iterator[str]:
    """The report page as text chunks (``budget``: see :func:`export_html`)."""
    page = _template()
    head, sep, tail = page.partition(_PLACEHOLDER)
    if not sep:  # pragma: no cover - the template ships with the package
        raise RuntimeError("aprof: the HTML report template has no data placeholder")
    yield head
    yield from _data_chunks(session, budget)
    yield tail


def check_budget(budget: object, what: str = "export_html") -> int:
    """``budget`` if it is an int >= 1.

    Raises:
        ValueError: it is not (the message names ``what`` and the value).
    """
    if type(budget) is not int or budget < 1:
        raise ValueError(f"{what}: budget must be an int >= 1 (events shown in full), got {budget!r}")
    return budget


def export_html(session: Session, path: str | PathLike[str], budget: int = DEFAULT_BUDGET) -> None:
    """Write ``session`` as a self-contained HTML report (``.html``).

    Args:
        budget: Events the page holds in full. A larger session keeps the
            tasks, executor jobs, loop blocks and the longest other events
            up to it (plus their ancestors), merges the rest into blocks
            per track and row, and says so in a banner.

    Raises:
        ValueError, OSError: ``budget`` is not an int >= 1, or see
            ``check_output_path``.
    """
    check_budget(budget)
    p = check_output_path(path, "export_html", SUFFIXES)
    atomic_write_text(p, html_chunks(session, budget), compress=False, what="export_html")
