"""Writing output files safely: clear errors, and never half a file.

Every exporter writes to a temporary file beside the target and renames it
into place, so a failure (a full disk, an interrupt) leaves the target as it
was, and the data is still in memory for a retry.
"""

from __future__ import annotations

import gzip
import os
import stat
import tempfile
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._post._session import Session

__all__ = ["atomic_write_bytes", "atomic_write_text", "check_output_path", "write_by_suffix"]


def write_by_suffix(
    session: Session, out: Path, max_events: int | None = None, html_budget: int | None = None
) -> None:
    """Write ``session`` to ``out`` in the format its name says, as
    ``aprof run -o`` does: ``.aprof`` (session), ``.speedscope.json``,
    ``.folded``, ``.html``, else a Chrome trace (``.json``, ``.json.gz``)."""
    name = out.name.lower()
    if name.endswith(".aprof"):
        session.save(out)
    elif name.endswith(".speedscope.json"):
        session.export_speedscope(out)
    elif name.endswith(".folded"):
        session.export_folded(out)
    elif name.endswith(".html"):
        if html_budget is None:
            session.export_html(out)
        else:
            session.export_html(out, html_budget)
    else:
        session.export_chrome_trace(out, max_events)


def check_output_path(path: object, what: str, suffixes: tuple[str, ...]) -> Path:
    """Validate an output path before any work is done.

    Raises:
        TypeError: ``path`` is not a str or path-like (e.g. a file object).
        ValueError: the name does not end in one of ``suffixes``.
        FileNotFoundError: the directory does not exist.
        IsADirectoryError: the path is a directory.
        PermissionError: the path is a read-only file.
    """
    if not isinstance(path, (str, PathLike)):
        raise TypeError(f"{what}: expected a file path (str or os.PathLike), got {type(path).__name__}")
    p = Path(path)
    name = p.name.lower()
    if not any(name.endswith(s) for s in suffixes):
        raise ValueError(f"{what}: cannot tell the format of {str(p)!r}: the name must end in one of {', '.join(suffixes)}")
    if p.is_dir():
        raise IsADirectoryError(f"{what}: {str(p)!r} is a directory, not a file path")
    parent = p.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"{what}: cannot write {str(p)!r}: directory {str(parent)!r} does not exist")
    if p.exists():
        mode = p.stat().st_mode
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(p, os.W_OK):
            raise PermissionError(f"{what}: cannot write {str(p)!r}: the file is read-only")
    return p


def atomic_write_text(path: Path, chunks: Iterable[str], *, compress: bool, what: str) -> None:
    """Write ``chunks`` to ``path`` through a temporary file and a rename.

    Raises:
        OSError: writing failed; the message names ``path``. The target is
            untouched and no temporary file is left behind.
    """
    # Every format escapes what UTF-8 cannot hold (JSON's \udcXX, the folded
    # format's Python escape); "backslashreplace" is the safety net that keeps
    # any file valid UTF-8 should a lone surrogate still get here.
    _atomic_write(path, (c.encode("utf-8", "backslashreplace") for c in chunks), compress=compress, what=what)


def atomic_write_bytes(path: Path, chunks: Iterable[bytes], *, what: str) -> None:
    """:func:`atomic_write_text` for binary chunks, written as they are."""
    _atomic_write(path, chunks, compress=False, what=what)


def _atomic_write(path: Path, chunks: Iterable[bytes], *, compress: bool, what: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            # mkstemp makes the file 0o600; give it the mode open(path, "w") would.
            os.fchmod(raw.fileno(), _mode_for(path))
            if compress:
                with gzip.GzipFile(filename=path.name[:-3], mode="wb", fileobj=raw, compresslevel=6, mtime=0) as gz:
                    for chunk in chunks:
                        gz.write(chunk)
            else:
                for chunk in chunks:
                    raw.write(chunk)
            raw.flush()
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise OSError(exc.errno, f"{what}: cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    except BaseException:
        _remove_quietly(tmp)
        raise


def _mode_for(path: Path) -> int:
    """The existing file's permission bits, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # Read it from /proc: os.umask() can only be read by setting it, which
    # races with files other threads create meanwhile.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
