"""The docs stay true: every public name documented, every docstring example runs."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import aprof

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [n for n in aprof.__all__ if n != "__version__"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_docstring_and_reference_entry(name: str) -> None:
    # STYLE: docstrings on every public name; docs/reference.md lists it.
    obj = getattr(aprof, name)
    if name != "CallbackHandle":
        assert (obj.__doc__ or "").strip(), f"aprof.{name} has no docstring"
        assert getattr(obj, "__module__", "aprof") == "aprof", f"aprof.{name} reports module {obj.__module__}"
    assert f"`aprof.{name}" in (ROOT / "docs" / "reference.md").read_text()


# "aprof" itself: the public objects report it as their module, so that is
# where doctest finds their examples.
MODULES = ["aprof", *sorted(m.name for m in pkgutil.walk_packages(aprof.__path__, "aprof.") if not m.name.endswith("__main__"))]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    # Every example in a docstring is a doctest that passes.
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if module == "aprof":
        assert result.attempted >= 20  # the public examples were found and run


def test_readme_quick_start_matches_ci() -> None:
    # The README's test command is the one .ci/run runs.
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/python -m pytest" in readme
    assert re.search(r"TEST_CMD=\(python -m pytest\)", ci)
    assert ".venv/bin/pip install -e '.[test]'" in readme
    assert "'.[test]'" in ci
    example = re.search(r"aprof run -o \S+ (examples/\S+\.py)", readme)
    assert example is not None
    assert (ROOT / example.group(1)).is_file()


def _guide_programs() -> list[str]:
    # The guide's complete programs: blocks that start with an import (the
    # others are fragments of the one before).
    text = (ROOT / "docs" / "guide.md").read_text()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith(("import ", "from "))]


def test_the_guide_has_programs() -> None:
    assert len(_guide_programs()) >= 7


@pytest.mark.parametrize("index", range(len(_guide_programs())))
def test_guide_programs_run(index: int, tmp_path: Path) -> None:
    # Every complete program in docs/guide.md runs as written (in a scratch
    # directory: some write traces).
    import subprocess
    import sys

    program = _guide_programs()[index]
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
