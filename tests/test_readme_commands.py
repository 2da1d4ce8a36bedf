"""Every command in the README's shell blocks is one the tools accept as written: the
subcommand exists, every option is one it has, a choice or a range holds the value given,
no extra argument is left over; scripts and test files it names exist. Nothing runs here
(bench/readme_commands.py runs them for real in a fresh clone); this is what a renamed
option or a removed command breaks first."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest

from specpilot.cli import cli
from specpilot.git_cli import git_cli

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from readme_commands import commands, shell_lines  # noqa: E402  (bench/: the one parser)


def accepts(group: click.Group, name: str, args: list[str]) -> str | None:
    """None if `group` accepts args as a command line, else what it says is wrong."""
    ctx, cmd, rest = click.Context(group, info_name=name), group, list(args)
    while isinstance(cmd, click.Group):
        if not rest:
            return None   # the group's own help
        sub = cmd.get_command(ctx, rest[0])
        if sub is None:
            return f"no command {rest[0]!r}"
        ctx, cmd = click.Context(sub, info_name=rest.pop(0), parent=ctx), sub
    try:
        values, extra, _ = cmd.make_parser(ctx).parse_args(rest)
    except click.UsageError as exc:
        return exc.format_message()
    if extra:
        return f"extra argument(s) {extra}"
    for param in cmd.params:
        value = values.get(param.name)
        if value is None or not isinstance(param.type, (click.Choice, click.IntRange,
                                                          click.FloatRange)):
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            try:
                param.type.convert(v, param, ctx)
            except click.BadParameter as exc:
                return exc.format_message()
    return None


def check(words: list[str], cwd: Path) -> str | None:
    """What is wrong with one simple command, or None (commands we do not know pass)."""
    if words[:3] == ["python", "-m", "specpilot"]:
        words = ["specpilot", *words[3:]]
    if words[0] == "specpilot":
        return accepts(cli, "specpilot", words[1:])
    if words[:2] == ["git", "specpilot"]:
        return accepts(git_cli, "git specpilot", words[2:])
    if words[0] == "bash" and len(words) > 1:
        return None if (cwd / words[1]).is_file() else f"no script {words[1]}"
    if words[:3] == ["python", "-m", "pytest"]:
        missing = [w for w in words[3:] if w.startswith("tests/") and not (cwd / w).exists()]
        return f"no test file {missing}" if missing else None
    return None


def _problems(text: str) -> list[str]:
    bad = []
    for line in shell_lines(text):
        cwd = REPO
        for words in commands(line):
            if words[0] == "cd":   # a worktree of this repository: the same files
                continue
            why = check(words, cwd)
            if why:
                bad.append(f"{line.strip()}: {why}")
    return bad


def test_every_readme_command_is_accepted_as_written():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = shell_lines(text)
    assert sum(line.lstrip().startswith("specpilot") for line in lines) >= 20
    assert _problems(text) == []


@pytest.mark.parametrize("line, word", [
    ("specpilot run hi --bogus 3", "--bogus"),
    ("specpilot gate --check nightly", "nightly"),
    ("specpilot memory verfy", "verfy"),
    ("SPECPILOT_OPTS=a=1 specpilot analyze --requests 0", "0"),
    ("cd ../w && python -m specpilot run a b", "extra"),
    ("git specpilot replay x --onto", "--onto"),
    ("bash bench/no_such.sh", "no script"),
])
def test_a_command_the_tools_refuse_is_named(line, word):
    [problem] = _problems(f"```sh\n{line}\n```\n")
    assert word in problem
