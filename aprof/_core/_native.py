"""The C extension ``aprof._ctracer``, if it is built and not switched off.

aprof has one C extension with two halves (the Python tracer, SPEC 8.1, and
the range fast path under ``record_function``), each with a pure-Python twin
of the same interface. Setting ``APROF_PURE_PYTHON=1`` in the environment
before aprof is imported makes aprof use the twins even when the extension
is built: the test suite runs the core tests that way too, so both paths
keep the same meaning.

The switch reads the way environment switches usually do (case and
surrounding spaces ignored): ``1``, ``true``, ``yes`` or ``on`` select the
twins; unset, empty, ``0``, ``false``, ``no`` or ``off`` leave the extension
on. Any other value also leaves it on, and ``aprof._core._callbacks`` warns
once, naming the value (it cannot warn from here: the warning class lives
there, and that module imports this one).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Final

__all__ = ["FORCED_PURE", "TASK_RECORD_TYPES", "UNRECOGNISED_SWITCH", "extension", "new_task_record", "parse_switch"]

_ON: Final = frozenset(("1", "true", "yes", "on"))
_OFF: Final = frozenset(("", "0", "false", "no", "off"))


def parse_switch(value: str | None) -> bool | None:
    """What an ``APROF_PURE_PYTHON`` value asks for: True (the twins),
    False (the extension), or None (not a value aprof knows)."""
    if value is None:
        return False
    word = value.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    return None


_asked = parse_switch(os.environ.get("APROF_PURE_PYTHON"))

#: Whether the environment asked for the pure-Python twins.
FORCED_PURE: Final = _asked is True

#: The ``APROF_PURE_PYTHON`` value when it was none of the known words
#: (the extension stays on, and aprof warns once at import), else None.
UNRECOGNISED_SWITCH: Final = os.environ.get("APROF_PURE_PYTHON") if _asked is None else None


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

#: Makes a finished task's record from its fields
#: (``aprof._integrations._tasks.TASK_RECORD_FIELDS``): the extension's
#: ``TaskRecord``, a sequence of them that is no GC container (a record per
#: request would otherwise bring the collector's young collections several
#: times as often), else a tuple of them.
new_task_record: Final[Any] = extension.TaskRecord if extension is not None else (lambda *fields: fields)

#: The types a finished task's record can have (a running task's is its
#: ``TaskThread``): the extension's ``TaskRecord``, or the twin's tuple.
TASK_RECORD_TYPES: Final = frozenset((tuple,) if extension is None else (tuple, extension.TaskRecord))
