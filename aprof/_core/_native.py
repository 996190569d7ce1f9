"""The C extension ``aprof._ctracer``, if it is built and not switched off.

aprof has one C extension with two halves (the Python tracer, SPEC 8.1, and
the range fast path under ``record_function``), each with a pure-Python twin
of the same interface. Setting ``APROF_PURE_PYTHON=1`` in the environment
before aprof is imported makes aprof use the twins even when the extension
is built: the test suite runs the core tests that way too, so both paths
keep the same meaning.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final

__all__ = ["FORCED_PURE", "extension"]

#: Whether the environment asked for the pure-Python twins.
FORCED_PURE: Final = os.environ.get("APROF_PURE_PYTHON", "") not in ("", "0")


def _load() -> ModuleType | None:
    if FORCED_PURE:
        return None
    try:
        from .. import _ctracer
    except ImportError:
        return None
    return _ctracer


#: The extension module, or None (not built, or ``APROF_PURE_PYTHON=1``).
extension: Final = _load()
