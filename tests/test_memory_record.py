"""Recording entries: commit, ref, note and memory/ files; a DAG with a diamond replays."""

import json
import tomllib

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import REPO
from specpilot.errors import SpecPilotError
from specpilot.memory.dag import DuplicateIdError, MissingDependencyError
from specpilot.memory.replay import Replayer
from specpilot.memory.verify import verify


def build_dag(project):
    """a ← b, a ← c, (b, c) ← d (the diamond), d ← e, and f alone on the base."""
    project.build("diamond-6", _build_dag)


def _build_dag(project):
    project.entry("a", {1: "'a'"})
    project.entry("b", {10: "'b'"}, ["a"])
    project.entry("c", {20: "'c'"}, ["a"])
    project.entry("d", {30: "'d'"}, ["b", "c"])
    project.entry("e", {40: "'e'"}, ["d"])
    project.entry("f", {50: "'f'"})


def test_record_writes_commit_ref_note_and_files(project):
    done = project.entry("a", {1: "'a'"})
    assert project.git("rev-parse", "refs/specpilot/entries/a") == done.commit
    assert project.git("rev-parse", f"{done.commit}^") == project.base
    note = project.git("notes", "--ref", "refs/notes/specpilot", "show", done.commit)
    assert (project.path / "memory/a.toml").read_text().strip() == note
    meta = tomllib.loads(note)
    assert meta["base"] == project.base and meta["deps"] == []
    assert meta["schema_version"] == 1
    patch = (project.path / "memory/a.patch").read_text()
    assert patch.startswith("diff --git a/stock/engine.py b/stock/engine.py")
    assert "+line_01 = 'a'" in patch


def test_entry_commit_hash_is_deterministic(project):
    # Fixed identity and the entry's `created` date: the same entry gives the same commit.
    done = project.entry("a", {1: "'a'"})
    assert done.commit == "ace0b831d3e967b0e4f631de5501331636c42e16"


def test_dag_with_a_diamond_replays_and_reproduces(project):
    build_dag(project)
    d = project.git("rev-parse", "refs/specpilot/entries/d")
    parents = project.git("rev-list", "--parents", "-n1", d).split()[1:]
    assert parents == [project.git("rev-parse", f"refs/specpilot/entries/{x}") for x in "bc"]
    report = verify(project.memory())
    assert [(s, o.id, o.status) for s, o in report.outcomes] == \
        [(s, x, "reproduced") for s in ("refs", "files") for x in "abcdef"]
    # The replay of e has every ancestor's change and nothing else.
    engine = project.git("show", "refs/specpilot/entries/e:stock/engine.py")
    changed = [line for line in engine.splitlines() if "'" in line]
    assert changed == ["line_01 = 'a'", "line_10 = 'b'", "line_20 = 'c'", "line_30 = 'd'",
                       "line_40 = 'e'"]


def test_own_patch_is_relative_to_the_replayed_dependencies(project):
    build_dag(project)
    patch = (project.path / "memory/d.patch").read_text()
    assert "+line_30 = 'd'" in patch
    assert "'b'" not in patch.replace(" line_10 = 'b'", "")  # b only as context, if at all
    assert "+line_10" not in patch and "+line_20" not in patch


def test_graph_draws_the_diamond(project):
    build_dag(project)
    out = project.specpilot("memory", "graph").output
    assert "├─ a" in out and "← b, c" in out and "└─ f" in out
    assert out.index("─ a") < out.index("─ b") < out.index("─ d") < out.index("─ e")


def test_record_refuses_a_duplicate_id(project):
    project.entry("a", {1: "'a'"})
    with pytest.raises(DuplicateIdError, match="entry id 'a' already exists"):
        project.entry("a", {2: "'again'"})


def test_record_refuses_a_missing_dependency(project):
    with pytest.raises(MissingDependencyError, match="entry 'b' depends on 'nope'"):
        project.entry("b", {2: "'b'"}, ["nope"])


def test_record_refuses_an_empty_change(project):
    project.make_commit(project.base, {"README.md": "changed\n"}, "docs only", branch="docs")
    result = project.specpilot("memory", "record", "--from", "docs", "--id", "docs",
                               "--base", project.base)
    assert result.exit_code == 1
    assert "changes nothing in the system paths" in result.output


def test_record_ignores_and_reports_changes_outside_system_paths(project):
    done = project.entry("a", {1: "'a'"}, extra={"README.md": "edited\n"})
    assert done.ignored_paths == ["README.md"]
    assert "README.md" not in (project.path / "memory/a.patch").read_text()
    assert project.git("show", "refs/specpilot/entries/a:README.md") == "# demo project"


def test_record_refuses_what_does_not_reproduce(project, monkeypatch):
    real = Replayer.apply_patch

    def corrupt(self, tree, entry_id, patch):  # a replay that loses the change
        return real(self, tree, entry_id, patch.replace(b"+line_01 = 'a'", b"+line_01 = 'x'"))

    monkeypatch.setattr(Replayer, "apply_patch", corrupt)
    with pytest.raises(SpecPilotError, match="does not reproduce"):
        project.entry("a", {1: "'a'"})
    assert project.git("for-each-ref", "refs/specpilot") == ""
    assert not (project.path / "memory").exists()


def test_record_cli_with_meta_file_and_json(project):
    project.make_commit(project.base, {"stock/engine.py": "x = 1\n"}, "rewrite", branch="w")
    project.write("../meta.toml", 'title = "Faster"\n[provenance]\nkind = "discovered"\n'
                  '[[options]]\nname = "fast"\ntype = "bool"\ndefault = false\n'
                  '[[results]]\nmetric = "tok/s"\nvalue = 1.2\nci_low = 1.1\nci_high = 1.3\n')
    result = project.specpilot("memory", "record", "--from", "w", "--id", "fast",
                               "--meta", str(project.path.parent / "meta.toml"), "--json")
    assert result.exit_code == 0, result.output
    assert '"id": "fast"' in result.output
    shown = project.specpilot("memory", "show", "fast", "--json").output
    assert '"kind": "discovered"' in shown and '"metric": "tok/s"' in shown


def test_record_meta_file_may_not_override_computed_fields(project):
    project.make_commit(project.base, {"stock/engine.py": "x = 1\n"}, "rewrite", branch="w")
    project.write("../meta.toml", 'base = "' + "0" * 40 + '"\n')
    result = project.specpilot("memory", "record", "--from", "w", "--id", "w",
                               "--meta", str(project.path.parent / "meta.toml"))
    assert result.exit_code == 2 and "base is computed by specpilot" in result.output


def test_record_from_a_worktree_folder(project):
    assert project.specpilot("worktree", "new", "agent1").exit_code == 0
    wt = project.path / ".specpilot/worktrees/agent1"
    (wt / "kernels/gemm.py").write_text("def gemm(a, b):\n    return (a @ b).contiguous()\n")
    result = project.specpilot("memory", "record", "--from", str(wt), "--id", "k",
                               "--base", project.base)
    assert result.exit_code == 2 and "uncommitted changes" in result.output
    project.git("-C", str(wt), "commit", "-qam", "contiguous gemm")
    result = project.specpilot("memory", "record", "--from", str(wt), "--id", "k")
    assert result.exit_code == 0, result.output
    assert project.specpilot("memory", "verify", "k").exit_code == 0


def test_the_meta_example_in_the_docs_is_valid(project):
    text = (REPO / "docs/memory.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    meta = project.path.parent / "meta.toml"
    meta.write_text(example)
    done = project.entry("fused-qkv", {3: "'fused'"}, meta_file=meta)
    shown = tomllib.loads((project.path / "memory/fused-qkv.toml").read_text())
    assert shown["options"][0]["name"] == "fused_qkv" and shown["id"] == done.id


def test_list_and_graph_json(project):
    build_dag(project)
    listed = json.loads(project.specpilot("memory", "list", "--json").output)
    assert [e["id"] for e in listed] == list("abcdef")
    assert listed[3]["deps"] == ["b", "c"] and listed[3]["commit"]
    graph = json.loads(project.specpilot("memory", "graph", "--json").output)
    assert {(e["from"], e["to"]) for e in graph["edges"]} == \
        {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")}
    assert graph["bases"] == [project.base]


def test_a_controller_verdict_is_attached_to_the_note_without_moving_the_entry(project):
    done = project.entry("a", {1: "'a'"})
    report = {"estimate": {"gain": 0.21, "lower_bound": 0.18, "level": 0.95},
              "decision": {"verdict": "adopted", "threshold": 0.012},
              "paired": {"hardware": "NVIDIA H200"}, "model": "random:dense-27b",
              "requests": ["rand-0", "rand-1"], "max_new": 32, "mode": "side-by-side",
              "devices": ["cuda:0", "cuda:1"], "b": {"options": {"weights": "w12"}},
              "sigma": 0.001}
    path = project.path / "cmp.json"
    path.write_text(json.dumps(report))
    res = project.specpilot("memory", "add-result", "a", "--comparison", str(path), "--json")
    assert res.exit_code == 0, res.output
    assert project.git("rev-parse", "refs/specpilot/entries/a") == done.commit  # tree untouched
    note = tomllib.loads(project.git("notes", "--ref", "refs/notes/specpilot", "show",
                                     done.commit))
    (got,) = note["results"]
    assert got["metric"] == "controller_gain" and got["value"] == 0.21
    assert got["ci_low"] == 0.18 and got["verdict"] == "adopted"
    assert got["hardware"] == "NVIDIA H200" and got["model"] == "random:dense-27b"
    assert (project.path / "memory/a.toml").read_text().strip() == \
        project.git("notes", "--ref", "refs/notes/specpilot", "show", done.commit)
    assert verify(project.memory()).ok
    path.write_text("{}")   # not a controller report: refused, nothing written
    bad = project.specpilot("memory", "add-result", "a", "--comparison", str(path))
    assert bad.exit_code == 2 and "not a controller report" in bad.output
    assert len(tomllib.loads((project.path / "memory/a.toml").read_text())["results"]) == 1
    typed = project.specpilot("memory", "add-result", "a", "--gain", "-0.144",
                              "--lower-bound", "-0.154", "--hardware", "NVIDIA H200",
                              "--model", "random:dense-27b", "--verdict", "not adopted",
                              "--stale")
    assert typed.exit_code == 0, typed.output
    second = tomllib.loads((project.path / "memory/a.toml").read_text())["results"][1]
    assert second["value"] == -0.144 and second["stale"] and second["verdict"] == "not adopted"
    both = project.specpilot("memory", "add-result", "a", "--gain", "0.1", "--comparison",
                             str(path))
    assert both.exit_code == 2 and "either" in both.output


def test_a_throughput_verdict_records_its_load_both_sides_options_and_its_output_check(
        project):
    """A throughput verdict's record says at what concurrency and how many requests a round
    (16 a round at C = 16 leaves no request waiting: an admission mechanism is not acted
    on), A's options as well as B's, and how many outputs were forced."""
    project.entry("a", {1: "'a'"})
    report = {"estimate": {"gain": 0.08, "lower_bound": 0.06}, "paired": {"hardware": "H100"},
              "decision": {"verdict": "adopted", "threshold": 0.043}, "model": "embedded",
              "requests": [f"r{i}" for i in range(256)], "rounds": 8, "max_new": 128,
              "mode": "alternate", "devices": ["cuda:0"], "batch": 16, "drafter": "block",
              "a": {"options": {"draft_len": "15"}},
              "b": {"options": {"admit_min": "4", "draft_len": "15"}}, "sigma": 0.0066,
              "outputs": {"A": {"forced": 372, "restarts": 0}, "B": {"forced": 336}}}
    path = project.path / "cmp.json"
    path.write_text(json.dumps(report))
    res = project.specpilot("memory", "add-result", "a", "--comparison", str(path), "--json")
    assert res.exit_code == 0, res.output
    run = tomllib.loads((project.path / "memory/a.toml").read_text())["results"][0][
        "controller_run"]
    assert "throughput at C = 16, 32 requests a round" in run
    assert "A options {'draft_len': '15'}" in run and "'admit_min': '4'" in run
    assert "A 372 forced / 0 continued, B 336 forced / 0 continued" in run
    assert "drafter block" in run
    # a run of several candidates: a list of reports, each named after its entry
    other = dict(report, b={"options": {"dynamic_draft": "true"}, "rev": "dyn"},
                 candidates=["a", "dyn"], family=2, estimate={"gain": -0.02,
                                                               "lower_bound": -0.05})
    report.update(b=dict(report["b"], rev="a"), candidates=["a", "dyn"], family=2)
    path.write_text(json.dumps([other, report]))
    res = project.specpilot("memory", "add-result", "a", "--comparison", str(path), "--json")
    assert res.exit_code == 0, res.output
    got = tomllib.loads((project.path / "memory/a.toml").read_text())["results"][1]
    assert got["value"] == 0.08 and "one of 2 candidates judged in one run (family 2)" in \
        got["controller_run"]
    project.entry("b", {2: "'b'"})
    res = project.specpilot("memory", "add-result", "b", "--comparison", str(path))
    assert res.exit_code == 2 and "without 'b'" in res.output
    assert "results" not in tomllib.loads((project.path / "memory/b.toml").read_text()) or \
        not tomllib.loads((project.path / "memory/b.toml").read_text())["results"]


def test_describe_rewrites_the_prose_only(project):
    done = project.entry("a", {1: "'a'"})
    before = tomllib.loads((project.path / "memory/a.toml").read_text())
    res = project.specpilot("memory", "describe", "a", "--untested", "speed on GPUs",
                            "--untested", "batches above 64", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["untested"] == ["speed on GPUs", "batches above 64"]
    assert project.git("rev-parse", "refs/specpilot/entries/a") == done.commit  # tree untouched
    note = tomllib.loads(project.git("notes", "--ref", "refs/notes/specpilot", "show",
                                     done.commit))
    assert note["untested"] == ["speed on GPUs", "batches above 64"]
    assert note["summary"] == before["summary"]                      # not given: kept
    assert note["applicability"] == before.get("applicability", [])
    assert (project.path / "memory/a.toml").read_text().strip() == \
        project.git("notes", "--ref", "refs/notes/specpilot", "show", done.commit)
    assert verify(project.memory()).ok
    cleared = project.specpilot("memory", "describe", "a", "--untested", "", "--summary", "new")
    assert cleared.exit_code == 0, cleared.output
    note = tomllib.loads((project.path / "memory/a.toml").read_text())
    assert note.get("untested", []) == [] and note["summary"] == "new"
    for args, msg in ((["a"], "nothing to change"), (["a", "--summary", " "], "empty"),
                      (["zz", "--summary", "x"], "no memory entry")):
        bad = project.specpilot("memory", "describe", *args)
        assert bad.exit_code == 2 and msg in bad.output, bad.output
    assert tomllib.loads((project.path / "memory/a.toml").read_text())["summary"] == "new"


def test_an_option_whose_default_is_an_expression_gets_its_tuned_value_once_listed(project):
    """A registration whose default is an expression (`BUCKETS[-1]`, as prefill-buckets'
    prefill_tokens) says the option's type but not its value: `memory option` refuses to
    list it from the patch, in one line, and sets the tuned value of one listed by hand (the
    admission stack's prefill_tokens was refused before, listed or not)."""
    project.entry("c", {3: "'c'"}, extra={"stock/opts2.py":
                                          'register("steps", int, BUCKETS[-1], "a bucket")\n'})
    bad = project.specpilot("memory", "option", "c", "steps", "--tuned", "256")
    assert bad.exit_code == 2 and "not a literal (BUCKETS[-1])" in bad.output, bad.output
    path = project.path / "memory/c.toml"   # listed by hand, its default read from stock
    text = path.read_text().replace("options = []\n", "")
    path.write_text(text + '\n[[options]]\nname = "steps"\ntype = "int"\ndefault = 64\n')
    res = project.specpilot("memory", "import", "--force")
    assert res.exit_code == 0, res.output
    res = project.specpilot("memory", "option", "c", "steps", "--tuned", "256", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"name": "steps", "type": "int", "default": 64,
                                      "tuned": 256, "help": ""}


def test_option_lists_what_a_patch_registers_and_sets_its_tuned_value(project):
    """`memory option`: an option the entry's replay registers (its own patch or a
    dependency's) is listed with its registration's type and default, a listed one gets a
    tuned value parsed by its type; an option nobody registers and a value of the wrong type
    are refused in one line; only the note changes."""
    reg = ('register("knob", int, 0, "a knob", min=0, max=9)\n'
           'register("flag", bool, False, "a flag")\n')
    a = project.entry("a", {1: "'a'"}, extra={"stock/opts.py": reg})
    b = project.entry("b", {2: "'b'"}, deps=["a"])
    res = project.specpilot("memory", "option", "b", "flag", "--tuned", "true", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"name": "flag", "type": "bool", "default": False,
                                      "tuned": True, "help": ""}
    listed = tomllib.loads((project.path / "memory/b.toml").read_text())["options"]
    assert [(o["name"], o["tuned"]) for o in listed] == [("flag", True)]
    res = project.specpilot("memory", "option", "a", "knob", "--help-text", "how far")
    assert res.exit_code == 0 and "knob (int, default 0)" in res.output, res.output
    res = project.specpilot("memory", "option", "a", "knob", "--tuned", "7")
    assert res.exit_code == 0, res.output
    knob = tomllib.loads((project.path / "memory/a.toml").read_text())["options"]
    assert knob == [{"name": "knob", "type": "int", "default": 0, "tuned": 7,
                     "help": "how far"}]
    assert project.git("rev-parse", "refs/specpilot/entries/a") == a.commit   # tree untouched
    assert project.git("rev-parse", "refs/specpilot/entries/b") == b.commit
    for args, msg in ((["a", "flux"], "registers no option 'flux'"),
                      (["a", "knob", "--tuned", "lots"], "is not of type int"),
                      (["zz", "knob"], "no memory entry")):
        bad = project.specpilot("memory", "option", *args)
        assert bad.exit_code == 2 and msg in bad.output, bad.output
    assert verify(project.memory()).ok
