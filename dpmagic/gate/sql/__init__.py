"""The query analysis pipeline, one module per pass (README, How a query is answered)."""
