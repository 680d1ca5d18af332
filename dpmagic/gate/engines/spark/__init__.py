"""Apache Spark as the engine of a dataset (``engine = "spark"`` in the policy).

``session`` starts or reaches the Spark session with the gate's settings pinned,
``prepare`` is the load-time preparation as a Spark job, ``guard`` the allow-list
every generated query passes before Spark sees it, and ``database`` runs the
queries. The SQL itself comes from the same plan as DuckDB's, rendered by
``engines/spark/dialect.py``. Noise, the ledger and the release stay in the gate's
process: executors only ever compute exact aggregates that the gate noises.
"""
