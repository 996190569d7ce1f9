"""Run third-party test suites with and without aprof, and diff the outcomes (issue 15 item 16, SPEC 15.6).

A profiled program must behave as it does without aprof. This script runs
whole test suites of the runtimes aprof hooks into, once plainly and once per
way aprof profiles a program, and lists every test whose outcome differs:

* CPython's ``test.test_asyncio`` and ``test.test_context`` (unittest):
  plain vs ``aprof run`` of the same unittest run; and pytest plain vs
  ``pytest --aprof`` over them;
* trio's own suite (shipped in the trio package; run from trio's sdist for
  its pytest configuration) and anyio's (from anyio's sdist):
  ``pytest`` plain vs ``aprof run -m pytest`` vs ``pytest --aprof``.

It is slow (tens of minutes per Python version) and is not part of the test
run (``tests/conftest.py`` keeps pytest out of this folder). Run it when the
machine is quiet::

    nice python tests/wild/run_suites.py --python VENV/bin/python \\
        --trio-src trio-0.35.0 --anyio-src anyio-4.16.0 --out /tmp/wild312

``VENV`` needs aprof installed and the suites' test dependencies (anyio's
``test`` group, trio's test requirements: its tool tests import ``isort``
and ``yaml``); the sdists give the tests and
their configuration (``pip download --no-binary anyio --no-deps
anyio==X``; set ``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_ANYIO=X`` so pip can
read its version). A suite whose source is not given is skipped.

The result is ``OUT/summary.txt`` (also printed) and one JSON file of
outcomes per run. Tests whose outcome differs only because they assert the
absence of a profiler hook are listed in ``EXPECTED`` below with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

#: Test ids (or id prefixes) whose outcome may differ under aprof, and why.
EXPECTED: dict[str, str] = {
    # Reads trio's private ``runner.instruments`` after ``trio._core.run`` and
    # asserts that no instrument has ``task_exited``: aprof's task instrument
    # does. (Seen once aprof hooks runs through ``setup_runner``, which also
    # covers ``trio._core.run``; hooking ``trio.run`` missed that run.)
    "_core._tests.test_instrumentation::test_instrument_that_raises_on_getattr": "asserts no instrument with task_exited is installed (reads trio's private runner.instruments)",
}

CPYTHON_MODULES = ["test.test_asyncio", "test.test_context"]


# -- unittest, with outcomes as JSON ----------------------------------------------


class _JsonResult(unittest.TextTestResult):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, str] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's API
        super().addSuccess(test)
        self.outcomes[test.id()] = "passed"

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self.outcomes[test.id()] = "failed"

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self.outcomes[test.id()] = "error"

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skipped"

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self.outcomes[test.id()] = "xfailed"

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "xpassed"


def unittest_json(out: str, modules: list[str]) -> None:
    """Run ``modules`` with unittest; write {test id: outcome} to ``out``."""
    suite = unittest.defaultTestLoader.loadTestsFromNames(modules)
    runner = unittest.TextTestRunner(resultclass=_JsonResult, verbosity=0, stream=sys.stderr)
    result = runner.run(suite)
    Path(out).write_text(json.dumps(result.outcomes, indent=0, sort_keys=True))  # type: ignore[attr-defined]


# -- running the suites -----------------------------------------------------------


def junit_outcomes(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            out[tid] = "error"
        elif "failure" in kinds:
            out[tid] = "failed"
        elif "skipped" in kinds:
            out[tid] = "skipped"
        else:
            out[tid] = "passed"
    return out


def run(cmd: list[str], cwd: Path, log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    with log.open("w") as f:
        try:
            proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env, check=False)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -9
    return code, time.monotonic() - t0


def run_cpython(py: str, out: Path, timeout: float) -> dict[str, dict[str, str]]:
    runs: dict[str, dict[str, str]] = {}
    mods = CPYTHON_MODULES
    for mode, cmd in {
        "unittest": [py, str(HERE), "--unittest-json", str(out / "cpython-unittest.json"), *mods],
        "unittest under aprof run": [
            py, "-m", "aprof", "run", "--no-summary", "-o", str(out / "cpython-aprof-run.aprof"),
            str(HERE), "--unittest-json", str(out / "cpython-aprof-run.json"), *mods,
        ],
    }.items():  # fmt: skip
        code, dt = run(cmd, Path.cwd(), out / f"cpython-{mode.replace(' ', '-')}.log", timeout)
        data = out / ("cpython-unittest.json" if mode == "unittest" else "cpython-aprof-run.json")
        runs[mode] = json.loads(data.read_text()) if data.exists() else {}
        print(f"  cpython {mode}: exit {code}, {len(runs[mode])} tests, {dt:.0f} s", flush=True)  # noqa: T201 - a command-line script
    for mode, extra in {"pytest": [], "pytest --aprof": [f"--aprof={out / 'cpython-traces'}"]}.items():
        junit = out / f"cpython-{mode.replace(' ', '-')}.xml"
        cmd = [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", *mods, f"--junitxml={junit}", *extra]
        # From the output directory: pytest must not pick up the settings of
        # the project it was started from (aprof's own make warnings errors).
        code, dt = run(cmd, out, out / f"cpython-{mode.replace(' ', '-')}.log", timeout)
        runs[mode] = junit_outcomes(junit)
        print(f"  cpython {mode}: exit {code}, {len(runs[mode])} tests, {dt:.0f} s", flush=True)  # noqa: T201 - a command-line script
    return runs


def run_pytest_suite(name: str, py: str, src: Path, args: list[str], out: Path, timeout: float) -> dict[str, dict[str, str]]:
    runs: dict[str, dict[str, str]] = {}
    modes = {
        "pytest": [py, "-m", "pytest"],
        "aprof run -m pytest": [py, "-m", "aprof", "run", "--no-summary", "-o", str(out / f"{name}-aprof-run.aprof"), "-m", "pytest"],
        "pytest --aprof": [py, "-m", "pytest", f"--aprof={out / f'{name}-traces'}", "--aprof-format=json.gz"],
    }
    for mode, head in modes.items():
        junit = out / f"{name}-{mode.replace(' ', '-')}.xml"
        cmd = [*head, *args, "-p", "no:cacheprovider", "-q", f"--junitxml={junit}"]
        code, dt = run(cmd, src, out / f"{name}-{mode.replace(' ', '-')}.log", timeout)
        runs[mode] = junit_outcomes(junit)
        print(f"  {name} {mode}: exit {code}, {len(runs[mode])} tests, {dt:.0f} s", flush=True)  # noqa: T201 - a command-line script
    return runs


# -- the diff ------------------------------------------------------------------------


def expected(tid: str) -> str | None:
    for prefix, why in EXPECTED.items():
        if tid.startswith(prefix):
            return why
    return None


def diff(suite: str, runs: dict[str, dict[str, str]], base: str, others: list[str]) -> list[str]:
    lines = []
    ref = runs.get(base, {})
    for mode in others:
        got = runs.get(mode, {})
        changed = sorted(t for t in set(ref) | set(got) if ref.get(t) != got.get(t))
        unexpected = [t for t in changed if expected(t) is None]
        lines.append(
            f"{suite}: {mode} vs {base}: {len(got)} vs {len(ref)} tests, {len(changed)} differ"
            f" ({len(unexpected)} not in EXPECTED)"
        )
        for t in changed:
            why = expected(t)
            lines.append(f"    {t}: {ref.get(t, 'absent')} -> {got.get(t, 'absent')}" + (f"  [expected: {why}]" if why else ""))
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--unittest-json"]:
        unittest_json(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the interpreter (a venv with aprof and the test deps)")
    ap.add_argument("--trio-src", type=Path, help="trio's unpacked sdist (its tests run from the installed trio)")
    ap.add_argument("--anyio-src", type=Path, help="anyio's unpacked sdist")
    ap.add_argument("--suites", default="cpython,trio,anyio", help="comma-separated: cpython, trio, anyio")
    ap.add_argument("--out", type=Path, default=Path("wild-results"))
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    ap.add_argument(
        "--test-timeout", type=int, default=None,
        help="seconds per trio test (pytest-timeout), so that a test hanging under aprof fails instead of stalling the run",
    )  # fmt: skip
    args = ap.parse_args()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background (``&``, nohup): the suites would inherit
        # SIGINT ignored, and trio's KeyboardInterrupt tests (test_ki,
        # test_reason_delayed_ki) then hang in the plain run. A Python
        # handler is reset to the default in each child.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    suites = set(args.suites.split(","))
    summary: list[str] = []
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True).stdout.strip()
    summary.append(f"Python {version} ({args.python})")
    if "cpython" in suites:
        runs = run_cpython(args.python, out, args.timeout)
        summary += diff("cpython", runs, "unittest", ["unittest under aprof run"])
        summary += diff("cpython", runs, "pytest", ["pytest --aprof"])
    if "trio" in suites and args.trio_src:
        trio_args = ["trio", "--pyargs", *([f"--timeout={args.test_timeout}"] if args.test_timeout else [])]
        runs = run_pytest_suite("trio", args.python, args.trio_src.resolve(), trio_args, out, args.timeout)
        summary += diff("trio", runs, "pytest", ["aprof run -m pytest", "pytest --aprof"])
    if "anyio" in suites and args.anyio_src:
        runs = run_pytest_suite("anyio", args.python, args.anyio_src.resolve(), ["tests"], out, args.timeout)
        summary += diff("anyio", runs, "pytest", ["aprof run -m pytest", "pytest --aprof"])
    text = "\n".join(summary) + "\n"
    (out / "summary.txt").write_text(text)
    print(text)  # noqa: T201


if __name__ == "__main__":
    main()
