"""Grading: re-runs replay for free, transcripts, offline replay, auto-loading.

The course notebook (``examples/course.ipynb``) is executed as an autograder
would: nbclient, a plain ``python3`` kernel of an environment where
``dpmagic kernel install --sys-prefix --autoload`` was run, twice against a
real gate and once from an exported transcript with no gate at all.
"""

from __future__ import annotations

from pathlib import Path

from dpmagic.kernel import AUTOLOAD_BEGIN, install_autoload


def test_autoload_config_is_idempotent_and_keeps_other_lines(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "ipython" / "ipython_kernel_config.py"
    config.parent.mkdir(parents=True)
    config.write_text("c.InteractiveShell.colors = 'nocolor'")
    assert install_autoload(prefix=str(tmp_path)) == config
    assert install_autoload(prefix=str(tmp_path), gate="unix:/run/dpmagic/gate.sock") == config
    text = config.read_text()
    assert text.count(AUTOLOAD_BEGIN) == 1
    assert text.startswith("c.InteractiveShell.colors = 'nocolor'\n")
    assert "c.DpSql.gate = 'unix:/run/dpmagic/gate.sock'" in text
    namespace: dict = {}

    class Config:  # traitlets' config object, as far as these lines use it
        def __getattr__(self, name: str):
            return namespace.setdefault(name, type("Section", (), {"extensions": []})())

    exec(compile(text, str(config), "exec"), {"c": Config()})
    assert namespace["InteractiveShellApp"].extensions == ["dpmagic"]
    assert namespace["DpSql"].gate == "unix:/run/dpmagic/gate.sock"
