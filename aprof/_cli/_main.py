"""``aprof`` on the command line (SPEC 10.1).

``aprof run [options] script.py [args...]`` or ``aprof run -m module
[args...]`` profiles a program from its first line, prints the summary
(the table, then what was slow, in which task, and why) and writes the
trace, even when the program raises, exits, is interrupted (Ctrl-C) or
terminated (SIGTERM). Everything after the script or module belongs to the
program, exactly as ``python`` passes it on, and the exit status is the one
the program would have had without aprof. ``aprof report FILE`` prints the
summary of a session, a Chrome trace or an HTML report; ``aprof convert IN
OUT`` rewrites one of those in the format OUT's name asks for.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from .. import _version
from .._core._memory import DEFAULT_INTERVAL as DEFAULT_MEMORY_INTERVAL
from .._core._memory import check_memory_interval
from .._core._profiler import profile
from .._core._propagation import install_propagation, uninstall_propagation
from .._export._files import check_output_path, write_by_suffix
from .._export._html import DEFAULT_BUDGET
from .._post._analysis import _SORT_KEYS
from .._post._compact import LOD_KEY
from .._post._readers import read_profile
from .._post._session import Session
from .._util import die_by

if TYPE_CHECKING:
    from .._integrations._follow import Follow

__all__ = ["main"]

_FORMATS = (".json", ".json.gz", ".speedscope.json", ".html", ".folded", ".aprof")


class _UsageError(Exception):
    """A one-line error for the user, printed without a traceback."""


#: Loop blocks are recorded by default under ``aprof run`` from this long on (seconds).
DEFAULT_LOOP_BLOCK_THRESHOLD: Final = 0.05

#: aprof run's options that take a value (the rest are flags): the command
#: line is split by hand at the script or ``-m module``, so that whatever
#: follows is the program's, untouched.
_RUN_VALUE_OPTIONS: Final = ("-o", "--output", "--scope", "--max-events", "--max-bytes", "--keep", "--html-budget", "--loop-block-threshold", "--sort", "--row-limit", "--memory-interval")


_HTML_BUDGET_HELP: Final = (
    f"for an HTML report (-o x.html): events shown in full (default {DEFAULT_BUDGET:,}); past it the report keeps "
    "tasks, executor jobs, loop blocks and the longest ranges, merges the rest into blocks and says so"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aprof", description="A profiler for async Python.")
    p.add_argument("--version", action="version", version=f"aprof {_version.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="profile a Python program",
        usage="aprof run [options] (script.py | -m module) [args ...]",
        description=(
            "Profile a script or module from its first line, print the summary (the table, then what was slow, "
            "in which task, and why) to stderr, and write the trace. aprof's options go before the script or "
            "-m module; everything after it is passed to the program exactly as python passes it. The exit "
            "status is the program's, also when it is interrupted (Ctrl-C) or terminated (SIGTERM), after the "
            "trace is written."
        ),
    )
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script (like python -m); the rest of the line is its arguments")
    run.add_argument("-o", "--output", metavar="FILE", help=f"write the trace here; format from the name: {', '.join(_FORMATS)} (default: <program>.trace.json); an unwritable FILE is refused before the program runs")
    run.add_argument("--scope", choices=("context", "global"), default="global", help="record the whole process (global, the default) or only the main context and what it spawns")
    run.add_argument("--propagate", action="store_true", help="carry the caller's context into run_in_executor, ThreadPoolExecutor.submit and threading.Thread (install_propagation)")
    run.add_argument(
        "--no-follow-executors",
        action="store_true",
        help="do not record bare thread-pool jobs (run_in_executor, ThreadPoolExecutor.submit) as executor ranges linked to the task that submitted them (on by default; they run in their own context either way)",
    )
    run.add_argument("--with-stack", action="store_true", help="attach the Python stack to each range")
    run.add_argument("--python-tracer", action="store_true", help="record every Python function call and return, on the tracks of the tasks that made them")
    run.add_argument("--c-calls", action="store_true", help="with --python-tracer, record the C functions Python code calls too (costs more: on 3.11 several times)")
    run.add_argument("--no-c-calls", action="store_true", help="with --python-tracer, Python frames only: the default now, accepted so older command lines still run")
    run.add_argument("--max-events", type=_positive_int, metavar="N", help="hold at most N events while recording (ranges, instants, tasks, loop blocks; and N raw tracer events, N samples) and count the rest as dropped")
    run.add_argument("--max-bytes", type=_positive_int, metavar="B", help="hold at most B bytes of recorded events (at least 65536; a range is 48 bytes)")
    run.add_argument("--keep", choices=("first", "latest"), default="first", help="past --max-events/--max-bytes: keep the first events (default), or the latest (a ring: the oldest whole events are let go)")
    run.add_argument("--html-budget", type=_positive_int, metavar="N", help=_HTML_BUDGET_HELP)
    run.add_argument(
        "--sample",
        nargs="?",
        const=0.001,
        type=_sample_interval,
        metavar="INTERVAL",
        help="take a stack sample of every thread running the program every INTERVAL seconds (default 0.001), each on its task's track",
    )
    run.add_argument(
        "--loop-block-threshold",
        type=_positive_seconds,
        default=DEFAULT_LOOP_BLOCK_THRESHOLD,
        metavar="SECONDS",
        help=f"record every stretch in which one task step or callback held the event loop (or trio run) longer than this, with the blocking stack (default {DEFAULT_LOOP_BLOCK_THRESHOLD})",
    )
    run.add_argument("--no-loop-block", action="store_true", help="do not watch for loop blocks")
    run.add_argument(
        "--no-follow",
        action="store_true",
        help="do not profile the Python programs this one starts (subprocess, os.exec*, multiprocessing spawn); by default each is "
        "profiled with the same options and merged into the output as its own process",
    )
    run.add_argument(
        "--control",
        action="store_true",
        help="record nothing at launch: open the control socket (aprof.enable_remote_control()) so that aprof ctl PID start/stop/dump "
        "switches profiling on and off while the program runs; a profile still running at exit is written to -o",
    )
    run.add_argument("--memory", action="store_true", help="track allocations: bytes allocated, net and peak per task and range (profile_memory), sampled every --memory-interval bytes")
    run.add_argument("--memory-interval", type=_memory_interval, metavar="BYTES", help="with --memory, sample an allocation every BYTES on average (default 16384); 0 records every allocation exactly")
    run.add_argument("--sort", default="total", choices=sorted(_SORT_KEYS), help="sort the summary table by this column (default total)")
    run.add_argument("--row-limit", type=int, default=30, help="rows in the summary table (default 30)")
    run.add_argument("--no-summary", action="store_true", help="print neither the summary table nor the sections under it")
    run.add_argument("target", nargs="?", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")

    report = sub.add_parser(
        "report",
        help="print the summary of a saved profile",
        description=(
            "Print the summary of a session (.aprof), a Chrome trace (.json, .json.gz) or an HTML report: the "
            "table, then what was slow, in which task, and why (slowest tasks, what blocked the loop, longest "
            "waits, executor queueing, tasks pending at exit, repeated awaits)."
        ),
    )
    report.add_argument("file", help="the file to read: .aprof, .json, .json.gz or .html")
    report.add_argument("--sort", default="total", choices=sorted(_SORT_KEYS), help="sort the table by this column (default total)")
    report.add_argument("--row-limit", type=int, default=30, help="rows in the table (default 30)")
    report.add_argument(
        "--group-by",
        default="name",
        choices=("name", "track", "stack", "node"),
        help="one row per range name (tasks by coroutine, the default), per track (task or thread), per name and stack, or per process (node)",
    )
    report.add_argument("--no-sections", action="store_true", help="print the table only, not the sections under it")

    convert = sub.add_parser(
        "convert", help="convert a saved profile to another format", description="Read a session, Chrome trace or HTML report and write it in the format OUTPUT's name asks for."
    )
    convert.add_argument("input", help="the file to read: .aprof, .json, .json.gz or .html")
    convert.add_argument("output", help=f"the file to write; format from the name: {', '.join(_FORMATS)}")
    convert.add_argument("--html-budget", type=_positive_int, metavar="N", help=_HTML_BUDGET_HELP)
    convert.add_argument(
        "--max-events",
        type=_positive_int,
        metavar="N",
        help="for a Chrome trace: keep the N longest events (tasks, executor jobs and loop blocks always), for a viewer that cannot load them all",
    )
    from ._ctl import add_parser as add_ctl_parser

    add_ctl_parser(sub, _positive_int, _positive_seconds, _sample_interval, _FORMATS)
    merge = sub.add_parser(
        "merge",
        help="merge the profiles of several processes into one",
        description=(
            "Merge saved sessions (.aprof), aprof Chrome traces and HTML reports of several processes (pool "
            "workers, server workers, separate runs) into one profile: each process on its own tracks under its "
            "own node id, clocks aligned (perf_counter within one boot, wall-clock offsets across machines). "
            "The first file's clock and ids are kept."
        ),
    )
    merge.add_argument("inputs", nargs="+", metavar="FILE", help="the files to merge: .aprof, .json, .json.gz or .html")
    merge.add_argument("-o", "--output", required=True, help=f"the file to write; format from the name: {', '.join(_FORMATS)}")
    merge.add_argument("--html-budget", type=_positive_int, metavar="N", help=_HTML_BUDGET_HELP)
    merge.add_argument(
        "--max-events", type=_positive_int, metavar="N", help="for a Chrome trace: keep the N longest events (tasks, executor jobs and loop blocks always)"
    )
    return p


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``aprof run ...`` into aprof's part and the program's.

    The program's part starts at the script (the first word that is not an
    option of aprof's or its value), or after ``-m MODULE``: what follows is
    handed over untouched, ``--``, ``-q`` and ``--help`` included, as
    ``python`` does.
    """
    i = 1  # argv[0] is "run"
    while i < len(argv):
        word = argv[i]
        if word == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if word.startswith("-m") and not word.startswith("--"):
            return argv[: i + 1], argv[i + 1 :]
        if word == "--":
            # `aprof run -- script.py args`: the script follows.
            return argv[:i] + argv[i + 1 : i + 2], argv[i + 2 :]
        if not word.startswith("-") or word == "-":
            return argv[: i + 1], argv[i + 1 :]
        if word in _RUN_VALUE_OPTIONS:
            i += 2
            continue
        if word == "--sample":
            # Its interval is optional: a bare --sample before the script
            # means the default (argparse would take the script's name).
            if _is_number(argv[i + 1] if i + 1 < len(argv) else ""):
                i += 2
            else:
                argv = [*argv[:i], "--sample=0.001", *argv[i + 1 :]]
                i += 1
            continue
        i += 1
    return argv, []


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


def _memory_interval(text: str) -> int:
    try:
        return check_memory_interval(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes from 0 to 2**40, got {text!r}") from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _sample_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0.00001 to 60, got {text!r}") from None
    if not 1e-5 <= value <= 60:
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0.00001 to 60, got {text!r}")
    return value


def _checked_output(name: str) -> Path:
    """The output path, made absolute (the program may change directory),
    refused now if it cannot be written: before the program runs, not after."""
    out = Path(name)
    if not any(out.name.lower().endswith(s) for s in _FORMATS):
        raise _UsageError(f"cannot tell the format of {name!r}: use a name ending in {', '.join(_FORMATS)}")
    if not out.parent.is_dir():
        raise _UsageError(f"cannot write {name!r}: directory {str(out.parent)!r} does not exist")
    try:
        check_output_path(out, "output", _FORMATS)
    except (OSError, ValueError) as exc:
        raise _UsageError(str(exc).removeprefix("output: ")) from None
    try:  # the directory's permissions, as this process really has them
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=out.parent)
    except OSError as exc:
        raise _UsageError(f"cannot write {name!r}: {exc.strerror or exc} in directory {str(out.parent)!r}") from None
    os.close(fd)
    os.unlink(probe)
    return out.absolute()


def _output_path(args: argparse.Namespace) -> tuple[Path, str]:
    """Where to write the trace, and the name to print for it."""
    name = args.output or f"{args.module if args.module else Path(args.target).stem}.trace.json"
    return _checked_output(name), name


def _is_chrome(out: Path) -> bool:
    """Whether :func:`_write` writes ``out`` as a Chrome trace."""
    name = out.name.lower()
    return not name.endswith((".aprof", ".speedscope.json", ".folded", ".html"))


def _is_html(out: Path) -> bool:
    """Whether :func:`_write` writes ``out`` as an HTML report."""
    return out.name.lower().endswith(".html")


def _write(session: Session, out: Path, max_events: int | None = None, html_budget: int | None = None) -> None:
    write_by_suffix(session, out, max_events, DEFAULT_BUDGET if html_budget is None else html_budget)


class _Finish:
    """Stops the profile, prints the summary and writes the trace, once:
    when the program ends, or from the SIGTERM handler.

    SIGTERM's default is to end the process at once (no ``finally``, no
    atexit), so the handler does not unwind the program: it finishes here
    and then ends the process by SIGTERM, as the program would have ended
    without aprof. A SIGTERM that arrives while finishing is delivered the
    same way after it. A process forked by the program inherits the
    handler, but not the job: there it is the default action at once.
    """

    def __init__(self, prof: profile, args: argparse.Namespace, out: Path, shown: str, undo: list[Callable[[], None]]) -> None:
        self.prof = prof
        self.args = args
        self.out = out
        self.shown = shown
        self.undo = undo
        self.busy = False
        self.pending: int | None = None
        self.pid = os.getpid()
        self._previous: Any = None
        self.follow: Follow | None = None

    def install(self) -> None:
        if threading_main() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def uninstall(self) -> None:
        if self._previous is not None and signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._previous)
        self._previous = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:
            die_by(signum)  # a forked child: not aprof's process
        if self.busy:
            self.pending = signum
            return
        print(f"aprof: terminated ({signal.Signals(signum).name})", file=sys.stderr)
        self.finish(0)
        die_by(signum)

    def finish(self, code: int) -> int:
        """Stop, summarise and write; returns the exit code to use."""
        if os.getpid() != self.pid:
            # A fork of the program that came back here (a gunicorn worker
            # ends by sys.exit through the master's code): the output and
            # the followed children are the parent's. The fork's own
            # profile, if it is followed, is saved at its exit.
            self.prof._forget()
            return code
        self.busy = True
        args = self.args
        try:
            if self.prof.running:
                self.prof.stop()
        finally:
            undo, self.undo = self.undo, []
            for action in undo:
                action()
        session = self.prof.session
        if self.follow is not None:
            session = self.follow.collect(session, shlex.join(sys.argv))
            self.follow = None
        if not args.no_summary:
            print(session.key_averages().table(sort_by=args.sort, row_limit=args.row_limit), file=sys.stderr)
            sections = session.summary().render()
            if sections:
                print(sections, file=sys.stderr)
        try:
            _write(session, self.out, html_budget=args.html_budget)
        except (OSError, ValueError, TypeError) as exc:
            print(f"aprof: {exc}", file=sys.stderr)
            return code or 1
        sampled = f", {len(session.samples)} samples" if session.samples is not None else ""
        print(f"aprof: wrote {self.shown} ({len(session._table)} events{sampled} on {len(session.tracks())} tracks)", file=sys.stderr)
        return code


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _profile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The profile's options (plain values: they go to the children too)."""
    return {
        "scope": args.scope,
        "with_stack": args.with_stack,
        "python_tracer": args.python_tracer,
        "max_events": args.max_events,
        "max_bytes": args.max_bytes,
        "keep": args.keep,
        "sample_interval": args.sample,
        "c_calls": args.c_calls,
        "loop_block_threshold": None if args.no_loop_block else args.loop_block_threshold,
        "profile_memory": args.memory,
        "memory_interval": DEFAULT_MEMORY_INTERVAL if args.memory_interval is None else args.memory_interval,
    }


def _profile_for(args: argparse.Namespace) -> profile:
    return profile(**_profile_options(args))



def _run(args: argparse.Namespace) -> int:
    if args.module and args.target:
        args.args = [args.target, *args.args]
        args.target = None
    if not args.module and not args.target:
        raise _UsageError("run: give a script (aprof run script.py) or a module (aprof run -m module)")
    if args.target and not Path(args.target).is_file():
        raise _UsageError(f"run: cannot find script {args.target!r}")
    if args.keep == "latest" and args.max_events is None and args.max_bytes is None:
        raise _UsageError("run: --keep latest needs a budget: add --max-events N or --max-bytes B")
    if args.max_bytes is not None and args.max_bytes < 65536:
        raise _UsageError(f"run: --max-bytes must be at least 65536 (64 KiB), got {args.max_bytes}")
    if args.memory_interval is not None and not args.memory:
        raise _UsageError("run: --memory-interval sets how often --memory samples: add --memory")
    if args.c_calls and not args.python_tracer:
        raise _UsageError("run: --c-calls changes what the Python tracer records: add --python-tracer")
    if args.no_c_calls and not args.python_tracer:
        raise _UsageError("run: --no-c-calls changes what the Python tracer records: add --python-tracer")
    if args.c_calls and args.no_c_calls:
        raise _UsageError("run: --c-calls and --no-c-calls contradict each other: give one")
    out, shown = _output_path(args)
    if args.html_budget is not None and not _is_html(out):
        raise _UsageError(f"run: --html-budget applies to HTML reports (-o x.html), not {shown!r}")

    prog = args.module or args.target
    sys.argv = [prog, *args.args]
    if args.target:
        sys.path.insert(0, str(Path(args.target).resolve().parent))
    if args.control:
        return _run_control(args, out, shown)
    if args.scope == "global":
        import asyncio  # noqa: F401  (so the global profile can hook the loops the program creates)
    try:
        prof = _profile_for(args)
    except RuntimeError as exc:  # profile_memory without the C extension
        raise _UsageError(f"run: {exc}") from None
    undo: list[Callable[[], None]] = []
    if args.propagate:
        install_propagation()
        undo.append(uninstall_propagation)
    elif not args.no_follow_executors and args.scope == "global":
        from .._integrations._executors import follow_executors

        undo.append(follow_executors())
    try:
        prof.start()
    except RuntimeError as exc:  # another tool holds the tracing hook (RELIABILITY FA-08)
        for action in undo:
            action()
        raise _UsageError(f"run: {exc}") from None
    finish = _Finish(prof, args, out, shown, undo)
    if not args.no_follow:
        # Child Python programs: profiled with the same options, merged at the end.
        from .._integrations._follow import Follow

        try:
            finish.follow = Follow(_profile_options(args), own=prof)
        except OSError as exc:
            print(f"aprof: cannot follow child processes ({exc}); profiling this one only", file=sys.stderr)
        else:
            undo.append(finish.follow.restore)
    finish.install()
    code, interrupted = _run_program(args)
    try:
        code = finish.finish(code)
    finally:
        finish.uninstall()
    if finish.pending is not None:
        die_by(finish.pending)
    if interrupted is not None:
        # As python does with an uncaught KeyboardInterrupt: the traceback,
        # then the end by SIGINT, after the program's atexit handlers.
        raise interrupted
    return code


def _run_program(args: argparse.Namespace) -> tuple[int, KeyboardInterrupt | None]:
    """Run the script or module as ``__main__``: its exit code, and the
    KeyboardInterrupt that ended it, if one did (re-raised by the caller
    once the profile is written)."""
    try:
        if args.module:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args.target, run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code), None
    except KeyboardInterrupt as exc:
        print("aprof: interrupted", file=sys.stderr)
        return 0, exc
    except BaseException:
        traceback.print_exc()
        return 1, None
    return 0, None


def _run_control(args: argparse.Namespace, out: Path, shown: str) -> int:
    """``aprof run --control``: the program runs unprofiled with its control
    socket open; a profile started by ``aprof ctl`` and running at exit is
    stopped, summarised and written to ``out``."""
    given = [flag for flag, on in (("--python-tracer", args.python_tracer), ("--sample", args.sample is not None), ("--max-events", args.max_events is not None), ("--max-bytes", args.max_bytes is not None), ("--keep", args.keep != "first"), ("--memory", args.memory), ("--with-stack", args.with_stack), ("--c-calls", args.c_calls)) if on]
    if given:
        raise _UsageError(f"run: with --control, aprof ctl PID start starts the profile: give {given[0]} to it there")
    from .._integrations import _control

    try:
        _control.enable_remote_control()
    except OSError as exc:
        raise _UsageError(f"run: --control: {exc}") from None
    code, interrupted = _run_program(args)
    prof = _control._close()
    if prof is not None:
        code = _Finish(prof, args, out, shown, []).finish(code)
    if interrupted is not None:
        raise interrupted
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _read(command: str, name: str) -> Session:
    try:
        return read_profile(name)
    except FileNotFoundError:
        raise _UsageError(f"{command}: no such file {name!r}") from None
    except IsADirectoryError:
        raise _UsageError(f"{command}: {name!r} is a directory, not a file") from None
    except (ValueError, OSError) as exc:
        raise _UsageError(f"{command}: {exc}") from None


def _partial_note(session: Session, name: str, what: str) -> None:
    """Say on stderr that ``session`` was read from an HTML report cut to its
    detail budget: it lacks the events the report merged."""
    lod = session.metadata.get(LOD_KEY)
    if lod:
        print(
            f"aprof: {name} is an HTML report past its detail budget: it holds {lod['kept']:,} of "
            f"{lod['events']:,} events in full; the other {lod['merged']:,} were merged there and {what}",
            file=sys.stderr,
        )


def _report(args: argparse.Namespace) -> int:
    session = _read("report", args.file)
    _partial_note(session, args.file, "are not in this summary (the report's own page counts them)")
    print(session.key_averages(args.group_by).table(sort_by=args.sort, row_limit=args.row_limit))
    if not args.no_sections:
        sections = session.summary().render()
        if sections:
            print(sections)
    return 0


def _convert(args: argparse.Namespace) -> int:
    session = _read("convert", args.input)
    _partial_note(session, args.input, f"are not in {args.output}")
    out = _checked_output(args.output)
    if args.max_events is not None and not _is_chrome(out):
        raise _UsageError(f"convert: --max-events applies to Chrome traces (.json, .json.gz), not {args.output!r}")
    if args.html_budget is not None and not _is_html(out):
        raise _UsageError(f"convert: --html-budget applies to HTML reports (.html), not {args.output!r}")
    try:
        _write(session, out, args.max_events, args.html_budget)
    except (OSError, ValueError, TypeError) as exc:
        raise _UsageError(f"convert: {exc}") from None
    written = len(session._table)
    note = ""
    if args.max_events is not None and written > args.max_events:
        note = f", capped to the longest {args.max_events:,}"
    print(f"aprof: wrote {args.output} ({written} events on {len(session.tracks())} tracks{note})", file=sys.stderr)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .._post._merge import merge_sessions

    out = _checked_output(args.output)
    if args.max_events is not None and not _is_chrome(out):
        raise _UsageError(f"merge: --max-events applies to Chrome traces (.json, .json.gz), not {args.output!r}")
    if args.html_budget is not None and not _is_html(out):
        raise _UsageError(f"merge: --html-budget applies to HTML reports (.html), not {args.output!r}")
    sessions = []
    for name in args.inputs:
        session = _read("merge", name)
        _partial_note(session, name, f"are not in {args.output}")
        sessions.append(session)
    try:
        merged = merge_sessions(sessions, [repr(n) for n in args.inputs])
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    try:
        _write(merged, out, args.max_events, args.html_budget)
    except (OSError, ValueError, TypeError) as exc:
        raise _UsageError(f"merge: {exc}") from None
    nodes = len({t.node_id for t in merged.tracks()})
    lost = f", {len(merged.lost)} jobs lost (see the session's 'lost')" if merged.lost else ""
    print(
        f"aprof: merged {len(sessions)} files into {args.output} ({len(merged._table):,} events of {nodes} processes "
        f"on {len(merged.tracks())} tracks{lost})",
        file=sys.stderr,
    )
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    if argv and argv[0] == "run":
        mine, program = _split_run(argv)
        args = _parser().parse_args(mine)
        args.args = [*args.args, *program]
        return args
    return _parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "convert":
            return _convert(args)
        if args.command == "ctl":
            from ._ctl import ctl

            return ctl(args, _FORMATS)
        if args.command == "merge":
            return _merge(args)
        return _report(args)
    except _UsageError as exc:
        print(f"aprof: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `aprof report ... | head`: the reader has gone; end quietly, and
        # keep Python from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def entry() -> None:  # pragma: no cover - thin wrapper for console_scripts
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
