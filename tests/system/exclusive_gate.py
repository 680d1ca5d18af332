"""A gate process whose admission is the old rule (the broken version of
``tests/system/test_fair_load.py``): a run that ran out of time or memory while
another overlapped it is run again with the dataset to itself
(``tests/unit/test_admission.py``'s ``ExclusiveRetry``). Run as
``python -m tests.system.exclusive_gate --policy … --listen …``."""

from __future__ import annotations

import sys

from dpmagic.gate import engine
from dpmagic.gate.service import server
from tests.unit.test_admission import ExclusiveRetry

if __name__ == "__main__":
    engine.Admission = ExclusiveRetry  # type: ignore[misc, assignment]
    sys.exit(server.main())
