"""All of SpecPilot's git access, in one place (GitPython; `git` plumbing where it has no API).

Four rules hold here and nowhere else needs to think about them:

- Work that builds trees (replay, verify, rebase) happens in a *private index*
  (`GIT_INDEX_FILE` in a temporary folder): the user's working tree, index and HEAD are
  never read or written by it.
- Ref updates are compare-and-swap (`update-ref <ref> <new> <old>`), and writers take a
  lock file in the common git dir, so a second concurrent writer gets a clear error.
- A folder someone else may have written (an agent's worktree) is read by `capture_tree`
  only: git runs there with a throw-away git dir and configuration of ours, never with the
  folder's `.git`, its configuration or hooks, nor any system or global configuration.
- An entry is published with `publish`: its ref name is checked first, and the note is
  taken back if the ref cannot be set, so a failed writer leaves no orphan note.
"""

from __future__ import annotations

import contextlib
import io
import hashlib
import os
import posixpath
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from specpilot.errors import SpecPilotError
from specpilot.lockfile import LockedError, writer_lock  # noqa: F401 (LockedError: re-export)

ZERO = "0" * 40
NOTES_REF = "refs/notes/specpilot"
ENTRY_PREFIX = "refs/specpilot/entries/"
ATTIC_PREFIX = "refs/specpilot/attic/"
IDENTITY = {
    "GIT_AUTHOR_NAME": "SpecPilot",
    "GIT_AUTHOR_EMAIL": "specpilot@localhost",
    "GIT_COMMITTER_NAME": "SpecPilot",
    "GIT_COMMITTER_EMAIL": "specpilot@localhost",
}
# Diffs are canonical whatever the user's configuration says: memory/ patches must be
# byte-identical when regenerated on another machine.
DIFF_FLAGS = (
    "-p", "-r", "--binary", "--full-index", "--no-renames", "--no-color", "--no-ext-diff",
    "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/",
)


class GitError(SpecPilotError):
    """A git command failed in a way the caller did not expect."""


class RefMovedError(SpecPilotError):
    """A compare-and-swap ref update lost a race."""


@dataclass
class Result:
    rc: int
    out: bytes
    err: str


class GitStore:
    """One repository: object store, refs, notes and worktrees."""

    def __init__(self, path: Path | str):
        try:
            self.repo = git.Repo(path, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise SpecPilotError(f"{path}: not inside a git repository", code=2) from exc
        self.root = Path(self.repo.working_tree_dir or path).resolve()
        self.common_dir = Path(self.run("rev-parse", "--git-common-dir").strip())
        if not self.common_dir.is_absolute():
            self.common_dir = (self.root / self.common_dir).resolve()

    # -- raw access -------------------------------------------------------------------

    def call(self, *args: str, env: dict | None = None, stdin: Path | None = None) -> Result:
        """Run `git <args>`; never raises on a non-zero exit. stdout is kept as raw bytes."""
        cmd = ["git", "-c", "core.quotePath=true", *args]
        handle = open(stdin, "rb") if stdin else None
        try:
            rc, out, err = self.repo.git.execute(
                cmd, istream=handle, env=env, with_extended_output=True,
                with_exceptions=False, stdout_as_string=False,
                strip_newline_in_stdout=False,
            )
        finally:
            if handle:
                handle.close()
        return Result(rc, out or b"", err if isinstance(err, str) else (err or b"").decode())

    def run(self, *args: str, env: dict | None = None, stdin: Path | None = None) -> str:
        """Run `git <args>` and return stdout as text; a non-zero exit raises GitError."""
        res = self.call(*args, env=env, stdin=stdin)
        if res.rc != 0:
            raise GitError(f"git {' '.join(args[:3])}: {res.err.strip() or f'exit {res.rc}'}")
        return res.out.decode("utf-8", "surrogateescape")

    # -- objects ----------------------------------------------------------------------

    def resolve(self, rev: str, kind: str = "commit") -> str | None:
        res = self.call("rev-parse", "--verify", "--quiet", f"{rev}^{{{kind}}}")
        return res.out.decode().strip() if res.rc == 0 else None

    def must_resolve(self, rev: str, kind: str = "commit") -> str:
        sha = self.resolve(rev, kind)
        if sha is None:
            raise SpecPilotError(f"{rev!r} is not a {kind} in this repository", code=2)
        return sha

    def read_blobs(self, shas: list[str]) -> dict[str, bytes]:
        """Many objects' contents from one short-lived `git cat-file --batch` call."""
        if not shas:
            return {}
        with tempfile.TemporaryDirectory(prefix="specpilot-batch-") as tmp:
            path = Path(tmp) / "shas"
            path.write_text("".join(f"{sha}\n" for sha in shas))
            res = self.call("cat-file", "--batch", stdin=path)
        out, pos, found = res.out, 0, {}
        for sha in shas:
            end = out.index(b"\n", pos)
            header = out[pos:end].split()
            if len(header) != 3:
                raise GitError(f"git cat-file: object {sha} is missing")
            size = int(header[2])
            found[sha] = out[end + 1:end + 1 + size]
            pos = end + 1 + size + 1
        return found

    def parents(self, commit: str) -> list[str]:
        _sha, kind, data = self.read_object(commit)
        if kind != "commit":
            raise GitError(f"{commit} is not a commit")
        header = data.split(b"\n\n", 1)[0].split(b"\n")
        return [line[7:].decode() for line in header if line.startswith(b"parent ")]

    def merge_base(self, a: str, b: str) -> str | None:
        res = self.call("merge-base", a, b)
        return res.out.decode().strip() if res.rc == 0 else None

    def commit_tree(self, tree: str, parents: list[str], message: str, date: str | None,
                    identity: dict | None = None) -> str:
        """A commit object with SpecPilot's fixed identity (or `identity`): same inputs,
        same hash. `date` None: now."""
        env = {**(identity or IDENTITY)}
        if date is not None:
            env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        return self.run(*args, "-m", message, env=env).strip()

    def read_object(self, name: str) -> tuple[str, str, bytes]:
        """(sha, type, content) through GitPython's long-lived `cat-file --batch`: no
        process per object, which keeps verifying many entries fast."""
        try:
            sha, kind, _size, data = self.repo.git.get_object_data(name)
        except ValueError as exc:
            raise GitError(f"git cat-file: no object {name}") from exc
        as_text = (lambda v: v.decode() if isinstance(v, bytes) else v)
        return as_text(sha), as_text(kind), data

    def tree_of(self, treeish: str) -> str:
        sha, kind, data = self.read_object(treeish)
        while kind == "tag":
            sha, kind, data = self.read_object(data.split(b"\n", 1)[0].split()[1].decode())
        if kind == "commit":
            return data[5:45].decode()
        if kind != "tree":
            raise GitError(f"{treeish} is a {kind}, not a tree or commit")
        return sha

    def tree_entries(self, tree: str) -> dict[str, tuple[str, str]]:
        """{name: (mode, sha)} of one tree object, parsed from its raw form."""
        _sha, _kind, data = self.read_object(tree)
        entries, pos = {}, 0
        while pos < len(data):
            space = data.index(b" ", pos)
            nul = data.index(b"\0", space)
            mode, name = data[pos:space].decode(), data[space + 1:nul].decode("utf-8", "replace")
            entries[name] = (mode, data[nul + 1:nul + 21].hex())
            pos = nul + 21
        return entries

    def system_tree(self, treeish: str, paths: list[str]) -> str:
        """The git tree hash of `treeish` restricted to `paths` (no object is written)."""
        root = self.tree_of(treeish)
        entries: dict[str, tuple[str, str]] = {}
        for path in paths:
            *dirs, leaf = path.strip("/").split("/")
            tree: str | None = root
            for part in dirs:
                found = self.tree_entries(tree).get(part)
                tree = found[1] if found and found[0] == "40000" else None
                if tree is None:
                    break
            if tree is not None and leaf in (listing := self.tree_entries(tree)):
                entries[path.strip("/")] = listing[leaf]
        return _virtual_tree(entries)

    def write_system_tree(self, treeish: str, paths: list[str]) -> str | None:
        """Write the system-path tree as an object (top-level system paths only)."""
        if any("/" in p.strip("/") for p in paths):
            return None
        listing = self.run("ls-tree", "-z", treeish, "--", *paths)
        with tempfile.TemporaryDirectory(prefix="specpilot-tree-") as tmp:
            path = Path(tmp) / "listing"
            path.write_text(listing)
            return self.run("mktree", "-z", stdin=path).strip()

    def export(self, treeish: str, paths: list[str], dest: Path) -> list[str]:
        """Write the files of `paths` at `treeish` into the new folder `dest`: a clean
        checkout with no index, no .git link and nothing from any worktree. Returns the
        paths that exist at `treeish`."""
        listing = self.run("ls-tree", "--name-only", treeish, "--", *paths)
        present = [p for p in listing.splitlines() if p]
        dest.mkdir(parents=True, exist_ok=False)
        if not present:
            return present
        res = self.call("archive", "--format=tar", treeish, "--", *present)
        if res.rc != 0:
            raise GitError(f"git archive {treeish[:12]}: {res.err.strip()}")
        with tarfile.open(fileobj=io.BytesIO(res.out)) as tar:
            tar.extractall(dest, filter="tar")
        return present

    def changed(self, a: str, b: str) -> dict[str, str]:
        """{path: new mode} of every path (anywhere in the tree) that differs between trees
        `a` and `b`; a deleted path has mode '000000'. This is git's own account of what a
        patch changed, whatever the patch text looked like."""
        out = self.run("diff-tree", "-r", "-z", "--no-renames", "--no-abbrev", a, b)
        fields = out.split("\0")
        found: dict[str, str] = {}
        for head, path in zip(fields[0::2], fields[1::2]):
            if head.startswith(":"):
                found[path] = head[1:].split()[1]
        return found

    def patch_paths(self, patch: bytes) -> list[str]:
        """The paths `git apply` reads `patch` as touching (`--numstat -z`: git's own parse,
        prefixes and plain `---`/`+++` sections included); [] if git cannot parse it (then
        applying it fails and says why). A rename lists its new name only: the tree diff
        after applying (`changed`) is the full account."""
        with tempfile.TemporaryDirectory(prefix="specpilot-patch-") as tmp:
            path = Path(tmp) / "patch"
            path.write_bytes(patch)
            res = self.call("apply", "--numstat", "-z", str(path))
        if res.rc != 0:
            return []
        fields = res.out.decode("utf-8", "surrogateescape").split("\0")
        paths, i = [], 0
        while i < len(fields):
            parts = fields[i].split("\t", 2)
            if len(parts) == 3 and parts[2]:
                paths.append(parts[2])
            elif len(parts) == 3:  # "added\tdeleted\t" then the two names
                paths += [f for f in fields[i + 1:i + 3] if f]
                i += 2
            i += 1
        return paths

    def links(self, treeish: str, paths: list[str]) -> dict[str, str]:
        """{path: target} of every symbolic link under `paths` at `treeish`."""
        out = self.run("ls-tree", "-r", "-z", "--full-tree", treeish, "--", *paths)
        found: dict[str, str] = {}
        for item in filter(None, out.split("\0")):
            info, path = item.split("\t", 1)
            mode, _kind, sha = info.split()
            if mode == "120000":
                found[path] = sha
        blobs = self.read_blobs(sorted(set(found.values())))
        return {p: blobs[sha].decode("utf-8", "surrogateescape") for p, sha in found.items()}

    def diff_names(self, a: str, b: str, paths: list[str]) -> list[str]:
        out = self.run("diff-tree", "-r", "--name-only", "--no-renames", a, b, "--", *paths)
        return [line for line in out.splitlines() if line]

    def diff_patch(self, a: str, b: str, paths: list[str]) -> bytes:
        """The canonical binary-safe, full-index patch from tree `a` to tree `b`."""
        res = self.call("diff-tree", *DIFF_FLAGS, a, b, "--", *paths)
        if res.rc != 0:
            raise GitError(f"git diff-tree {a[:12]} {b[:12]}: {res.err.strip()}")
        return res.out

    # -- refs and notes ---------------------------------------------------------------

    def refs(self, prefix: str) -> dict[str, str]:
        out = self.run("for-each-ref", "--format=%(objectname) %(refname)", prefix)
        pairs = (line.split(" ", 1) for line in out.splitlines() if line)
        return {name: sha for sha, name in pairs}

    def update_ref(self, ref: str, new: str, old: str | None, reason: str) -> None:
        """Set `ref` to `new` only if it still holds `old` (None: only if it is absent)."""
        self.check_ref_name(ref)
        res = self.call("update-ref", "-m", reason, ref, new, old or ZERO)
        if res.rc != 0:
            now = self.call("rev-parse", "--verify", "--quiet", ref).out.decode().strip()
            if (now or None) != old:
                raise RefMovedError(
                    f"{ref} changed under us (expected {(old or 'absent')[:12]}): "
                    f"another writer got there first; nothing was overwritten")
            raise GitError(f"git update-ref {ref}: {res.err.strip() or f'exit {res.rc}'}")

    def check_ref_name(self, ref: str) -> None:
        if self.call("check-ref-format", ref).rc != 0:
            raise SpecPilotError(f"{ref!r} is not a valid git ref name", code=2)

    def publish(self, ref: str, commit: str, old: str | None, note: bytes, date: str,
                reason: str) -> None:
        """Give `commit` its note, then point `ref` at it (compare-and-swap against `old`):
        a reader that sees the ref finds its note. If the ref cannot be set, the notes ref
        is put back where it was, so no orphan note is left behind."""
        self.check_ref_name(ref)
        notes_before = self.resolve(NOTES_REF)
        self.set_note(commit, note, date)
        try:
            self.update_ref(ref, commit, old, reason)
        except SpecPilotError:
            notes_after = self.resolve(NOTES_REF)
            if notes_before is None:
                self.call("update-ref", "-d", NOTES_REF, notes_after or "")
            else:
                self.call("update-ref", "-m", "specpilot: take back an orphan note",
                          NOTES_REF, notes_before, notes_after or ZERO)
            raise

    def delete_ref(self, ref: str, old: str) -> None:
        res = self.call("update-ref", "-d", ref, old)
        if res.rc != 0:
            raise RefMovedError(f"{ref} changed under us; not deleted")

    def notes(self) -> dict[str, str]:
        """{annotated commit: note blob} for every SpecPilot note."""
        out = self.run("notes", "--ref", NOTES_REF, "list")
        pairs = (line.split() for line in out.splitlines() if line)
        return {obj: blob for blob, obj in pairs}

    def note(self, commit: str) -> bytes | None:
        res = self.call("notes", "--ref", NOTES_REF, "show", commit)
        return res.out if res.rc == 0 else None

    def set_note(self, commit: str, text: bytes, date: str) -> None:
        env = {**IDENTITY, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        blob = self.hash_object(text)
        # -C reuses the blob as it is: `-F`/`-m` would re-flow blank lines and whitespace,
        # and the note must hold exactly the bytes of memory/<id>.toml.
        self.run("notes", "--ref", NOTES_REF, "add", "-f", "--allow-empty",
                 "-C", blob, commit, env=env)

    def hash_object(self, data: bytes) -> str:
        with tempfile.TemporaryDirectory(prefix="specpilot-blob-") as tmp:
            path = Path(tmp) / "blob"
            path.write_bytes(data)
            return self.run("hash-object", "-w", "--no-filters", str(path)).strip()

    def union_of_additions(self, env: dict | None = None) -> dict[str, tuple[str, bytes]] | None:
        """For the unmerged paths of an index (ours: stage 2, base: 1, theirs: 3), the
        merge that keeps ours then theirs, if every conflict only added lines on both sides
        (e.g. two option registrations appended to stock/options.py); None if any conflict
        is of another kind or lacks a common base. `env` selects the index (GIT_INDEX_FILE).
        Returns {path: (mode, merged bytes)}; {} when nothing is unmerged."""
        stages: dict[str, dict[int, tuple[str, str]]] = {}
        for item in self.run("ls-files", "-u", "-z", env=env).split("\0"):
            if "\t" in item:
                info, path = item.split("\t", 1)
                mode, sha, stage = info.split()
                stages.setdefault(path, {})[int(stage)] = (mode, sha)
        merged: dict[str, tuple[str, bytes]] = {}
        with tempfile.TemporaryDirectory(prefix="specpilot-merge-") as tmp:
            for path, st in stages.items():
                if set(st) != {1, 2, 3}:
                    return None
                files = []
                for stage in (2, 1, 3):
                    f = Path(tmp) / str(stage)
                    f.write_bytes(self.call("cat-file", "blob", st[stage][1]).out)
                    files.append(str(f))
                diff3 = self.call("merge-file", "-p", "--diff3", *files).out
                if not only_additions(diff3.decode(errors="replace")):
                    return None
                merged[path] = (st[2][0], self.call("merge-file", "-p", "--union", *files).out)
        return merged

    # -- private index ----------------------------------------------------------------

    @contextlib.contextmanager
    def private_index(self):
        with tempfile.TemporaryDirectory(prefix="specpilot-index-") as tmp:
            yield PrivateIndex(self, Path(tmp))

    # -- capturing a folder another process wrote -------------------------------------

    def capture_tree(self, folder: Path, paths: list[str], base: str,
                     strict: bool = True) -> str:
        """The tree of `base` with `paths` replaced by what `folder` holds now (files the
        folder lacks are deleted), its blobs written into this repository's objects.

        git runs with `folder` as its work tree but a throw-away git dir of ours (fixed
        configuration: no hooks, no fsmonitor, no filters; objects: this repository's), a
        fresh index, GIT_CONFIG_NOSYSTEM and no global configuration: the folder's `.git`
        file, any configuration or hook it names, and every configuration file its writer
        could reach are never read. `strict`: a symlink whose target leaves the folder, or
        a nested repository, is refused (SpecPilotError)."""
        folder = Path(folder)
        if folder.is_symlink() or not folder.is_dir():
            raise SpecPilotError(f"{folder}: not a folder")
        folder = folder.resolve()
        tree = self.tree_of(base)
        fmt = self.run("rev-parse", "--show-object-format").strip()
        objects = Path(self.run("rev-parse", "--git-path", "objects").strip())
        with tempfile.TemporaryDirectory(prefix="specpilot-capture-") as tmp:
            git = _Sealed(Path(tmp), folder, fmt, objects if objects.is_absolute()
                          else (self.root / objects).resolve())
            git("read-tree", tree)
            present = [p for p in paths if os.path.lexists(folder / p) or git("ls-files", "--", p)]
            if present:
                git("add", "-A", "--", *present)
            if strict and present:
                self._check_captured(git("ls-files", "-s", "-z", "--", *present))
            return git("write-tree").strip()

    def _check_captured(self, listing: str) -> None:
        for item in filter(None, listing.split("\0")):
            info, path = item.split("\t", 1)
            mode, sha, _stage = info.split()
            if mode == "160000":
                raise SpecPilotError(f"refused: {path} is a nested git repository")
            if mode == "120000":
                target = self.read_blobs([sha])[sha].decode("utf-8", "surrogateescape")
                where = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
                if posixpath.isabs(target) or where == ".." or where.startswith("../"):
                    raise SpecPilotError(f"refused: symlink {path} -> {target} leaves the tree")

    # -- config -----------------------------------------------------------------------

    def config_get_all(self, key: str) -> list[str]:
        res = self.call("config", "--get-all", key)
        return res.out.decode().splitlines() if res.rc == 0 else []

    def config_add(self, key: str, value: str) -> None:
        self.run("config", "--add", key, value)

    def remotes(self) -> list[str]:
        return [line for line in self.run("remote").splitlines() if line]

    def hooks_dir(self) -> Path:
        path = Path(self.run("rev-parse", "--git-path", "hooks").strip())
        return path if path.is_absolute() else (self.root / path)

    # -- lock -------------------------------------------------------------------------

    def writer_lock(self):
        """Serialise SpecPilot writers; a second one fails at once with a clear message, a
        lock left by a killed writer on this host is recognised and removed
        (specpilot/lockfile.py)."""
        return writer_lock(self.common_dir / "specpilot.lock")


class PrivateIndex:
    """An index file of our own: `read-tree`, `apply --cached`, `write-tree`."""

    def __init__(self, store: GitStore, folder: Path):
        self.store = store
        self.folder = folder
        self.env = {"GIT_INDEX_FILE": str(folder / "index")}
        self.tree: str | None = None  # what the index holds, when known

    def load(self, tree: str) -> None:
        if self.tree != tree:
            self.store.run("read-tree", tree, env=self.env)
            self.tree = tree

    def apply(self, patch: bytes, three_way: bool = False) -> Result:
        """Apply `patch` to the index; returns git's result (rc, stderr) untouched."""
        path = self.folder / "patch"
        path.write_bytes(patch)
        args = ["apply", "--cached", "--whitespace=nowarn"]
        if three_way:
            args.append("--3way")
        self.tree = None
        return self.store.call(*args, str(path), env=self.env)

    def unmerged(self) -> list[str]:
        out = self.store.run("ls-files", "-u", "-z", env=self.env)
        return sorted({item.split("\t", 1)[1] for item in out.split("\0") if "\t" in item})

    def write(self) -> str:
        self.tree = self.store.run("write-tree", env=self.env).strip()
        return self.tree

    def resolve_additions(self) -> list[str]:
        """Resolve the conflicts of a 3-way apply in this index where both sides only added
        lines (GitStore.union_of_additions); returns the resolved paths, or [] (and changes
        nothing) when any conflict is of another kind."""
        merged = self.store.union_of_additions(env=self.env)
        for path, (mode, data) in (merged or {}).items():
            sha = self.store.hash_object(data)
            self.store.run("update-index", "--force-remove", "--", path, env=self.env)
            self.store.run("update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}",
                           env=self.env)
        self.tree = None
        return sorted(merged or {})


class _Sealed:
    """`git` over a foreign work tree with nothing of its configuration (capture_tree)."""

    def __init__(self, tmp: Path, work_tree: Path, object_format: str, objects: Path):
        gitdir = tmp / "git"
        (gitdir / "refs").mkdir(parents=True)
        (gitdir / "objects").mkdir()
        (gitdir / "HEAD").write_text("ref: refs/heads/capture\n")
        sha256 = object_format == "sha256"
        (gitdir / "config").write_text(
            f"[core]\n\trepositoryformatversion = {1 if sha256 else 0}\n\tbare = false\n"
            "\thooksPath = /dev/null\n\tfsmonitor = false\n\tuntrackedCache = false\n"
            "\tsymlinks = true\n\tfilemode = true\n\tautocrlf = false\n"
            + ("[extensions]\n\tobjectFormat = sha256\n" if sha256 else ""))
        self.argv = ["git", "--git-dir", str(gitdir), "--work-tree", str(work_tree),
                     "--literal-pathspecs", "-c", "core.hooksPath=/dev/null",
                     "-c", "core.fsmonitor=false", "-c", "core.quotePath=true"]
        self.cwd = work_tree
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
                    "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
                    "GIT_INDEX_FILE": str(tmp / "index"), "GIT_OBJECT_DIRECTORY": str(objects),
                    "GIT_TERMINAL_PROMPT": "0"}

    def __call__(self, *args: str) -> str:
        res = subprocess.run(self.argv + list(args), cwd=self.cwd, env=self.env,
                             capture_output=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace").strip()
            raise GitError(f"git {' '.join(args[:2])} (capture): {err or res.returncode}")
        return res.stdout.decode("utf-8", "surrogateescape")


def _virtual_tree(entries: dict[str, tuple[str, str]]) -> str:
    """Hash a git tree made of `path -> (mode, sha)` entries; paths may be nested."""
    children: dict[str, dict] = {}
    for path, value in entries.items():
        node = children
        *dirs, leaf = path.split("/")
        for part in dirs:
            node = node.setdefault(part, {})
        node[leaf] = value
    return _hash_node(children)


def _hash_node(node: dict) -> str:
    rows = []
    for name, value in node.items():
        if isinstance(value, dict):
            mode, sha = "40000", _hash_node(value)
        else:
            mode, sha = value
            mode = "40000" if mode == "040000" else mode
        sort_key = name + "/" if mode == "40000" else name
        rows.append((sort_key.encode(), mode.encode(), name.encode(), bytes.fromhex(sha)))
    body = b"".join(m + b" " + n + b"\0" + s for _k, m, n, s in sorted(rows))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def only_additions(diff3: str) -> bool:
    """True if every conflict block of a `git merge-file --diff3` result has an empty base
    section: both sides only added lines at the same place (e.g. two option registrations
    appended to stock/options.py), so keeping both loses nothing."""
    state = None
    for line in diff3.splitlines():
        if line.startswith("<<<<<<< "):
            state = "ours"
        elif line.startswith("||||||| ") and state == "ours":
            state = "base"
        elif line.startswith("=======") and state == "base":
            state = "theirs"
        elif line.startswith(">>>>>>> "):
            state = None
        elif state == "base":
            return False
    return True
