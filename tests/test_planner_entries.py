"""The offline planner reads the shipped entries right: which factor each targets, and the
gain its current (not stale) controller verdicts recorded."""

import tomllib
from pathlib import Path

from specpilot.agents.planner import _factor_of, _recorded_gain
from specpilot.memory.entry import EntryMeta

MEMORY = Path(__file__).resolve().parents[1] / "memory"


def _meta(entry_id: str) -> EntryMeta:
    text = (MEMORY / f"{entry_id}.toml").read_text()
    return EntryMeta.validate_dict(tomllib.loads(text), entry_id)


def test_tree_verify_targets_tau_though_its_summary_names_a_kernel():
    meta = _meta("tree-verify")
    assert "kernel" in meta.summary.lower()
    assert _factor_of(meta, {"kernel": 3.0, "tau": 1.2}) == "tau"
    assert _factor_of(_meta("fused-rmsnorm"), {"tau": 3.0}) == "kernel"


def test_recorded_gain_reads_controller_gains_as_fractions_and_skips_stale_ones():
    meta = _meta("tree-verify")
    gains = [r for r in meta.results if r.metric == "controller_gain"]
    assert gains
    fresh = meta.model_copy(update={"results": [
        gains[0].model_copy(update={"stale": False, "value": 0.2039}),
        gains[0].model_copy(update={"stale": False, "value": -0.05})]})
    assert _recorded_gain(fresh) == 0.204          # a fraction, not a ratio minus one
    stale = meta.model_copy(update={"results": [r.model_copy(update={"stale": True})
                                                for r in fresh.results]})
    assert _recorded_gain(stale) == 0.0
