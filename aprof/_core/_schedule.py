"""Step schedules (SPEC 5.6), with torch.profiler's meanings.

``schedule(wait=, warmup=, active=, repeat=, skip_first=)`` maps a step number
to a :class:`ProfilerAction`. A profile built with ``schedule=`` records only
in the ``active`` steps of each cycle (after ``wait`` idle steps and
``warmup`` steps whose events are discarded), and calls ``on_trace_ready``
with the profile at the end of each cycle; ``prof.step()`` marks the end of a
step.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._profiler import profile

__all__ = ["ProfilerAction", "schedule", "trace_handler"]


class ProfilerAction(enum.Enum):
    """What a scheduled profile does during a step."""

    NONE = 0
    """Not recording."""
    WARMUP = 1
    """Recording, but the events are discarded."""
    RECORD = 2
    """Recording."""
    RECORD_AND_SAVE = 3
    """Recording; the cycle ends with this step and ``on_trace_ready`` runs."""


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"schedule: option {name!r} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"schedule: option {name!r} must be >= {minimum}, got {value}")
    return value


def schedule(
    *, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0
) -> Callable[[int], ProfilerAction]:
    """A step schedule, as ``torch.profiler.schedule``.

    After ``skip_first`` steps, cycles of ``wait`` idle steps, ``warmup``
    discarded steps and ``active`` recorded steps repeat ``repeat`` times
    (forever when 0).

    Raises:
        TypeError: an option is not an int.
        ValueError: an option is negative, or ``active`` is below 1; the
            message names the option.

    Example:
        >>> import aprof
        >>> s = aprof.schedule(wait=1, warmup=1, active=2)
        >>> [s(i).name for i in range(4)]
        ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE']
    """
    wait = _count("wait", wait, 0)
    warmup = _count("warmup", warmup, 0)
    active = _count("active", active, 1)
    repeat = _count("repeat", repeat, 0)
    skip_first = _count("skip_first", skip_first, 0)
    cycle = wait + warmup + active

    def schedule_fn(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    schedule_fn.__qualname__ = f"schedule(wait={wait}, warmup={warmup}, active={active}, repeat={repeat}, skip_first={skip_first})"
    return schedule_fn


def trace_handler(
    dir_name: str | os.PathLike[str], worker_name: str | None = None, use_gzip: bool = False
) -> Callable[[profile], None]:
    """An ``on_trace_ready`` handler that writes one Chrome trace per cycle.

    Files are named as ``torch.profiler.tensorboard_trace_handler`` names
    them: ``{worker_name}.{milliseconds}.pt.trace.json[.gz]`` in
    ``dir_name`` (created if missing), ``worker_name`` defaulting to
    ``{hostname}_{pid}`` (``-N`` is added to the stamp when two cycles end
    within one millisecond).

    Raises:
        TypeError: ``dir_name`` is not a path, ``worker_name`` neither a
            str nor None, or ``use_gzip`` not a bool.
    """
    if not isinstance(dir_name, (str, os.PathLike)):
        raise TypeError(f"trace_handler: dir_name must be a directory path (str or os.PathLike), got {dir_name!r}")
    if worker_name is not None and not isinstance(worker_name, str):
        raise TypeError(f"trace_handler: worker_name must be a str or None, got {worker_name!r}")
    if not isinstance(use_gzip, bool):
        raise TypeError(f"trace_handler: use_gzip must be True or False, got {use_gzip!r}")
    directory = Path(dir_name)

    def handler(prof: profile) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        stamp = time.time_ns() // 1_000_000
        suffix = ".pt.trace.json" + (".gz" if use_gzip else "")
        path = directory / f"{worker}.{stamp}{suffix}"
        n = 1
        while path.exists():  # two cycles within one millisecond: keep both
            path = directory / f"{worker}.{stamp}-{n}{suffix}"
            n += 1
        prof.export_chrome_trace(path)

    return handler


def check_schedule(fn: Any, on_trace_ready: Any) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(f"profile: option 'schedule' must be callable (aprof.schedule(...)), got {fn!r}")
    if on_trace_ready is not None and not callable(on_trace_ready):
        raise TypeError(f"profile: option 'on_trace_ready' must be callable, got {on_trace_ready!r}")
