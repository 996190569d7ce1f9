"""The compact session document: what the HTML report embeds and reads back.

A session file (``.aprof``) keeps every field of every event as a row of
22 values. The HTML report needs the same information in a form a browser
can draw 100k events from without choking, and ``aprof report trace.html``
must be able to rebuild the session from it. So the report embeds this
document::

    {"format": "aprof-compact", "version": 1, "metadata": {...},
     "names": [...], "scopes": [...],
     "tracks": [{"id", "name", "kind", "os_thread_id", "node_id", "steps"}],
     "events": [t, start, dur, parent, name, scope, flags, detail, ...],
     "details": [{...}, ...]}

``events`` is flat, eight integers per event: track index, start and
duration in nanoseconds (start relative to ``metadata.start_ns``), the index
of its parent event (-1 for none), indexes into ``names`` and ``scopes``,
flag bits (``F_*``) and an index into ``details`` (-1 when the event has
nothing beyond those fields). Task steps are relative nanoseconds too.
Stack samples, when the profile sampled, are under ``"samples"``
(:func:`compact_samples`). A report past its detail budget holds only some
events here and the rest, merged, under ``"lod"`` (aprof._export._html):
read back, such a document gives the events it holds, and the session's
``metadata["html_lod"]`` says how many were merged
(``{"budget", "events", "kept", "merged", "shortest_kept_ns",
"resolution_ns"}``).
"""

from __future__ import annotations

import json
from array import array
from typing import TYPE_CHECKING, Any, Final

from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import FLAG_ASYNC, FLAG_UNFINISHED, KIND_INSTANT, KIND_RANGE
from ._events import EventTable, FunctionEvent, Track, add_event, set_parents
from ._table import SCOPES
from ._validate import check_parent_indexes

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["FORMAT", "LOD_KEY", "compact_document", "compact_parts", "session_from_compact"]

FORMAT: Final = "aprof-compact"
VERSION: Final = 1
STRIDE: Final = 8
F_ASYNC: Final = 1
F_INSTANT: Final = 2
F_UNFINISHED: Final = 4


def _details(ev: FunctionEvent) -> dict[str, Any] | None:
    d: dict[str, Any] = {}
    if ev.exception is not None:
        d["exception"] = ev.exception
    if ev.args is not None:
        d["args"] = ev.args
    if ev.sequence_nr != -1:
        d["sequence_nr"] = ev.sequence_nr
    if ev.forward_thread_id:
        d["forward_thread_id"] = ev.forward_thread_id
    if ev.end_thread_id != ev.thread_id:
        d["end_thread_id"] = ev.end_thread_id
    if ev.inputs is not None:
        d["inputs"] = list(ev.inputs)
    if ev.stack is not None:
        d["stack"] = [list(f) for f in ev.stack]
    if ev.extra:
        d["extra"] = {k: v for k, v in ev.extra.items() if k != "steps"}
    return d or None


def compact_document(session: Session) -> dict[str, Any]:
    """``session`` as a compact document (a JSON-ready dict)."""
    tracks = session.tracks()
    doc, details = _document(session, tracks)
    base = int(session.metadata.get("start_ns", 0))
    doc["events"] = _flat_events(session._table, _remap(session, tracks), base, details[0])
    doc["details"] = details[1]
    return doc


def compact_parts(session: Session) -> tuple[dict[str, Any], str]:
    """:func:`compact_document` with ``"events"`` left None and given apart,
    as the JSON text ``json.dumps(..., separators=(",", ":"))`` makes of it:
    the HTML report splices it in (with the extension, the text is printed
    from the columns, ``compact_events`` in aprof/_cevents.c)."""
    tracks = session.tracks()
    doc, (rows, details) = _document(session, tracks)
    base = int(session.metadata.get("start_ns", 0))
    tab = session._table
    remap = _remap(session, tracks)
    ext = _native.extension
    if ext is not None:
        text: str = ext.compact_events(tab, base, remap, _FLAGS, rows)
    else:
        text = json.dumps(_flat_events(tab, remap, base, rows), separators=(",", ":"))
    doc["details"] = details
    return doc, text


def _document(
    session: Session, tracks: list[Track]
) -> tuple[dict[str, Any], tuple[array[int], list[dict[str, Any]]]]:
    """The document but its events (None) and details (None), and the
    details: the rows that have one (ascending) and theirs."""
    base = int(session.metadata.get("start_ns", 0))
    track_index = {t.id: i for i, t in enumerate(tracks)}
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "metadata": session.metadata,
        "names": session._table.names,
        "scopes": [s.value for s in SCOPES],
        "tracks": [
            {**t.to_dict(), "steps": [s - base for s in t.steps] if t.steps is not None else None} for t in tracks
        ],
        "events": None,
        "details": None,
    }
    if session.samples is not None:
        doc["samples"] = compact_samples(session, base, track_index)
    return doc, _details_of(session._table)


def _remap(session: Session, tracks: list[Track]) -> array[int]:
    """Each table track's index in the document (``tracks``, the session's order)."""
    order = {id(t): i for i, t in enumerate(tracks)}
    return array("i", [order[id(t)] for t in session._table.tracks])


#: Record kind bits (1 instant, 2 unfinished, 4 async) -> the document's F_* flags.
_FLAGS: Final = bytes(
    (F_INSTANT if k & KIND_INSTANT else 0) | (F_UNFINISHED if k & FLAG_UNFINISHED else 0) | (F_ASYNC if k & FLAG_ASYNC else 0)
    for k in range(256)
)


def _detail_rows(tab: EventTable) -> list[int]:
    """The rows :func:`_details` may say more than the columns for: rare
    fields, a sequence number, a spawner, or an end on another thread
    (``compact_detail_rows`` in aprof/_cevents.c is the C twin of the
    column part)."""
    own = array("q", [t.id for t in tab.tracks])
    ext = _native.extension
    if ext is not None:
        found = array("i")
        found.frombytes(ext.compact_detail_rows(tab, own))
        with_details = set(found)
    else:
        seq, fwd, end_lt, track = tab.seq, tab.fwd, tab.end_lt, tab.track
        with_details = {i for i, v in enumerate(seq) if v != -1}
        with_details.update(i for i, v in enumerate(fwd) if v)
        with_details.update(i for i, v in enumerate(end_lt) if v != -1 and v != own[track[i]])
    with_details.update(tab.rare)
    return sorted(with_details)


def _details_of(tab: EventTable) -> tuple[array[int], list[dict[str, Any]]]:
    """The rows that have details, ascending, and their details."""
    rows = array("i")
    details: list[dict[str, Any]] = []
    for i in _detail_rows(tab):
        d = _details(tab.view(i))
        if d is not None:
            rows.append(i)
            details.append(d)
    return rows, details


def _flat_events(tab: EventTable, remap: array[int], base: int, rows: array[int]) -> list[int]:
    """The flat event array from the columns, a slice assignment per field
    (the twin of ``compact_events``); row ``rows[j]`` has detail ``j``."""
    n = len(tab)
    start, end, _, _, _, name, track, parent, scope, kind = tab.columns()
    detail = [-1] * n
    for j, i in enumerate(rows):
        detail[i] = j
    flat: list[int] = [0] * (STRIDE * n)
    flat[0::STRIDE] = [remap[t] for t in track]
    flat[1::STRIDE] = [s - base for s in start]
    flat[2::STRIDE] = [e - s for e, s in zip(end, start, strict=True)]
    flat[3::STRIDE] = parent.tolist()
    flat[4::STRIDE] = name.tolist()
    flat[5::STRIDE] = scope.tolist()
    flat[6::STRIDE] = list(kind.tobytes().translate(_FLAGS))
    flat[7::STRIDE] = detail
    return flat


def compact_samples(session: Session, base: int, track_index: dict[int, int]) -> dict[str, Any]:
    """The stack samples (SPEC 8.4) for the report: the stack trie as
    :class:`aprof.Samples` keeps it, and five integers per sample (track
    index, time relative to the start, weight, stack node, idle), plus each
    track's spawn chain (the names of the tracks that spawned it)."""
    from ._samples import spawn_chains

    smp = session.samples
    assert smp is not None
    flat: list[int] = []
    for tid, t, w, node, idle in zip(smp.thread_id, smp.time_ns, smp.weight_ns, smp.node, smp.idle, strict=True):
        flat += (track_index[tid], t - base, w, node, idle)
    chains = spawn_chains(session)
    return {
        "frames": smp.frames,
        "parents": smp.parents,
        "frame_ids": smp.frame_ids,
        "samples": flat,
        "interval_ns": smp.interval_ns,
        "dropped": smp.dropped,
        "chains": [list(chains.get(t.id, ())) for t in session.tracks()],
    }


def _samples_from_compact(doc: dict[str, Any], base: int, tracks: list[Track]) -> Any:
    from ._samples import Samples

    flat = doc["samples"]
    if len(flat) % 5:
        raise ValueError(f"sample array of length {len(flat)} is not a multiple of 5")
    cols: list[list[int]] = [[], [], [], [], []]
    for i in range(0, len(flat), 5):
        ti, t, w, node, idle = (int(v) for v in flat[i : i + 5])
        cols[0].append(tracks[ti].id)
        cols[1].append(base + t)
        cols[2].append(w)
        cols[3].append(node)
        cols[4].append(idle)
    return Samples.from_json(
        {
            "frames": doc["frames"], "parents": doc["parents"], "frame_ids": doc["frame_ids"],
            "thread_id": cols[0], "time_ns": cols[1], "weight_ns": cols[2], "node": cols[3], "idle": cols[4],
            "interval_ns": doc["interval_ns"], "dropped": doc.get("dropped", 0),
        }
    )  # fmt: skip


def _index(i: int, n: int, what: str) -> int:
    if not 0 <= i < n:
        raise ValueError(f"{what} index {i} is outside 0..{n - 1}")
    return i


#: Where a session read from a report cut to its detail budget says so.
LOD_KEY: Final = "html_lod"
_LOD_FIELDS: Final = ("budget", "events", "kept", "merged", "shortest_kept_ns", "resolution_ns")


def _lod_info(lod: Any, n: int) -> dict[str, int]:
    """What a budgeted report's ``"lod"`` part says about the events it
    merged (aprof._export._html), checked: the session read back holds the
    ``kept`` events only."""
    if type(lod) is not dict:
        raise ValueError("the level-of-detail part is not an object")
    info: dict[str, int] = {}
    for k in _LOD_FIELDS:
        v = lod.get(k)
        if type(v) is not int or v < 0:
            raise ValueError(f"level-of-detail field {k!r} is {v!r}, not a whole number")
        info[k] = v
    if info["kept"] != n or info["kept"] + info["merged"] != info["events"]:
        raise ValueError(
            f"level-of-detail counts disagree: {info['kept']} kept + {info['merged']} merged "
            f"for {info['events']} events, and the document holds {n}"
        )
    return info


def session_from_compact(doc: dict[str, Any]) -> Session:
    """Rebuild a session from :func:`compact_document`'s output.

    Raises:
        KeyError, TypeError, ValueError, IndexError: the document is damaged
            (callers turn these into a ``ValueError`` naming the file).
    """
    from ._session import Session

    if doc.get("version") != VERSION:
        raise ValueError(f"compact document of version {doc.get('version')!r}; this aprof reads version {VERSION}")
    metadata = dict(doc["metadata"])
    base = int(metadata.get("start_ns", 0))
    names = [str(n) for n in doc["names"]]
    scopes = [RecordScope(s) for s in doc["scopes"]]
    tracks: list[Track] = []
    for t in doc["tracks"]:
        track = Track(int(t["id"]), str(t["name"]), str(t["kind"]), int(t["os_thread_id"]), int(t["node_id"]))
        if t.get("steps") is not None:
            track.steps = [base + int(s) for s in t["steps"]]
        tracks.append(track)
    details = doc["details"]
    flat = doc["events"]
    if len(flat) % STRIDE:
        raise ValueError(f"event array of length {len(flat)} is not a multiple of {STRIDE}")
    tab = EventTable()
    for t in tracks:
        tab.add_track(t)
    parents: list[int] = []
    for i in range(0, len(flat), STRIDE):
        ti, start, dur, parent, name_i, scope_i, flags, detail_i = flat[i : i + STRIDE]
        if any(type(v) is not int for v in flat[i : i + STRIDE]):
            raise ValueError(f"event {i // STRIDE} has a field that is not an integer")
        # Python's negative indexes would quietly pick another entry: check.
        track = tracks[_index(ti, len(tracks), "track")]
        name = names[_index(name_i, len(names), "name")]
        scope = scopes[_index(scope_i, len(scopes), "scope")]
        d: dict[str, Any] = details[_index(detail_i, len(details), "detail")] if detail_i != -1 else {}
        if type(d) is not dict:
            raise ValueError(f"detail {detail_i} is not an object")
        end_tid = d.get("end_thread_id")
        stack = d.get("stack")
        inputs = d.get("inputs")
        rec = [
            name, scope, base + start, base + start + dur,
            int(end_tid) if end_tid is not None else None, d.get("exception"), d.get("args"),
            int(d.get("sequence_nr", -1)), int(d.get("forward_thread_id", 0)),
            tuple(str(x) for x in inputs) if inputs is not None else None,
            tuple((str(f), int(line), str(fn)) for f, line, fn in stack) if stack is not None else None,
            KIND_INSTANT if flags & F_INSTANT else KIND_RANGE, d.get("extra"),
        ]  # fmt: skip
        if rec[1] is RecordScope.TASK and track.steps is not None:
            extra: dict[str, Any] = d.get("extra") or {}
            rec[-1] = {**extra, "steps": track.steps}  # as consolidation leaves it
        add_event(tab, rec, track, bool(flags & F_ASYNC), bool(flags & F_UNFINISHED))
        parents.append(parent)
    check_parent_indexes(parents, len(tab))
    set_parents(tab, parents)
    if doc.get("lod") is not None:
        metadata[LOD_KEY] = _lod_info(doc["lod"], len(tab))
    samples = _samples_from_compact(doc["samples"], base, tracks) if doc.get("samples") is not None else None
    session = Session(tab, {t.id: t for t in tracks}, metadata, samples)
    mem = doc.get("memory")
    if type(mem) is dict and mem.get("records") is not None:  # an HTML report's (aprof._export._html)
        from ._memory import Memory, recharge

        try:
            m = Memory.from_records_json(mem["records"])
        except ValueError as exc:
            raise ValueError(f"the report's memory part: {exc}") from None
        recharge(m, tab)
        session.memory = m
    return session
