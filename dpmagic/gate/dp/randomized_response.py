"""Rule: undoing randomized response is an unbiased linear map of the reports, and
post-processing of the noisy measurements (it costs no privacy).

A column collected by randomized response holds reports: each respondent gave
their true value with probability ``p``, else one drawn uniformly from the
column's ``k`` public values (mean ``m``).

Proof. Of ``n`` respondents, ``t_v`` hold value ``v``. A holder reports ``v`` with
probability ``p + r`` and any other respondent with ``r = (1 − p)/k``, so the
count ``c_v`` of reports of ``v`` has expectation ``(p + r)·t_v + r·(n − t_v) =
p·t_v + r·n``, and ``t_v = (c_v − r·n)/p`` is unbiased. A report of true value
``x`` has expectation ``p·x + (1 − p)·m``; summed over ``n`` reports the sum ``S``
has expectation ``p·Σx + (1 − p)·m·n``, so ``Σx = (S − (1 − p)·m·n)/p``. Both
maps are linear and read only the noisy counts and sums the gate released (and
the public ``p``, ``k``, ``m``): post-processing, which costs nothing more
(Dwork and Roth 2014, Proposition 2.1). The gate's intervals for them are in
``sql/randomized.py``.
"""

from __future__ import annotations


def random_share(p: float, k: int) -> float:
    """``r``: the chance a respondent reports any one value at random."""
    return (1 - p) / k


def true_count(reported: float, total: float, p: float, k: int) -> float:
    """``t_v`` from the count of reports of ``v`` among ``total`` reports."""
    return (reported - random_share(p, k) * total) / p


def true_sum(reported_sum: float, total: float, p: float, mean: float) -> float:
    """``Σx`` from the sum of ``total`` numeric reports, ``mean`` the public values'."""
    return (reported_sum - (1 - p) * mean * total) / p
