"""Run an agent's command: sandboxed where possible, scrubbed environment, own process group,
time limit with a kill.

Sandbox: bubblewrap when `bwrap` exists and works — the whole filesystem read-only, the
worktree writable, the user's home, the sealed-request folder and /tmp replaced by empty
tmpfs, no network, new PID namespace (so no other process's environment is visible). Where
bwrap is absent the command still runs with the scrubbed environment, its own process group
and the time limit, and `describe()` says "none: ..." so the run record shows it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specpilot.judges.confine import usable_bwrap

# Only these variables reach an agent's command; everything else (API keys, tokens,
# credentials, SPECPILOT_* knobs) is dropped.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TERM", "CUDA_VISIBLE_DEVICES", "TZ", "PYENV_ROOT",
             "PYENV_VERSION")


@dataclass
class CommandResult:
    rc: int
    output: str
    timed_out: bool
    seconds: float
    sandbox: str


def agent_env(worktree: Path, extra: dict | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(PYTHONPATH=str(worktree), PYTHONDONTWRITEBYTECODE="1", HOME=str(worktree),
               PYTHONNOUSERSITE="1")
    env.update(extra or {})
    return env


def sealed_dirs() -> list[Path]:
    from specpilot.requests.sealed import default_sealed_dir

    sealed = default_sealed_dir().resolve()
    return [sealed, sealed.parent] if sealed.parent.name == "specpilot" else [sealed]


@lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    if os.environ.get("SPECPILOT_NO_SANDBOX") == "1":   # tests of the fallback path
        return None
    return usable_bwrap()   # the probe the judges' confinement uses


def describe() -> str:
    if bwrap_path():
        return "bubblewrap (read-only root, writable worktree, no home, no sealed set, no network)"
    why = "SPECPILOT_NO_SANDBOX=1" if os.environ.get("SPECPILOT_NO_SANDBOX") == "1" else \
        "bwrap not found or not usable"
    return f"none: {why}; commands run with a scrubbed environment, own process group, time limit"


def _bwrap_argv(worktree: Path, argv: list[str]) -> list[str]:
    home = Path.home().resolve()
    wt = worktree.resolve()
    args = [bwrap_path(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--tmpfs", str(home)]
    prefix = Path(sys.base_prefix).resolve()
    if home in prefix.parents:   # e.g. pyenv under ~: the interpreter must stay visible
        args += ["--ro-bind", str(prefix), str(prefix)]
        if (home / ".pyenv").is_dir():
            args += ["--ro-bind", str(home / ".pyenv"), str(home / ".pyenv")]
    for folder in sealed_dirs():
        if folder.exists() and folder != home:
            args += ["--tmpfs", str(folder)]
    args += ["--bind", str(wt), str(wt), "--chdir", str(wt), "--unshare-all",
             "--die-with-parent", "--new-session", "--"]
    return args + argv


def run(argv: list[str] | str, worktree: Path, timeout_s: float, extra_env: dict | None = None,
        stdin: str | None = None, limit_chars: int = 20000) -> CommandResult:
    """Run `argv` (a list, or a shell string) in `worktree` under the sandbox."""
    if isinstance(argv, str):
        argv = ["/bin/bash", "-c", argv]
    wrapped = _bwrap_argv(worktree, argv) if bwrap_path() else argv
    t0 = time.perf_counter()
    proc = subprocess.Popen(wrapped, cwd=worktree, env=agent_env(worktree, extra_env),
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    timed_out = False
    try:
        out, _ = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, _ = proc.communicate()
    out = out or ""
    if len(out) > limit_chars:
        out = out[: limit_chars // 2] + "\n[... output cut ...]\n" + out[-limit_chars // 2:]
    if timed_out:
        out += f"\n[killed: time limit of {timeout_s:g} s exceeded]"
    return CommandResult(proc.returncode if not timed_out else -9, out, timed_out,
                         time.perf_counter() - t0, "bubblewrap" if bwrap_path() else "none")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
