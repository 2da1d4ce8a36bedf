"""Run an agent's command: sandboxed, scrubbed environment, own process group, time limit
with a kill.

Sandbox: bubblewrap — the whole filesystem read-only, the worktree writable, every home
folder (/home, /root and the user's $HOME wherever it is), the sealed folder (the secret
seed, the sealed requests and their references), the project's `.specpilot/` (run records,
caches, the other agents' worktrees) and /tmp replaced by empty tmpfs, no
network, new PID namespace (so no other process's environment is visible). The Python
installation stays visible (read-only) when it lives in a home folder (e.g. pyenv).

`policy()` decides, like the judges' confinement (judges/confine.py): sandboxed by
default; where bwrap is missing or broken, an agent command is refused unless the user
opted out with `[explore] agent_sandbox = false` (commands then run with the user's rights,
with only the scrubbed environment, process group and time limit). No command ever runs
unconfined without that opt-out.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specpilot import lifeline
from specpilot.errors import SpecPilotError
from specpilot.judges.confine import python_roots, usable_bwrap
from specpilot.requests.sealed import default_sealed_dir, private_dir

# Only these variables reach an agent's command; everything else (API keys, tokens,
# credentials, SPECPILOT_* knobs) is dropped.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TERM", "CUDA_VISIBLE_DEVICES", "TZ", "PYENV_ROOT",
             "PYENV_VERSION")
OPT_OUT = "[explore] agent_sandbox = false"
CONFINED = "bubblewrap"


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
    """The sealed folder (seed, sealed requests, sealed references), created (0700) if
    missing so that it can be hidden, and its `specpilot` parent when it has one."""
    sealed = private_dir(default_sealed_dir()).resolve()
    return [sealed, sealed.parent] if sealed.parent.name == "specpilot" else [sealed]


def home_dirs() -> list[Path]:
    """Every home folder: /home, /root, $HOME and the user's home from the password file."""
    found = [Path("/home"), Path("/root"), Path.home()]
    try:
        found.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return [p.resolve() for p in found if p.is_dir()]


@lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    return usable_bwrap()   # the probe the judges' confinement uses


def policy(sandboxed: bool = True) -> str:
    """"bubblewrap" when agent commands run sandboxed, "none: <why>" when the user opted
    out; raises (one line) when a sandbox is wanted and bwrap cannot provide one."""
    if not sandboxed:
        return f"none: {OPT_OUT}"
    if bwrap_path() is None:
        raise SpecPilotError(
            "agent commands must run in a sandbox but bubblewrap is missing or does not work "
            "here: install it (apt-get install bubblewrap), use [explore] backend = "
            f"\"offline\", or opt out with {OPT_OUT} (agent commands then run with your "
            "rights: your home, SSH keys and the sealed set are readable)", code=2)
    return CONFINED


def describe(sandboxed: bool = True) -> str:
    """One line for the run record; never raises."""
    try:
        how = policy(sandboxed)
    except SpecPilotError:
        return "none: bwrap not found or not usable (only offline backends can run)"
    if how == CONFINED:
        return (f"{CONFINED} (read-only root, writable worktree, no home folders, no sealed "
                "set, no network)")
    return how + "; commands run with your rights, a scrubbed environment, time limit"


def _hidden(worktree: Path) -> list[Path]:
    hidden = [Path("/tmp").resolve()] + home_dirs() + sealed_dirs()
    if worktree.parent.name == "worktrees" and worktree.parent.parent.name == ".specpilot":
        hidden.append(worktree.parent.parent)   # the project's runs, caches, other worktrees
    keep = [p for p in dict.fromkeys(hidden) if p != Path("/")]
    # a folder inside another one is hidden with it (its tmpfs would be mounted on nothing)
    return [p for p in keep if not any(q in p.parents for q in keep)]


def _bwrap_argv(worktree: Path, argv: list[str]) -> list[str]:
    wt = worktree.resolve()
    hidden = _hidden(wt)
    args = [bwrap_path(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for folder in hidden:
        args += ["--tmpfs", str(folder)]
    under = lambda p: any(h == p or h in p.parents for h in hidden)  # noqa: E731
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    shown = [r for r in python_roots() if under(r)]   # e.g. pyenv under ~: keep Python
    if pyenv.is_dir() and under(pyenv) and any(pyenv in r.parents for r in shown):
        shown.append(pyenv)
    for root in sorted(set(shown)):
        args += ["--ro-bind", str(root), str(root)]
    args += ["--bind", str(wt), str(wt), "--chdir", str(wt), "--unshare-all",
             "--die-with-parent", "--new-session", "--"]
    return args + argv


def run(argv: list[str], worktree: Path, timeout_s: float, extra_env: dict | None = None,
        stdin: str | None = None, limit_chars: int = 20000,
        sandboxed: bool = True) -> CommandResult:
    """Run the argument vector `argv` in `worktree` under the sandbox (never a shell string:
    a caller that wants a shell passes ["/bin/bash", "-c", script] itself). Raises when no
    sandbox is available and the user did not opt out (`sandboxed=False`)."""
    if isinstance(argv, str) or not all(isinstance(a, str) for a in argv):
        raise TypeError("sandbox.run takes an argument vector (a list of strings)")
    how = policy(sandboxed)
    wrapped = _bwrap_argv(worktree, list(argv)) if how == CONFINED else list(argv)
    t0 = time.perf_counter()
    # its own session, killed with this process (specpilot/lifeline.py)
    proc = lifeline.spawn(wrapped, cwd=worktree, env=agent_env(worktree, extra_env),
                          stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    timed_out = False
    try:
        out, _ = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, _ = proc.communicate()
    finally:
        lifeline.forget(proc)
    out = out or ""
    if len(out) > limit_chars:
        out = out[: limit_chars // 2] + "\n[... output cut ...]\n" + out[-limit_chars // 2:]
    if timed_out:
        out += f"\n[killed: time limit of {timeout_s:g} s exceeded]"
    return CommandResult(proc.returncode if not timed_out else -9, out, timed_out,
                         time.perf_counter() - t0, how)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
