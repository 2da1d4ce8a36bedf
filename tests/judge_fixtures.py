"""Cheating candidates as real commits in a temporary repository (the red-team tests).

`judge_project(tmp)` is a git repository whose committed stock/ and kernels/ are this checkout's;
`cheat(root, name, code)` commits a candidate on a branch of its own whose stock/engine.py
ends with `code` (Python run at import time: it may wrap `Engine.generate` or `Engine.force`)
and returns the commit. The candidates run through the real judges, in real workers.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1",
           "PATH": "/usr/bin:/bin:/usr/local/bin"}

CONFIG = """[controller]
rounds = 2
warmup_rounds = 1
requests = 2
max_new = 16
# 2 rounds x 2 requests: a 2-core CPU budget (the shipped minimum is 8 pairs per process)
min_pairs = 4

[gates]
near_tie_rate = 0.002
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, env={**GIT_ENV, "HOME": str(root)},
                          check=True, text=True, capture_output=True).stdout


def judge_project(root: Path, config: str = CONFIG) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for part in ("stock", "kernels"):   # the system paths
        shutil.copytree(REPO / part, root / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / ".specpilot").mkdir()
    (root / ".specpilot" / "config.toml").write_text(config)
    (root / ".gitignore").write_text("/.specpilot/cache/\n/.specpilot/runs/\n")
    git(root, "init", "-q", "-b", "main")
    # stock/ holds 23 MB of drafter weights: git's zlib took ~1 s of every project's
    # setup to compress them; stored uncompressed the objects are the same objects
    git(root, "config", "core.looseCompression", "0")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "stock")
    return root


def descendants(pid: int) -> list[int]:
    """`pid` and all its descendants (a judge's workers, their bwrap and what they start)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            out += descendants(int(child))
    return out


def cheat(root: Path, name: str, code: str, path: str = "stock/engine.py") -> str:
    """Commit `code` appended to `path` on branch `cheat-<name>`; back on main after."""
    git(root, "checkout", "-q", "-b", f"cheat-{name}", "main")
    target = root / path
    target.write_text(target.read_text() + "\n\n" + textwrap.dedent(code))
    git(root, "commit", "-qam", f"cheat: {name}")
    commit = git(root, "rev-parse", "HEAD").strip()
    git(root, "checkout", "-q", "main")
    return commit


# -- the cheats ----------------------------------------------------------------------------

# Generates two real tokens, then repeats the last one: fast, and wrong after token 2.
# force() is untouched, so the forcing gate alone would pass it.
STOP_EARLY = """
_real_generate = Engine.generate


def _fast_generate(self, prompt, max_new, drafter=None, recorder=None, profiler=None):
    res = _real_generate(self, prompt, min(max_new, 2), drafter, recorder, profiler)
    res.tokens += [res.tokens[-1]] * (max_new - len(res.tokens))
    res.stop_reason = "length"
    return res


Engine.generate = _fast_generate
"""

# Echoes the forced tokens as its own choices (a forcing gate that trusts force() passes)
# and serves garbage from generate().
ECHO_FORCE = STOP_EARLY + """

def _echo_force(self, prompt, forced, chunk=None, digests=False):
    return ForcedResult(list(forced), [10.0] * len(forced), list(forced), [])


Engine.force = _echo_force
"""

# Correct outputs, memoized by prompt: free on every prompt it has seen in this process.
MEMOIZE = """
_real_generate = Engine.generate
_seen = {}


def _memo_generate(self, prompt, max_new, drafter=None, recorder=None, profiler=None):
    key = (tuple(prompt), max_new)
    if key not in _seen:
        _seen[key] = _real_generate(self, prompt, max_new, drafter, recorder, profiler)
    return _seen[key]


Engine.generate = _memo_generate
"""

# Verifies with half the layers while generating (forcing runs the whole stack).
FEWER_LAYERS = """
_real_generate = Engine.generate


def _shallow_generate(self, prompt, max_new, drafter=None, recorder=None, profiler=None):
    stack = self.model.model.layers
    self.model.model.layers = stack[: max(1, len(stack) // 2)]
    try:
        return _real_generate(self, prompt, max_new, drafter, recorder, profiler)
    finally:
        self.model.model.layers = stack


Engine.generate = _shallow_generate
"""
