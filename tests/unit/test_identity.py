"""Which notebook is charged under ``jupyter execute``, nbconvert and papermill: the
notebook they run, read from the parent's command line, never where they write."""

from __future__ import annotations

import pytest

from dpmagic.client.identity import input_notebook

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([PY, "jupyter-execute", "hw1.ipynb"], "hw1.ipynb"),
        ([PY, "jupyter-execute", "--output", "out.ipynb", "in.ipynb"], "in.ipynb"),
        ([PY, "jupyter-execute", "--output=out.ipynb", "in.ipynb"], "in.ipynb"),
        ([PY, "jupyter-execute", "--NbClientApp.output_base", "out.ipynb", "in.ipynb"], "in.ipynb"),
        ([PY, "jupyter-execute", "--inplace", "in.ipynb"], "in.ipynb"),
        ([PY, "jupyter-nbconvert", "--execute", "in.ipynb", "--output", "out.ipynb"], "in.ipynb"),
        (
            [PY, "jupyter-nbconvert", "--output-dir", "done.ipynb", "--execute", "in.ipynb"],
            "in.ipynb",
        ),
        ([PY, "papermill", "in.ipynb", "out.ipynb", "-p", "n", "3"], "in.ipynb"),
        ([PY, "jupyter-execute", "--output", "out.ipynb"], None),
        ([PY, "ipython"], None),
    ],
)
def test_the_notebook_run_is_named_not_the_one_written(argv, named):
    assert input_notebook(argv) == named
