"""The pytest plugin, run as a user runs it, with pytester (SPEC 11.2)."""

from __future__ import annotations

import pytest

from .tracecheck import validate_trace

pytest_plugins = ["pytester"]

INNER = '''
import anyio
import pytest
import aprof

def test_sync():
    with aprof.record_function("sync work"):
        pass

@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async(anyio_backend):
    async def child():
        with aprof.record_function("child work"):
            await anyio.sleep(0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(child)

def test_not_profiled_without_failing():
    assert 1 + 1 == 2
'''


def test_one_trace_per_test(pytester: pytest.Pytester) -> None:
    # SPEC 11.2: --aprof=DIR writes one trace per test; async tests included.
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("--aprof=traces", "-p", "anyio")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*aprof: wrote 4 trace(s) to traces*"])
    files = sorted((pytester.path / "traces").iterdir())
    assert len(files) == 4
    by_name = {f.name: validate_trace(f) for f in files}
    sync = next(doc for name, doc in by_name.items() if "test_sync" in name)
    assert "sync work" in {e.get("name") for e in sync["traceEvents"]}
    for backend in ("asyncio", "trio"):
        doc = next(doc for name, doc in by_name.items() if f"test_async_{backend}" in name)
        names = {e.get("name") for e in doc["traceEvents"]}
        assert "child work" in names, (backend, names)


PYTEST_ASYNCIO = '''
import asyncio
import pytest
import aprof

async def child():
    with aprof.record_function("child of the asyncio test"):
        await asyncio.sleep(0)

@pytest.mark.asyncio
async def test_with_pytest_asyncio():
    with aprof.record_function("asyncio test body"):
        await asyncio.gather(asyncio.create_task(child()), child())
'''


def test_pytest_asyncio_tests_are_profiled(pytester: pytest.Pytester) -> None:
    # SPEC 11.2, 7.1: a pytest-asyncio test's body and the tasks it spawns.
    pytester.makepyfile(test_inner=PYTEST_ASYNCIO)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("--aprof=traces", "-p", "asyncio")
    result.assert_outcomes(passed=1)
    (trace,) = (pytester.path / "traces").iterdir()
    events = validate_trace(trace)["traceEvents"]
    names = [e.get("name") for e in events if e.get("ph") == "X"]
    assert names.count("child of the asyncio test") == 2
    assert "asyncio test body" in names
    assert any(e.get("cat") == "task" for e in events)  # the spawned task has its own track


def test_session_format_and_default_dir(pytester: pytest.Pytester) -> None:
    # SPEC 11.2, 6.5: --aprof-format=aprof writes sessions that aprof.load reads.
    pytester.makepyfile(test_inner="import aprof\ndef test_a():\n    aprof.mark('hello')\n")
    result = pytester.runpytest_subprocess("--aprof", "--aprof-format=aprof")
    result.assert_outcomes(passed=1)
    (session,) = (pytester.path / ".aprof").iterdir()
    assert session.name.endswith(".aprof")
    import aprof

    assert [e.name for e in aprof.load(session).events()] == ["hello"]


def test_plugin_is_inert_without_the_option(pytester: pytest.Pytester) -> None:
    # SPEC 11.2: without --aprof nothing is profiled or written.
    pytester.makepyfile(test_inner="import aprof\ndef test_a():\n    assert not aprof.has_callbacks()\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert not (pytester.path / ".aprof").exists()
