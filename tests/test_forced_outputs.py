"""Throughput mode's output check by forcing (judges/outputs.py, check_forced): a timed
output that parts from stock's reference passes only if every token is stock's argmax after
the output's own earlier tokens, or differs where stock's margin there is a near-tie (within
the comparison's budget), and it ends where stock would."""

from __future__ import annotations

from specpilot.judges.outputs import Expected, OutputCheck, check_forced

STOP = frozenset({0})
EPS = 0.05


def _exp(tokens, max_new=6):
    return Expected(request_id="r", prompt_ids=[1, 2], max_new=max_new, tokens=tokens,
                    margins=[1.0] * len(tokens), stop_reason="length")


def _check(got, argmax, margin, exp=None, budget=4, check=None):
    check = check or OutputCheck(side="B")
    check_forced(check, exp or _exp([5, 6, 7, 8, 9, 10]), got, argmax, margin, EPS, budget,
                 STOP)
    return check


def test_the_reference_itself_needs_no_forcing():
    c = _check([5, 6, 7, 8, 9, 10], None, None)
    assert c.ok and c.forced == 0 and not c.near_ties and c.requests == 1 and c.tokens == 6


def test_a_near_tie_then_stocks_own_choices_after_it_passes():
    """Token 2 is stock's second choice where its margin is 0.01; from there every token is
    stock's argmax after the output's own prefix (another text than the reference's)."""
    got = [5, 6, 70, 71, 72, 73]
    c = _check(got, [5, 6, 7, 71, 72, 73], [1, 1, 0.01, 1, 1, 1])
    assert c.ok and c.forced == 1 and [(t.position, t.got, t.expected) for t in c.near_ties] \
        == [(2, 70, 7)]


def test_garbage_after_a_near_tie_is_a_fault():
    """The attack the charge-free check must stop: steer a near-tie, then serve tokens stock
    would not give after them (cheap ones)."""
    c = _check([5, 6, 70, 1, 1, 1], [5, 6, 7, 71, 72, 73], [1, 1, 0.01, 0.9, 1, 1])
    assert not c.ok and "token 3 is 1" in c.faults[0] and "margin 0.900" in c.faults[0]


def test_where_stock_is_sure_any_other_token_is_a_fault():
    c = _check([5, 60, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10], [1, 0.5, 1, 1, 1, 1])
    assert not c.ok and len(c.faults) == 1 and not c.near_ties


def test_near_ties_beyond_the_budget_are_faults():
    check = OutputCheck(side="A")
    for _ in range(2):
        _check([5, 60, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10], [1, 0.0, 1, 1, 1, 1], budget=1,
               check=check)
    assert len(check.near_ties) == 1 and "beyond the 1 tolerated" in check.faults[0]


def test_an_output_must_end_where_stock_would():
    sure = [1.0] * 6
    early = _check([5, 6, 7], [5, 6, 7], sure[:3])          # no stop token, 3 of 6 asked
    assert not early.ok and "without a stop token" in early.faults[0]
    stopped = _check([5, 6, 0], [5, 6, 0], sure[:3])        # stock's argmax is the stop too
    assert stopped.ok
    past = _check([5, 0, 7, 8, 9, 10], [5, 0, 7, 8, 9, 10], sure)
    assert not past.ok and "past the stop token at 1" in past.faults[0]
    long = _check([5, 6, 7, 8, 9, 10, 11], [], [])    # never forced: it could pass the context
    assert not long.ok and "7 tokens, 6 asked" in long.faults[0]
    cut = _exp([5, 6, 7, 8, 9, 10]).model_copy(update={"stop_reason": "context"})
    assert _check([5, 6, 70], [5, 6, 70], sure[:3], exp=cut).ok   # the context cut stock too
    short_pass = _check([5, 6, 7, 8], [5, 6, 7, 8, 9], sure[:5])
    assert not short_pass.ok and "covered 5 of 4" in short_pass.faults[0]

