"""Issue 30, item 4: the judges' commands as a user stops them and mistypes them.

- `specpilot gate` (the real command, a real project) stopped by SIGTERM while its worker
  computes leaves no worker process behind: every process it started is gone.
- `--device cuda` on a torch without CUDA is one `error:` line, not a traceback.
- A bad --opt (unknown name, value out of range) fails in seconds, before any model loads:
  stock's references (the only path to a model before the candidate's own worker) are
  never asked for; a good one gets there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from judge_fixtures import CONFIG, cheat, judge_project

from specpilot.cli import cli

REPO = Path(__file__).resolve().parents[1]
RANDOM = '\n[model]\npath = "random:tiny-qwen3"\n'


def _table() -> dict[int, tuple[int, float, str]]:
    """Every process here: pid -> (parent pid, CPU seconds, command line)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] in ("Z", "X"):
            continue
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def _descendants(root: int) -> dict[int, tuple[int, float, str]]:
    table = _table()
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, row in table.items():
            if row[0] == parent and pid not in found:
                found[pid] = row
                frontier.append(pid)
    return found


def test_sigterm_to_a_running_gate_leaves_no_worker(tmp_path):
    root = judge_project(tmp_path / "proj", CONFIG + RANDOM)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "gate", "--device", "cpu",
                             "--requests", "1", "--length", "3000", "--opt", "repeat_work=1000"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    started: dict = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            kids = _descendants(proc.pid)
            workers = {p: r for p, r in kids.items() if "worker_main.py" in r[2]}
            if any(cpu > 1.0 for _, cpu, _ in workers.values()):   # a worker at work
                started = kids
                break
            time.sleep(0.2)
        assert started, f"no busy worker appeared: {proc.poll()} {proc.stderr.read()[-2000:]}"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code == 128 + signal.SIGTERM
        assert proc.stderr.read().strip().splitlines()[-1] == "error: stopped by SIGTERM"
        deadline = time.time() + 15
        while time.time() < deadline and set(started) & set(_table()):
            time.sleep(0.1)
        left = {p: started[p][2] for p in set(started) & set(_table())}
        assert not left, f"processes outlived the stopped gate: {left}"
        assert not list((tmp_path / "tmp").glob("specpilot-worker-*")), "scratch left behind"
    finally:
        proc.kill()
        for pid in set(started) & set(_table()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
@pytest.mark.parametrize("args", [["run", "hi"], ["gate"], ["analyze"], ["bench"]])
def test_device_cuda_without_cuda_is_one_line(args):
    res = CliRunner().invoke(cli, [*args, "--device", "cuda"], catch_exceptions=False)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and "CUDA is not available" in lines[0]
    assert "Traceback" not in res.output


class _Reached(Exception):
    pass


@pytest.fixture(scope="module")
def marked_project(tmp_path_factory):
    """One project for every case below: each fails (or is stopped) before a model loads, so
    none changes what the next one sees."""
    return judge_project(tmp_path_factory.mktemp("marked") / "proj", CONFIG + RANDOM)


@pytest.fixture
def marked(marked_project, monkeypatch):
    """A project whose judges raise _Reached where stock's references (a model) would load;
    `calls` records each attempt."""
    from specpilot.judges import controller, gates

    root = marked_project
    calls: list[str] = []

    def reached(name):
        def fake(*args, **kwargs):
            calls.append(name)
            raise _Reached(name)
        return fake
    monkeypatch.setattr(gates, "stock_references", reached("gate"))
    monkeypatch.setattr(controller, "stock_outputs", reached("compare"))
    monkeypatch.chdir(root)
    return calls


@pytest.mark.parametrize("args, says", [
    (["gate", "--opt", "nosuch=1"], "candidate options: OptionError: unknown option 'nosuch'"),
    (["gate", "--opt", "draft_len=0"], "option draft_len: 0 is out of its range 1..256"),
    (["compare", "stock", "HEAD", "--opt-b", "nosuch=1"], "B options: OptionError: unknown"),
    (["compare", "stock", "HEAD", "--opt-a", "ngram_max=999"], "A options: OptionError: option "
                                                               "ngram_max: 999 is out of"),
    (["gate", "--candidate", "nosuchrev", "--opt", "draft_len=3"], "'nosuchrev' is not a commit"),
    (["compare", "stock", "HEAD", "--opt-of", "other", "draft_len=3"],
     "--opt-of other: not a candidate of this run (HEAD)"),
    (["compare", "stock", "HEAD", "HEAD"], "a candidate is given twice: HEAD HEAD"),
    (["compare", "stock", "HEAD", "stock", "--opt-of", "stock", "nosuch=1"],
     "C (stock) options: OptionError: unknown option 'nosuch'"),
])
def test_a_bad_argument_fails_before_any_model_loads(marked, args, says):
    res = CliRunner().invoke(cli, [*args, "--device" if args[0] == "gate" else "--devices",
                                   "cpu"], catch_exceptions=False)
    lines = res.output.strip().splitlines()
    assert res.exit_code in (1, 2) and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert marked == [], "a model was asked for before the arguments were checked"


@pytest.mark.parametrize("args, where", [(["gate", "--opt", "draft_len=3", "--device", "cpu"],
                                          "gate"),
                                         (["compare", "stock", "HEAD", "--opt-b", "draft_len=3",
                                           "--devices", "cpu"], "compare")])
def test_good_options_pass_the_check_and_reach_the_model(marked, args, where):
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert "_Reached" in res.output and marked == [where]


def test_an_option_only_the_batched_engine_registers_passes_the_check(marked, marked_project):
    """A system's batched engine registers options of its own (an entry's admission or tree
    knobs live in modules only stock/batch.py imports): the candidate's registry check knows
    them, as the throughput mode needs (the H200 verdict on coalesced-admission was refused
    with "unknown option 'admit_min'" before the worker imported stock.batch)."""
    commit = cheat(marked_project, "batch-knob", """
        from stock.options import register as _register
        _register("batch_only_knob", int, 1, "test: registered by the batched engine only",
                  min=1, max=4)
        """, path="stock/batch.py")
    res = CliRunner().invoke(cli, ["compare", "stock", commit, "--opt-b", "batch_only_knob=2",
                                   "--devices", "cpu"], catch_exceptions=False)
    assert "_Reached" in res.output and marked == ["compare"], res.output
    res = CliRunner().invoke(cli, ["compare", "stock", commit, "--opt-a", "batch_only_knob=2",
                                   "--devices", "cpu"], catch_exceptions=False)
    assert "A options: OptionError: unknown option 'batch_only_knob'" in res.output, res.output
