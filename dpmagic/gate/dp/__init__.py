"""The privacy rules, one per module, each with its statement and short proof in
its docstring and its brute-force test in ``tests/unit/dp/`` (which also shows an
under-estimating version of the rule caught):

- ``contribution``: what one privacy unit can touch after bounding;
- ``enforcement``: what each way of bounding a unit (row level, the load-time
  ranks, the per-query window) lets it contribute;
- ``sums``: the L1 and L2 sensitivity of per-partition sums of bounded values;
- ``counts``: counts and distinct counts, sums of ones, and what a unit brings
  to ``COUNT(DISTINCT unit)``;
- ``centred_sums``: a sum noised around the middle of its values' range (an
  AVG's, a variance's): the bounds of one row's term, and the centre;
- ``quantiles``: a quantile's scores, how much one value moves them, and how many
  values a unit moves in the multisets a quantile scores;
- ``partition_selection``: how many keys a unit can make appear or vanish, and
  the partition count sensitivities assume for keys chosen from the data;
- ``group_privacy``: the cost for groups of ``k`` units, per accountant;
- ``join_bounding``: a join of one unit's rows keeps at most ``K`` joined rows;
- ``randomized_response``: debiasing is unbiased post-processing;
- ``shares``: how a query's budget is split over its parts (weights that read no
  data, shares that add up to the charge);
- ``composition``: what a plan's parts cost together, and the refusal of a plan
  that would spend more than its charge;
- ``left_out``: the bounding report's noises (one unit moves its rows total by at
  most its cap, its units count by one) and its share of the query's budget.
- ``levels``: the level each part of a released interval is computed at (the
  union bound: ``k`` parts at ``α/k`` hold together at ``1 − α``), its splits for
  an expression, a variance's and an average's box, a quantile's interval and
  band, and the default report level.

``accounting``'s ``Composition`` is how charges add up, within a query and across
queries in every budget's tally (``ledger/scopes.py``).

How the generated SQL enforces these (load-time ranks, a join's room, the
per-query window) is in ``dpmagic/gate/sql/ranks.py``; the contribution each gives,
``enforcement``. The plan calls these
rules for every noise it calibrates (``calibration.noise_for``,
``count_noise_for``), which ``tests/unit/dp/test_production.py`` checks against the
policy's bounds for each aggregate kind, and refuses a plan whose parts compose to
more than its charge (``composition.composes``). The same file pins the inputs
production hands the rules (the partition count for chosen keys, ``COUNT(DISTINCT
unit)``'s contribution, each bounding's, how budgets add up) against brute force
and exact sums, and checks that each broken is caught.
"""
