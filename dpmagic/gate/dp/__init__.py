"""The privacy rules, one per module, each with its statement and short proof in
its docstring and its brute-force test in ``tests/unit/dp/`` (which also shows an
under-estimating version of the rule caught):

- ``contribution``: what one privacy unit can touch after bounding;
- ``sums``: the L1 and L2 sensitivity of per-partition sums of bounded values;
- ``counts``: counts and distinct counts, sums of ones;
- ``quantiles``: how many values a unit moves in the multisets a quantile scores;
- ``partition_selection``: how many keys a unit can make appear or vanish;
- ``group_privacy``: the cost for groups of ``k`` units, per accountant.

How the generated SQL enforces the contribution bound (load-time ranks, a join's
room, the per-query window) is argued in ``dpmagic/gate/sql/contribution.py``.
"""
