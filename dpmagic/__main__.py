"""``python -m dpmagic``: the same as the ``dpmagic`` command."""

from dpmagic.commands.cli import main

raise SystemExit(main())
