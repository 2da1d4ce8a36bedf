"""Bad input is one line, `error: …`, naming the file or field (issue 21, class 7).

Every case runs the real CLI in a real git repository (memory_fixtures' `project`) and
asserts: exit code ≥ 1, one line of output starting `error: ` (not `error: internal`) that
names the file or field, no traceback, and the repository byte-identical afterwards. Model
folders are tiny ones built in tmp (tests/model_folders.py). Then: `--debug` shows the
traceback; a bug is one `error: internal: …` line; and, with real processes, a judge's
worker dies with its parent (SIGKILL) and a stopped parent (SIGTERM) leaves no worker and
no scratch folder behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from memory_fixtures import hermetic, project, snapshot  # noqa: F401
from model_folders import NORM, WEIGHTS, build, copy, edit_config, edit_weights

from specpilot.cli import cli

RUN = ["run", "hello", "--max-new", "2", "--device", "cpu"]
CONFIG = 'schema_version = 1\nsystem_paths = ["stock", "kernels"]\n'


@pytest.fixture(scope="module")
def good_model(tmp_path_factory) -> Path:
    folder = build(tmp_path_factory.mktemp("models") / "good")
    from stock.system import load_system   # the folder itself is sound: only a case breaks it

    load_system(str(folder), device="cpu", max_context=64).engine.generate([1, 2, 3], 2)
    return folder


# -- the cases: each returns the CLI's arguments after breaking one thing -------------------

def model(breaker):
    def setup(c):
        breaker(c.model)
        return RUN + ["--model", str(c.model)]
    return setup


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop(key):
    return lambda cfg: {k: v for k, v in cfg.items() if k != key}


def setting(**values):
    return lambda cfg: {**cfg, **values}


def options(*args):
    return lambda c: RUN + ["--model", str(c.model), *args]


def opts_file(data: bytes | str):
    return lambda c: RUN + ["--model", str(c.model), "--opts-file",
                            str(write(c.tmp / "opts.toml", data))]


def config(text: bytes | str):
    """The project's config.toml with `text` after a [model] section naming the good
    model, and `specpilot run` reading it (no --model)."""
    def setup(c):
        body = text if isinstance(text, bytes) else text.encode()
        write(c.root / ".specpilot" / "config.toml",
              CONFIG.encode() + body + f'\n[model]\npath = "{c.model}"\n'.encode())
        return RUN
    return setup


def config_in_model(text: str):
    """As config(), with `text` inside the [model] section."""
    def setup(c):
        write(c.root / ".specpilot" / "config.toml",
              CONFIG + f'[model]\npath = "{c.model}"\n{text}\n')
        return RUN
    return setup


def run_record(data: bytes | str):
    def setup(c):
        write(c.root / ".specpilot" / "runs" / "run-20260101-000000-0001" / "state.json", data)
        return ["runs", "list"]
    return setup


def requests_file(c):
    path = write(c.tmp / "reqs.jsonl", b'{"id": "a", "category": "chat", "prompt": "caf\xe9"}\n')
    return ["bench", "--requests", str(path), "--model", str(c.model), "--device", "cpu",
            "--modes", "ar", "--max-new", "2"]


CASES = [
    # model folders
    ("shape", model(lambda m: edit_weights(m, NORM, torch.ones(63))), [NORM, "shape"]),
    ("dtype", model(lambda m: edit_weights(m, NORM, torch.ones(64, dtype=torch.int32))),
     [NORM, "int32"]),
    ("json-malformed", model(lambda m: write(m / "config.json", "{hidden_size: 64")),
     ["config.json", "JSON"]),
    ("json-not-object", model(lambda m: edit_config(m, lambda cfg: [cfg])), ["config.json"]),
    ("json-incomplete", model(lambda m: edit_config(m, drop("num_attention_heads"))),
     ["config.json", "num_attention_heads"]),
    ("json-wrong-type", model(lambda m: edit_config(m, setting(hidden_size="64"))),
     ["config.json", "hidden_size"]),
    ("json-inconsistent", model(lambda m: edit_config(m, setting(num_attention_heads=3))),
     ["config.json", "num_heads"]),
    ("safetensors-truncated", model(lambda m: truncate(m / WEIGHTS)), [WEIGHTS]),
    ("no-tokenizer", model(lambda m: (m / "tokenizer.json").unlink()), ["tokenizer.json"]),
    ("tokenizer-corrupt", model(lambda m: write(m / "tokenizer.json", "{not json")),
     ["tokenizer.json"]),
    # engine options: every one declares its range, checked when Options are built
    ("lattice-topk-0", options("--opt", "lattice_topk=0"), ["lattice_topk", "1..64"]),
    ("ngram-min-above-max", options("--opt", "ngram_min=5", "--opt", "ngram_max=2"),
     ["ngram_min", "ngram_max"]),
    ("draft-len-0", options("--opt", "draft_len=0"), ["draft_len", "range"]),
    ("draft-len-negative", options("--opt", "draft_len=-3"), ["draft_len", "range"]),
    ("opts-file-out-of-range", opts_file("draft_len = 0\n"), ["opts.toml", "draft_len"]),
    ("opts-file-not-utf8", opts_file(b"draft_len = 3 # caf\xe9\n"), ["opts.toml", "UTF-8"]),
    ("opts-file-directory", lambda c: RUN + ["--model", str(c.model), "--opts-file",
                                             str(c.tmp)], ["<tmp>", "directory"]),
    # prompts and request files
    ("prompt-not-utf8", lambda c: ["run", "caf\udce9", "--max-new", "2", "--device", "cpu",
                                   "--model", str(c.model)], ["prompt", "UTF-8"]),
    ("requests-not-utf8", requests_file, ["reqs.jsonl", "UTF-8"]),
    # devices and limits
    ("device-bogus", options("--device", "bogus"), ["--device", "bogus"]),
    ("device-missing-gpu", options("--device", "cuda:99"), ["--device", "cuda:99"]),
    ("analyze-device-bogus", lambda c: ["analyze", "--device", "bogus", "--model",
                                        str(c.model)], ["--device", "bogus"]),
    ("analyze-opt-unknown", lambda c: ["analyze", "--device", "cpu", "--model", str(c.model),
                                       "--opt", "draft_lenn=15"], ["draft_lenn"]),
    ("analyze-opt-out-of-range", lambda c: ["analyze", "--device", "cpu", "--model",
                                            str(c.model), "--opt", "draft_len=0"],
     ["draft_len", "0"]),
    ("max-context-negative", options("--max-context", "-5"), ["--max-context", "-5"]),
    ("max-context-0", options("--max-context", "0"), ["--max-context", "0"]),
    ("max-new-0", options("--max-new", "0"), ["--max-new", "0"]),
    # the project's config file
    ("toml-unknown-section", config("[bogus]\nx = 1\n"), ["config.toml", "bogus"]),
    ("toml-unknown-key", config("sytem_paths = []\n"), ["config.toml", "sytem_paths"]),
    ("toml-section-unknown-key", config_in_model('paht = "x"'), ["config.toml", "paht"]),
    ("toml-wrong-type", config("[controller]\nprocesses = \"many\"\n"),
     ["config.toml", "[controller] processes"]),
    ("toml-out-of-range", config("[gates]\ndev_length = 0\n"),
     ["config.toml", "[gates] dev_length"]),
    ("toml-explore-unknown-key", config("[explore]\nmax_direction = 2\n"),
     ["config.toml", "[explore] max_direction"]),
    ("toml-not-utf8", config(b"# caf\xe9\n"), ["config.toml", "UTF-8"]),
    # run records
    ("run-record-truncated", run_record('{"run_id": "run-2026'), ["state.json"]),
    ("run-record-not-a-run", run_record('{"run_id": 5}'), ["state.json", "run_id"]),
]


@pytest.mark.parametrize("setup, names", [pytest.param(s, n, id=i) for i, s, n in CASES])
def test_bad_input_is_one_line_naming_the_file_or_field(setup, names, project, good_model,
                                                        tmp_path):
    c = SimpleNamespace(model=copy(good_model, tmp_path / "model"), root=project.path,
                        tmp=tmp_path / "tmp")
    c.tmp.mkdir()
    args = setup(c)
    names = [n.replace("<tmp>", str(c.tmp)) for n in names]
    before = snapshot(project.path)
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code >= 1, result.output
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and not lines[0].startswith("error: internal")
    assert all(n in lines[0] for n in names), (names, lines[0])
    assert "Traceback" not in result.output
    assert snapshot(project.path) == before


def test_debug_shows_the_traceback(project, good_model, tmp_path):
    bad = copy(good_model, tmp_path / "model")
    edit_config(bad, drop("hidden_size"))
    args = ["run", "hello", "--device", "cpu", "--model", str(bad)]
    plain = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert plain.exit_code == 1 and "Traceback" not in plain.output
    debug = CliRunner().invoke(cli, ["--debug", *args], catch_exceptions=False)
    assert debug.exit_code == 1 and "Traceback (most recent call last)" in debug.output
    assert debug.output.strip().splitlines()[-1] == plain.output.strip()


def test_a_bug_is_one_internal_line_and_debug_shows_it(project, monkeypatch):
    import stock.system

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(stock.system, "load_system", broken)
    result = CliRunner().invoke(cli, ["run", "hello"], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.output.strip() == ("error: internal: ZeroDivisionError: boom "
                                     "(rerun with --debug for the traceback)")
    debug = CliRunner().invoke(cli, ["--debug", "run", "hello"], catch_exceptions=False)
    assert debug.exit_code == 1 and "Traceback" in debug.output and "broken" in debug.output
    assert debug.output.strip().splitlines()[-1] == "error: internal: ZeroDivisionError: boom"


# -- child processes die with their parent -------------------------------------------------

PARENT = """
import json, sys, time
from pathlib import Path

from specpilot.gitstore import GitStore
from specpilot.judges.worker_proc import Worker, clean_checkout

root, mode = Path(sys.argv[1]), sys.argv[2]
if mode.startswith("handled"):   # what the specpilot command does first (cli.main)
    try:
        from specpilot import lifeline
        lifeline.install()
    except ImportError:   # before issue 21: none, SIGTERM's default ends the parent at once
        pass
co = clean_checkout(GitStore(root), "HEAD", ["stock", "kernels"], root)
w = Worker("busy", co, ["stock", "kernels"], "random:tiny-qwen3", {"repeat_work": "1000"}, "cpu",
           root / "worker.log", confine=mode.rpartition("-")[2] == "confined")
w.start()
w._send({"cmd": "run", "id": "long", "max_new": 500, "ids": [1, 2, 3]})  # minutes of work
print(json.dumps({"pid": w.proc.pid, "scratch": str(w._scratch)}), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def parent_project(tmp_path_factory) -> Path:
    """One judge project for the parents below: each only reads its committed stock (a
    clean checkout, made once and then reused) and writes its own worker.log; each test's
    scratch folders are under its own TMPDIR."""
    from judge_fixtures import judge_project

    return judge_project(tmp_path_factory.mktemp("parents") / "proj")


def _parent(tmp_path, root: Path, mode: str):
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    env.pop("SPECPILOT_UNCONFINED", None)
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    proc = subprocess.Popen([sys.executable, str(script), str(root), mode], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(f"the parent did not start its worker: {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line)


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_worker_dies_with_its_parent_killed_by_sigkill(tmp_path, parent_project):
    # unconfined: bubblewrap's --die-with-parent aside
    proc, worker = _parent(tmp_path, parent_project, "unconfined")
    try:
        assert _alive(worker["pid"]) and worker["scratch"] == "None"
        proc.kill()
        proc.wait(timeout=30)
        assert _gone(worker["pid"], 15), "the worker outlived its parent"
    finally:
        proc.kill()
        if _alive(worker["pid"]):
            os.killpg(worker["pid"], signal.SIGKILL)


@pytest.mark.parametrize("mode", ["handled-unconfined", "handled-confined"])
def test_sigterm_stops_the_worker_and_removes_its_scratch(tmp_path, parent_project, mode):
    confined = mode == "handled-confined"
    if confined:
        from specpilot.judges.confine import usable_bwrap

        if usable_bwrap() is None:
            pytest.skip("bubblewrap does not work here")
    proc, worker = _parent(tmp_path, parent_project, mode)
    try:
        assert _alive(worker["pid"])
        assert (worker["scratch"] != "None") == confined
        if confined:
            assert Path(worker["scratch"]).is_dir()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        assert _gone(worker["pid"], 15), "the worker outlived its parent"
        assert not list((tmp_path / "tmp").glob("specpilot-worker-*")), "scratch left behind"
        assert code == 128 + signal.SIGTERM
        assert proc.stderr.read().strip().splitlines()[-1] == "error: stopped by SIGTERM"
    finally:
        proc.kill()
        if _alive(worker["pid"]):
            os.killpg(worker["pid"], signal.SIGKILL)


def test_analyze_measures_the_system_at_the_options_given(good_model, tmp_path):
    """`specpilot analyze --opt draft_len=3`: the cost model's chain is the one of draft_len
    3 (the option reaches the measured system; SPECPILOT_OPTS alone never did)."""
    from specpilot.judges.analyze import analyze
    from specpilot.judges.hardware import for_device

    hw = for_device("cpu", tmp_path, measure_size="small")
    rep = analyze(None, str(good_model), "cpu", 1, 6, opts=["draft_len=3"], hardware=hw,
                  prompts=[("p", [5, 6, 7, 5, 6, 7, 5, 6])])
    assert rep.tau_rows[0].mode == "chain" and rep.tau_rows[0].budget == 4
