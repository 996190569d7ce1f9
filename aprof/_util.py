"""Small helpers for the public modules."""

from __future__ import annotations

import os
import signal
import sys
from types import ModuleType
from typing import Any, NoReturn

__all__ = ["die_by", "fixup_module_metadata"]


def die_by(signum: int) -> NoReturn:
    """End the process by ``signum`` with its default action, as a program
    with no handler for it ends (the parent sees "killed by signal")."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pragma: no cover - the signal ends the process first


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Make re-exported names report the public module they are used from.

    So reprs, docs and pickles say ``aprof.profile``, not
    ``aprof._core._profiler.profile`` (trio's ``_util.fixup_module_metadata``).
    """
    seen: set[int] = set()

    def fix_one(qualname: str, name: str, obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        mod = getattr(obj, "__module__", None)
        if mod is not None and mod.startswith("aprof."):
            try:
                obj.__module__ = module_name
            except (AttributeError, TypeError):
                return
            if isinstance(obj, type):
                obj.__name__ = name
                obj.__qualname__ = qualname
                for attr_name, attr_value in obj.__dict__.items():
                    fix_one(f"{qualname}.{attr_name}", attr_name, attr_value)

    for objname, obj in list(namespace.items()):
        if not objname.startswith("_") and not isinstance(obj, ModuleType):
            fix_one(objname, objname, obj)
