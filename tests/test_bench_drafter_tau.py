"""bench/drafter_tau.py's columns: weights with options of their own ("shipped@block_size=8"),
so that two block sizes are compared side by side in one run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

dt = pytest.importorskip("drafter_tau")
TAU_RUNS = dt.answer_runs   # the real scoring, which a test's spy calls through


def test_a_column_takes_its_own_block_size_and_draft_length():
    label, path, opts = dt.column("shipped", 16, 15)
    assert label.startswith("shipped (steps ") and opts == {"block_size": 16, "draft_len": 15}
    label, path8, opts = dt.column("shipped@block_size=8", 16, 15)
    assert path8 == path and label.endswith(" @block_size=8")
    assert opts == {"block_size": 8, "draft_len": 7}          # the block's masks cap it
    assert dt.column("shipped@block_size=8", 16, 5)[2]["draft_len"] == 5
    assert dt.column("shipped@block_size=8+draft_len=3", 16, 15)[2] == {"block_size": 8,
                                                                      "draft_len": 3}
    for bad in ("shipped@block_size=x", "shipped@topk=4", "shipped@draft_len=16",
                "shipped@block_size"):
        with pytest.raises(SystemExit, match="drafter_tau: "):
            dt.column(bad, 16, 15)


def test_the_walk_gains_what_decoding_gains(smol, monkeypatch):
    """--walk's τ (teacher-forced blocks of the AR output, walked) is the speculative
    decode's, step for step, in fp32; a column of fewer drafts walks the same weights'
    scoring capped (one scoring for both), and still gains what decoding at its length
    gains."""
    from specpilot.requests import load_dev, select
    from stock.engine import Engine
    from stock.options import Options
    from stock.system import make_drafter

    model = smol.engine.model
    columns = [dt.column("shipped", 16, 15), dt.column("shipped@draft_len=7", 16, 15)]
    engines = [Engine(model, Options({**o, "block_weights": str(p)}), 2048,
                      set(smol.engine.stop_ids)) for _l, p, o in columns]
    drafters = [make_drafter("block", e) for e in engines]
    scored = []
    monkeypatch.setattr(dt, "answer_runs", lambda *a: scored.append(a[-1])
                        or TAU_RUNS(*a))
    walks = dt.walkers(model, columns, drafters)
    for r in select(load_dev(), None, 1)[:1]:
        prompt = smol.tokenizer.chat(r.prompt)
        want = smol.engine.generate(prompt, 24).tokens
        gains = []
        for e, d, walk in zip(engines, drafters, walks):
            decoded, equal = dt.decoder(e, d)(prompt, want, 24)
            walked, _ = walk(prompt, want, 24)
            assert equal and walked == decoded and sum(walked) == len(want) - 1
            gains.append(walked)
        assert scored == [15]                 # one scoring, at the largest draft_len
        assert gains[0] != gains[1]           # the cap changed the walk (7 drafts, not 15)
