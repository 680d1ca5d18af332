"""JupySQL's conventions in dpmagic: ``{{var}}``, ``autopandas``/``autopolars``, and
``[tool.dpmagic]`` in ``pyproject.toml``; in a real IPython shell against a real gate."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError

from dpmagic.client.settings import load_project_settings
from dpmagic.magics.dpsql import DpSql
from dpmagic.magics.templates import bind_templates


def test_templates_become_parameters_not_text():
    sql, quoted = bind_templates("SELECT {{ a }} + {{b}} AS x, '{{c}}' AS y, 'x''{' AS z")
    assert sql == "SELECT $a + $b AS x, $c AS y, 'x''{' AS z"
    assert quoted == {"c"}
    assert bind_templates('SELECT "{" FROM t') == ('SELECT "{" FROM t', set())


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT 1 WHERE s LIKE '%{{x}}%'", "inside a quoted string"),
        ('SELECT "{{x}}" FROM t', "inside a quoted string"),
        ("SELECT {{ x + 1 }}", r"\{\{x \+ 1\}\} is not a variable name"),
        ("SELECT {{ x | upper }}", "is not a variable name"),
        ("{% if x %}SELECT 1{% endif %}", "Jinja blocks"),
    ],
)
def test_templating_beyond_a_name_is_refused(sql, reason):
    with pytest.raises(UsageError, match=reason):
        bind_templates(sql)


def test_bad_project_settings_are_reported_and_skipped(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.dpmagic]\nepsilonn = 1\ndisplaylimit = 'many'\nfeedback = false\n"
    )
    target = DpSql(None)
    path, problems = load_project_settings(target, tmp_path)
    assert path == tmp_path / "pyproject.toml"
    assert problems[0].startswith("unknown key 'epsilonn' (known: ")
    assert problems[1] == "displaylimit = 'many' is not a valid value"
    assert target.feedback is False and target.displaylimit == 50
    (tmp_path / "pyproject.toml").write_text("[tool.dpmagic\n")
    assert load_project_settings(DpSql(None), tmp_path)[1][0].startswith("cannot read it: ")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert load_project_settings(DpSql(None), tmp_path) == (None, [])
