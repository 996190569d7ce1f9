"""Aggregation and the summary table (SPEC 6.4)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from .._core._callbacks import RecordScope
from ._events import FunctionEvent

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["EventAverages", "FunctionEventAvg", "key_averages"]

GROUP_BY: Final = ("name", "track", "stack")
_STACK_DEPTH: Final = 5


class FunctionEventAvg:
    """One row of :meth:`aprof.profile.key_averages`: a group of events.

    Times are nanoseconds. ``running_ns`` and ``waiting_ns`` split the total
    of task ranges into time on the loop and time suspended (0 when unknown).
    ``samples``, ``sampled_ns`` and ``self_sampled_ns`` come from stack
    samples (SPEC 8.4), never from ranges: for a function, the samples with
    it on the stack and with it on top; for a range, task or executor job,
    the samples taken on its track while it ran; for a track, its samples.
    """

    __slots__ = (
        "count", "key", "max_ns", "min_ns", "running_ns", "sampled_ns", "samples", "self_ns", "self_sampled_ns",
        "stack", "total_ns", "waiting_ns",
    )  # fmt: skip

    def __init__(self, key: str, stack: tuple[tuple[str, int, str], ...] = ()) -> None:
        self.key = key
        self.stack = stack
        self.count = 0
        self.total_ns = 0
        self.self_ns = 0
        self.min_ns = 0
        self.max_ns = 0
        self.running_ns = 0
        self.waiting_ns = 0
        self.samples = 0
        self.sampled_ns = 0
        self.self_sampled_ns = 0

    @property
    def mean_ns(self) -> float:
        """Average duration."""
        return self.total_ns / self.count if self.count else 0.0

    def add(self, ev: FunctionEvent) -> None:
        d = ev.duration_ns
        if self.count == 0 or d < self.min_ns:
            self.min_ns = d
        if d > self.max_ns:
            self.max_ns = d
        self.count += 1
        self.total_ns += d
        self.self_ns += ev.self_duration_ns
        if ev.running_ns is not None:
            self.running_ns += ev.running_ns
        if ev.waiting_ns is not None:
            self.waiting_ns += ev.waiting_ns

    def __repr__(self) -> str:
        return f"<FunctionEventAvg {self.key!r} count={self.count} total={_fmt(self.total_ns)}>"


_SORT_KEYS: Final[dict[str, Callable[[FunctionEventAvg], Any]]] = {
    "total": lambda r: -r.total_ns,
    "self": lambda r: -r.self_ns,
    "count": lambda r: -r.count,
    "mean": lambda r: -r.mean_ns,
    "max": lambda r: -r.max_ns,
    "min": lambda r: -r.min_ns,
    "running": lambda r: -r.running_ns,
    "waiting": lambda r: -r.waiting_ns,
    "samples": lambda r: -r.samples,
    "sampled": lambda r: -r.sampled_ns,
    "self_sampled": lambda r: -r.self_sampled_ns,
    "name": lambda r: r.key,
}


class EventAverages:
    """The rows of :meth:`aprof.profile.key_averages`, iterable and indexable by key."""

    def __init__(self, rows: list[FunctionEventAvg], group_by: str) -> None:
        self._rows = rows
        self.group_by = group_by
        #: Samples of a loop waiting for I/O (SPEC 8.4): counted, charged to no row.
        self.idle_samples = 0
        self.idle_ns = 0

    def __iter__(self) -> Iterator[FunctionEventAvg]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, key: str) -> FunctionEventAvg:
        for r in self._rows:
            if r.key == key:
                return r
        raise KeyError(key)

    def table(self, sort_by: str = "total", row_limit: int | None = None) -> str:
        """Render the rows as a text table.

        Args:
            sort_by: One of ``total``, ``self``, ``count``, ``mean``, ``max``,
                ``min``, ``running``, ``waiting``, ``name``.
            row_limit: Show at most this many rows (all when None).

        Raises:
            ValueError: unknown ``sort_by`` or a negative ``row_limit``.
        """
        key = _SORT_KEYS.get(sort_by)
        if key is None:
            raise ValueError(f"table: unknown sort_by {sort_by!r}; expected one of {', '.join(_SORT_KEYS)}")
        if row_limit is not None and (isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < 0):
            raise ValueError(f"table: row_limit must be an int >= 0 or None, got {row_limit!r}")
        rows = sorted(self._rows, key=key)
        if row_limit is not None:
            rows = rows[:row_limit]
        show_tasks = any(r.running_ns or r.waiting_ns for r in rows)
        show_samples = any(r.samples for r in self._rows)
        header = [self.group_by.capitalize(), "Count", "Total", "Self", "Mean", "Min", "Max"]
        if show_tasks:
            header += ["Running", "Waiting"]
        if show_samples:
            header += ["Samples", "Sampled", "Self sampled"]
        body = []
        for r in rows:
            label = r.key if len(r.key) <= 60 else r.key[:57] + "..."
            label = label.replace("\n", "\\n").replace("\t", "\\t")
            cells = [label, str(r.count), _fmt(r.total_ns), _fmt(r.self_ns), _fmt(r.mean_ns), _fmt(r.min_ns), _fmt(r.max_ns)]
            if show_tasks:
                cells += [_fmt(r.running_ns), _fmt(r.waiting_ns)]
            if show_samples:
                cells += [str(r.samples), _fmt(r.sampled_ns), _fmt(r.self_sampled_ns)]
            body.append(cells)
        widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(header)]
        line = "-" * (sum(widths) + 2 * (len(widths) - 1))

        def fmt_row(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        out = [line, fmt_row(header), line, *(fmt_row(c) for c in body), line]
        if show_samples or self.idle_samples:
            out.append(
                "Count..Max: traced ranges and calls; Samples, Sampled: stack samples (SPEC 8.4)"
                + (f"; idle (a loop waiting for I/O): {self.idle_samples} samples, {_fmt(self.idle_ns)}" if self.idle_samples else "")
            )
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<EventAverages group_by={self.group_by!r} rows={len(self._rows)}>"


def _fmt(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3f}us"
    return f"{ns:.0f}ns"


def key_averages(session: Session, group_by: str = "name") -> EventAverages:
    """Aggregate a session's events (instants excluded)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"key_averages: unknown group_by {group_by!r}; expected one of {', '.join(GROUP_BY)}")
    rows: dict[Any, FunctionEventAvg] = {}
    tracks = {t.id: t for t in session.tracks()}
    for ev in session.events():
        if ev.is_instant:
            continue
        if group_by == "name":
            if ev.scope is RecordScope.TASK and ev.extra and ev.extra.get("coro"):
                # Tasks are named one by one (Task-7, ...): group them by coroutine.
                label = f"task {ev.extra['coro']}"
                k: Any = (RecordScope.TASK, label)
            elif ev.scope is RecordScope.EXECUTOR:
                # Named after the function handed over, which may also be the
                # name of a range inside it: keep the two rows apart.
                label = f"executor {ev.name}"
                k = (RecordScope.EXECUTOR, label)
            else:
                k = label = ev.name
            stack: tuple[tuple[str, int, str], ...] = ()
        elif group_by == "track":
            k = ev.thread_id
            t = tracks.get(ev.thread_id)
            label = f"{t.name if t else ev.track} ({ev.thread_id})"
            stack = ()
        else:
            stack = tuple(ev.stack[:_STACK_DEPTH]) if ev.stack else ()
            k = (ev.name, stack)
            label = ev.name if not stack else f"{ev.name} @ {stack[0][0]}:{stack[0][1]}"
        row = rows.get(k)
        if row is None:
            row = rows[k] = FunctionEventAvg(label, stack)
        row.add(ev)
    averages = EventAverages(list(rows.values()), group_by)
    _add_samples(session, averages, rows, group_by, tracks)
    return averages


def _add_samples(
    session: Session, averages: EventAverages, rows: dict[Any, FunctionEventAvg], group_by: str, tracks: dict[int, Any]
) -> None:
    """The sampled columns (SPEC 8.4): see :class:`FunctionEventAvg`."""
    from ._samples import sampled_totals, samples_within

    totals = sampled_totals(session)
    if totals is None or group_by == "stack":
        return
    samples = session.samples
    assert samples is not None
    averages.idle_samples, averages.idle_ns = samples.idle_count, samples.idle_ns
    if group_by == "track":
        for tid, (count, ns) in totals.by_track.items():
            row = rows.get(tid)
            if row is None:
                t = session._tracks.get(tid)
                row = rows[tid] = FunctionEventAvg(f"{t.name if t else tid} ({tid})")
                averages._rows.append(row)
            row.samples, row.sampled_ns = count, ns
        return
    # Ranges (not traced Python calls: those are matched by name below),
    # tasks and executor jobs: the samples on their track while they ran.
    for ev in session.events():
        if ev.is_instant or ev.is_async or ev.scope is RecordScope.PYTHON_FUNCTION:
            continue
        count, ns = samples_within(totals, ev.thread_id, ev.start_ns, ev.end_ns)
        if not count:
            continue
        if ev.scope is RecordScope.TASK and ev.extra and ev.extra.get("coro"):
            k: Any = (RecordScope.TASK, f"task {ev.extra['coro']}")
        elif ev.scope is RecordScope.EXECUTOR:
            k = (RecordScope.EXECUTOR, f"executor {ev.name}")
        else:
            k = ev.name
        row = rows.get(k)
        if row is not None:
            row.samples += count
            row.sampled_ns += ns
    # Functions: the samples with the function on the stack (and on top).
    for name, (count, ns, _self_count, self_ns) in totals.by_name.items():
        row = rows.get(name)
        if row is None:
            row = rows[name] = FunctionEventAvg(name)
            averages._rows.append(row)
        row.samples += count
        row.sampled_ns += ns
        row.self_sampled_ns += self_ns
