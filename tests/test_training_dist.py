"""Block-drafter training over several processes (training/dist.py, launched by
torch.distributed.run with the gloo backend on this CPU) and its loss path
(training/loss.py: the compiled head and loss against the eager ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from training import loss as loss_module
from training.cli import main
from training.loss import HeadLoss, head_terms

ROOT = Path(__file__).resolve().parents[1]


def _launch(tmp_path: Path, args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


WORKER = textwrap.dedent("""
    import sys, torch
    from training.dist import Dist
    d = Dist.from_env()
    d.start("cpu")
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    if d.rank == 1:  # another start on rank 1: broadcast_params must replace it
        with torch.no_grad():
            m.weight.add_(1.0)
    d.broadcast_params(m)
    w0 = m.weight.detach().clone()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    ((m(x[d.rank::2]) ** 2).sum(-1).mean()).backward()  # this rank's half of the batch
    d.mean_grads(list(m.parameters()))
    stop, frac = d.agree(d.rank == 0, 0.25 + d.rank, None)
    torch.save({"w0": w0, "grads": [p.grad for p in m.parameters()], "stop": stop,
                "frac": frac, "gathered": d.gather(10 * d.rank), "same": d.same_weights(m)},
               f"{sys.argv[1]}/rank{d.rank}.pt")
    d.close()
""")


def test_ranks_start_equal_average_gradients_and_follow_rank_0(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    run = _launch(tmp_path, ["worker.py", str(tmp_path)])
    assert run.returncode == 0, run.stderr[-2000:]
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    ((m(x) ** 2).sum(-1).mean()).backward()  # the whole batch in one process
    for r in (0, 1):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert torch.equal(got["w0"], m.weight.detach())  # rank 0's start, on both
        for g, p in zip(got["grads"], m.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-6, atol=1e-7)
        assert got["stop"] is True and got["frac"] == 0.25  # rank 0's decision
        assert got["gathered"] == [0, 10]
        assert got["same"] is True


def test_two_processes_train_one_drafter_on_both_shards(tmp_path):
    out = tmp_path / "blk"
    run = _launch(tmp_path, ["-m", "training.block", "--out", str(out), "--seed",
                             "3", "--toy", "--prompts", "6", "--max-new", "12", "--steps", "4",
                             "--val-every", "2"])
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    t = man["training"]
    assert t["ranks"] == 2 and t["ranks_agree"] is True
    assert [r["prompts"] for r in t["rank_data"]] == [3, 3]  # shards 0/2 and 1/2 of 6
    assert t["answers"] == sum(r["answers"] for r in t["rank_data"]) == 6
    assert [r["steps"] for r in t["rank_data"]] == [t["steps"]] * 2  # rank 0's stop for both
    assert man["command"].startswith("python -m torch.distributed.run --standalone "
                                     "--nproc_per_node 2 -m training.block")
    assert "2 processes" in man["data"]["ranks"]
    assert "[rank 1]" in run.stdout and "saved 1 shard" in run.stdout


def test_two_processes_split_saved_answers_between_them(tmp_path):
    """--data-in under the launcher: each rank trains on the merged rows i % 2 == rank."""
    toy = ["--seed", "3", "--toy", "--prompts", "6", "--max-new", "12"]
    main([*toy, "--data-out", str(tmp_path / "d.pt")])
    out = tmp_path / "blk"
    run = _launch(tmp_path, ["-m", "training.block", "--out", str(out), *toy,
                             "--steps", "3", "--val-every", "0", "--data-in",
                             str(tmp_path / "d.pt")])
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    t = man["training"]
    assert [r["answers"] for r in t["rank_data"]] == [3, 3] and t["answers"] == 6
    assert t["ranks_agree"] is True and "merged rows i % 2 == r" in man["data"]["ranks"]
    assert man["data"]["files"][0]["rows"] == 6


def test_shard_and_data_out_are_refused_under_the_launcher(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for extra in (["--data-out", str(tmp_path / "d.pt")], ["--prompt-shard", "0/2"]):
        with pytest.raises(SystemExit) as exc:
            main(["--seed", "0", "--toy", "--out", str(tmp_path / "o"), *extra])
        assert exc.value.code == 2
        assert "each rank answers its own shard" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "d.pt").exists()


def _head_case():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 3, 4, 16, generator=g)
    w = torch.randn(50, 16, generator=g) / 4
    labels = torch.randint(0, 50, (2, 3, 4), generator=g)
    labels[1, 2, 2:] = -100  # past an answer's end
    return h, w, labels


def test_compiled_head_loss_equals_the_eager_one():
    h, w, labels = _head_case()
    he, hc = h.clone().requires_grad_(), h.clone().requires_grad_()
    le, ae = head_terms(he, labels, w, 7.0)
    lc, ac = HeadLoss(w, 7.0, compiled=True)(hc, labels)
    le.backward()
    lc.backward()
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
    assert float(ac) == pytest.approx(float(ae))
    torch.testing.assert_close(hc.grad, he.grad, rtol=1e-4, atol=1e-6)
    # and the weights matter: another decay gives another loss
    assert float(head_terms(h, labels, w, 1.0)[0]) != pytest.approx(float(le))


def test_a_failing_compile_falls_back_to_the_eager_loss(monkeypatch):
    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("no compiler here")
        return run

    monkeypatch.setattr(loss_module.torch, "compile", broken)
    said = []
    h, w, labels = _head_case()
    hl = HeadLoss(w, 7.0, compiled=True, log=said.append)
    loss, acc = hl(h, labels)
    assert not hl.compiled and len(said) == 1 and "no compiler here" in said[0]
    want = head_terms(h, labels, w, 7.0)
    assert torch.equal(loss, want[0]) and torch.equal(acc, want[1])
    hl(h, labels)
    assert len(said) == 1  # said once
