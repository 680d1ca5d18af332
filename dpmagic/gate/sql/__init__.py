"""The query analysis pipeline, one module per pass (DESIGN.md §3)."""
