"""``aprof`` on the command line (SPEC 10.1).

``aprof run [options] script.py [args...]`` or ``aprof run -m module
[args...]`` profiles a program from its first line, prints the summary table
and writes the trace, even when the program raises, exits or is interrupted.
The program's exit code is aprof's. ``aprof report FILE`` prints the summary
of a session, a Chrome trace or an HTML report; ``aprof convert IN OUT``
rewrites one of those in the format OUT's name asks for.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .. import _version
from .._core._profiler import profile
from .._core._propagation import install_propagation, uninstall_propagation
from .._post._analysis import _SORT_KEYS
from .._post._readers import read_profile
from .._post._session import Session

__all__ = ["main"]

_FORMATS = (".json", ".json.gz", ".speedscope.json", ".html", ".folded", ".aprof")


class _UsageError(Exception):
    """A one-line error for the user, printed without a traceback."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aprof", description="A profiler for async Python.")
    p.add_argument("--version", action="version", version=f"aprof {_version.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="profile a Python program", description="Profile a script or module from its first line.")
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script (like python -m)")
    run.add_argument("-o", "--output", metavar="FILE", help=f"write the trace here; format from the name: {', '.join(_FORMATS)} (default: <program>.trace.json)")
    run.add_argument("--scope", choices=("context", "global"), default="global", help="record the whole process (global, the default) or only the main context and what it spawns")
    run.add_argument("--propagate", action="store_true", help="carry context into run_in_executor, ThreadPoolExecutor.submit and threading.Thread")
    run.add_argument("--with-stack", action="store_true", help="attach the Python stack to each range")
    run.add_argument("--python-tracer", action="store_true", help="record every Python function call and return, on the tracks of the tasks that made them")
    run.add_argument("--c-calls", action="store_true", help="with --python-tracer, record the C functions Python code calls too (costs more: on 3.11 several times)")
    run.add_argument("--no-c-calls", action="store_true", help=argparse.SUPPRESS)  # the default now: accepted as a no-op
    run.add_argument("--max-events", type=_positive_int, metavar="N", help="with --python-tracer or --sample, keep the first N raw tracer events (and N samples) and count the rest as dropped")
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
        metavar="SECONDS",
        help="record every stretch in which one step or callback held the asyncio loop longer than this, with the blocking stack",
    )
    run.add_argument("--sort", default="total", choices=sorted(_SORT_KEYS), help="sort the summary table by this column")
    run.add_argument("--row-limit", type=int, default=30, help="rows in the summary table (default 30)")
    run.add_argument("--no-summary", action="store_true", help="do not print the summary table")
    run.add_argument("target", nargs="?", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")

    report = sub.add_parser(
        "report", help="print the summary of a saved profile", description="Print the summary table of a session (.aprof), a Chrome trace (.json, .json.gz) or an HTML report."
    )
    report.add_argument("file")
    report.add_argument("--sort", default="total", choices=sorted(_SORT_KEYS))
    report.add_argument("--row-limit", type=int, default=30)
    report.add_argument("--group-by", default="name", choices=("name", "track", "stack"))

    convert = sub.add_parser(
        "convert", help="convert a saved profile to another format", description="Read a session, Chrome trace or HTML report and write it in the format OUTPUT's name asks for."
    )
    convert.add_argument("input")
    convert.add_argument("output", help=f"format from the name: {', '.join(_FORMATS)}")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


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
    out = Path(name)
    if not any(out.name.lower().endswith(s) for s in _FORMATS):
        raise _UsageError(f"cannot tell the format of {name!r}: use a name ending in {', '.join(_FORMATS)}")
    if not out.parent.is_dir():
        raise _UsageError(f"cannot write {name!r}: directory {str(out.parent)!r} does not exist")
    return out


def _output_path(args: argparse.Namespace) -> Path:
    if args.output:
        return _checked_output(args.output)
    stem = args.module if args.module else Path(args.target).stem
    return Path(f"{stem}.trace.json")


def _write(session: Session, out: Path) -> None:
    name = out.name.lower()
    if name.endswith(".aprof"):
        session.save(out)
    elif name.endswith(".speedscope.json"):
        session.export_speedscope(out)
    elif name.endswith(".folded"):
        session.export_folded(out)
    elif name.endswith(".html"):
        session.export_html(out)
    else:
        session.export_chrome_trace(out)


def _run(args: argparse.Namespace) -> int:
    if args.module and args.target:
        args.args = [args.target, *args.args]
        args.target = None
    if not args.module and not args.target:
        raise _UsageError("run: give a script (aprof run script.py) or a module (aprof run -m module)")
    if args.target and not Path(args.target).is_file():
        raise _UsageError(f"run: cannot find script {args.target!r}")
    out = _output_path(args)

    prog = args.module or args.target
    sys.argv = [prog, *args.args]
    if args.target:
        sys.path.insert(0, str(Path(args.target).resolve().parent))
    if args.propagate:
        install_propagation()
    if args.scope == "global":
        import asyncio  # noqa: F401  (so the global profile can hook the loops the program creates)
    if args.max_events is not None and not (args.python_tracer or args.sample is not None):
        raise _UsageError("run: --max-events limits the Python tracer's events and the samples: add --python-tracer or --sample")
    if args.c_calls and not args.python_tracer:
        raise _UsageError("run: --c-calls changes what the Python tracer records: add --python-tracer")
    if args.no_c_calls and not args.python_tracer:
        raise _UsageError("run: --no-c-calls changes what the Python tracer records: add --python-tracer")
    if args.c_calls and args.no_c_calls:
        raise _UsageError("run: --c-calls and --no-c-calls contradict each other: give one")
    prof = profile(
        scope=args.scope,
        with_stack=args.with_stack,
        python_tracer=args.python_tracer,
        max_events=args.max_events,
        sample_interval=args.sample,
        c_calls=args.c_calls,
        loop_block_threshold=args.loop_block_threshold,
    )
    code = 0
    try:
        prof.start()
    except RuntimeError as exc:  # another tool holds the tracing hook (RELIABILITY FA-08)
        if args.propagate:
            uninstall_propagation()
        raise _UsageError(f"run: {exc}") from None
    try:
        if args.module:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args.target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        print("aprof: interrupted", file=sys.stderr)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if prof.running:
            prof.stop()
        if args.propagate:
            uninstall_propagation()
    session = prof.session
    if not args.no_summary:
        print(session.key_averages().table(sort_by=args.sort, row_limit=args.row_limit), file=sys.stderr)
    try:
        _write(session, out)
    except (OSError, ValueError, TypeError) as exc:
        print(f"aprof: {exc}", file=sys.stderr)
        return code or 1
    sampled = f", {len(session.samples)} samples" if session.samples is not None else ""
    print(f"aprof: wrote {out} ({len(session.events())} events{sampled} on {len(session.tracks())} tracks)", file=sys.stderr)
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


def _report(args: argparse.Namespace) -> int:
    session = _read("report", args.file)
    print(session.key_averages(args.group_by).table(sort_by=args.sort, row_limit=args.row_limit))
    return 0


def _convert(args: argparse.Namespace) -> int:
    session = _read("convert", args.input)
    out = _checked_output(args.output)
    try:
        _write(session, out)
    except (OSError, ValueError, TypeError) as exc:
        raise _UsageError(f"convert: {exc}") from None
    print(f"aprof: wrote {out} ({len(session.events())} events on {len(session.tracks())} tracks)", file=sys.stderr)
    return 0


#: ``aprof run`` options that take a value (the next token), for _bare_sample.
_RUN_VALUED = frozenset({"-o", "--output", "--scope", "--max-events", "--loop-block-threshold", "--sort", "--row-limit", "-m"})


def _bare_sample(argv: list[str]) -> list[str]:
    """``aprof run --sample script.py``: a bare ``--sample`` before the program
    means the default interval (argparse would take the script's name as the
    interval). Tokens from the program on are the program's and untouched."""
    if not argv or argv[0] != "run":
        return argv
    out = list(argv)
    i = 1
    while i < len(out):
        tok = out[i]
        if tok == "--sample":
            nxt = out[i + 1] if i + 1 < len(out) else None
            try:
                float(nxt)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                out[i] = "--sample=0.001"
            else:
                i += 1
        elif tok in _RUN_VALUED:
            if tok == "-m":
                break  # the module, then its arguments
            i += 1
        elif not tok.startswith("-"):
            break  # the script: the rest is the program's
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(_bare_sample(list(sys.argv[1:] if argv is None else argv)))
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "convert":
            return _convert(args)
        return _report(args)
    except _UsageError as exc:
        print(f"aprof: {exc}", file=sys.stderr)
        return 2


def entry() -> None:  # pragma: no cover - thin wrapper for console_scripts
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    os._exit(main())
