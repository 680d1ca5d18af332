"""The durable privacy ledger, below the engine: every charge, release, failure and
replay (``store.py``), the file and its transactions (``schema.py``), the flush off a
query's path (``flush.py``), replay keys and shared releases (``replays.py``), whose
budget a row counts for (``scopes.py``, ``tallies.py``) and the budgets as replies show
them (``views.py``). It imports nothing of the engine, the SQL passes or the HTTP
service (``pyproject.toml``'s import contracts)."""
