"""Which replies are padded: those whose computation read the private data.

Padding holds a reply to the next multiple of ``response_quantum_ms`` after its
connection was accepted, so that how long a computation over the private data
took does not show in when its reply leaves. A reply whose computation never
read the private data has nothing of it to hide in its time: a replay (the
stored reply, sent again), a dry run, a refusal decided before the debit or at
it, a budget or a schema is a function of the request, the policy and what the
gate has already told the same user (docs/security.md, "Which replies are
padded"). Those are answered at once; holding them only made every re-run
notebook cell wait a quantum.

Whether a request read the private data is a typed fact, ``PrivateRead``, set
by the engine at the one place a query's run begins (``Engine._query``), before
the first row is read, so everything that follows it (a release, a failure at
the run's deadline, a refusal decided from what the run returned, an unexpected
error) is padded; the server reads it once the computation is over. It is
never inferred from the reply's text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class PrivateRead:
    """Whether one request's computation has begun to read the private database.

    One per request: the server makes it, the engine calls ``begin`` in an engine
    thread, and the server reads ``began`` on its event loop after that thread's
    work is done (the executor's future orders the two). It only ever goes from
    False to True, so a query run twice (``admission``: retried after running out of
    memory under load) or in two releases (``Engine._clipped``) stays marked from
    the first read on."""

    began: bool = False

    def begin(self) -> None:
        """Mark the request as having read private data; call before the read."""
        self.began = True


def release_time(arrival: float, now: float, quantum: float) -> float:
    """When a padded reply leaves: the first whole multiple of ``quantum`` after
    ``arrival`` (the connection's accept) that is not before ``now``, and never
    sooner than one quantum after ``arrival``. A run longer than a quantum lands
    in a later one, which says only that it took that many quanta."""
    elapsed = now - arrival
    return arrival + quantum * max(1, math.ceil(elapsed / quantum))
