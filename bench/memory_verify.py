"""How long does `specpilot memory verify` take on a DAG of 50 entries?

Builds a throw-away repository about the size of this project (stock/, kernels/,
specpilot/, tests/: 200 files, ~1.6 MB), records 50 entries with chains and diamonds
(each entry depends on up to two earlier ones), then times verify per source, in process
and through the CLI. Goal: under 5 s. Prints one table.

    python bench/memory_verify.py [--entries 50] [--files 200] [--repeat 3]
    python bench/memory_verify.py --smoke      # 6 entries over 20 files, once (CPU, seconds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, print_table  # noqa: E402 - sets sys.path first

from specpilot.memory.dag import ancestors  # noqa: E402
from specpilot.memory.record import record  # noqa: E402
from specpilot.memory.store import Memory  # noqa: E402
from specpilot.memory.verify import verify  # noqa: E402

LINES = 200
FOLDERS = {"stock": 0.3, "kernels": 0.2, "specpilot": 0.3, "tests": 0.2}


# the benchmark's own commits: an identity of its own, whatever the user's git config holds
# (a fresh HOME has none, and `git commit` refuses to run without one)
IDENTITY = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
            "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}


def git(repo: Path, *args: str, env: dict | None = None, stdin: str | None = None) -> str:
    res = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                         input=stdin, env={**os.environ, **IDENTITY, **(env or {})},
                         check=True)
    return res.stdout.strip()


def file_text(name: str, edits: dict[int, str]) -> str:
    return "".join(f"{name}_{i:03d} = {edits.get(i, i)}  # some code of a realistic width\n"
                   for i in range(LINES))


def build(repo: Path, n_files: int, n_entries: int) -> float:
    git(repo, "init", "-q", "-b", "main")
    (repo / ".specpilot").mkdir()
    (repo / ".specpilot/config.toml").write_text('system_paths = ["stock", "kernels"]\n')
    names = []
    for folder, share in FOLDERS.items():
        for i in range(int(n_files * share)):
            path = repo / folder / f"mod{i:03d}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file_text(f"{folder}{i}", {}))
            if folder in ("stock", "kernels"):
                names.append(f"{folder}/mod{i:03d}.py")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "stock")
    base = git(repo, "rev-parse", "HEAD")
    deps: dict[int, list[int]] = {}
    edits: dict[int, dict[str, dict[int, str]]] = {}
    start = time.perf_counter()
    memory = Memory(repo)
    for e in range(n_entries):
        # chains (e-1), and every 4th entry also joins e-3: diamonds over shared ancestors
        deps[e] = [d for d in ([e - 1] if e % 5 else []) + ([e - 3] if e % 4 == 3 else [])
                   if d >= 0]
        mine = {}
        for k in range(2):  # two files per entry, each entry on its own lines
            name = names[(e * 7 + k * 13) % len(names)]
            mine.setdefault(name, {})[(e * 4 + k) % LINES] = f"'entry{e}'"
        edits[e] = mine
        files: dict[str, dict[int, str]] = {}
        for a in sorted(ancestors(deps, e)) + [e]:
            for name, lines in edits[a].items():
                files.setdefault(name, {}).update(lines)
        env = {"GIT_INDEX_FILE": str(repo.parent / "bench-index")}
        git(repo, "read-tree", base, env=env)
        for name, lines in files.items():
            blob = git(repo, "hash-object", "-w", "--stdin", stdin=file_text(_stem(name), lines))
            git(repo, "update-index", "--cacheinfo", f"100644,{blob},{name}", env=env)
        tree = git(repo, "write-tree", env=env)
        commit = git(repo, "commit-tree", tree, "-p", base, "-m", f"entry {e}")
        git(repo, "branch", f"src/e{e}", commit)
        record(memory, f"src/e{e}", f"e{e:02d}", [f"e{d:02d}" for d in deps[e]], base=base)
    return time.perf_counter() - start


def _stem(name: str) -> str:
    folder, mod = name.split("/")
    return f"{folder}{int(mod[3:6])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repo", type=Path, help="Build here and keep it (reused if built).")
    parser.add_argument("--smoke", action="store_true",
                        help="6 entries over 20 files, one repeat: a plumbing check")
    args = parser.parse_args()
    if args.smoke:
        args.entries, args.files, args.repeat = 6, 20, 1
    with tempfile.TemporaryDirectory(prefix="specpilot-bench-") as tmp:
        repo = args.repo or Path(tmp) / "repo"
        setup = 0.0
        if not (repo / ".git").exists():
            repo.mkdir(parents=True)
            setup = build(repo, args.files, args.entries)
        size = sum(p.stat().st_size for p in repo.rglob("*") if ".git" not in p.parts)
        rows = []
        for source in ("refs", "files", "all"):
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                report = verify(Memory(repo), source)
                times.append(time.perf_counter() - t)
                assert report.ok, [o.error for _s, o in report.outcomes if not o.ok]
            rows.append((f"verify --source {source} (in process)", len(report.outcomes), times))
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "specpilot", "memory", "verify"], cwd=repo,
                           check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            times.append(time.perf_counter() - t)
        rows.append(("specpilot memory verify (CLI, all)", 2 * args.entries, times))
    print(f"repo: {args.files} files, {size / 1e6:.1f} MB; {args.entries} entries "
          f"recorded in {setup:.1f} s; {os.cpu_count()} CPUs; best of {args.repeat}")
    print_table(["what", "checks", "best s", "median s"],
                [[what, checks, f"{min(times):.2f}", f"{statistics.median(times):.2f}"]
                 for what, checks, times in rows])
    worst = min(rows[-1][2])
    print(f"goal < 5 s: {'met' if worst < 5 else 'NOT met'} ({worst:.2f} s for the CLI)")


if __name__ == "__main__":
    main()
