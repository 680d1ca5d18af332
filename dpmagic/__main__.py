"""``python -m dpmagic``: the same as the ``dpmagic`` command."""

from dpmagic.cli import main

raise SystemExit(main())
