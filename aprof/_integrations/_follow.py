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
a new program (gunicorn's workers, ``multiprocessing``'s ``fork`` and
``forkserver`` children): no bootstrap runs there, so a following process
(``aprof run``'s, a followed child, the forkserver) registers a fork hook
that detaches the child's copies of the parent's profiles (emptied at the
fork) and starts the child's own, saved as a followed child's is. An
``exec`` replaces the program: what ran before it in that process is not
recorded; the program it becomes is, if it is Python.

At the end, ``aprof run`` merges the sessions it finds into its own (each
process its own group of tracks, named by pid and command line) and names
in ``session.lost`` each child still running (a ``.part`` alone), then
removes the directory and restores the environment.
"""

from __future__ import annotations

import contextlib
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
    if "multiprocessing.forkserver" in command:
        # The server runs none of the program's code, but every process it
        # forks runs some: those are followed.
        options = _options(home)
        if options is not None:
            follow_forks(home, options, command)
        return
    if any(m in command for m in _MACHINERY):
        return  # multiprocessing's own servers: they outlive the program and run none of its code
    options = _options(home)
    if options is not None:
        _begin(home, options, command)


def _options(home: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(home, "options.json"), encoding="utf-8") as f:
            options: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return None  # aprof run has finished: nobody would read this profile
    except Exception as exc:  # noqa: BLE001 - the program runs anyway
        _warn(f"could not profile child process {os.getpid()} ({type(exc).__name__}: {exc})")
        return None
    return options


def _warn(message: str) -> None:
    with contextlib.suppress(Exception):
        warnings.warn(f"aprof: {message}", stacklevel=3)


def _begin(home: str, options: dict[str, Any], command: str, guard: bool = True) -> None:
    """Profile this process (node id = its pid) into ``home``, saved at its
    end or (``guard``) at SIGTERM; its forks are followed too. Never raises."""
    global _current, _claimed
    if guard:
        _guard_signals()  # first: a signal from now on leaves no half-made file
    try:
        from .._core._profiler import profile

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
        _claimed = part
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(command)
        prof = profile(node_id=pid, **options)
        prof.start()
    except FileNotFoundError:
        _claimed = None
        return  # aprof run has finished: nobody would read this profile
    except Exception as exc:  # noqa: BLE001 - the program runs anyway
        if _claimed is not None:
            with contextlib.suppress(OSError):
                os.unlink(_claimed)
            _claimed = None
        _warn(f"could not profile child process {os.getpid()} ({type(exc).__name__}: {exc})")
        return
    _current = (prof, part, pid, command)
    _own.append(prof)
    _claimed = None
    threading._register_atexit(_finish_child, prof, part, pid, command)  # type: ignore[attr-defined]
    follow_forks(home, options, command)
    if guard and "asyncio" in sys.modules:
        # A server's worker may put SIGTERM back to its default after the
        # fork (gunicorn's UvicornWorker does, before its loop starts):
        # the handler goes in again when the program makes its loop.
        from ._asyncio import on_new_loops

        on_new_loops(_on_new_loop)


#: The signals whose default action ends the process before any exit hook runs.
_ENDING: Final = (signal.SIGTERM, signal.SIGINT)

#: The profile this process saves at its end: (profile, .part path, pid, command line).
_current: tuple[Any, str, int, str] | None = None
#: The .part of a profile being started (a signal then removes it: nothing was recorded yet).
_claimed: str | None = None
#: A save is under way; the signal that came meanwhile, delivered after it.
_busy = False
_pending: int | None = None


def _guard_signals() -> None:
    """A program ended by SIGTERM (or SIGINT, where the program put it back
    to the default) runs no exit hook: a server's worker told to stop
    (uvicorn's re-raises the signal after its graceful shutdown, with the
    handler it found) would take its profile with it. Where the program has
    no handler of its own, save the profile first, then end by the signal
    as the program would have. Main thread only (signals are set there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _ENDING:
        handler = signal.getsignal(signum)
        if handler is signal.SIG_DFL or _inherited(handler):
            signal.signal(signum, _on_signal)


def _inherited(handler: Any) -> bool:
    """Whether ``handler`` is aprof's, inherited through a fork: aprof
    run's (it ends a fork at once) or a followed parent's."""
    if handler is _on_signal:
        return True
    owner = getattr(handler, "__self__", None)
    return type(owner).__name__ == "_Finish" and type(owner).__module__ == "aprof._cli._main"


def _on_new_loop(loop: Any) -> None:
    _guard_signals()


def _on_signal(signum: int, frame: Any) -> None:
    global _pending
    if _busy:
        _pending = signum  # the save under way ends the process by it
        return
    current = _current
    if current is not None and os.getpid() == current[2]:
        _finish_child(*current)
    elif _claimed is not None:
        with contextlib.suppress(OSError):
            os.unlink(_claimed)  # being started: nothing recorded yet
    die_by(signum)


def step_aside() -> None:
    """This process runs work a profile sent it (a process pool's worker,
    a ``multiprocessing`` child started under ``install_propagation``): that
    profile records the work, with its link to the submit. This process's
    own profile, which would count the work twice, is dropped, and so is its
    ``.part`` (nothing is lost). Its forks are still followed."""
    global _current
    current = _current
    if current is None or current[2] != os.getpid():
        return
    _current = None
    prof, part, _, _ = current
    _saved.add(part)
    with contextlib.suppress(Exception):
        prof._forget()
    with contextlib.suppress(OSError):
        os.unlink(part)


#: Command lines of multiprocessing's helper processes, left alone.
_MACHINERY: Final = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


#: The profiles _finish_child saved (the exit hook and the SIGTERM handler may both come).
_saved: set[str] = set()


def _finish_child(prof: Any, part: str, pid: int, command: str) -> None:
    global _busy
    if os.getpid() != pid or part in _saved:
        return  # a forked copy of the child (not the program that was followed), or saved already
    _saved.add(part)
    _busy = True
    try:
        _save(prof, part, pid, command)
    finally:
        _busy = False
    if _pending is not None:
        die_by(_pending)  # a SIGTERM that came while saving: the end it asked for


def _save(prof: Any, part: str, pid: int, command: str) -> None:
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
        _warn(f"could not save the profile of child process {pid} ({type(exc).__name__}: {exc})")


# -- forks -------------------------------------------------------------------

#: While this process follows (aprof run's program, a followed child,
#: multiprocessing's forkserver): the directory, the options, and the
#: command line its forks are named by.
_following: tuple[str, dict[str, Any], str] | None = None
_fork_hook = False
#: The profiles aprof started to follow this process (aprof run's own, a
#: followed child's): a fork detaches its copies of them.
_own: list[Any] = []


def follow_forks(home: str, options: dict[str, Any], command: str) -> None:
    """Follow the processes this one forks from now on (a fork runs the
    program's code, as gunicorn's workers do): each profiles itself as a
    child of its own, named by ``command`` and the pid that forked it."""
    global _following, _fork_hook
    _following = (home, options, command)
    if not _fork_hook:
        # Registered now, after the profiler's own fork hooks (they run in
        # registration order): those empty the parent's profiles in the
        # child first, then this one starts the child's.
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook = True


def stop_following_forks() -> None:
    global _following
    _following = None


def _forked_by(function: str, module: str) -> bool:
    """Whether ``module.function`` is on the stack of the fork that runs the fork hooks."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _after_fork_in_child() -> None:
    global _current, _claimed, _busy, _pending
    following = _following
    _current = _claimed = _pending = None  # the parent's profile is not this process's to save
    _busy = False
    if following is None:
        return
    home, options, command = following
    if _forked_by("_execute_child", "subprocess"):
        # subprocess runs the fork hooks for a preexec_fn, then execs: the
        # program it becomes is followed, if it is Python.
        return
    # aprof's own profiles of the parent (aprof run's, a followed child's),
    # emptied by the profiler's fork hook, are detached here: their hooks
    # would cost the child for nothing. The program's own profiles are
    # left as the fork made them (RELIABILITY LC-01: their stop() in the
    # child gives an empty session).
    for prof in _own:
        with contextlib.suppress(Exception):
            prof._forget()
    _own.clear()
    # A multiprocessing fork child gets no signal handler of aprof's, and
    # loses the one aprof run's process has: CPython can miss a Python-level
    # SIGTERM handler's signal in a forked Pool worker that waits on its
    # task queue, and Pool.terminate() (what `with Pool()` does at its end)
    # then waits for it forever. Such a child saves at its normal end
    # (Process._bootstrap runs the threading exit hooks); one ended by
    # terminate() is named in session.lost.
    guard = not _forked_by("_launch", "multiprocessing.popen_fork")
    if not guard and threading.current_thread() is threading.main_thread():
        for signum in _ENDING:
            if _inherited(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)  # what the program had: aprof run's took its place
    _begin(home, options, f"{command} (forked by pid {os.getppid()})", guard)


def _why_lost(pid: int) -> str:
    """Why the process ``pid`` left no profile: it runs on, or it ended
    without the exit that saves one (SIGKILL, a crash, ``os._exit``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[:1]
        running = state != ["Z"]
    except FileNotFoundError:
        running = False
    except OSError:
        try:
            os.kill(pid, 0)
            running = True
        except ProcessLookupError:
            running = False
        except OSError:
            running = True
    if running:
        return "still running when the profiled program ended"
    return "ended without saving its profile (killed by SIGKILL, crashed, or left by os._exit)"


class Follow:
    """``aprof run``'s side: the directory and the environment, while the
    program runs; the children's sessions merged at its end."""

    def __init__(self, options: dict[str, Any], command: str | None = None, own: Any = None) -> None:
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
        if own is not None:
            _own.append(own)  # aprof run's profile: a fork detaches its copy
        follow_forks(self.dir, options, shlex.join(sys.argv) if command is None else command)

    def restore(self) -> None:
        """Put the environment back as it was, and follow no more forks (idempotent)."""
        stop_following_forks()
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
                    lost.append({"node_id": pid, "pid": pid, "name": who, "reason": _why_lost(pid)})
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
