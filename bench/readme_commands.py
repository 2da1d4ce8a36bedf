"""The README's shell commands, run verbatim in a fresh clone, one after another, as a new
user would: does every command work as written?

A fresh clone of this repository's HEAD (uncommitted changes are not in it) in a temporary
folder, a virtual environment that sees this machine's packages (`--system-site-packages`:
the README's `pip install` lines then find torch and the rest installed and download
nothing big; its `pip` is this machine's, installing into it) whose `bin/` goes first on
PATH, so the README's own install line installs the
clone's `specpilot` there and every later `specpilot` is the clone's. Each line runs with
`bash -c` in the clone (a `cd` holds for its own line), with a time limit; `specpilot
serve` is started in the background and stopped after the lines that talk to it. Skipped,
with the reason in the table: templates (`<commit>`, `name=value`, a model folder of your
own), lines for the H200, and the whole test suite (`.ci/run` runs that command).

    python bench/readme_commands.py                 # every README command (explore: minutes)
    python bench/readme_commands.py --quick         # without explore, validate and bench
    python bench/readme_commands.py --smoke         # CI: the same machinery on two lines

Prints one table (command, result, seconds, what a failure said) and writes
readme_commands.json to --out (default $OUT); exits 1 if any command failed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (the repository on sys.path)
from common import ROOT, log, print_table, write_json

SEPARATORS = {";", "&&", "||", "|"}
TEMPLATES = ("<commit>", "<entry>", "name=value", "MODEL_DIR", "./Qwen3.5-27B")
LONG = ("specpilot explore", "specpilot validate", "specpilot bench")   # skipped by --quick
# documented exits that are a verdict, not a failure (README: compare 3 not adopted, gate 4
# fails, explore and validate 5 validation failed)
VERDICTS = {"specpilot compare": {3: "not adopted"}, "specpilot gate": {4: "gate failed"},
            "specpilot explore": {5: "validation failed"},
            "specpilot validate": {5: "validation failed"}}
SMOKE_README = """```sh
specpilot init                    # config, refspecs, hooks
specpilot runs list --json
```
"""


def shell_lines(text: str) -> list[str]:
    """The command lines of a Markdown text's ```sh blocks (comment-only lines dropped)."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh" and not inside
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            lines.append(line)
    return lines


def commands(line: str) -> list[list[str]]:
    """One shell line as its simple commands (split at ; && || |), assignments, subshell
    parentheses and redirections dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    out, cur, skip = [], [], False
    for w in list(lex) + [";"]:
        if skip or w in ("(", ")"):
            skip = False
            continue
        if w in (">", ">>", "<", "2>", "&>"):
            skip = True   # and the file it names
            continue
        if w in SEPARATORS:
            while cur and "=" in cur[0] and not cur[0].startswith("-"):
                cur.pop(0)   # VAR=value before the command
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out


def why_skipped(line: str, quick: bool) -> str | None:
    code, _, comment = line.partition("  #")
    if any(t in code for t in TEMPLATES):
        return "a template: fill in your own values"
    if "H200" in comment:
        return "for the H200 (device tool)"
    if any(w[:3] == ["python", "-m", "pytest"] and not any(a.startswith("tests") for a in w[3:])
           for w in commands(line)):
        return "the whole test suite (.ci/run runs it)"
    if quick and any(code.strip().startswith(p) for p in LONG):
        return "long (--quick)"
    return None


def run_lines(lines: list[str], clone: Path, env: dict, limit: float,
              quick: bool) -> list[dict]:
    rows, server = [], None
    try:
        for line in lines:
            row = {"line": line.split("  #")[0].strip(), "seconds": 0.0, "note": ""}
            rows.append(row)
            skip = why_skipped(line, quick)
            if skip:
                row.update(result="skipped", note=skip)
                continue
            if quick and "&& specpilot explore" in line:   # the install, without the cycle
                row["line"] = line.split("&& specpilot explore")[0].strip()
                row["note"] = "`&& specpilot explore` left out (--quick)"
            if row["line"] == "specpilot serve":
                server, row["result"], row["note"] = start_server(clone, env, limit)
                continue
            log(f"$ {row['line']}")
            t0 = time.perf_counter()
            try:
                res = subprocess.run(["bash", "-c", row["line"]], cwd=clone, env=env,
                                     capture_output=True, text=True, timeout=limit)
                ok = res.returncode == 0
                verdict = next((v[res.returncode] for cmd, v in VERDICTS.items()
                                if commands(row["line"])[-1][:2] == cmd.split()
                                and res.returncode in v), None)
                if verdict:
                    ok, row["note"] = True, f"exit {res.returncode}: {verdict} (its verdict)"
                row["result"] = "ok" if ok else f"FAILED (exit {res.returncode})"
                if not ok:
                    tail = (res.stderr or res.stdout).strip().splitlines()
                    row["note"] = (tail[-1][:160] if tail else "") or row["note"]
            except subprocess.TimeoutExpired:
                row["result"] = f"FAILED (over {limit:.0f} s)"
            row["seconds"] = time.perf_counter() - t0
            if server is not None and not row["line"].startswith("specpilot load"):
                stop(server)
                server = None
    finally:
        if server is not None:
            stop(server)
    return rows


def start_server(clone: Path, env: dict, limit: float):
    """`specpilot serve` in the background, until it says it is serving."""
    log("$ specpilot serve  (background)")
    proc = subprocess.Popen(["bash", "-c", "exec specpilot serve"], cwd=clone, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.time() + limit
    for line in proc.stdout:
        if "serving" in line:
            return proc, "ok", line.strip()[:160]
        if time.time() > deadline:
            break
    stop(proc)
    return None, "FAILED", "no ready line"


def stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def cell(line: str, width: int = 90) -> str:
    """A command as a table cell: its head and tail where long, pipes escaped."""
    if len(line) > width:
        line = line[:35] + " ... " + line[-(width - 40):]
    return "`" + line.replace("|", "\\|") + "`"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip explore, validate and bench")
    ap.add_argument("--limit", type=float, default=1800, help="seconds a command may take")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: two lines, same machinery")
    args = ap.parse_args()
    text = SMOKE_README if args.smoke else (ROOT / "README.md").read_text(encoding="utf-8")
    tmp = Path(tempfile.mkdtemp(prefix="readme-commands."))
    clone, venv = tmp / "clone", tmp / "venv"
    log(f"fresh clone of {ROOT} (HEAD) in {clone}")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    # no pip of its own (ensurepip's setuptools cannot build an editable install): the
    # machine's pip, run by the venv's python, installs into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True)
    shim = venv / "bin" / "pip"
    shim.write_text(f'#!/bin/sh\nexec "{venv / "bin" / "python"}" -m pip "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               SPECPILOT_SEALED_DIR=str(tmp / "sealed"), PYTHONUNBUFFERED="1")
    if args.smoke:   # the README's install line, less its downloads: the clone's specpilot
        subprocess.run([str(shim), "install", "-q", "--no-deps",
                        "--no-build-isolation", "-e", str(clone)], check=True, env=env)
    rows = run_lines(shell_lines(text), clone, env, args.limit, args.quick)
    where = subprocess.run(["bash", "-c", "python -c 'import specpilot; print(specpilot.__file__)'"
                            " && command -v specpilot"], cwd=tmp, env=env,
                           capture_output=True, text=True).stdout.split()
    own = len(where) == 2 and where[0].startswith(str(clone)) and where[1].startswith(str(venv))
    rows.append({"line": "(the specpilot that ran)", "seconds": 0.0,
                 "result": "ok" if own else "FAILED", "note": " ".join(where)[:160]
                 + ("" if own else f" (not the clone's, in {venv})")})
    print_table(["command", "result", "s", "note"],
                [[cell(r["line"]), r["result"], f"{r['seconds']:.0f}",
                  r["note"].replace("|", "\\|")]
                 for r in rows],
                f"README commands in a fresh clone ({sum(r['result'] == 'ok' for r in rows)} ok, "
                f"{sum(r['result'].startswith('FAILED') for r in rows)} failed, "
                f"{sum(r['result'] == 'skipped' for r in rows)} skipped)")
    write_json(args.out, "readme_commands.json", rows)
    if args.keep:
        log(f"kept {tmp}")
    else:
        subprocess.run(["rm", "-rf", str(tmp)])
    sys.exit(1 if any(r["result"].startswith("FAILED") for r in rows) else 0)


if __name__ == "__main__":
    main()
