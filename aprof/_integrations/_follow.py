"""``aprof run`` follows the Python programs it starts (issue 20 item 3).

A child program is a stranger: no context and no pickle reach it, only its
environment. ``aprof run`` (unless ``--no-follow``) makes a private
directory (``tempfile.mkdtemp``: mode 0700, in the system's temp dir) with

* ``options.json``: the profile's options, as ``aprof run`` was given them;
* ``boot/sitecustomize.py``: a bootstrap that Python imports at startup,

and, while the program runs, sets ``APROF_FOLLOW`` to the directory and
puts ``boot`` first on ``PYTHONPATH``. Every Python that starts with that
environment (``subprocess``, ``os.exec*``, ``os.system``, a
``multiprocessing`` spawn or forkserver child, a grandchild) imports the
bootstrap, which:

* takes ``boot`` off its ``sys.path`` (the program's path is its own);
* if it can import this aprof, starts a profile with the same options
  (node id = its pid), claims ``<pid>-<random>.part`` in the directory
  (with its command line), and at its end (before its threads are joined: ``threading._register_atexit``,
  which also runs in a ``multiprocessing`` child that leaves by
  ``os._exit``) writes its session there and renames it ``.aprof``;
  a Python without aprof (another interpreter, another venv) is left
  alone;
* runs the ``sitecustomize`` it shadows, if there is one.

A program that is not Python ignores both variables. A forked child is not
a new program: it records nothing (the parent's profiles are emptied in a
fork). An ``exec`` replaces the program: what ran before it in that
process is not recorded; the program it becomes is, if it is Python.

At the end, ``aprof run`` merges the sessions it finds into its own (each
process its own group of tracks, named by pid and command line) and names
in ``session.lost`` each child still running (a ``.part`` alone), then
removes the directory and restores the environment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from typing import Any, Final

from .._util import die_by

__all__ = ["Follow", "start_child"]

ENV: Final = "APROF_FOLLOW"

#: The bootstrap. It must run on any Python 3 that sees the environment,
#: and do nothing when it is not this aprof's (the directory does not
#: match, aprof cannot be imported).
BOOTSTRAP: Final = '''\
"""aprof run's bootstrap: profiles this Python program for the aprof run
that started it (APROF_FOLLOW); a no-op anywhere else."""


def _aprof_follow():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    home = os.environ.get("APROF_FOLLOW")
    if home and os.path.abspath(home) == os.path.dirname(here):
        try:
            from aprof._integrations._follow import start_child
        except Exception:
            pass  # a Python without this aprof: left alone
        else:
            start_child(home)
    # The sitecustomize this one shadows, if any, as if it were the only one.
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_aprof_follow()
del _aprof_follow
'''


def _command_line() -> str:
    """This process's command line, as it was started (``sys.argv`` is not
    set yet when the bootstrap runs, and ``-c``/``-m`` hide it)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        return shlex.join(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
    except OSError:
        return shlex.join([sys.executable, *sys.argv])


def start_child(home: str) -> None:
    """In a child Python: profile this program for the ``aprof run`` whose
    directory is ``home``. Never raises: the program runs either way."""
    command = _command_line()
    if any(m in command for m in _MACHINERY):
        return  # multiprocessing's own servers: they outlive the program and run none of its code
    try:
        from .._core._profiler import profile

        with open(os.path.join(home, "options.json"), encoding="utf-8") as f:
            options = json.load(f)
        pid = os.getpid()
        # A .part of this pid is a program this process was before an exec
        # (it cannot be running): what it recorded is gone with it.
        for n in os.listdir(home):
            if n.startswith(f"{pid}-") and n.endswith(".part"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(home, n))
        # Says which process is running (named as lost, by its command
        # line, if it does not finish before aprof run does). Unique: a pid
        # may come again.
        part = os.path.join(home, f"{pid}-{os.urandom(4).hex()}.part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(command)
        prof = profile(node_id=pid, **options)
        prof.start()
    except FileNotFoundError:
        return  # aprof run has finished: nobody would read this profile
    except Exception as exc:  # noqa: BLE001 - the program runs anyway
        with contextlib.suppress(Exception):
            warnings.warn(f"aprof: could not profile child process {os.getpid()} ({type(exc).__name__}: {exc})", stacklevel=2)
        return
    threading._register_atexit(_finish_child, prof, part, pid, command)  # type: ignore[attr-defined]
    # A program ended by SIGTERM runs no exit hook: a server's worker told
    # to stop (uvicorn's re-raises the signal after its graceful shutdown,
    # with the handler it found) would take its profile with it. Where the
    # program has no handler of its own, save the profile first, then end
    # by the signal as the program would have.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, prof, part, pid, command))


def _on_sigterm(prof: Any, part: str, pid: int, command: str, signum: int, frame: Any) -> None:
    if os.getpid() == pid:  # not a forked copy of the child
        _finish_child(prof, part, pid, command)
    die_by(signum)


#: Command lines of multiprocessing's helper processes, left alone.
_MACHINERY: Final = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


#: The profiles _finish_child saved (the exit hook and the SIGTERM handler may both come).
_saved: set[str] = set()


def _finish_child(prof: Any, part: str, pid: int, command: str) -> None:
    if os.getpid() != pid or part in _saved:
        return  # a forked copy of the child (not the program that was followed), or saved already
    _saved.add(part)
    try:
        from .._post._binary import write_binary

        prof.stop()
        session = prof.session
        session.metadata["commands"] = {str(pid): command}
        with open(part, "wb") as f:  # over the command line it held
            f.writelines(write_binary(session))
        os.replace(part, part[: -len(".part")] + ".aprof")
    except FileNotFoundError:
        pass  # aprof run finished meanwhile: it names this process as lost
    except Exception as exc:  # noqa: BLE001 - never fail the program for its profile
        with contextlib.suppress(OSError):
            os.unlink(part)
        with contextlib.suppress(Exception):
            warnings.warn(f"aprof: could not save the profile of child process {pid} ({type(exc).__name__}: {exc})", stacklevel=2)


class Follow:
    """``aprof run``'s side: the directory and the environment, while the
    program runs; the children's sessions merged at its end."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.dir = tempfile.mkdtemp(prefix="aprof-follow-")
        try:
            boot = os.path.join(self.dir, "boot")
            os.mkdir(boot, 0o700)
            with open(os.path.join(boot, "sitecustomize.py"), "w", encoding="utf-8") as f:
                f.write(BOOTSTRAP)
            with open(os.path.join(self.dir, "options.json"), "w", encoding="utf-8") as f:
                json.dump(options, f)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self._saved = {k: os.environ.get(k) for k in (ENV, "PYTHONPATH")}
        path = os.environ.get("PYTHONPATH")
        os.environ[ENV] = self.dir
        os.environ["PYTHONPATH"] = boot if not path else boot + os.pathsep + path

    def restore(self) -> None:
        """Put the environment back as it was (idempotent)."""
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved = {}

    def collect(self, session: Any, command: str | None = None) -> Any:
        """``session`` (aprof run's own) with the children's merged in; the
        directory is removed."""
        from .._post._merge import merge_children
        from .._post._session import load

        self.restore()
        children = []
        lost: list[dict[str, Any]] = []
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            names = []
        for n in names:
            stem, _, ext = n.partition(".")
            head, _, tag = stem.partition("-")
            if not head.isdigit() or not tag or ext not in ("aprof", "part"):
                continue
            pid = int(head)
            if ext == "part":
                if f"{stem}.aprof" not in names:
                    try:
                        with open(os.path.join(self.dir, n), encoding="utf-8", errors="replace") as f:
                            who = f.read(1000) or f"process {pid}"
                    except OSError:
                        who = f"process {pid}"
                    lost.append({"node_id": pid, "pid": pid, "name": who, "reason": "still running when the profiled program ended"})
                continue
            try:
                children.append(load(os.path.join(self.dir, n)))
            except (OSError, ValueError) as exc:
                lost.append({"node_id": pid, "pid": pid, "name": f"process {pid}", "reason": f"its profile could not be read ({exc})"})
        shutil.rmtree(self.dir, ignore_errors=True)
        if command is not None:
            node = session.metadata.get("node_id", 0)
            session.metadata["commands"] = {**(session.metadata.get("commands") or {}), str(node): command}
        return merge_children(session, children, lost)
