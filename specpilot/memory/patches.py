"""Git patches: their hashes, which hunk a failed apply points at, and the system-path rule.

Which paths a patch touches is never read from its text here: headers can say one thing
while `git apply` does another (a plain `--- x/… +++ y/…` section, a `diff --git` line
whose prefixes are not a/ and b/, a binary section). The rule is checked on git's own
account of what applying it changed (`GitStore.changed`, the tree diff), see replay.py.
The header reading below only names the hunk of a failed apply in an error message.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from specpilot.errors import SpecPilotError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FAILED = re.compile(r"patch failed: (.+):(\d+)")
_NOT_APPLY = re.compile(r"error: (.+?): (does not exist in index|already exists in index|"
                        r"patch does not apply|does not match index|wrong type)")


class OutsideSystemPathsError(SpecPilotError):
    """A patch that changes files outside the system paths."""


class PatchHashError(SpecPilotError):
    """A patch whose sha256 is not the one recorded in its entry."""


class PatchApplyError(SpecPilotError):
    """A patch that does not apply onto the replayed dependencies."""


@dataclass
class FilePatch:
    hunks: list[bytes] = field(default_factory=list)  # hunk header lines, in order


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_files(patch: bytes) -> dict[str, FilePatch]:
    """{new path (or old path for deletions): FilePatch} for each `diff --git` section
    (for naming a failed hunk only: never for deciding what a patch touches)."""
    files: dict[str, FilePatch] = {}
    current: FilePatch | None = None
    for line in patch.split(b"\n"):
        if line.startswith(b"diff --git "):
            current = FilePatch()
            a, b = _diff_git_paths(line)
            files[b or a] = current
        elif current is not None and _HUNK.match(line):
            current.hunks.append(line)
    return files


def check_format(entry_id: str, patch: bytes) -> None:
    if patch.strip() and not patch.startswith(b"diff --git "):
        raise PatchApplyError(f"entry {entry_id!r}: patch is not a git diff")


def check_paths(entry_id: str, changed: list[str], system_paths: list[str]) -> None:
    """`changed`: the paths applying the patch changed, as git reports them."""
    for path in sorted(changed):
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in system_paths):
            raise OutsideSystemPathsError(
                f"entry {entry_id!r}: patch touches {path!r}, outside the system paths "
                f"({', '.join(system_paths)})")


def check_hash(entry_id: str, patch: bytes, expected: str, where: str) -> None:
    actual = sha256(patch)
    if actual != expected:
        raise PatchHashError(
            f"entry {entry_id!r}: {where} has sha256 {actual[:16]}…, but the entry records "
            f"patch_sha256 {expected[:16]}… (the patch or its metadata was altered)")


def describe_failure(entry_id: str, patch: bytes, stderr: str) -> str:
    """'entry X: patch does not apply: FILE hunk #N (@@ … @@)' from `git apply` stderr."""
    files = split_files(patch)
    failed = _FAILED.search(stderr)
    if failed:
        path, line = failed.group(1), int(failed.group(2))
        fp = files.get(path)
        where = f"{path} line {line}"
        if fp:
            for number, header in enumerate(fp.hunks, 1):
                match = _HUNK.match(header)
                if match and int(match.group(1)) == line:
                    where = f"{path} hunk #{number} ({header.decode(errors='replace')})"
                    break
        return f"entry {entry_id!r}: patch does not apply: {where}"
    other = _NOT_APPLY.search(stderr)
    if other:
        return f"entry {entry_id!r}: patch does not apply: {other.group(1)}: {other.group(2)}"
    detail = stderr.strip().splitlines()[-1] if stderr.strip() else "git apply failed"
    return f"entry {entry_id!r}: patch does not apply: {detail}"


def _diff_git_paths(line: bytes) -> tuple[str, str]:
    rest = line[len(b"diff --git "):]
    if rest.startswith(b'"'):
        parts = re.findall(rb'"(?:[^"\\]|\\.)*"|\S+', rest)
        a, b = (parts + [b"", b""])[:2]
        return _strip_prefix(_unquote(a)), _strip_prefix(_unquote(b))
    half = rest.find(b" b/")
    return _strip_prefix(rest[:half].decode(errors="replace")), \
        _strip_prefix(rest[half + 1:].decode(errors="replace"))


def _strip_prefix(path: str) -> str:
    return path[2:] if path[:2] in ("a/", "b/") else path


def _unquote(raw: bytes) -> str:
    raw = raw.rstrip(b"\r")
    if raw.startswith(b'"') and raw.endswith(b'"'):
        body = raw[1:-1].decode("unicode_escape").encode("latin-1")
        return body.decode("utf-8", "replace")
    text = raw.decode("utf-8", "replace")
    return text.split("\t", 1)[0]

