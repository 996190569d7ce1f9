"""``aprof ctl PID status|start|stop OUT|dump OUT``: the client of the control socket (SPEC 15.3).

One request line of JSON, one reply line (see ``aprof._integrations._control``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from .._integrations._control import PROTOCOL_VERSION, VERSION_KEY, check_private_dir, control_dirs

__all__ = ["add_parser", "ctl"]

#: How long the client waits for a reply (seconds): a stop writes the whole trace first.
DEFAULT_TIMEOUT = 120.0


class CtlError(Exception):
    """A one-line error for the user."""


def add_parser(sub: Any, positive_int: Any, positive_seconds: Any, sample_interval: Any, formats: tuple[str, ...]) -> None:
    ctl = sub.add_parser(
        "ctl",
        help="start, stop or dump a profile in a running process",
        usage="aprof ctl PID (status | start [options] | stop OUT | dump OUT)",
        description=(
            "Talk to a process that opened its control socket (aprof.enable_remote_control(), or aprof run "
            "--control): start a global profile, stop it and write it (format from OUT's name), dump its flight "
            "recorder, or ask its status. Only the process's own user can reach the socket."
        ),
    )
    ctl.add_argument("pid", type=int, help="the process id")
    ctl.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS", help=f"wait this long for the reply (default {DEFAULT_TIMEOUT:g})")
    cmds = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    cmds.add_parser("status", help="is a profile running, with which options; is a flight recorder running")
    start = cmds.add_parser("start", help="start a global profile (the whole process)")
    start.add_argument("--no-tasks", action="store_true", help="do not record tasks as TASK ranges")
    start.add_argument("--python-tracer", action="store_true", help="record every Python call and return")
    start.add_argument("--c-calls", action="store_true", help="with --python-tracer, record C calls too")
    start.add_argument("--with-stack", action="store_true", help="attach the Python stack to each range")
    start.add_argument("--record-inputs", action="store_true", help="keep repr() of each range's inputs")
    start.add_argument("--sample", nargs="?", const=0.001, type=sample_interval, metavar="INTERVAL", help="take a stack sample every INTERVAL seconds (default 0.001)")
    start.add_argument("--loop-block-threshold", type=positive_seconds, default=0.05, metavar="SECONDS", help="record loop blocks from this long on (default 0.05)")
    start.add_argument("--no-loop-block", action="store_true", help="do not watch for loop blocks")
    start.add_argument("--max-events", type=positive_int, metavar="N", help="the profile's max_events")
    start.add_argument("--max-bytes", type=positive_int, metavar="N", help="the profile's memory budget (max_bytes), where this aprof has it")
    start.add_argument("--keep", choices=("first", "latest"), help="past the budget, keep the first or the latest events, where this aprof has it")
    stop = cmds.add_parser("stop", help="stop the profile and write it")
    stop.add_argument("output", help=f"the file to write (in the process, as its user); format from the name: {', '.join(formats)}")
    dump = cmds.add_parser("dump", help="write the flight recorder's window without stopping it")
    dump.add_argument("output", help="the file to write; format from the name")


def _start_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "tasks": not args.no_tasks,
        "loop_block_threshold": None if args.no_loop_block else args.loop_block_threshold,
    }
    for flag in ("python_tracer", "c_calls", "with_stack", "record_inputs"):
        if getattr(args, flag):
            options[flag] = True
    if args.sample is not None:
        options["sample_interval"] = args.sample
    for name in ("max_events", "max_bytes", "keep"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def request_of(args: argparse.Namespace, formats: tuple[str, ...]) -> dict[str, Any]:
    """The protocol request for a parsed ``aprof ctl`` command line."""
    req: dict[str, Any] = {VERSION_KEY: PROTOCOL_VERSION, "command": args.ctl_command}
    if args.ctl_command == "start":
        req["options"] = _start_options(args)
    elif args.ctl_command in ("stop", "dump"):
        out = Path(args.output)
        if not out.name.lower().endswith(formats):
            raise CtlError(f"cannot tell the format of {args.output!r}: use a name ending in {', '.join(formats)}")
        req["output"] = str(out.absolute())  # the process's working directory is not ours
    return req


def _process_state(pid: int) -> str:
    """"gone", "other user" or "alive"."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "other user"
    return "alive"


def find_socket(pid: int) -> Path:
    """The control socket of ``pid``, or a CtlError saying why there is none."""
    if pid <= 0:
        raise CtlError(f"{pid} is not a process id")
    for directory in control_dirs():
        path = directory / f"{pid}.sock"
        if os.path.lexists(path):
            try:
                check_private_dir(directory)
            except PermissionError as exc:
                raise CtlError(f"refusing to use {path}: {exc}") from None
            return path
    state = _process_state(pid)
    if state == "gone":
        raise CtlError(f"no process {pid}")
    if state == "other user":
        raise CtlError(f"process {pid} belongs to another user: aprof ctl reaches only your own processes (run it as that user)")
    raise CtlError(
        f"process {pid} has no aprof control socket: start it with aprof run --control, or call aprof.enable_remote_control() in it "
        f"(looked in {', '.join(str(d) for d in control_dirs())})"
    )


def send(pid: int, request: dict[str, Any], timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Send one request to process ``pid``'s control socket; returns its reply object."""
    path = find_socket(pid)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except (ConnectionRefusedError, FileNotFoundError):
            state = _process_state(pid)
            if state == "gone":
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise CtlError(f"stale control socket {path}: process {pid} is gone (removed the socket)") from None
            raise CtlError(f"stale control socket {path}: process {pid} does not answer on it (it stopped remote control, or pid {pid} was reused)") from None
        except PermissionError:
            raise CtlError(f"cannot reach {path}: permission denied (process {pid} belongs to another user?)") from None
        sock.sendall((json.dumps(request) + "\n").encode())
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise CtlError(f"process {pid} closed the connection without a reply")
            data += chunk
    except TimeoutError:
        raise CtlError(f"no reply from process {pid} within {timeout:g} s") from None
    except OSError as exc:
        if isinstance(exc, CtlError):
            raise
        raise CtlError(f"talking to process {pid}: {os.strerror(exc.errno) if exc.errno else exc}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise CtlError(f"process {pid} sent a reply that is not JSON") from None
    if not isinstance(reply, dict) or reply.get(VERSION_KEY) != PROTOCOL_VERSION:
        raise CtlError(f"process {pid} speaks another protocol version: {reply.get(VERSION_KEY) if isinstance(reply, dict) else reply!r}")
    return reply


def _describe(command: str, reply: dict[str, Any]) -> str:
    pid = reply.get("pid")
    if command == "status":
        lines = [f"process {pid}: aprof {reply.get('aprof')}, Python {reply.get('python')}, commands run on {reply.get('runs_commands_on')}"]
        if reply.get("running"):
            lines.append(f"profile running for {reply.get('seconds')} s with {json.dumps(reply.get('options'), sort_keys=True)}")
        else:
            lines.append("no profile running" + (" (a stopped profile is waiting to be written: stop OUT)" if reply.get("unsaved") else ""))
        lines.append("flight recorder running" if reply.get("flight_recorder") else "no flight recorder")
        return "\n".join(lines)
    if command == "start":
        return f"process {pid}: profile started with {json.dumps(reply.get('started'), sort_keys=True)}"
    if command == "stop":
        return f"process {pid}: profile stopped; wrote {reply.get('output')} ({reply.get('events')} events on {reply.get('tracks')} tracks)"
    return f"process {pid}: wrote {reply.get('output')}"


def ctl(args: argparse.Namespace, formats: tuple[str, ...]) -> int:
    """Run ``aprof ctl``; returns the exit code (1: the process refused, 2: it could not be asked)."""
    try:
        request = request_of(args, formats)
        reply = send(args.pid, request, args.timeout)
    except CtlError as exc:
        print(f"aprof: ctl: {exc}", file=sys.stderr)
        return 2
    if not reply.get("ok"):
        print(f"aprof: ctl: process {args.pid}: {reply.get('error')}", file=sys.stderr)
        return 1
    print(_describe(args.ctl_command, reply))
    return 0

