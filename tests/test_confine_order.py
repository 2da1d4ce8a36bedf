"""A Python installation under /tmp (a CI runner's venv) is mounted into the confined
worker after its private /tmp, not hidden under it (a fresh venv in /tmp failed every
confined worker with `bwrap: execvp .../bin/python: No such file or directory`)."""

from specpilot.judges import confine


def test_python_roots_under_tmp_are_bound_after_the_private_tmp(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(confine, "python_roots", lambda: [venv])
    argv = confine.command(["python", "x"], tmp_path / "w.py", tmp_path, tmp_path)
    tmpfs = argv.index("--tmpfs")
    binds = [i for i, a in enumerate(argv) if a == str(venv) and argv[i - 1] == "--ro-bind"]
    assert binds and all(i > tmpfs for i in binds)
