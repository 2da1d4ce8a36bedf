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

from specpilot.cycle import runner
from specpilot.cycle.state import Candidate, Direction, DirectionState, System

REPO = Path(__file__).resolve().parents[1]
CONFIG = """schema_version = 1
system_paths = ["stock", "kernels"]
[model]
path = "random:tiny-qwen3"
[controller]
# The tests' effects are large (10x repeated work removed), but 4 pairs per process on a
# shared 2-core CPU can put σ above 60%: one σ, not two, keeps their verdicts about the
# effect; and 2 rounds x 2 requests (4 pairs, below the shipped minimum of 8) keep the
# cycle tests within that CPU's budget.
sigma_multiple = 1.0
min_pairs = 4
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
validate_length = 24
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
    """References and clean checkouts, shared by every test project."""
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
    # stock/ holds 23 MB of drafter weights: git's zlib took ~1 s of every project's
    # setup to compress them; stored uncompressed the objects are the same objects
    _git(root, "config", "core.looseCompression", "0")
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


# -- adopted Phase 1 directions on real commits (Phase 2 and 3 tests) ---------------------

BASE_OPTIONS = {"repeat_work": "10"}   # a deliberately slow base: the patches remove work
LOOP = 'for _ in range(self.options["repeat_work"]):'
KMAX = 'k_max = self.options["draft_len"] if drafter is not None else 0'
ANCHOR = 'register("draft_layers", int, 4,'


def reg(name: str) -> str:
    return f'register("{name}", bool, False, "test patch {name}")\n'


A = ("skip_a", [("stock/options.py", ANCHOR, reg("skip_a") + ANCHOR),
                ("stock/engine.py", LOOP,
                 'for _ in range(0 if self.options["skip_a"] else self.options["repeat_work"]):')])
B = ("cap_b", [("stock/options.py", None, reg("cap_b")),     # None: append
               ("stock/engine.py", KMAX,
                'k_max = (min(self.options["draft_len"], 8) if self.options["cap_b"] else '
                'self.options["draft_len"]) if drafter is not None else 0')])
C = ("half_c", [("stock/options.py", ANCHOR, reg("half_c") + ANCHOR),
                ("stock/engine.py", LOOP, 'for _ in range(self.options["repeat_work"] // '
                                          '(2 if self.options["half_c"] else 1)):')])
BOTH = ('for _ in range(0 if self.options["skip_a"] else self.options["repeat_work"] // '
        '(2 if self.options["half_c"] else 1)):')


def edited(root, edits) -> dict[str, str]:
    out = {}
    for path, old, new in edits:
        text = out.get(path, (root / path).read_text())
        if old is None:
            text += new
        else:
            assert text.count(old) == 1, (path, old)
            text = text.replace(old, new)
        out[path] = text
    return out


def candidate(root, tmp_path, patch) -> str:
    """A real commit on its own branch: stock with `patch`'s edits."""
    name, edits = patch
    wt = tmp_path / f"wt-{name}"
    _git(root, "worktree", "add", "-q", "-b", f"cand-{name}", str(wt), "HEAD")
    for path, text in edited(wt, edits).items():
        (wt / path).write_text(text)
    _git(wt, "commit", "-qam", f"{name}")
    sha = _git(wt, "rev-parse", "HEAD").strip()
    _git(root, "worktree", "remove", "--force", str(wt))
    return sha


def adopted(cycle, root, tmp_path, patch, gain: float) -> DirectionState:
    """An adopted Phase 1 direction with its memory entry (recorded by the cycle's own code)."""
    name, _ = patch
    d = Direction(id=f"d-{name.replace('_', '-')}", title=name, hypothesis="less work",
                  target_factor="overhead", evidence_plan="e", predicted_gain=gain,
                  option=name, backend="anthropic")
    ds = DirectionState(direction=d, status="adopted", step="recorded", gain=gain,
                        lower_bound=gain / 2,
                        candidate=Candidate(commit=candidate(root, tmp_path, patch),
                                            options={**BASE_OPTIONS, name: "true"}),
                        gates=[{"gate": "forcing", "check": "dev", "passed": True, "reasons": [],
                                "option_specs": {name: {"type": "bool", "default": False,
                                                        "help": f"test patch {name}"}}}],
                        verdict={"adopted": True, "gain": gain, "lower_bound": gain / 2,
                                 "threshold": 0.01, "requests": ["rand-0"], "max_new": 8,
                                 "hardware": "cpu"})
    ds.entry = cycle.record_entry(ds)
    return ds


def setup_adopted(project, tmp_path, patches, client=None):
    cycle = runner.start(project, client=client)
    cycle.sleep = lambda s: None
    base = System(commit=head(project), options=BASE_OPTIONS)
    cycle.state.base = cycle.state.best = base
    cycle.state.directions = [adopted(cycle, project, tmp_path, p, g) for p, g in patches]
    cycle.state.phase = "integrate"
    cycle.save()
    return cycle
