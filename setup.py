"""Only a workaround; all configuration is in pyproject.toml.

setuptools' editable wheels install ``data-files`` only when the distribution
answers ``has_data()``, a method its ``Distribution`` does not define (it has
``has_data_files()``), so ``pip install -e .`` would leave out the prebuilt
JupyterLab extension that a regular install puts in
``share/jupyter/labextensions/``. This distribution class answers it.
"""

from setuptools import setup
from setuptools.dist import Distribution


class _WithDataFiles(Distribution):
    def has_data(self) -> bool:
        return self.has_data_files()


setup(distclass=_WithDataFiles)
