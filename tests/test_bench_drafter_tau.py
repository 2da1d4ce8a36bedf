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
