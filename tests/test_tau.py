"""Exact τ (specpilot/judges/tau.py): decodes simulated over teacher-forced lattices, scored
against the greedy output; the teacher-forced lattices equal the ones a real speculative
run drafts at the same positions; analyze reports the chain and the trees."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from specpilot.judges import costmodel, tau
from specpilot.judges.analyze import report
from specpilot.judges.hardware import TABLE
from specpilot.judges.worker_main import teacher_forced
from stock.config import PRESETS
from stock.lattice_log import LatticeRecorder
from stock.tree import build

NEG = -math.inf
OUT = [10, 11, 12, 13, 14, 15, 16]   # a greedy output: OUT[0] from the prefill


def lat(rows):
    """A lattice from rows of (token, logprob) alternatives, padded to one width."""
    k = max((len(r) for r in rows), default=1)
    ids = np.full((len(rows), k), -1, np.int64)
    lps = np.full((len(rows), k), NEG)
    for d, row in enumerate(rows):
        for j, (t, lp) in enumerate(row):
            ids[d, j], lps[d, j] = t, lp
    return ids, lps


# at OUT[0]: the drafter's top-1 (20) is wrong, its second choice (11) right
OFF_TOP1 = lat([[(20, -0.1), (11, -1.0)], [(12, -0.1), (30, -2.0)]])


def test_node_targets_follow_the_output_path_only():
    tree = build(*OFF_TOP1, root=10, budget=5)
    assert tree.tokens == [10, 20, 12, 11, 12]   # 20, 20→12 (-0.2), 11 (-1.0), 11→12 (-1.1)
    assert tree.parents == [-1, 0, 1, 0, 3]
    # root → OUT[1]; 20 and its child are off the output's path; 11 → OUT[2], 11→12 → OUT[3]
    assert tau.node_targets(tree, OUT, 0) == [11, -1, -1, 12, 13]
    assert tau.accepted(tree, OUT, 0) == 2


def test_a_tree_accepts_a_non_top1_branch_once_the_budget_reaches_it():
    got = {b: tau.accepted(tau.step_tree(OFF_TOP1, 10, b), OUT, 0) for b in (1, 2, 3, 4, 5)}
    assert got == {1: 0, 2: 0, 3: 0, 4: 1, 5: 2}
    assert tau.accepted(tau.step_tree(OFF_TOP1, 10, None), OUT, 0) == 0   # the chain: 20, 12
    assert tau.accepted(tau.step_tree(OFF_TOP1, 10, 5, max_depth=1), OUT, 0) == 1


def test_targets_past_the_output_are_unknown():
    tree = build(*lat([[(15, 0.0)], [(16, 0.0)], [(17, 0.0)]]), root=14, budget=4)
    assert tau.node_targets(tree, OUT, 4) == [15, 16, -1, -1]
    assert tau.accepted(tree, OUT, 4) == 2


def counterfactual_lattices():
    """At 0 the chain misses and a tree takes the second choice; at 1 the lattice is the
    output's next four tokens; from 2 on the drafter has nothing."""
    return [lat([[(20, -0.1), (11, -1.0)]]),
            lat([[(12, 0.0)], [(13, 0.0)], [(14, 0.0)], [(15, 0.0)]]),
            *[lat([]) for _ in range(4)]]


def test_a_tree_moves_where_later_steps_start():
    lats = counterfactual_lattices()
    chain = tau.simulate_decode(lats, OUT, None, max_depth=8)
    assert chain.starts == (0, 1) and chain.gained == (1, 5) and chain.tau == 3.0
    tree = tau.simulate_decode(lats, OUT, 3)
    assert tree.starts == (0, 2, 3, 4, 5) and tree.gained == (2, 1, 1, 1, 1)
    assert tree.tau == pytest.approx(6 / 5) and tree.nodes == (3, 1, 1, 1, 1)
    # re-scoring the chain run's own steps credits the tree at both (ancestor-only: it
    # never learns that its step at 0 lands where the drafter has nothing)
    steps = [(*lats[0], [11, 99]), (*lats[1], [12, 13, 14, 15, 16])]
    assert costmodel.tau_curve(steps, budgets=(8,)) == {8: 3.5}


def test_the_chain_is_the_top1_tree_cut_at_its_length():
    lats = counterfactual_lattices()
    short = tau.simulate_decode(lats, OUT, None, max_depth=2)
    assert short.starts == (0, 1, 4, 5) and short.gained == (1, 3, 1, 1)
    assert tau.simulate_decode(lats, OUT, 1).gained == (1,) * 6   # the root alone: AR


def test_exact_factor_picks_the_chain_over_a_tree_that_lands_worse():
    lats = counterfactual_lattices()
    res = costmodel.tau_factor_exact([(lats, OUT)], 8, bound_of=lambda t: 1.0,
                                     budgets=(3, 8))
    assert res.method == "exact" and res.curve[costmodel.CHAIN] == 3.0
    assert res.best_budget == costmodel.CHAIN and res.factor == 1.0
    assert res.curve[3] == pytest.approx(1.2)


def test_simulation_needs_a_lattice_at_every_position():
    with pytest.raises(ValueError, match="every position"):
        tau.simulate_decode(counterfactual_lattices()[:3], OUT, None, 8)


@pytest.fixture
def one_thread():
    """The 135M model on this shared 2-core machine runs faster on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["ngram", "block"])
def test_teacher_forced_lattices_are_the_speculative_runs(smol, one_thread, name):
    """For each drafter, the lattice teacher-forced at position p (an AR decode asking the
    drafter at every step) is the one a real speculative run drafted at its step starting
    at p: n-gram exactly, the block drafter to fp32 rounding (its context comes from target
    hidden states of 1-token steps here, of the accepted runs there); and the chain's
    simulated decode is the real one, step for step."""
    from specpilot.requests import load_dev, select

    prompt = smol.tokenizer.chat(select(load_dev(), ["code"], 1)[0].prompt)
    drafter, draft_len, max_new = smol.drafter(name), smol.options["draft_len"], 16
    rec = LatticeRecorder(8)
    real = smol.engine.generate(prompt, max_new, drafter, recorder=rec)
    forced = teacher_forced(smol.engine, drafter, prompt, max_new, draft_len)
    assert forced["output"] == real.tokens
    assert len(forced["lattices"]) == len(real.tokens) - 1
    assert max(real.accepted) >= 5   # steps that committed several tokens at once
    p = 0
    for step, gained in zip(rec.steps, real.accepted):
        ids = torch.tensor(forced["lattices"][p]["ids"])
        lps = torch.tensor(forced["lattices"][p]["logprobs"])
        n, k = step.lattice.ids.shape[0], ids.shape[-1] if ids.numel() else 0
        assert ids.shape[0] == n
        if n:
            assert torch.equal(step.lattice.ids[:, :k], ids)
            torch.testing.assert_close(step.lattice.logprobs[:, :k], lps,
                                       atol=0 if name == "ngram" else 1e-4, rtol=0)
        p += gained
    sim = tau.simulate_decode(forced["lattices"], forced["output"], None, draft_len)
    assert list(sim.gained) == real.accepted and sim.tau == pytest.approx(real.tau)


def synthetic_measurement() -> dict:
    """worker_main.measure's shape: one request decoded with the chain, and its
    teacher-forced lattices (counterfactual_lattices)."""
    lats = counterfactual_lattices()
    forced = {"output": OUT, "depth": 8,
              "lattices": [{"ids": i.tolist(), "logprobs": lp.tolist()} for i, lp in lats]}
    chain_steps = [{"ids": lats[0][0][:, :1].tolist(), "logprobs": lats[0][1][:, :1].tolist(),
                    "target": [11, 99], "accepted": 0},
                   {"ids": lats[1][0].tolist(), "logprobs": lats[1][1].tolist(),
                    "target": [12, 13, 14, 15, 16], "accepted": 4}]
    return {"runs": [{"prompt_len": 5, "decode_s": 0.02, "steps": 2,
                      "lattices": chain_steps, "forced": forced}],
            "profile": {"per_step_ms": {"gemm": 5.0, "attention": 1.0, "other": 2.0}},
            "topk": 1, "draft_len": 8, "device": "cuda", "dtype": "bf16",
            "model_cfg": dataclasses.asdict(PRESETS["smollm2-135m"])}


def test_report_carries_the_chain_and_tree_rows():
    measured = synthetic_measurement()
    rep = report(measured, "embedded", TABLE["H200"], ["r"])
    assert rep.tau_method == "exact" and rep.tau_measured == 3.0
    rows = [(r.mode, r.budget, r.max_depth) for r in rep.tau_rows]
    assert rows == [("chain", 9, 8)] + [("tree", b, 8) for b in (8, 16, 32, 64)]
    assert [r.tau for r in rep.tau_rows] == pytest.approx([3.0] + [1.2] * 4)
    assert rep.tau_curve[costmodel.CHAIN] == 3.0 and rep.factors["tau"] == 1.0
    assert "tau_rows" in rep.model_dump_json()
    del measured["runs"][0]["forced"]   # an older measurement: the chain-trace estimate
    assert report(measured, "embedded", TABLE["H200"], ["r"]).tau_method == "ancestor-only"


def test_analyze_command_prints_the_tree_rows(monkeypatch):
    from click.testing import CliRunner

    from specpilot.cli import cli
    from specpilot.judges import analyze as module

    rep = report(synthetic_measurement(), "embedded", TABLE["H200"], ["r"])
    monkeypatch.setattr(module, "analyze", lambda *a, **k: rep)
    out = CliRunner().invoke(cli, ["analyze", "--model", "embedded", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    rows = [ln.split() for ln in lines if ln.split()[:1] in (["chain"], ["tree"])]
    assert [(r[0], int(r[1])) for r in rows] == [("chain", 9)] + [("tree", b)
                                                                  for b in (8, 16, 32, 64)]
    assert any(ln.startswith("τ factor") and "best: chain" in ln for ln in lines)
    js = CliRunner().invoke(cli, ["analyze", "--model", "embedded", "--json"])
    assert [r["budget"] for r in json.loads(js.output)["tau_rows"]] == [9, 8, 16, 32, 64]


def test_a_measurement_without_decode_steps_is_a_one_line_error():
    measured = synthetic_measurement()
    measured["runs"][0].update(steps=0, lattices=[], accepted=[])
    with pytest.raises(ValueError, match="no decode steps were run"):
        report(measured, "embedded", TABLE["H200"], ["r"])
