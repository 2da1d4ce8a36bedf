"""File and command tools confined to one worktree (the sub-agent's whole world).

Every path is relative to the worktree; absolute paths, `..` components, `.git`, and any
path whose real location (after symlinks) leaves the worktree are refused. Commands run
through specpilot/agents/sandbox.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.agents import sandbox

MAX_READ = 60_000


class ToolRefused(Exception):
    """A tool call refused for safety or bad input; its message goes back to the agent."""


@dataclass
class Submission:
    option: str
    summary: str
    predicted_gain: float
    value: str = "true"


@dataclass
class Workspace:
    root: Path
    command_timeout_s: float = 300.0
    sandboxed: bool = True          # False only with [explore] agent_sandbox = false
    submission: Submission | None = None
    commands: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.root = Path(self.root).resolve()

    # -- paths ------------------------------------------------------------------------

    def path(self, rel: str, must_exist: bool = False) -> Path:
        if not isinstance(rel, str) or not rel.strip():
            raise ToolRefused("a path is required")
        p = Path(rel)
        if p.is_absolute():
            raise ToolRefused(f"refused: {rel!r} is absolute; paths are relative to the worktree")
        if ".." in p.parts:
            raise ToolRefused(f"refused: {rel!r} contains '..'")
        if p.parts and p.parts[0] == ".git":
            raise ToolRefused(f"refused: {rel!r} is inside .git")
        full = self.root / p
        cur = self.root
        for part in p.parts:   # no symlink anywhere on the way, inside or not
            cur = cur / part
            if cur.is_symlink():
                raise ToolRefused(f"refused: {rel!r} goes through a symlink ({cur.name})")
        real = full.resolve()
        if real != self.root and self.root not in real.parents:
            raise ToolRefused(f"refused: {rel!r} is outside the worktree")
        if must_exist and not real.exists():
            raise ToolRefused(f"{rel}: no such file or folder")
        return real

    # -- tools ------------------------------------------------------------------------

    def list(self, path: str = ".") -> str:
        folder = self.path(path, must_exist=True)
        if not folder.is_dir():
            raise ToolRefused(f"{path}: not a folder")
        rows = []
        for child in sorted(folder.iterdir()):
            if child.name == ".git":
                continue
            rows.append(child.name + ("/" if child.is_dir() else ""))
        return "\n".join(rows) or "(empty)"

    def read(self, path: str, start: int = 1, end: int | None = None) -> str:
        f = self.path(path, must_exist=True)
        if not f.is_file():
            raise ToolRefused(f"{path}: not a file")
        lines = f.read_text(errors="replace").splitlines()
        end = min(end or len(lines), len(lines))
        text = "\n".join(f"{i:5d}  {lines[i - 1]}" for i in range(max(start, 1), end + 1))
        return text[:MAX_READ] + ("\n[... cut ...]" if len(text) > MAX_READ else "")

    def grep(self, pattern: str, path: str = ".") -> str:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolRefused(f"bad pattern: {exc}") from None
        base = self.path(path, must_exist=True)
        files = [base] if base.is_file() else sorted(base.rglob("*"))
        hits = []
        for f in files:
            if ".git" in f.relative_to(self.root).parts or f.is_symlink() or not f.is_file():
                continue
            try:
                for n, line in enumerate(f.read_text(errors="strict").splitlines(), 1):
                    if rx.search(line):
                        hits.append(f"{f.relative_to(self.root)}:{n}: {line[:200]}")
            except (UnicodeDecodeError, OSError):
                continue
            if len(hits) >= 200:
                break
        return "\n".join(hits) or "(no match)"

    def write(self, path: str, content: str) -> str:
        f = self.path(path)
        f.parent.mkdir(parents=True, exist_ok=True)
        self.path(path)  # re-check after creating folders
        f.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    def edit(self, path: str, old: str, new: str) -> str:
        f = self.path(path, must_exist=True)
        text = f.read_text()
        count = text.count(old)
        if count != 1:
            raise ToolRefused(f"{path}: the old text occurs {count} times; it must occur once")
        f.write_text(text.replace(old, new, 1))
        return f"edited {path}"

    def run(self, command: str, timeout_s: float | None = None) -> str:
        """The agent's own shell command (its whole string is the script bash runs)."""
        return self._exec(["/bin/bash", "-c", command], command, timeout_s)

    def tests(self, path: str = "tests") -> str:
        self.path(path, must_exist=True)
        return self._exec(["python", "-m", "pytest", "-q", "-x", "--", path],
                          f"pytest -q -x -- {path!r}")

    def bench(self, options: str = "", max_new: int = 16) -> str:
        """Time stock (this worktree's code) with and without the options (agent evidence
        only: the controller decides)."""
        script = ("import time,sys;from stock.system import load_system;"
                  "from stock.options import Options,parse_pairs;"
                  "o=parse_pairs(sys.argv[1].split(','),'bench') if sys.argv[1] else {};"
                  "s=load_system(sys.argv[3]);p=s.tokenizer.chat('Write a haiku.');"
                  "from stock.engine import Engine\n"
                  "for name,opts in (('default',{}),('options',o)):\n"
                  " e=Engine(s.engine.model,Options(opts),s.engine.max_context,s.engine.stop_ids)\n"
                  " t=time.perf_counter();r=e.generate(p,int(sys.argv[2]),s.drafter('ngram'))\n"
                  " print(name,round(time.perf_counter()-t,3),'s',len(r.tokens),'tokens')")
        return self._exec(["python", "-c", script, str(options), str(int(max_new)), "embedded"],
                          f"bench {options!r} {int(max_new)}")

    def _exec(self, argv: list[str], label: str, timeout_s: float | None = None) -> str:
        """Run one argument vector under the sandbox (never a string a shell re-parses)."""
        limit = min(timeout_s or self.command_timeout_s, self.command_timeout_s)
        res = sandbox.run(argv, self.root, limit, sandboxed=self.sandboxed)
        self.commands.append({"command": label, "rc": res.rc, "timed_out": res.timed_out,
                              "seconds": round(res.seconds, 2), "sandbox": res.sandbox})
        return f"exit {res.rc}{' (timed out)' if res.timed_out else ''}\n{res.output}"

    def submit(self, option: str, summary: str, predicted_gain: float) -> str:
        if not re.match(r"^[a-z][a-z0-9_]{0,63}$", option or ""):
            raise ToolRefused("option must be a snake_case option name")
        self.submission = Submission(option, summary, float(predicted_gain))
        return "submitted"
