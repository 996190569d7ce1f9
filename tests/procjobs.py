"""Jobs that tests hand to other processes (importable by a spawned child)."""

from __future__ import annotations

import contextvars
import os
import signal
import time
from pathlib import Path

import aprof


def work(n: int) -> int:
    """A job with a range inside."""
    with aprof.record_function("inner"):
        return sum(range(n))


def pid_of(_: int = 0) -> int:
    return os.getpid()


def die(_: int = 0) -> int:
    """Killed with SIGKILL inside a range."""
    with aprof.record_function("about to die"):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
    return 0


def slow(flag: str, seconds: float) -> str:
    """Says it started (creates ``flag``), then takes ``seconds``."""
    with aprof.record_function("slow inner"):
        Path(flag).touch()
        time.sleep(seconds)
    return "done"


def fail(_: int = 0) -> int:
    with aprof.record_function("failing inner"):
        raise ValueError("job failed")


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("procjobs_var", default="unset")


def set_var(value: str) -> str:
    """Sets a context variable in the worker (the next job may see it)."""
    _VAR.set(value)
    return value


def get_var(_: int = 0) -> str:
    return _VAR.get()


def stack_depth(_: int = 0) -> int:
    with aprof.record_function("with a stack"):
        return 0


def alloc(n: int) -> int:
    """Allocates ``n`` bytes (one bytes object) and frees them."""
    data = bytes(n)
    return len(data)


def track_memory_here() -> None:
    """A pool initializer: the worker tracks memory for a profile of its own."""
    prof = aprof.profile(profile_memory=True, scope="global")
    prof.start()
    _OWN.append(prof)


_OWN: list[aprof.profile] = []


def burn(seconds: float = 0.2) -> int:
    """Burns CPU for ``seconds`` in this function (what a sampler sees)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


class _NoThreadSampler:
    """A sampler whose thread cannot start (what a process at its thread
    limit gives): see :func:`break_sampler`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.dropped = self.idle = 0
        self.active = False

    def start(self) -> None:
        raise RuntimeError("can't start new thread")

    def stop(self) -> None:
        pass

    def take(self) -> tuple[bytes, bytes, list[object], list[int]]:
        return b"", b"", [], []


class BrokenSamplerModule:
    Sampler = _NoThreadSampler


def break_sampler() -> None:
    """A pool initializer: this process's sampler cannot start."""
    from aprof._core import _sampler

    _sampler._forced = BrokenSamplerModule


def break_profiles() -> None:
    """A pool initializer: no profile can start in this process."""
    from aprof._core import _profiler

    def start(self: object) -> None:
        raise RuntimeError("no profile here")

    _profiler.profile.start = start  # type: ignore[method-assign,assignment]
