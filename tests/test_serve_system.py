"""`specpilot serve --system NAME` (issue 27 item 3: serve the best system, entries applied):
a real server subprocess in a temporary project (tests/judge_fixtures.py), a candidate
commit served from its clean checkout by a confined judges' worker, spoken to over HTTP.

The candidate's stock/__init__.py tries, when imported, to write into the project and to
print a marker: the replies must still be the model's greedy tokens, the project file
unchanged (the worker ran under bubblewrap), and the marker in the worker's log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from judge_fixtures import cheat, descendants, git, judge_project
from model_folders import build
from specpilot.judges import confine
from specpilot.lifeline import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "SPECPILOT_THREADS": "1"}
ENV.pop(confine.OPT_OUT, None)
CONTEXT = 96
PROMPTS = ["w1 w2 w3", "w5 w9 w2 w7 w5 w9 w2", "w42"]
ATTACK = """
def _attack():
    import pathlib
    try:
        pathlib.Path({notes!r}).write_text("pwned\\n")
        print("ATTACK wrote", flush=True)
    except OSError as exc:
        print("ATTACK refused", type(exc).__name__, flush=True)


_attack()
del _attack
"""

needs_bwrap = pytest.mark.skipif(confine.usable_bwrap() is None,
                                 reason="bubblewrap is not usable here")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(project, candidate commit, model folder)."""
    root = judge_project(tmp_path_factory.mktemp("serve-system") / "proj")
    (root / "NOTES.md").write_text("the project's own notes\n")
    git(root, "add", "NOTES.md")
    git(root, "commit", "-qm", "notes")
    rev = cheat(root, "serve", textwrap.dedent(ATTACK.format(notes=str(root / "NOTES.md"))),
                path="stock/__init__.py")
    folder = build(tmp_path_factory.mktemp("serve-system-model") / "tiny")
    return root, rev, folder


def _serve(root: Path, *args: str):
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "serve", "--port", "0",
                             "--device", "cpu", "--max-context", str(CONTEXT), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=root, preexec_fn=die_with_parent())
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 180
    while not lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, lines


@needs_bwrap
def test_a_commit_is_served_confined_and_replies_its_greedy_tokens(project):
    from stock.system import load_system

    root, rev, folder = project
    ref = load_system(str(folder), device="cpu", max_context=CONTEXT)
    proc, lines = _serve(root, "--system", rev, "--model", str(folder), "--drafter", "ngram",
                         "--opt", "draft_len=4")
    try:
        assert lines, proc.stderr.read() if proc.poll() is not None else "no ready line"
        m = re.fullmatch(r"serving tiny at (http://127\.0\.0\.1:\d+)/v1 \(drafter ngram, cpu; "
                         rf"commit {rev[:12]}, tree [0-9a-f]{{12}}, confined: bubblewrap, "
                         rf"context {CONTEXT}, batches of up to 8\)\n", lines[0])
        assert m, lines[0]
        url = m.group(1)
        with httpx.Client(timeout=120) as client:
            for prompt in PROMPTS:
                want = ref.engine.generate(ref.tokenizer.encode(prompt), 10).tokens
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 10}
                got = client.post(f"{url}/v1/completions", json=body).json()
                assert got["choices"][0]["text"] == ref.tokenizer.decode(want)
                text = ""
                with client.stream("POST", f"{url}/v1/completions",
                                   json={**body, "stream": True}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            text += json.loads(line[6:])["choices"][0]["text"]
                assert text == ref.tokenizer.decode(want)
            bad = client.post(f"{url}/v1/completions",
                              json={"model": "tiny", "prompt": " ".join(["w1"] * CONTEXT)})
            assert bad.status_code == 400    # too long: refused, the server goes on
            assert client.get(f"{url}/health").json()["status"] == "ok"
            # the served system's process dies: a request is a one-line 500, the server
            # itself goes on answering
            for pid in descendants(proc.pid)[1:]:
                os.kill(pid, signal.SIGKILL)
            dead = client.post(f"{url}/v1/completions", json={**body, "prompt": PROMPTS[0]})
            assert dead.status_code == 500, dead.text
            assert "the served system stopped" in dead.json()["error"]["message"]
            assert client.get(f"{url}/health").json()["status"] == "ok"
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert (root / "NOTES.md").read_text() == "the project's own notes\n"
    logs = list((root / ".specpilot" / "runs" / "serve").glob("*.log"))
    assert len(logs) == 1 and "ATTACK refused" in logs[0].read_text(), err
    assert "Traceback" not in err, err


def test_names_that_are_no_system_are_one_line_errors(project, tmp_path):
    root, _, folder = project
    for name, says in (("no-such-thing", "not 'best', a memory entry or a commit"),
                       ("best", "no validated system yet")):
        proc, lines = _serve(root, "--system", name, "--model", str(folder))
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 2 and not lines
        assert err.count("\n") == 1 and says in err, err
    # an option the named system's own registry does not know: refused by its worker
    proc, lines = _serve(root, "--system", "main", "--model", str(folder), "--opt",
                         "no_such_option=1")
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 1 and not lines, err
    assert err.splitlines()[-1].startswith("error: served system: OptionError: unknown option "
                                           "'no_such_option'"), err
    bad = tmp_path / "opts.toml"
    bad.write_text("draft_len = [")
    proc, _ = _serve(root, "--system", "main", "--model", str(folder), "--opts-file", str(bad))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 2 and err.startswith("error: options file") and \
        err.count("\n") == 1, err
