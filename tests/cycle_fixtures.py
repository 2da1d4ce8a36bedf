"""Fixtures for the cycle and agent tests: a small SpecPilot project (this checkout's stock/
and memory/, the tiny random model, evidence scaled down) in a tmp folder, and the scripted
Anthropic client (the only fake: it replays responses through the real tool loop).
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = """schema_version = 1
system_paths = ["stock", "kernels"]
[model]
path = "random:tiny-qwen3"
[controller]
rounds = 2
warmup_rounds = 0
requests = 2
max_new = 8
[gates]
default_tokens = 8
[explore]
max_directions = 2
tune_values = 1
prescreen_requests = 1
prescreen_max_new = 8
gate_requests = 2
gate_length = 12
controller_rounds = 2
controller_requests = 2
controller_max_new = 8
validate_requests = 2
validate_length = 16
analyze_max_new = 8
command_timeout_s = 20
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """References, clean checkouts and the A/A noise σ, shared by every test project."""
    return tmp_path_factory.mktemp("specpilot-cache")


@pytest.fixture
def project(tmp_path, shared_cache, monkeypatch) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    for name in ("stock", "kernels", "memory"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".specpilot").mkdir()
    (root / ".specpilot" / "config.toml").write_text(CONFIG)
    (root / ".gitignore").write_text("__pycache__/\n/.specpilot/runs/\n/.specpilot/worktrees/\n"
                                     "/.specpilot/cache\n")
    os.symlink(shared_cache, root / ".specpilot" / "cache")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "stock")
    sealed = tmp_path / "sealed-data"
    monkeypatch.setenv("SPECPILOT_SEALED_DIR", str(sealed))
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(root)
    return root


def head(root: Path) -> str:
    return _git(root, "rev-parse", "HEAD").strip()


# -- the scripted Anthropic client ------------------------------------------------------

_ids = itertools.count(1)


def tool(name: str, **args) -> dict:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": args}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def reply(stop_reason: str, *blocks: dict, tokens=(1000, 200)):
    return SimpleNamespace(content=[SimpleNamespace(**b) for b in blocks], stop_reason=stop_reason,
                           usage=SimpleNamespace(input_tokens=tokens[0], output_tokens=tokens[1]))


class ScriptedClient:
    """Replays scripted replies (or raises scripted exceptions) through the real tool loop
    and keeps every request it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.messages = self

    def create(self, **kw):
        self.requests.append(copy.deepcopy(kw))
        if not self.replies:
            raise AssertionError("the script ran out of replies")
        r = self.replies.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r

    def tool_results(self) -> list[dict]:
        """The tool_result blocks the loop sent back, in order."""
        out = []
        for req in self.requests:
            last = req["messages"][-1]
            if last["role"] == "user" and isinstance(last["content"], list):
                out += [b for b in last["content"] if b.get("type") == "tool_result"]
        return out
