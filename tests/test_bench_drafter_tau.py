"""bench/drafter_tau.py's columns: weights with options of their own ("shipped@block_size=8"),
so that two block sizes are compared side by side in one run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

dt = pytest.importorskip("drafter_tau")


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


@pytest.mark.parametrize("draft_len", [15, 7])
def test_the_walk_gains_what_decoding_gains(smol, draft_len):
    """--walk's τ (teacher-forced blocks of the AR output, walked) is the speculative
    decode's, step for step, in fp32."""
    from specpilot.requests import load_dev, select
    from stock.drafters.block_weights import DEFAULT_DIR
    from stock.engine import Engine
    from stock.options import Options
    from stock.system import make_drafter

    model = smol.engine.model
    eng = Engine(model, Options({"block_size": 16, "draft_len": draft_len,
                                 "block_weights": str(DEFAULT_DIR)}), 2048,
                 set(smol.engine.stop_ids))
    drafter = make_drafter("block", eng)
    decode, walk = dt.decoder(eng, drafter), dt.walker(model, drafter, draft_len)
    for r in select(load_dev(), None, 1)[:1]:
        prompt = smol.tokenizer.chat(r.prompt)
        want = smol.engine.generate(prompt, 24).tokens
        decoded, equal = decode(prompt, want, 24)
        walked, _ = walk(prompt, want, 24)
        assert equal and walked == decoded and sum(walked) == len(want) - 1
