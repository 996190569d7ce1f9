"""Self-contained HTML report (SPEC 9.2).

One file, no network: the page carries its own styles and script, and the
profile as a compact document (``aprof._post._compact``) in a
``<script type="application/json">`` tag. It draws a timeline of tracks on a
canvas (nested ranges by depth, async ranges in lanes, each task's running
slices, flow arrows from spawn and submit points), a flame graph of ranges
merged by call path, and sortable summary and track tables. Drawing skips
what is off screen and merges ranges narrower than a pixel, so 100k events
stay interactive. ``aprof report`` and ``aprof convert`` read the embedded
document back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from os import PathLike
from typing import TYPE_CHECKING

from .._post._compact import compact_document
from ._files import atomic_write_text, check_output_path

if TYPE_CHECKING:
    from .._post._session import Session

__all__ = ["export_html", "html_chunks"]

SUFFIXES = (".html", ".htm")
_PLACEHOLDER = "{{APROF_DATA}}"
_SUMMARY_ROWS = 500


def _template() -> str:
    return resources.files(__package__).joinpath("_report.html").read_text(encoding="utf-8")


def _data_json(session: Session) -> str:
    doc = compact_document(session)
    rows = sorted(session.key_averages(), key=lambda r: (r.total_ns, r.sampled_ns), reverse=True)[:_SUMMARY_ROWS]
    doc["summary"] = [
        [r.key, r.count, r.total_ns, r.self_ns, r.running_ns, r.waiting_ns, r.samples, r.sampled_ns] for r in rows
    ]
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
