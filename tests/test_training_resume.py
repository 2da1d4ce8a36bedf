"""Training that continues from run to run (training/resume.py): `--resume DIR` picks up
DIR's last-step fp32 weights and AdamW moments from its training state (kept outside the
weights folder) and appends DIR's run to the manifest's history; without a state it says
so and starts a fresh optimizer; a state of other weights is a one-line error."""

from __future__ import annotations

import json

import pytest
import torch

from training.cli import main
from training.resume import default_state_path, find_state

TOY = ["--toy", "--steps", "4", "--prompts", "6", "--max-new", "12", "--val-every", "2",
       "--warmup", "0"]   # fresh and resumed runs then differ only by the state


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE_DIR", str(tmp_path / "cache"))


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_resume_continues_weights_moments_and_history(tmp_path, capsys):
    first, second, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    main(["--out", str(first), "--seed", "1", *TOY])
    man = _manifest(first)
    rec = man["training"]["optimizer_state"]
    assert rec["steps"] == 4 and rec["file"].startswith(str(tmp_path / "cache"))
    state = torch.load(rec["file"], weights_only=True)
    assert state["optimizer"]["state"] and state["key"] == rec["key"]   # AdamW moments kept
    assert man["history"] == []

    # the toy's target is its seed's: one seed for every run of one target
    main(["--out", str(second), "--seed", "1", "--resume", str(first), *TOY])
    out = capsys.readouterr().out
    assert "resume: the last step's fp32 weights and AdamW moments" in out
    m2 = _manifest(second)
    t2 = m2["training"]
    assert t2["resumed_from_state"] == rec["file"] and t2["steps_before"] == 4
    assert t2["optimizer_state"]["steps"] == 8
    assert [h["command"] for h in m2["history"]] == [man["command"]]
    assert m2["history"][0]["steps"] == 4

    # the same run from DIR's weights alone (no state): another start, so other weights
    default_state_path(rec["key"]).unlink()
    assert find_state(first)[0] is None
    main(["--out", str(fresh), "--seed", "1", "--resume", str(first), *TOY])
    assert "a fresh optimizer from its weights" in capsys.readouterr().out
    m3 = _manifest(fresh)
    assert m3["training"]["resumed_from_state"] == "" and len(m3["history"]) == 1
    assert m3["shards"][0]["sha256"] != m2["shards"][0]["sha256"]


def test_a_training_state_of_other_weights_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    main(["--out", str(a), "--seed", "1", *TOY])
    main(["--out", str(b), "--seed", "1", *TOY, "--steps", "3"])   # the same target
    other = _manifest(b)["training"]["optimizer_state"]["file"]
    with pytest.raises(ValueError, match="belongs to other weights"):
        main(["--out", str(tmp_path / "c"), "--seed", "1", "--resume", str(a),
              "--optimizer-state", other, *TOY])


def test_a_continued_run_validates_its_start_and_keeps_it_when_no_step_beats_it(tmp_path,
                                                                                 capsys):
    """A run from trained weights validates them at step 0 on its own held-out answers (its
    log then shows what the run gained), and keeps them when no later check is better: here
    a learning rate that wrecks the drafter."""
    first, wrecked = tmp_path / "a", tmp_path / "b"
    main(["--out", str(first), "--seed", "1", *TOY])
    main(["--out", str(wrecked), "--seed", "1", "--init-from-weights", str(first), *TOY,
          "--lr", "30"])
    out = capsys.readouterr().out
    assert "validate at step 0:" in out
    t = _manifest(wrecked)["training"]
    assert [h["step"] for h in t["val_history"]] == [0, 2, 4]
    assert t["kept_step"] == 0 and "kept the checkpoint of step 0" in out
    assert _manifest(wrecked)["shards"][0]["sha256"] == _manifest(first)["shards"][0]["sha256"]
