"""Gate replies as the client receives them, made by hand: what the rendering tests
(tables, footers, plots) read."""

from __future__ import annotations


def budget(nb_left: float, user_left: float) -> dict:
    return {
        "user": {
            "spent": {"epsilon": 5.0 - user_left, "delta": 0.0},
            "limit": {"epsilon": 5.0, "delta": 0.0},
            "remaining": {"epsilon": user_left, "delta": 0.0},
        },
        "notebook": {
            "spent": {"epsilon": 2.0 - nb_left, "delta": 0.0},
            "limit": {"epsilon": 2.0, "delta": 0.0},
            "remaining": {"epsilon": nb_left, "delta": 0.0},
        },
    }


def reply(**overrides) -> dict:
    base = {
        "dataset": "d",
        "columns": ["sex", "n", "mean <age>"],
        "rows": [[0, 41.0, 37.25], [1, 57.0, 44.5], ["<script>x</script>", 3.0, 50.0]],
        "cost": {"epsilon": 0.5, "delta": 0.0},
        "accuracy": {
            "alpha": 0.05,
            "columns": [
                None,
                {
                    "mechanism": "discrete_laplace",
                    "scale": 4.0,
                    "intervals": [[29.0, 53.0]] * 3,
                    "rule": "zero",
                    "noise_dominates": [False, False, True],
                },
                {
                    "mechanism": "laplace",
                    "scale": 1.5,
                    "intervals": [[30.5, 44.0]] * 3,
                    "rule": "range",
                    "range": [0, 100],
                    "noise_dominates": [False] * 3,
                },
            ],
        },
        "budget": budget(1.5, 4.5),
        "replayed": False,
        "dry_run": False,
        "plan": [],
    }
    base.update(overrides)
    return base


def quantile_reply() -> dict:
    """A median by sex, judged by the count of its argument: each cell's interval in
    units, its band of percentiles and the gate's verdict."""
    return reply(
        columns=["sex", "median <age>"],
        rows=[[0, 37.0], [1, 41.0]],
        accuracy={
            "alpha": 0.05,
            "columns": [
                None,
                {"mechanism": "exponential", "scale": 8.0, "level": 0.5, "rank_radius": 39.6,
                 "intervals": [[35.0, 38.5], [17.5, 100.0]], "rule": "percentiles",
                 "count": "COUNT(age)", "percentiles": [[0.4, 0.6], [0.0, 1.0]],
                 "noise_dominates": [False, True]},
            ],
        },
    )  # fmt: skip
