"""Tampering with a patch byte or a note is detected by verify."""


from memory_fixtures import *  # noqa: F401,F403
from specpilot.memory.verify import verify


def outcomes(project, source="all"):
    return [(s, o.id, o.status) for s, o in verify(project.memory(), source).outcomes]


def rewrite_note(project, entry_id, old, new):
    commit = project.git("rev-parse", f"refs/specpilot/entries/{entry_id}")
    text = project.git("notes", "--ref", "refs/notes/specpilot", "show", commit) + "\n"
    assert old in text
    path = project.path.parent / "note.txt"
    path.write_text(text.replace(old, new))
    project.git("notes", "--ref", "refs/notes/specpilot", "add", "-f", "-F", str(path), commit)


def test_untampered_dag_reproduces(chain_ab):
    assert verify(chain_ab.memory()).ok


def test_one_flipped_byte_in_a_patch_file_is_detected(chain_ab):
    path = chain_ab.path / "memory/a.patch"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify(chain_ab.memory(), "files")
    assert not report.ok
    assert [(o.id, o.status) for _s, o in report.outcomes] == [("a", "failed"), ("b", "failed")]
    assert "memory/a.patch has sha256" in report.outcomes[0][1].error


def note_field(project, entry_id, field):
    text = project.git("notes", "--ref", "refs/notes/specpilot", "show",
                       f"refs/specpilot/entries/{entry_id}")
    return text.split(f'{field} = "')[1].split('"')[0]


def test_note_with_altered_source_tree_diverges(chain_ab):
    rewrite_note(chain_ab, "b", note_field(chain_ab, "b", "source_tree"), "0" * 40)
    report = verify(chain_ab.memory(), "refs")
    b = [o for _s, o in report.outcomes if o.id == "b"][0]
    assert b.status == "diverged"
    assert b.expected_tree == "0" * 40 and b.replayed_tree != b.expected_tree
    assert b.differing_paths == ["(unknown: the recorded source tree is not in this repository)"]


def test_note_with_altered_patch_hash_fails(chain_ab):
    rewrite_note(chain_ab, "a", note_field(chain_ab, "a", "patch_sha256"), "0" * 64)
    report = verify(chain_ab.memory(), "refs")
    assert [(o.id, o.status) for _s, o in report.outcomes] == [("a", "failed"), ("b", "failed")]
    assert "the entry records patch_sha256 0000" in report.outcomes[0][1].error


def test_note_that_breaks_the_schema_is_rejected(chain_ab):
    rewrite_note(chain_ab, "a", note_field(chain_ab, "a", "base"), "HEAD")
    result = chain_ab.specpilot("memory", "verify")
    assert result.exit_code == 1
    assert "note on refs/specpilot/entries/a: does not match the entry schema: base" in result.output


def test_note_with_an_innocent_looking_edit_disagrees_with_memory_files(chain_ab):
    rewrite_note(chain_ab, "a", 'title = "work on a"', 'title = "work on A"')
    assert ("both", "a", "failed") in outcomes(chain_ab)


def test_entry_ref_moved_to_another_commit_is_detected(chain_ab):
    other = chain_ab.make_commit(chain_ab.base, {"stock/engine.py": "evil = 1\n"}, "evil")
    note = chain_ab.git("notes", "--ref", "refs/notes/specpilot", "show", "refs/specpilot/entries/a")
    chain_ab.git("update-ref", "refs/specpilot/entries/a", other)
    path = chain_ab.path.parent / "n.txt"
    path.write_text(note + "\n")
    chain_ab.git("notes", "--ref", "refs/notes/specpilot", "add", "-f", "-F", str(path), other)
    assert ("refs", "a", "failed") in outcomes(chain_ab, "refs")
