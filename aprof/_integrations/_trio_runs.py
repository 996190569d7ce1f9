"""Trio runs started while a global profile runs (``aprof run`` on a trio program).

A global profile started before the program's ``trio.run`` (or anyio's trio
backend, or a guest run) cannot add its instrument from inside the run the
way a profile started in the run does. Instead, while at least one listener
is registered, ``trio.run`` and ``trio.lowlevel.start_guest_run`` pass one
more instrument (through trio's private ``trio._core._run.setup_runner``,
which both call: no public name of trio changes), whose ``before_run`` calls every listener inside the new run
(where ``trio.lowlevel.add_instrument`` and ``current_trio_token`` work).

trio is not imported here: if the program has not imported it yet, a
``sys.meta_path`` finder patches it right after its first import, and takes
itself out again.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._core._callbacks import AprofWarning

__all__ = ["on_new_trio_runs"]

#: Called inside every new trio run, before its first task.
Listener = Callable[[], None]

_lock = threading.Lock()
_listeners: list[Listener] = []
_originals: dict[str, Any] = {}  # "setup_runner" -> trio's function while patched
_finder: _PatchAfterImport | None = None


class _RunStart:
    """A duck-typed ``trio.abc.Instrument``: only ``before_run`` is defined."""

    def before_run(self) -> None:
        with _lock:
            listeners = list(_listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # never break the program's run
                pass


def _with_run_start(original: Callable[..., Any]) -> Callable[..., Any]:
    # trio's private ``setup_runner(clock, instruments, ...)``, which both
    # ``trio.run`` and ``start_guest_run`` call through their module's
    # globals: patching it leaves every public name of trio as it is
    # (SPEC 15.6: ``trio.run is trio._core.run`` stays true).
    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        if "instruments" in kwargs:
            kwargs["instruments"] = (*kwargs["instruments"], _RunStart())
        else:
            args = (args[0], (*args[1], _RunStart()), *args[2:])
        return original(*args, **kwargs)

    patched.__aprof_original__ = original  # type: ignore[attr-defined]
    return patched


def _patch(trio: ModuleType) -> None:
    # Under _lock.
    if _originals:
        return
    run_module = sys.modules.get("trio._core._run")
    if run_module is None or not callable(getattr(run_module, "setup_runner", None)):
        # A trio without it (0.26 to 0.35 have it): runs that start later
        # are not seen; a profile started inside a run still is.
        warnings.warn(
            f"aprof: this trio ({getattr(trio, '__version__', '?')}) has no setup_runner: a global profile "
            "cannot follow trio runs that start after it (start the profile inside the run)",
            AprofWarning,
            stacklevel=2,
        )
        return
    _originals["setup_runner"] = run_module.setup_runner
    run_module.setup_runner = _with_run_start(run_module.setup_runner)  # type: ignore[attr-defined]


def _unpatch() -> None:
    # Under _lock.
    run_module = sys.modules.get("trio._core._run")
    if run_module is not None and _originals:
        run_module.setup_runner = _originals["setup_runner"]  # type: ignore[attr-defined]
    _originals.clear()


class _PatchingLoader(importlib.abc.Loader):
    """Runs trio's own loader, then patches the fresh module."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        with _lock:
            if _listeners:
                _patch(module)

    def __getattr__(self, name: str) -> Any:  # resource readers and the like
        return getattr(self._inner, name)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``trio`` with the other finders and wraps its loader, once."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "trio":
            return None
        _remove_finder()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec  # type: ignore[no-any-return]
        return None


def _remove_finder() -> None:
    global _finder
    finder, _finder = _finder, None
    if finder is not None:
        try:
            sys.meta_path.remove(finder)
        except ValueError:
            pass


def on_new_trio_runs(listener: Listener) -> Callable[[], None]:
    """Call ``listener()`` inside every trio run that starts from now on.

    Returns the undo action: the last one restores trio's ``setup_runner``
    (a run already going keeps its instrument, which does
    nothing once its listeners are gone).
    """
    global _finder
    with _lock:
        _listeners.append(listener)
        trio = sys.modules.get("trio")
        if trio is not None:
            _patch(trio)
        elif _finder is None:
            _finder = _PatchAfterImport()
            sys.meta_path.insert(0, _finder)

    def undo() -> None:
        with _lock:
            if listener not in _listeners:
                return
            _listeners.remove(listener)
            if not _listeners:
                _remove_finder()
                _unpatch()

    return undo
