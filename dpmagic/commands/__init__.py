"""The ``dpmagic`` command and what its subcommands run: a gate (``serve``), the
example end to end (``demo``), JupyterLab wired to a gate (``lab``), a policy from a
data file's schema (``init``), and the supervisor that stops their children.

The top layer of the client side: the only one that may import the trusted gate,
since these commands start it or read its policy on the owner's machine
(pyproject's import contracts, docs/architecture.md).
"""
