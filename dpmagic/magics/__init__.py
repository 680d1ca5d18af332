"""The notebook's commands: ``%%dpsql`` and its line magics (``dpsql``), with what
they need of IPython alone: tab completion, saved snippets, ``{{name}}`` templates and
the interruptible wait for a reply.

Below the commands and above the client and the display, which the magics join:
the client asks, the display shows (pyproject's import contracts).
"""
