"""Child processes die with their parent; a stopped CLI leaves no worker and no scratch.

- `spawn()` starts a long-lived child (a judge's worker, an agent's command) in its own
  session, with the kernel's parent-death signal set (Linux `PR_SET_PDEATHSIG`: SIGKILL
  when the thread that started it ends, the whole process included, even by SIGKILL), and
  tracks it until `forget()`; bubblewrap's `--die-with-parent` does the same for confined
  workers, this covers the unconfined ones and the sandbox-less agent commands.
- `track_folder()` names a temporary folder to remove if the process is stopped.
- `install()` (the `specpilot` command calls it) turns SIGTERM, SIGHUP and SIGINT into:
  kill every tracked child's process group, remove every tracked folder, then unwind (a
  single-threaded command: `KeyboardInterrupt` for SIGINT, `SystemExit(128 + n)` otherwise,
  so `finally` blocks run) or, while other threads run (a cycle's parallel directions),
  exit at once with 128 + n: the run record is then as a crash leaves it, at its last
  saved transition, and `specpilot explore --resume` continues it.

A child started from a thread that ends before the child should is killed with it: every
judge starts and stops its workers in the same thread.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1
SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")

_children: dict[int, subprocess.Popen] = {}
_folders: dict[str, Path] = {}


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn giving the child SIGKILL when its parent dies (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here, not in the child
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:   # the parent died before the signal was armed
            os._exit(1)
    return preexec


def spawn(argv: list[str], **popen) -> subprocess.Popen:
    """subprocess.Popen in a new session, dying with its parent, tracked until forget()."""
    popen.setdefault("start_new_session", True)
    proc = subprocess.Popen(argv, preexec_fn=die_with_parent(), **popen)
    _children[proc.pid] = proc
    return proc


def forget(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        _children.pop(proc.pid, None)


def track_folder(path: Path) -> Path:
    _folders[str(path)] = Path(path)
    return path


def forget_folder(path: Path | None) -> None:
    if path is not None:
        _folders.pop(str(path), None)


def cleanup() -> None:
    """Kill every tracked child's process group and remove every tracked folder."""
    for proc in list(_children.values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                proc.kill()
            except OSError:
                pass
    for proc in list(_children.values()):
        try:
            proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            pass
    _children.clear()
    for path in list(_folders.values()):
        shutil.rmtree(path, ignore_errors=True)
    _folders.clear()


def _on_signal(signum, frame) -> None:
    cleanup()
    name = signal.Signals(signum).name
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if others:
        if sys.stderr.isatty():
            sys.stderr.write("\x1b[?25h")   # the cursor a live view may have hidden
        sys.stderr.write(f"error: stopped by {name}\n")
        sys.stderr.flush()
        os._exit(128 + signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.stderr.write(f"error: stopped by {name}\n")
    raise SystemExit(128 + signum)


def install() -> None:
    """Handle SIGTERM, SIGHUP and SIGINT as above (main thread only)."""
    for name in SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_IGN, None):
            signal.signal(sig, _on_signal)
