"""The query analysis pipeline, one module per pass (docs: How a query is answered)."""
