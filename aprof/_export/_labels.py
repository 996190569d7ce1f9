"""What the viewers call things, so that every view agrees with the summary.

The summary (``key_averages``) groups tasks by coroutine (``task fetch``) and
executor jobs by function (``executor render``). The flame graphs, speedscope
profiles and folded stacks name those frames the same way, so a row of the
summary can be found in every view; a track keeps the task's own name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core._callbacks import RecordScope

if TYPE_CHECKING:
    from .._post._events import FunctionEvent

__all__ = ["frame_label"]


def frame_label(ev: FunctionEvent) -> str:
    """The name of ``ev``'s frame in a call tree: the summary's key."""
    scope = ev.scope
    if scope is RecordScope.TASK:
        extra = ev.extra
        coro = extra.get("coro") if extra else None
        if coro:
            return f"task {coro}"
    elif scope is RecordScope.EXECUTOR:
        return f"executor {ev.name}"
    return ev.name
