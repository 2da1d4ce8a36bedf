"""The stock engine's CLI: output shapes and one-line errors with a non-zero exit."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specpilot.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("args, message", [
    (["run", "hello", "--model", "/no/such/model"], "model path does not exist"),
    (["run", "hello", "--opt", "nope=1"], "unknown option 'nope'"),
    (["run", "hello", "--opt", "draft_len=x"], "not a valid int"),
    (["run", "   "], "empty prompt"),
    (["run", "word " * 200, "--max-context", "64"], "does not fit the context"),
    (["run", "hello", "--drafter", "magic"], "unknown drafter"),
    (["bench", "--modes", "ar,warp"], "unknown mode 'warp'"),
])
def test_bad_input_is_a_one_line_error(args, message, smol):
    # smol: the embedded model converted first, so that its one-time conversion notice is
    # not part of a case's output when this test is the first to load it
    result = run(*args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_corrupt_gguf_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    result = run("run", "hello", "--model", str(bad))
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "GGUF" in result.output
    assert not list((tmp_path / "cache").rglob("*.safetensors"))  # nothing half-written kept


def test_run_json_reports_tokens_speed_and_options():
    result = run("run", "What is 3 + 4?", "--max-new", "6", "--json", "--opt", "draft_len=3")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert len(out["tokens"]) == 6 or out["stop_reason"] == "stop"
    assert out["options"]["draft_len"] == 3 and out["mode"] == "ngram"
    assert sum(out["accepted_per_step"]) + 1 >= len(out["tokens"]) and out["tokens_per_s"] > 0


def test_a_conversion_finished_by_another_process_first_is_kept(tmp_path):
    """Two processes converting the same GGUF at once (two workers on a fresh machine): the
    second to finish keeps the first's folder and drops its own; a stale partial folder (no
    model.safetensors) is replaced; a fresh one is moved in."""
    from stock.gguf_convert import publish

    def finished(name, text):
        d = tmp_path / name
        d.mkdir()
        (d / "model.safetensors").write_text(text)
        (d / "config.json").write_text(text)
        return d

    out = tmp_path / "model-abc"
    publish(finished(".convert-1", "first"), out)
    assert (out / "config.json").read_text() == "first" and not (tmp_path / ".convert-1").exists()
    inode = (out / "model.safetensors").stat().st_ino
    publish(finished(".convert-2", "second"), out)
    assert (out / "model.safetensors").stat().st_ino == inode
    assert (out / "config.json").read_text() == "first" and not (tmp_path / ".convert-2").exists()
    (out / "model.safetensors").unlink()                 # a stale, partial folder
    publish(finished(".convert-3", "third"), out)
    assert (out / "config.json").read_text() == "third"
