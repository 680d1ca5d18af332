"""The bundled example: a synthetic clinic, its policy and a quickstart notebook."""
