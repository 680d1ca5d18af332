"""DuckDB as a dataset's engine: its prepared file, locked database, guard and timeouts."""
