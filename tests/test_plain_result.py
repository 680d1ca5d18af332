"""The demo's terminal text of an answer: every noisy value beside its interval."""

from __future__ import annotations

from dpmagic.plain_result import result_text
from dpmagic.result import DPResult, format_value
from tests.test_result import reply


def _reply() -> dict:
    """Three rows whose cells each have a different interval, so a value shown
    beside another row's or column's interval is caught."""
    return reply(
        rows=[["F", 41.0, -53.0], ["M", 57.0, 44.5], ["<b>&", 3.0, 50.0]],
        accuracy={
            "alpha": 0.05,
            "columns": [
                None,
                {"mechanism": "discrete_laplace", "intervals": [[29, 53], [45, 69], [-9, 15]]},
                {"mechanism": "laplace", "intervals": [[-80.5, -25.5], [17.25, 71.75], [2, 98]]},
            ],
        },
    )


def test_each_noisy_value_is_printed_with_its_own_interval() -> None:
    answer = _reply()
    text = result_text(DPResult(answer)._repr_html_())
    assert text is not None
    lines = text.splitlines()
    assert lines[0].split() == ["sex", "n", "mean", "<age>"]  # headers unescaped
    columns = answer["accuracy"]["columns"]
    for r, row in enumerate(answer["rows"]):
        expected = [str(row[0])] + [
            f"{format_value(row[c])} [{format_value(float(columns[c]['intervals'][r][0]))}, "
            f"{format_value(float(columns[c]['intervals'][r][1]))}]"
            for c in (1, 2)
        ]
        line = lines[1 + r]
        positions = [line.index(cell) for cell in expected]
        assert positions == sorted(positions), line
    assert "95% intervals beside each noisy value" in text
    assert lines[-1] == DPResult(answer).footer()


def test_no_text_without_intervals_or_for_other_html() -> None:
    dry = reply(dry_run=True, plan=[{"aggregate": "COUNT(*)", "epsilon": 0.5}])
    assert result_text(DPResult(dry)._repr_html_()) is None
    assert result_text("<table><tr><td>1</td></tr></table>") is None
