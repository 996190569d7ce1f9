"""pytest plugin (SPEC 11.2): ``pytest --aprof[=DIR]`` profiles each test.

Each selected test's call phase (not its fixtures) runs under a global-scope
profile, so async tests run by the anyio plugin or pytest-asyncio are seen
whatever loop or context their runner uses. One Chrome trace per test is
written to DIR (default ``.aprof``), named after the test's node id; the
summary line lists where they went. ``--aprof-format`` picks ``json``,
``json.gz`` or ``aprof`` (a session for ``aprof report``).

The plugin is registered through the ``pytest11`` entry point and does
nothing unless ``--aprof`` is given.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_FORMATS = ("json", "json.gz", "aprof")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aprof", "profiling with aprof")
    group.addoption(
        "--aprof",
        nargs="?",
        const=".aprof",
        default=None,
        metavar="DIR",
        help="profile each test with aprof and write one trace per test to DIR (default: .aprof)",
    )
    group.addoption(
        "--aprof-format", choices=_FORMATS, default="json", help="trace format for --aprof (default: json)"
    )


def _file_name(nodeid: str, fmt: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180] or "test"
    return f"{safe}.{fmt}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    directory = item.config.getoption("--aprof")
    if directory is None:
        yield
        return
    import aprof

    fmt = item.config.getoption("--aprof-format")
    prof = aprof.profile(scope="global")
    prof.start()
    try:
        yield
    finally:
        prof.stop()
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        path = out / _file_name(item.nodeid, fmt)
        if fmt == "aprof":
            prof.save(path)
        else:
            prof.export_chrome_trace(path)
        written = item.config.stash.setdefault(_WRITTEN, [])
        written.append(str(path))


_WRITTEN = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.write_line(f"aprof: wrote {len(written)} trace(s) to {Path(written[0]).parent}")
