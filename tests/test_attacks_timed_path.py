"""Red team, issue 20 classes 1 and 2: the controller judges the outputs of the very runs it
times, against stock's reference from trusted code, and never times a prompt twice.

Each cheat is a real candidate commit (tests/judge_fixtures.py) run through the real
`compare` in real workers on the random tiny target. σ is given (5%: a threshold of 11%, or
13% with divergent outputs) so that noise cannot adopt anything and the A/A run is skipped;
under the old controller both cheats below cleared that bar by orders of magnitude.
"""

from __future__ import annotations

import pytest

from judge_fixtures import MEMOIZE, STOP_EARLY, cheat, judge_project
from specpilot.judges import prompts
from specpilot.judges.controller import compare, compare_many
from specpilot.judges.outputs import Expected, OutputCheck, check_request

MODEL = "random:tiny-qwen3"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return judge_project(tmp_path_factory.mktemp("redteam") / "proj")


def test_candidates_fast_only_on_the_timed_path_or_with_half_their_layers_are_rejected(
        project):
    """Two cheats judged in one run (`compare A B C`: one stock reference, one A side; each
    candidate is rejected only for its own faults, so neither can hide behind the other):
    B stops after two real tokens and pads, a large speed-up that buys nothing now; C
    verifies with half its layers while generating (forcing runs the whole stack). They
    were two runs of their own; a wrong output rejects whatever the speed, so the family's
    wider bound changes nothing that is asserted here."""
    from judge_fixtures import FEWER_LAYERS

    bad = cheat(project, "stop-early", STOP_EARLY)
    shallow = cheat(project, "fewer-layers", FEWER_LAYERS)
    rep, half = compare_many(project, "stock", [(bad, {}), (shallow, {})], model=MODEL,
                             sigma=0.05, max_new=24)
    assert [rep.b.rev, half.b.rev] == [bad, shallow]
    assert not rep.decision.adopted
    assert rep.outputs["A"].ok and not rep.outputs["B"].ok
    assert rep.faults and rep.faults[0].startswith("B ")
    assert any(w in rep.faults[0] for w in ("stock's is", "beyond the 1 tolerated"))
    assert not half.decision.adopted and half.faults and not half.outputs["B"].ok
    assert half.outputs["A"].ok and half.faults[0].startswith("C ")


def test_a_memoizing_candidate_gains_nothing_because_no_prompt_is_timed_twice(project):
    memo = cheat(project, "memoize", MEMOIZE)
    rep = compare(project, "stock", memo, model=MODEL, sigma=0.05, max_new=24)
    assert not rep.faults                       # its outputs are stock's, and it never
    assert len(set(rep.requests)) == len(rep.requests) == 4   # sees a prompt twice
    assert not rep.decision.adopted


def test_prompts_are_fresh_every_round_and_in_every_comparison():
    a = prompts.draw("embedded", "fresh", 3, 4)
    b = prompts.draw("embedded", "fresh", 3, 4)
    texts_a = [p for row in a for _, p, _ in row]
    assert len(set(texts_a)) == 12                     # no prompt twice in one comparison
    assert not set(texts_a) & {p for row in b for _, p, _ in row}   # secret seed each time
    ids = [i for row in prompts.draw(MODEL, "fresh", 2, 3) for _, _, i in row]
    assert len({tuple(x) for x in ids}) == 6


def test_a_pool_too_small_for_every_round_is_refused(tmp_path):
    from specpilot.errors import SpecPilotError

    pool = tmp_path / "own.jsonl"
    pool.write_text("".join(
        f'{{"id": "w-{i}", "category": "writing", "prompt": "Write {i}.", '
        f'"max_new_tokens": 8}}\n' for i in range(5)))
    assert len([r for row in prompts.draw("embedded", str(pool), 2, 2) for r in row]) == 4
    with pytest.raises(SpecPilotError, match="need 6 different"):
        prompts.draw("embedded", str(pool), 3, 2)


def _expected(tokens, margins):
    return Expected(request_id="r", prompt_ids=[1, 2], max_new=len(tokens), tokens=tokens,
                    margins=margins, stop_reason="length")


def test_a_near_tie_is_tolerated_once_and_checked_onwards_through_the_same_path():
    exp = _expected([5, 6, 7, 8], [1.0, 0.01, 1.0, 1.0])
    asked = []

    def rerun(ids, n):      # the candidate's continuation from stock's prefix
        asked.append((ids, n))
        return [7, 8][:n], 0.25

    ok = OutputCheck(side="B")
    check_request(ok, exp, [5, 9, 9, 9], rerun, epsilon=0.05, budget=1)
    assert ok.ok and len(ok.near_ties) == 1 and asked == [([1, 2, 5, 6], 2)]
    assert ok.continuation_s == {"r": 0.25}      # the controller adds it to the timed run
    wrong = OutputCheck(side="B")
    check_request(wrong, exp, [5, 9, 9, 9], lambda ids, n: ([7, 0], 0.0), epsilon=0.05,
                  budget=1)
    assert wrong.faults and "token 3" in wrong.faults[0]
    sure = OutputCheck(side="B")
    check_request(sure, exp, [9, 6, 7, 8], rerun, epsilon=0.05, budget=1)
    assert "margin 1.000" in sure.faults[0]
    spent = OutputCheck(side="B", near_ties=ok.near_ties)
    check_request(spent, exp, [5, 9, 9, 9], rerun, epsilon=0.05, budget=1)
    assert "beyond the 1 tolerated" in spent.faults[0]
    short = OutputCheck(side="B")
    check_request(short, exp, [5, 6], rerun, epsilon=0.05, budget=1)
    assert "stops after 2 tokens" in short.faults[0]


@pytest.mark.slow
def test_the_forcing_gate_checks_generate_not_only_what_force_reports(project):
    """force() echoes the forced tokens (so every forced position 'matches'); generate()
    serves garbage. The gate runs the candidate's generation as well and fails it."""
    from judge_fixtures import ECHO_FORCE

    from specpilot.judges.gates import run_gate

    bad = cheat(project, "echo-force", ECHO_FORCE)
    rep = run_gate(project, "dev", {}, False, False, 1, 12, candidate=bad, base="main")
    assert not rep.mismatches                     # what force() says is stock's...
    assert not rep.passed                         # ...but generation is not
    assert rep.generation is not None and rep.generation.faults
    assert any("candidate " in r for r in rep.reasons)
