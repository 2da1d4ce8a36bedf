"""The writer lock: one file, created exclusively, recording who holds it.

`specpilot.lock` in the common git dir holds `pid <pid> on <host>`. A second writer fails
at once with a message naming the holder. A lock whose holder ran on this host and is no
longer running (a killed writer) is stale: the next writer removes it and goes on. A lock
from another host, or one that cannot be read, is never removed automatically: from here
nobody can tell whether its writer still runs.

Breaking a stale lock happens under a second, short-lived guard file
(`specpilot.lock.break`, also created exclusively), and only if the lock still holds the
bytes that were judged stale: two writers that both find the same stale lock cannot remove
a lock the other has just taken.

A failure to write the lock (disk full, read-only git dir) is a one-line error and leaves
no file behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from pathlib import Path

from specpilot.errors import SpecPilotError

_HOLDER = re.compile(r"^pid (\d+) on (\S+)\s*$")


class LockedError(SpecPilotError):
    """Another SpecPilot writer holds the repository lock."""


@contextlib.contextmanager
def writer_lock(path: Path):
    _acquire(path)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def holder_state(text: str) -> str:
    """'running', 'stale' (this host, process gone) or 'unknown' for a lock's contents."""
    match = _HOLDER.match(text)
    if not match or match.group(2) != socket.gethostname():
        return "unknown"
    pid = int(match.group(1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "stale"
    except PermissionError:  # alive, owned by someone else
        return "running"
    return "running"


def _acquire(path: Path) -> None:
    for _attempt in range(3):
        if _create(path):
            return
        try:
            seen = path.read_bytes()
        except FileNotFoundError:
            continue  # released between our two looks: try again
        except OSError as exc:
            raise LockedError(f"{path} exists and cannot be read ({exc.strerror}); delete it "
                              f"if no specpilot writer is running") from None
        text = seen.decode(errors="replace").strip()
        state = holder_state(text)
        if state == "stale" and _break(path, seen):
            continue
        if state == "running":
            raise LockedError(f"another specpilot writer holds {path} ({text}, running); "
                              f"retry when it finishes")
        if state == "stale":
            raise LockedError(f"{path} was left by a writer that is no longer running "
                              f"({text}) and another process is removing it; retry (delete "
                              f"{path.name}.break beside it if this persists)")
        raise LockedError(f"another specpilot writer holds {path} ({text or 'no holder'}); "
                          f"retry when it finishes, or delete the file if no writer is "
                          f"running (it may run on another host)")
    raise LockedError(f"{path}: could not take the lock (it keeps changing hands); retry")


def _create(path: Path) -> bool:
    """Create the lock with our holder line; False if it exists. Any other failure (disk
    full, no permission) removes what was created and raises a SpecPilotError."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        raise SpecPilotError(f"cannot create the writer lock {path}: {exc.strerror}; "
                             f"nothing was written") from None
    try:
        data = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise SpecPilotError(f"cannot write the writer lock {path}: "
                             f"{exc.strerror or exc}; nothing was written") from None
    os.close(fd)
    return True


def _break(path: Path, seen: bytes) -> bool:
    """Remove the stale lock `path` if it still holds `seen`; False if another process is
    breaking it right now."""
    guard = path.with_name(path.name + ".break")
    try:
        os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return False
    try:
        try:
            if path.read_bytes() == seen:
                path.unlink()
        except FileNotFoundError:
            pass
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            guard.unlink()
