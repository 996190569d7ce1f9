"""A stopped profile's results, and the session file format (SPEC 6.5).

A :class:`Session` is what post-processing works on: events, tracks and
metadata. ``profile.stop()`` builds one; :func:`load` reads one back from a
file written by ``save()``, with the same analysis and export methods.

``save()`` writes the binary, columnar format of :mod:`._binary` (version
2). :func:`load` also reads version 1, gzip-compressed JSON: ``{"format":
"aprof-session", "version": 1, "metadata": {...}, "tracks": [...],
"events": [[...], ...]}``, one array per event in the order of ``_FIELDS``,
with ``parent`` as an index into the event list; ``_to_json`` still builds
that document (a session embedded in an HTML report, tests).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from array import array
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .. import _version
from .._core import _native
from .._core._callbacks import RecordScope
from .._core._recorder import KIND_INSTANT, KIND_RANGE, R_EXTRA, R_SCOPE, ProfilerState
from .._core._ring import KIND_NAMES
from .._export._files import atomic_write_bytes, check_output_path
from ._binary import MAGIC, read_binary, write_binary
from ._events import EventTable, FunctionEvent, Track, add_event, consolidate, set_parents, stack_from_json
from ._memory import Memory
from ._samples import Samples
from ._validate import _check_record, check_parent_indexes, decompress, parse_json, validate_session

if TYPE_CHECKING:
    from ._analysis import EventAverages, Summary

__all__ = ["Session", "load"]

_NONE: Final = 2**63 - 1  # first_starts' value for a track with no events

#: ``dropped_by_kind``'s keys, and those counted in ``dropped`` (a step is
#: part of its task, not an event of its own; an allocation record of
#: profile_memory is a figure's sample, not an event).
DROPPED_KINDS: Final = (*KIND_NAMES, "tracer_events", "allocations")
DROPPED_EVENTS: Final = tuple(k for k in DROPPED_KINDS if k not in ("steps", "allocations"))


def dropped_metadata(by_kind: dict[str, int]) -> dict[str, Any]:
    """A session's ``dropped`` (the events not kept) and ``dropped_by_kind``
    metadata, from counts by kind (missing kinds are 0)."""
    full = dict.fromkeys(DROPPED_KINDS, 0)
    full.update(by_kind)
    return {"dropped": sum(full[k] for k in DROPPED_EVENTS), "dropped_by_kind": full}

FORMAT: Final = "aprof-session"
VERSION: Final = 1
SUFFIXES: Final = (".aprof",)
_FIELDS: Final = (
    "name", "scope", "start_ns", "end_ns", "thread_id", "end_thread_id", "os_thread_id", "track",
    "is_async", "is_instant", "unfinished", "exception", "sequence_nr", "forward_thread_id",
    "inputs", "stack", "node_id", "args", "extra", "running_ns", "waiting_ns", "parent",
)  # fmt: skip


class Session:
    """Recorded events with their tracks and metadata.

    Returned by ``profile.session`` and :func:`aprof.load`; has the same
    analysis and export methods as a stopped :class:`aprof.profile`.
    """

    def __init__(
        self,
        table: EventTable,
        tracks: dict[int, Track],
        metadata: dict[str, Any],
        samples: Samples | None = None,
        memory: Memory | None = None,
    ) -> None:
        self._table = table
        self._tracks = tracks
        known = table._track_ids  # the table lists every track: files and exports index them there
        for t in tracks.values():
            if id(t) not in known:
                table.add_track(t)
        self.metadata = metadata
        #: The stack samples (SPEC 8.4), or None when the profile did not sample.
        self.samples = samples
        if memory is not None:
            self.memory = memory

    @classmethod
    def from_state(cls, state: ProfilerState) -> Session:
        """Consolidate a stopped profile's raw lists."""
        stop_ns = state.stop_ns if state.stop_ns is not None else state.start_ns
        # Building a million linked objects would set off the cyclic GC many
        # times over, each pass walking every record so far: pause it.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            records = state.all_task_records()
            table, tracks = consolidate(state.raw_lists(), stop_ns, state.node_id, records, state.with_stack)
        finally:
            if gc_was_enabled:
                gc.enable()
        # The raw records are not needed any more. The lists of task records
        # are emptied, not just let go: a task still running holds the one
        # its record is in.
        records.clear()
        state.task_records.clear()  # a bounded profile's current generation's (records is a copy then)
        state.lists = {}
        state.task_records = []
        ring = state.ring
        by_kind = {} if ring is None else ring.dropped()
        if ring is not None:
            ring.clear()
        by_kind["tracer_events"] = state.dropped
        ext = _native.extension
        if ext is not None and len(table) >= 10_000:
            # Their memory, several times the columns', is free in the middle
            # of the C heap: give it back, so RSS after stop is about the
            # session's size (docs/how-it-works.md, "The columns"). Not for
            # a small session: malloc_trim costs tens of microseconds, more
            # than a process-pool job's whole profile (issue 20).
            ext.trim_heap()
        metadata = cls.base_metadata(state, stop_ns)
        metadata.update(dropped_metadata(by_kind))
        return cls(table, tracks, metadata)

    @staticmethod
    def base_metadata(state: ProfilerState, stop_ns: int) -> dict[str, Any]:
        """A recorded session's metadata, but for what was dropped."""
        metadata = {
            "aprof_version": _version.__version__,
            "python": sys.version.split()[0],
            "node_id": state.node_id,
            "pids": {str(state.node_id): os.getpid()},
            "start_ns": state.start_ns,
            "stop_ns": stop_ns,
            # perf_counter_ns -> Unix epoch ns, for exports that need wall
            # time (OpenTelemetry, SPEC 11.5).
            "unix_offset_ns": time.time_ns() - time.perf_counter_ns(),
            # For merges (aprof/_post/_merge.py): which session this is (one
            # given twice is refused), and whose perf_counter clock it uses.
            "session_id": os.urandom(8).hex(),
        }
        from ._merge import boot_id

        boot = boot_id()
        if boot is not None:
            metadata["boot_id"] = boot
        lt = state.start_lt
        if lt is not None:
            # The task or thread that started the profile spawns work but
            # often records nothing itself: exports name its row from this.
            metadata["start_thread"] = {"id": lt.id, "name": lt.name, "kind": lt.kind}
        return metadata

    @property
    def memory(self) -> Memory | None:
        """The allocations (``profile(profile_memory=True)``, issue 21), or
        None when the profile did not track memory."""
        return self._table.memory

    @memory.setter
    def memory(self, value: Memory | None) -> None:
        if value is not None:
            value._table = self._table
            value._per_event = None
        self._table.memory = value

    def events(self) -> list[FunctionEvent]:
        """All events, track by track, in start order."""
        return list(self._table)

    def tracks(self) -> list[Track]:
        """The tracks that have events, in order of first activity."""
        return sorted(self._tracks.values(), key=_first_start(self._table))

    @property
    def lost(self) -> list[dict[str, Any]]:
        """Work of other processes that never came back (SPEC 15.4): one
        record per job or process, ``{"node_id", "pid", "name", "reason"}``
        (``node_id`` and ``pid`` are None when the process never said who
        it was). Empty when everything came back."""
        return [dict(x) for x in self.metadata.get("lost") or () if type(x) is dict]

    @property
    def dropped(self) -> int:
        """Events that were not kept (the profile's memory budget and the
        tracer's buffer): ranges, instants, tasks and tracer events."""
        return int(self.metadata.get("dropped", 0))

    @property
    def dropped_by_kind(self) -> dict[str, int]:
        """What was not kept, by kind: ``ranges``, ``instants``, ``tasks``,
        ``steps`` (of the tasks dropped) and ``tracer_events``; samples are
        counted in ``samples.dropped``. A session recorded before these
        counts existed (or read from another tool's file) has every event it
        dropped under ``tracer_events``."""
        got = self.metadata.get("dropped_by_kind")
        out = dict.fromkeys(DROPPED_KINDS, 0)
        if isinstance(got, dict):
            out.update({k: int(v) for k, v in got.items() if k in out and type(v) is int})
        else:
            out["tracer_events"] = self.dropped
        return out

    def key_averages(self, group_by: str = "name") -> EventAverages:
        """Aggregate events by ``"name"``, ``"track"``, ``"stack"`` or
        ``"node"`` (one row per process of a merged session) (SPEC 6.4, 15.4).

        Raises:
            ValueError: unknown ``group_by``.
        """
        from ._analysis import key_averages

        return key_averages(self, group_by)

    def summary(self, limit: int = 5) -> Summary:
        """What was slow, in which task, and why: the sections ``aprof run``
        prints under the table (slowest tasks, what blocked the loop, where
        the loop was held, longest waits, executor queueing, tasks pending
        at exit, repeated sequential awaits), each at most ``limit`` lines.

        ``str()`` of the result is the text; its fields are the records
        (see the reference).

        Raises:
            ValueError: ``limit`` is not an int >= 1.
        """
        from ._analysis import summarize

        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"summary: limit must be an int >= 1, got {limit!r}")
        return summarize(self, limit)

    def export_chrome_trace(self, path: str | PathLike[str], max_events: int | None = None) -> None:
        """Write a Chrome/Perfetto trace; gzip when the path ends in ``.gz``.

        ``max_events`` caps a large session to its longest events (tasks,
        executor jobs and loop blocks always kept); without it, a trace of
        more than 2,000,000 events is written whole with an ``AprofWarning``.
        """
        from .._export._chrome import export_chrome_trace

        export_chrome_trace(self, path, max_events)

    def export_speedscope(self, path: str | PathLike[str]) -> None:
        """Write a speedscope file (``.speedscope.json``), one profile per track (SPEC 9.2)."""
        from .._export._speedscope import export_speedscope

        export_speedscope(self, path)

    def export_folded(self, path: str | PathLike[str]) -> None:
        """Write folded stacks (``.folded``) for flame graphs (SPEC 9.2)."""
        from .._export._folded import export_folded

        export_folded(self, path)

    def export_html(self, path: str | PathLike[str], budget: int = 1_000_000) -> None:
        """Write a self-contained HTML report (``.html``): timeline, flame graph, summary (SPEC 9.2).

        A session of more than ``budget`` events keeps that many in full
        (tasks, executor jobs, loop blocks, then the longest) and shows the
        rest merged into blocks, with a banner that says so.
        """
        from .._export._html import export_html

        export_html(self, path, budget)

    def export_opentelemetry(
        self, tracer_provider: object = None, *, parent: object = None, python_frames: bool = False
    ) -> int:
        """Emit the events as OpenTelemetry spans; return how many (SPEC 11.5).

        Needs ``opentelemetry-api`` (``pip install 'aprof[otel]'``). One
        ``aprof profile`` span is the root, a child of ``parent`` (a Span or
        Context; by default the current span); each range is a span under
        the range it is nested in or was spawned from; instants are span
        events. Python tracer frames are left out unless ``python_frames``.

        Raises:
            ImportError: the OpenTelemetry API is not installed.
            TypeError: an argument has the wrong type; the message names it.
            ValueError: the session has no wall-clock offset to place its
                times (read from a file written without one).
        """
        from .._export._otel import export_opentelemetry

        return export_opentelemetry(self, tracer_provider, parent=parent, python_frames=python_frames)

    def save(self, path: str | PathLike[str]) -> None:
        """Write the whole session to ``path`` (``.aprof``) for :func:`aprof.load`.

        The file is the binary, columnar format (version 2, see
        docs/how-it-works.md), compressed with zlib.

        Raises:
            TypeError, ValueError, OSError: the path is unusable; the message
                names it and nothing is written.
        """
        p = check_output_path(path, "save", SUFFIXES)
        atomic_write_bytes(p, write_binary(self), what="save")

    def _to_json(self) -> dict[str, Any]:
        rows = []
        parents = self._table.parent
        for i, e in enumerate(self._table):
            d = e.to_dict()
            d["parent"] = parents[i]
            rows.append([d[f] for f in _FIELDS])
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "metadata": self.metadata,
            "tracks": [t.to_dict() for t in self._tracks.values()],
            "fields": list(_FIELDS),
            "events": rows,
        }
        if self.samples is not None:
            doc["samples"] = self.samples.to_json()
        if self.memory is not None:
            doc["memory"] = self.memory.to_json()
        return doc

    def __repr__(self) -> str:
        return f"<aprof.Session {len(self._table)} events on {len(self._tracks)} tracks>"


def _first_start(tab: EventTable) -> Any:
    """Sort key for tracks: the start of their first event, then their id."""
    first: dict[int, int] = {}
    get = first.get
    ext = _native.extension
    if ext is not None:
        # first_starts in aprof/_cevents.c: the same scan in C (the HTML
        # report asks for the tracks' order a few times over a million events).
        starts = array("q")
        starts.frombytes(ext.first_starts(tab, len(tab.tracks)))
        for t, start in zip(tab.tracks, starts, strict=True):
            cur = get(t.id)
            if start != _NONE and (cur is None or start < cur):
                first[t.id] = start
        return lambda t: (get(t.id, 0), t.id)
    last = -1
    tracks = tab.tracks
    for ti, start in zip(tab.track, tab.start, strict=True):
        # Events come track by track in start order: only the first of each
        # run needs a look (the min keeps it right for any order of runs).
        if ti == last:
            continue
        last = ti
        tid = tracks[ti].id
        cur = get(tid)
        if cur is None or start < cur:
            first[tid] = start

    def key(t: Track) -> tuple[int, int]:
        return (first.get(t.id, 0), t.id)

    return key


def load(path: str | PathLike[str]) -> Session:
    """Read a session written by ``profile.save()`` / ``Session.save()``.

    The file is read as untrusted input (docs/reference.md, ``aprof.load``):
    compressed data is inflated only up to a bound, nesting is bounded
    before parsing, and the session is validated completely before it is
    returned, so every analysis and export can walk it.

    Args:
        path: The ``.aprof`` file.

    Returns:
        A :class:`Session` with the same analysis and export methods.

    Raises:
        TypeError: ``path`` is not a path.
        FileNotFoundError: no such file.
        IsADirectoryError: the path is a directory.
        ValueError: the file is empty, truncated, not JSON, not an aprof
            session, a decompression bomb, or a session with a wrong field
            (the message names the file and what is wrong).
    """
    if not isinstance(path, (str, PathLike)):
        raise TypeError(f"load: expected a file path, got {type(path).__name__}")
    p = Path(path)
    where = repr(str(p))
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise IsADirectoryError(f"load: {where} is a directory, not a session file") from None
    if not raw:
        raise ValueError(f"load: {where} is empty, not an aprof session")
    if raw.startswith(MAGIC):
        try:
            return read_binary(raw)
        except ValueError as exc:
            raise ValueError(f"load: {where} {exc}") from None
    try:
        doc = parse_json(decompress(raw))
    except ValueError as exc:
        raise ValueError(f"load: {where} {exc}") from None
    return session_from_document(doc, f"load: {where}")


def session_from_document(doc: Any, where: str) -> Session:
    """The session in a parsed session document, validated.

    ``where`` starts every error message (``"load: '<file>'"``).

    Raises:
        ValueError: the document is not a session of this version, or is
            damaged; the message says what is wrong.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        if isinstance(doc, dict) and "traceEvents" in doc:
            raise ValueError(f"{where} is a Chrome trace, not an aprof session (write one with prof.save())")
        raise ValueError(f"{where} is not an aprof session (no 'format': {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ValueError(f"{where} is an aprof session of version {doc.get('version')!r}; this aprof reads version {VERSION}")
    try:
        session = _from_json(doc)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"{where} is a damaged aprof session ({type(exc).__name__}: {exc})") from None
    try:
        # _from_json checked each record as it read it: the columns are left.
        validate_session(session._table, session._tracks, session.metadata, records_checked=True)
    except ValueError as exc:
        raise ValueError(f"{where} is not a valid aprof session: {exc}") from None
    return session


def _flag(d: dict[str, Any], key: str) -> bool:
    v = d[key]
    if type(v) is not bool:
        raise ValueError(f"{key} is {v!r}, not true or false")
    return v


def _from_json(doc: dict[str, Any]) -> Session:
    """Build the session as the document says, without coercing types:
    validate_session checks them all afterwards."""
    fields = doc["fields"]
    if type(fields) is not list or sorted(map(str, fields)) != sorted(_FIELDS):
        raise ValueError(f"fields are {fields!r}, not the {len(_FIELDS)} fields of version {VERSION}")
    tracks: dict[int, Track] = {}
    for t in doc["tracks"]:
        tid = t["id"]
        if type(tid) is not int or tid in tracks:
            raise ValueError(f"track id {tid!r} is not an int, or is listed twice")
        tracks[tid] = Track(tid, t["name"], t["kind"], t["os_thread_id"], t["node_id"])
    rows = doc["events"]
    if type(rows) is not list:
        raise ValueError(f"events are a {type(rows).__name__}, not a list")
    tab = EventTable()
    parents: list[Any] = []
    checked_steps: set[int] = set()
    for row in rows:
        d = dict(zip(fields, row, strict=True))
        tid = d["thread_id"]
        if type(tid) is not int:
            raise ValueError(f"thread_id {tid!r} is not an int")
        track = tracks.get(tid)
        if track is None:
            track = tracks[tid] = Track(tid, d["track"], "thread", d["os_thread_id"], d["node_id"])
        end_tid = d["end_thread_id"]
        inputs = d["inputs"]
        rec = [
            d["name"], RecordScope(d["scope"]), d["start_ns"], d["end_ns"],
            None if end_tid == tid else end_tid, d["exception"], d["args"], d["sequence_nr"],
            d["forward_thread_id"], tuple(inputs) if type(inputs) is list else inputs, stack_from_json(d["stack"]),
            KIND_INSTANT if _flag(d, "is_instant") else KIND_RANGE, d["extra"],
        ]  # fmt: skip
        _check_record(len(tab), rec, checked_steps)
        extra = rec[R_EXTRA]
        if rec[R_SCOPE] is RecordScope.TASK and type(extra) is dict and extra.get("steps") is not None:
            # running/waiting are derived from the task's steps, as at stop
            track.steps = extra["steps"]
        add_event(tab, rec, track, _flag(d, "is_async"), _flag(d, "unfinished"))
        parents.append(d["parent"])
    check_parent_indexes(parents, len(tab))
    set_parents(tab, parents)
    metadata = doc["metadata"]
    samples = Samples.from_json(doc["samples"]) if doc.get("samples") is not None else None
    if samples is not None:
        for tid in set(samples.thread_id):
            if tid not in tracks:
                raise ValueError(f"samples: a sample is on track {tid}, which the session does not have")
    memory = None
    if doc.get("memory") is not None:
        memory = Memory.from_json(doc["memory"])
        memory.check_events(len(tab))
    return Session(tab, tracks, dict(metadata) if type(metadata) is dict else metadata, samples, memory)
