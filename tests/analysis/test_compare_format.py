"""`stability compare`'s table: how a change is printed (fast; the end-to-end tests are in test_compare.py)."""

import pytest


@pytest.mark.parametrize("a,b,shown", [
    (1.25e-15, 4.76e-4, "+0.000476"),            # a residual at round-off against a real one: no +38102323392%
    (0.0, 0.5, "+0.5"),                           # from zero: no percentage
    (-0.2, 0.3, "+0.5"),                          # across zero
    (3e-3, 3.2e-5, "-0.00297"),                   # down to near zero on A's scale
    (0.8, 1.2, "+0.4 (+50%)"),                    # both away from zero: the relative change too
    (2.0, 0.4, "-1.6 (-80%)"),
    (-4.0, -5.0, "-1 (-25%)"),
])
def test_the_relative_change_is_shown_only_where_both_values_are_away_from_zero_on_their_scale(a, b, shown):
    from stability.compare import Row, change_text

    row = Row("val", "ρ(J*) median", a, b)
    assert change_text(row) == shown
    assert (row.to_dict()["relative"] is None) == ("%" not in shown)
