"""Shared fixtures: every async scenario on every backend, and a leak check.

``backend`` runs a test body on asyncio, asyncio with the eager task factory
(3.12+), uvloop, trio, and anyio over asyncio and over trio. Test bodies use
the ``Backend`` object's small vocabulary (``run``, ``sleep``, ``group``,
``to_thread``, ``checkpoint``) so one scenario covers all six.

The autouse ``no_leftovers`` fixture checks, after every test, what
RELIABILITY.md asks: profile hooks untouched, no aprof state or callback left
in the test's context, no propagation patch, no aprof thread alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any

import pytest

import aprof
from aprof._core import _propagation

#: Not part of the test run: third-party suites run with and without aprof
#: (slow; see tests/wild/run_suites.py).
collect_ignore = ["wild"]

# The eager task factory exists from 3.12 on; on 3.11 it is not a backend.
BACKENDS = ["asyncio", *(["asyncio-eager"] if sys.version_info >= (3, 12) else []), "uvloop", "trio", "anyio-asyncio", "anyio-trio"]


class Group:
    """A started task group: asyncio.TaskGroup, a trio nursery or an anyio group."""

    def __init__(self, start_soon: Callable[..., Any]) -> None:
        self.start_soon = start_soon


class Backend:
    """One async runtime, seen through the operations the tests need."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_trio = name in ("trio", "anyio-trio")
        self.is_anyio = name.startswith("anyio")

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        name = self.name
        if name == "asyncio":
            return asyncio.run(fn(*args))
        if name == "asyncio-eager":

            async def eager_main() -> Any:
                asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
                return await fn(*args)

            return asyncio.run(eager_main())
        if name == "uvloop":
            import uvloop

            return uvloop.run(fn(*args))
        if name == "trio":
            import trio

            return trio.run(fn, *args)
        import anyio

        return anyio.run(fn, *args, backend="trio" if name == "anyio-trio" else "asyncio")

    async def sleep(self, seconds: float) -> None:
        if self.is_anyio:
            import anyio

            await anyio.sleep(seconds)
        elif self.is_trio:
            import trio

            await trio.sleep(seconds)
        else:
            await asyncio.sleep(seconds)

    async def checkpoint(self) -> None:
        await self.sleep(0)

    @contextlib.asynccontextmanager
    async def group(self) -> AsyncIterator[Group]:
        if self.is_anyio:
            import anyio

            async with anyio.create_task_group() as tg:
                yield Group(tg.start_soon)
        elif self.is_trio:
            import trio

            async with trio.open_nursery() as nursery:
                yield Group(nursery.start_soon)
        else:
            async with asyncio.TaskGroup() as tg:
                yield Group(lambda fn, *a: tg.create_task(fn(*a)))

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.is_anyio:
            import anyio.to_thread

            return await anyio.to_thread.run_sync(fn, *args)
        if self.is_trio:
            import trio

            return await trio.to_thread.run_sync(fn, *args)
        return await asyncio.to_thread(fn, *args)


@contextlib.asynccontextmanager
async def named_group(backend: Backend) -> AsyncIterator[Callable[..., None]]:
    """A task group whose ``spawn(fn, *args, name=...)`` names the task."""
    if backend.is_anyio:
        import anyio

        async with anyio.create_task_group() as tg:
            yield lambda fn, *args, name: tg.start_soon(fn, *args, name=name)
    elif backend.is_trio:
        import trio

        async with trio.open_nursery() as nursery:
            yield lambda fn, *args, name: nursery.start_soon(fn, *args, name=name)
    else:
        async with asyncio.TaskGroup() as tg:
            yield lambda fn, *args, name: tg.create_task(fn(*args), name=name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return Backend(request.param)


def _runtime_patches() -> list[str]:
    """Hooks a global profile installs until its stop: asyncio.Runner, trio's setup_runner,
    trio's post-import finder, the to_thread wrappers."""
    import asyncio.runners

    from aprof._integrations import _trio_runs

    found = []
    if getattr(asyncio.runners.Runner._lazy_init, "__module__", "").startswith("aprof"):
        found.append("asyncio.Runner._lazy_init")
    if any(isinstance(f, _trio_runs._PatchAfterImport) for f in sys.meta_path):
        found.append("the trio import hook")
    trio_run = sys.modules.get("trio._core._run")
    if trio_run is not None and hasattr(trio_run.setup_runner, "__aprof_original__"):
        found.append("trio's setup_runner")
    if _propagation._to_thread_users:
        found.append("the to_thread wrappers")
    import asyncio.tasks

    from aprof._integrations import _asyncio

    registry = asyncio.tasks._scheduled_tasks if sys.version_info >= (3, 12) else asyncio.tasks._all_tasks  # type: ignore[attr-defined]
    if _asyncio._users or registry.add != type(registry).add.__get__(registry, type(registry)):
        found.append("the asyncio task hooks")
    return found


def _aprof_threads() -> list[Any]:
    from aprof._integrations._control import remote_control_running
    from aprof._integrations._loop_block import live_watchdogs

    found: list[Any] = [t for t in threading.enumerate() if getattr(t, "_aprof_owned", False) and t.is_alive()]
    n = live_watchdogs()  # bare threads, not in threading.enumerate()
    if remote_control_running():  # a bare thread too
        found.append("the remote-control server")
    return found + [f"{n} loop-block watchdog(s)"] if n else found


@pytest.fixture(autouse=True)
def no_leftovers() -> Any:
    profile_hook, trace_hook = sys.getprofile(), sys.gettrace()
    yield
    problems = []
    if sys.getprofile() is not profile_hook:
        problems.append(f"sys.setprofile hook left behind: {sys.getprofile()!r}")
        sys.setprofile(profile_hook)
    if sys.gettrace() is not trace_hook:
        problems.append(f"sys.settrace hook left behind: {sys.gettrace()!r}")
        sys.settrace(trace_hook)
    if sys.version_info >= (3, 12):
        for tool in range(6):
            owner = sys.monitoring.get_tool(tool)
            if owner is not None and "aprof" in owner:
                problems.append(f"sys.monitoring tool {tool} still held by {owner!r}")
                sys.monitoring.free_tool_id(tool)
    if aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE) is not None:
        problems.append("a profiler state is left in the test's context")
    if aprof.has_callbacks():
        problems.append("callbacks are left registered")
        aprof.clear_callbacks()
    patched = _runtime_patches()
    if patched:
        problems.append(f"runtime hooks left installed: {', '.join(patched)}")
    if _propagation.is_propagation_installed():
        problems.append("install_propagation() was left in effect")
        aprof.uninstall_propagation()
    deadline = time.monotonic() + 5.0
    while _aprof_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    if _aprof_threads():
        problems.append(f"aprof threads still alive: {_aprof_threads()}")
    gc.collect()
    if problems:
        pytest.fail("; ".join(problems))


def require_c_paths() -> None:
    """End a test of a C path against its twin under ``APROF_PURE_PYTHON=1``,
    where the C paths are not set up (the twin alone runs, and the suite's
    other tests check it)."""
    from aprof._core import _native

    if _native.extension is None:
        pytest.skip("APROF_PURE_PYTHON=1: the C path is not set up (the twin alone runs)")


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT: the
    signal at its default, so Python turns it into KeyboardInterrupt, as
    for a program run from a terminal. A shell without job control starts
    its background jobs with SIGINT ignored, and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def twin(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the C extension switched off for the call: the
    pure-Python twins run, as under ``APROF_PURE_PYTHON=1`` (for parity
    tests of a C function and its twin in one process)."""
    from aprof._core import _native

    ext = _native.extension
    _native.extension = None
    try:
        return fn(*args)
    finally:
        _native.extension = ext


def require_c_extension() -> ModuleType:
    """The built C extension ``aprof._ctracer``, or end the test.

    The install builds it (README): missing, that is a failure, except on a
    free-threaded build, where it is not built on purpose (the test skips).
    """
    try:
        from aprof import _ctracer
    except ImportError:
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            pytest.skip("aprof._ctracer is not built on free-threaded Python (the twins run)")
        pytest.fail("aprof._ctracer is not built: reinstall aprof with a C compiler (pip install -e '.[test]')")
    return _ctracer
