"""Whose code a frame is: the user's, or a library's (stdlib, site-packages, aprof).

A summary that names ``selectors.py:468 select`` or ``base_events.py:1922
_run_once`` has named nothing a user can change. Stacks are kept whole in
the events (``FunctionEvent.stack``, innermost first); what is *shown* is
the user's own frames, outermost first, with each run of library frames
collapsed into one line. The same test picks the nearest user frame for a
spawn site or a blocked task's culprit.

Used both while recording (one ``startswith`` per frame, on a path only a
loop block or a spawn takes) and at display time; it imports nothing of
aprof.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "Frame", "format_frame", "innermost_user_frame", "is_library_file", "short_path", "shown_stack", "user_site",
]  # fmt: skip

#: (file, line, function), as ``FunctionEvent.stack`` holds them.
Frame = tuple[str, int, str]

_APROF_DIR: Final = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _library_dirs() -> tuple[str, ...]:
    dirs = {_APROF_DIR}
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = paths.get(key)
        if p:
            dirs.add(os.path.abspath(p) + os.sep)
    for p in (sys.base_prefix, sys.prefix):
        # The interpreter's own lib directory, however the venv is laid out.
        dirs.add(os.path.join(os.path.abspath(p), "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}") + os.sep)
    return tuple(sorted(dirs))


_LIBRARY_DIRS: Final = _library_dirs()
_PACKAGE_MARKERS: Final = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is not the user's code: the standard library,
    an installed package, aprof itself, or a frozen/generated module
    (``<frozen importlib._bootstrap>``, ``<string>``)."""
    if not filename or filename.startswith("<"):
        return True
    if filename.startswith(_LIBRARY_DIRS):
        return True
    # uvloop's Cython frames are named "uvloop/loop.pyx"; packages installed
    # elsewhere still sit under a site-packages directory.
    return any(m in filename for m in _PACKAGE_MARKERS) or filename.startswith("uvloop/")


_library_cache: dict[str, bool] = {}


def is_library_cached(filename: str) -> bool:
    """:func:`is_library_file`, with the verdict per file name cached."""
    lib = _library_cache.get(filename)
    if lib is None:
        if len(_library_cache) > 4096:
            _library_cache.clear()
        lib = _library_cache[filename] = is_library_file(filename)
    return lib


def user_site(skip: int = 0) -> Frame | None:
    """The nearest frame of the user's code above the caller's (``skip``
    more frames up): where a task was spawned or a job submitted, past
    ``asyncio.create_task``, ``TaskGroup.create_task``, anyio's
    ``start_soon`` and aprof's own hooks. None if the stack is all library.

    For spawn and submit hooks: a few frames' walk, with the verdict per
    file name cached (about 0.1 us a frame).
    """
    try:
        f = sys._getframe(skip + 1)
    except ValueError:
        return None
    cache = _library_cache
    while f is not None:
        code = f.f_code
        filename = code.co_filename
        lib = cache.get(filename)
        if lib is None:
            if len(cache) > 4096:
                cache.clear()
            lib = cache[filename] = is_library_file(filename)
        if not lib:
            return (filename, f.f_lineno or 0, code.co_qualname)
        f = f.f_back  # type: ignore[assignment]
    return None


def short_path(filename: str) -> str:
    """A path short enough to read in a summary (SPEC 8.2): relative to
    the working directory when it is inside it; an installed package's or
    the standard library's from its top-level directory; any other file as
    its directory's name and its own (``examples/app.py``)."""
    for marker in _PACKAGE_MARKERS:
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i + len(marker) :]
    try:
        cwd = os.getcwd() + os.sep
    except OSError:
        cwd = ""
    if cwd and filename.startswith(cwd):
        return filename[len(cwd) :]
    for d in _LIBRARY_DIRS:
        if filename.startswith(d):
            return filename[len(d) :]
    if os.path.isabs(filename):
        parent = os.path.basename(os.path.dirname(filename))
        return os.path.join(parent, os.path.basename(filename)) if parent else filename
    return filename


def format_frame(frame: Sequence[object]) -> str:
    """``file:line function`` with the file shortened."""
    filename, line, function = frame[0], frame[1], frame[2]
    return f"{short_path(str(filename))}:{line} {function}"


def innermost_user_frame(stack: Iterable[Sequence[object]] | None) -> Frame | None:
    """The innermost frame of the user's code in ``stack`` (innermost first), or None."""
    for f in stack or ():
        if not is_library_file(str(f[0])):
            return (str(f[0]), int(str(f[1])), str(f[2]))
    return None


def shown_stack(stack: Iterable[Sequence[object]] | None, limit: int = 12) -> list[str]:
    """The lines to show for ``stack`` (innermost first, as recorded):
    outermost first, the user's frames as ``file:line function``, each run
    of library frames as one ``... N library frames (module, ...)`` line;
    at most ``limit`` user frames, the innermost kept."""
    frames = [(str(f[0]), int(str(f[1])), str(f[2])) for f in stack or ()]
    frames.reverse()
    lines: list[str] = []
    run: list[Frame] = []

    def flush() -> None:
        if run:
            mods = []
            for filename, _, _ in run:
                mod = os.path.splitext(os.path.basename(short_path(filename)))[0] or filename
                if mod not in mods:
                    mods.append(mod)
            shown = ", ".join(mods[:3]) + (", ..." if len(mods) > 3 else "")
            lines.append(f"... {len(run)} library frame{'s' if len(run) != 1 else ''} ({shown})")
            run.clear()

    user = 0
    for f in frames:
        if is_library_file(f[0]):
            run.append(f)
        else:
            flush()
            lines.append(format_frame(f))
            user += 1
    if run and user:
        # Below the innermost user frame: what it called (time.sleep, a
        # library's parser). Name the first call, collapse the rest.
        first = run.pop(0)
        lines.append(f"-> {format_frame(first)}")
        flush()
    else:
        flush()
    if user > limit:
        kept: list[str] = []
        seen = 0
        for line in reversed(lines):
            if not line.startswith(("...", "->")):
                seen += 1
                if seen > limit:
                    kept.append(f"... {user - limit} outer frames")
                    break
            kept.append(line)
        lines = list(reversed(kept))
    return lines
