"""The gate's service around the analysis: the HTTP server, who the caller is, the
request body, the ledger of spending and releases, and signed transcripts. None
of it decides what a query may release; ``dpmagic.gate.sql`` does."""
