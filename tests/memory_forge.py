"""Forged memory inputs for the bad-input tests: entries in memory/ whose patch and metadata
agree (sha256, source tree), so only the check under test can refuse them.

Import after `from memory_fixtures import *`.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from specpilot.gitstore import DIFF_FLAGS, GitStore

SYSTEM = ["stock", "kernels"]
README_SECTION = (b"--- x/README.md\n+++ y/README.md\n@@ -1 +1 @@\n"
                  b"-# demo project\n+# owned by a patch\n")


def drop_refs(project) -> None:
    """Leave memory/ as a fresh clone has it: no entry refs, no notes."""
    for ref in project.git("for-each-ref", "--format=%(refname)", "refs/specpilot").split():
        project.git("update-ref", "-d", ref)
    project.git("update-ref", "-d", "refs/notes/specpilot")


def set_field(text: str, key: str, value: str) -> str:
    new, n = re.subn(rf'^{key} = ".*"$', f'{key} = "{value}"', text, flags=re.M)
    assert n == 1, key
    return new


def forge(project, entry_id: str, patch: bytes, source_tree: str | None = None,
          template: str = "a") -> None:
    """memory/<entry_id>.{toml,patch}: `template`'s metadata with this id, this patch and
    its sha256 (and `source_tree` when given)."""
    folder = project.path / "memory"
    text = (folder / f"{template}.toml").read_text()
    text = set_field(text, "id", entry_id)
    text = set_field(text, "patch_sha256", hashlib.sha256(patch).hexdigest())
    if source_tree:
        text = set_field(text, "source_tree", source_tree)
    (folder / f"{entry_id}.toml").write_text(text)
    (folder / f"{entry_id}.patch").write_bytes(patch)


def commit_with(project, parent: str, blobs: dict[str, tuple[str, bytes]], message: str) -> str:
    """A commit of `parent` plus `blobs` ({path: (mode, bytes)}; mode 120000 is a link whose
    bytes are its target), built in a private index."""
    index = project.path.parent / "forge-index"
    env = {"GIT_INDEX_FILE": str(index)}
    project.git("read-tree", parent, env=env)
    for path, (mode, data) in blobs.items():
        sha = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=project.path,
                             input=data, capture_output=True, check=True).stdout.decode().strip()
        project.git("update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}", env=env)
    tree = project.git("write-tree", env=env)
    index.unlink()
    return project.git("commit-tree", tree, "-p", parent, "-m", message)


def canonical(project, a: str, b: str, paths: list[str] | None = None) -> bytes:
    return subprocess.run(["git", "diff-tree", *DIFF_FLAGS, a, b, "--", *(paths or SYSTEM)],
                          cwd=project.path, capture_output=True, check=True).stdout


def system_tree(project, commit: str) -> str:
    return GitStore(project.path).system_tree(commit, SYSTEM)


def binary_section(project, path: str, data: bytes, header_prefix: str) -> bytes:
    """A `diff --git` binary section creating `path`, its header's a/ and b/ prefixes
    replaced by `header_prefix` (git strips the first component whatever it is)."""
    commit = commit_with(project, project.base, {path: ("100644", data)}, "binary")
    section = canonical(project, project.base, commit, [path])
    first, rest = section.split(b"\n", 1)
    assert first == f"diff --git a/{path} b/{path}".encode()
    return f"diff --git {header_prefix}{path} {header_prefix}{path}\n".encode() + rest


def link_entry(project, entry_id: str, link: str, target: str) -> None:
    """memory/<entry_id>: an entry (on the base) that adds the symbolic link `link`."""
    commit = commit_with(project, project.base, {link: ("120000", target.encode())},
                         f"link {entry_id}")
    forge(project, entry_id, canonical(project, project.base, commit),
          system_tree(project, commit))


def with_readme_section(project, entry_id: str = "a") -> None:
    """memory/<entry_id>.patch plus a plain-diff section that edits README.md."""
    patch = (project.path / "memory" / f"{entry_id}.patch").read_bytes() + README_SECTION
    forge(project, entry_id, patch, template=entry_id)


def with_binary_section(project, entry_id: str = "a") -> None:
    """memory/<entry_id>.patch plus a binary section that creates specpilot/evil.bin under a
    header that reads `stock/specpilot/evil.bin`."""
    extra = binary_section(project, "specpilot/evil.bin", b"\0\1\2evil" * 8, "stock/")
    patch = (project.path / "memory" / f"{entry_id}.patch").read_bytes() + extra
    forge(project, entry_id, patch, template=entry_id)


def write_note(project, entry_id: str, text: bytes) -> None:
    commit = project.git("rev-parse", f"refs/specpilot/entries/{entry_id}")
    path = project.path.parent / "forged-note"
    path.write_bytes(text)
    blob = project.git("hash-object", "-w", str(path))
    project.git("notes", "--ref", "refs/notes/specpilot", "add", "-f", "-C", blob, commit)


def files_of(project) -> Path:
    return project.path / "memory"
