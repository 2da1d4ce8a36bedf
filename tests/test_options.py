"""Options: defaults are stock; sources and precedence; clear errors."""

from __future__ import annotations

import pytest

from stock.options import REGISTRY, OptionError, Options, resolve


def test_defaults_are_the_registered_ones():
    opts = Options()
    assert opts.as_dict() == {n: o.default for n, o in sorted(REGISTRY.items())}
    assert opts.non_default() == {}


def test_precedence_toml_then_env_then_cli(tmp_path):
    path = tmp_path / "o.toml"
    path.write_text("draft_len = 3\nngram_max = 2\nlattice_topk = 2\n")
    env = {"SPECPILOT_OPTS": "ngram_max=5,lattice_topk=6"}
    opts = resolve(["lattice_topk=7"], path, env)
    assert (opts["draft_len"], opts["ngram_max"], opts["lattice_topk"]) == (3, 5, 7)
    assert opts.non_default() == {"draft_len": 3, "ngram_max": 5, "lattice_topk": 7}


@pytest.mark.parametrize("cli, message", [
    (["nope=1"], "unknown option 'nope'"),
    (["draft_len=abc"], "not a valid int"),
    (["draft_len"], "expected name=value"),
])
def test_bad_options_are_clear_errors(cli, message):
    with pytest.raises(OptionError, match=message):
        resolve(cli, env={})


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("draft_len = = 3")
    with pytest.raises(OptionError, match="bad.toml"):
        resolve([], bad, {})
    with pytest.raises(OptionError, match="not found"):
        resolve([], tmp_path / "missing.toml", {})
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("draft_len = 'x'\n")
    with pytest.raises(OptionError, match="not a valid int"):
        resolve([], wrong, {})
