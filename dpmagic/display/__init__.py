"""What a notebook shows for what came over the wire: an answer with its accuracy
(``result``, ``cells``, ``plan``, ``plot``), the budget (``budget``, ``preview``) and
the schema (``schema``), built from shared HTML pieces (``render``).

The lowest layer above the wire: it renders typed replies (``dpmagic.protocol``,
``dpmagic.wire``) and never asks the gate anything, so a view is the same for a
live gate, a mock run and a replayed transcript.
"""
