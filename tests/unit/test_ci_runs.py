"""Every test is run by exactly one of CI's pytest runs, and the README's command is CI's.

A test moved out of the default (unit) run to keep it under two minutes must still run
somewhere: ``.ci/run`` runs ``-m X`` for each suite marker X, and the default run's
``addopts`` leaves out exactly those markers, so a test with no suite marker runs in
the default run and one with a single suite marker runs in that suite's run. The
conftest refuses a test with two (it would run twice); the tests below hold the three
lists equal and show the refusal firing.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.conftest import CI_SUITES

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def ci_script() -> str:
    return (ROOT / ".ci" / "run").read_text()


def pytest_config() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_each_suite_marker_has_one_ci_run_of_its_own() -> None:
    """``.ci/run`` runs ``pytest -m X`` once for each suite marker, and for no other."""
    runs = [
        line for line in ci_script().splitlines() if "pytest" in line and not line.startswith("#")
    ]
    selected = [
        m for line in runs for m in re.findall(r"\s-m\s+(\w+)", line.split("-m pytest", 1)[-1])
    ]
    assert sorted(selected) == sorted(CI_SUITES)


def test_the_default_run_leaves_out_exactly_the_suite_markers() -> None:
    addopts = shlex.split(str(pytest_config()["addopts"]))
    expression = addopts[addopts.index("-m") + 1]
    assert sorted(re.findall(r"not (\w+)", expression)) == sorted(CI_SUITES)
    assert " or " not in expression and "(" not in expression
    declared = {str(line).split(":", 1)[0] for line in pytest_config()["markers"]}  # type: ignore[union-attr]
    assert set(CI_SUITES) <= declared


def test_readme_unit_command_is_the_one_ci_runs() -> None:
    """README's second opening command is word for word the first line ``.ci/run`` runs."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    unit_command = block[1]
    assert "pytest" in unit_command
    assert f'checked sh -c "{unit_command}"' in ci_script()


def test_a_test_in_two_ci_runs_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken version (a test with two suite markers) stops collection, and names
    that test only: one with a single suite marker beside it is not refused."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # a second's worth of plugins
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems  # noqa: F401")
    pytester.makepyfile(
        "import pytest\n\n"
        "@pytest.mark.search\n@pytest.mark.fuzz\ndef test_twice():\n    pass\n\n"
        "@pytest.mark.system\n@pytest.mark.spark\ndef test_system_twice():\n    pass\n\n"
        "@pytest.mark.search\ndef test_once():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (refusal,) = [line for line in result.stderr.lines if "more than one CI run" in line]
    assert "test_twice (search, fuzz)" in refusal
    assert "test_system_twice (system, spark)" in refusal
    assert "test_once" not in refusal
