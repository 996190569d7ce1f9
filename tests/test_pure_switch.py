"""``APROF_PURE_PYTHON``: the code and the reference say the same (issue 22 item 3).

docs/reference.md ("The C extension and APROF_PURE_PYTHON") is the contract:
1/true/yes/on select the pure-Python twins, unset/empty/0/false/no/off leave
the C extension on, and any other value leaves it on with one warning naming
the value.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aprof._core._native import parse_switch

from .conftest import require_c_extension


@pytest.mark.parametrize(
    ("value", "pure"),
    [
        ("1", True), ("true", True), ("True", True), ("YES", True), (" on ", True),
        (None, False), ("", False), ("0", False), ("false", False), ("No", False), ("OFF", False),
        ("maybe", None), ("2", None), ("ture", None),
    ],
)  # fmt: skip
def test_switch_values(value: str | None, pure: bool | None) -> None:
    # SPEC 14, 12: the table in docs/reference.md.
    assert parse_switch(value) is pure


def _child(value: str) -> subprocess.CompletedProcess[str]:
    code = "import aprof._core._native as n; print('pure' if n.extension is None else 'c')"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, APROF_PURE_PYTHON=value),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("value", "expected"), [("true", "pure"), ("false", "c"), ("off", "c")])
def test_switch_selects_the_implementation_at_import(value: str, expected: str) -> None:
    # SPEC 14: "false" used to select the twins (any value but "" and "0" did).
    require_c_extension()
    run = _child(value)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected
    assert run.stderr == ""


def test_unrecognised_switch_value_warns_and_keeps_the_extension() -> None:
    # SPEC 12: an unknown value is named in one warning; the extension stays on.
    require_c_extension()
    run = _child("maybe")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "c"
    assert run.stderr.count("AprofWarning") == 1
    assert "APROF_PURE_PYTHON='maybe'" in run.stderr
