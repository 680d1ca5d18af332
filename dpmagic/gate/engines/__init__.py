"""The engines a dataset can live on, behind one interface (``interface.py``); the
registry (``registry.py``) opens a dataset on the one its policy names. Kept empty,
so that the analysis passes can import the dialect profile without an engine."""
