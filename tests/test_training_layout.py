"""Where drafter training lives (ARCHITECTURE.md, "Layout"; issue 22 item 2): in the
top-level package `training/`, outside the system paths. `stock/` holds no training code and
imports neither `training` nor `specpilot`; `kernels/` imports nothing of the project;
`training/` imports stock (and kernels through it) but not specpilot, has no import loop and
no project import hidden inside a function. The prompt corpus's word lists are packaged
data that load to the very lists they were as code."""

from __future__ import annotations

import ast
import hashlib
import json
import tomllib
from importlib import resources
from pathlib import Path

from training import prompts

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("stock", "kernels", "specpilot", "training")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, inside a function) of every import in `path`: import
    statements at any depth (relative ones resolved), importlib.import_module("...") and
    __import__("...") with a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                out.append((name, in_function))
            elif (isinstance(child, ast.Call) and child.args
                  and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str)
                  and ((isinstance(child.func, ast.Attribute)
                        and child.func.attr == "import_module")
                       or (isinstance(child.func, ast.Name) and child.func.id == "__import__"))):
                out.append((child.args[0].value, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def _project_imports(package: str, of: tuple[str, ...] = PROJECT) -> dict[str, list[str]]:
    """{file relative to the repository: [imported modules of the packages `of`]}."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        mods = [m for m, _ in _imports(path) if m.split(".")[0] in of]
        if mods:
            found[str(path.relative_to(ROOT))] = mods
    return found


def test_stock_imports_neither_training_nor_specpilot():
    assert _project_imports("stock", ("training", "specpilot")) == {}


def test_stock_holds_no_training_code():
    """No training module, no optimizer, no distributed process group, no backward pass."""
    assert not [p for p in (ROOT / "stock").rglob("train*.py")]
    found = {}
    for path in sorted((ROOT / "stock").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hits = [m for m, _ in _imports(path)
                if m.startswith(("torch.optim", "torch.distributed", "torch.nn.parallel"))]
        hits += [f"line {n.lineno}: {ast.unparse(n)[:60]}" for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute)
                 and (n.attr == "backward"
                      or (n.attr in ("optim", "distributed") and isinstance(n.value, ast.Name)
                          and n.value.id == "torch"))]
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}


def test_kernels_import_nothing_of_the_project():
    assert _project_imports("kernels", ("stock", "specpilot", "training")) == {}


def test_training_imports_stock_not_specpilot_without_loops_or_hidden_imports():
    files = sorted((ROOT / "training").rglob("*.py"))
    graph: dict[str, set[str]] = {}
    for path in files:
        imports = _imports(path)
        name = _module(path)
        assert not [m for m, _ in imports if m.split(".")[0] == "specpilot"], name
        hidden = [m for m, inner in imports if inner and m.split(".")[0] in PROJECT]
        assert hidden == [], f"{name}: project imports inside functions: {hidden}"
        graph[name] = {m for m, _ in imports if m.split(".")[0] == "training" and m != name}
    assert any(m.startswith("stock.") for p in files for m, _ in _imports(p))
    # an import of a module of the package also runs the package's __init__ (which imports
    # nothing); a loop is a path from a module back to itself
    state: dict[str, int] = {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, "import loop: " + " -> ".join(path + [nxt])
            if nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for mod in sorted(graph):
        if mod not in state:
            walk(mod, [mod])
    assert graph["training"] == set()


# The 36 word lists of stock/drafters/train_prompts.py as they were written as code, before
# they moved to training/words/prompts.json (computed once on that file, commit ce751c0):
#   names = upper-case module constants that were lists or tuples (MIX, a dict, is not one)
#   json.dumps({name: value with tuples as lists}, sort_keys=True, ensure_ascii=False,
#              separators=(",", ":")) -> sha256
# The data file names each list in lower case. Editing a list changes these on purpose.
OLD_LISTS = ("ACTIVITIES ATTRS AUDIENCES CHARACTERS CHAT CHAT_CLOSERS CHAT_OPENERS CODE_EXTRAS "
             "CODE_FORMS CONCEPTS DEBATES ENTITIES EVENTS FORMS INSTRUCTIONS INSTRUCTION_STYLES "
             "ISSUES ITEMS MATH_CLOSERS MECHANISMS NAMED_FORMS NAMED_TASKS PAIRS PEOPLE PHENOMENA "
             "PLACES PROSE_SUMMARY_FORMS RECIPIENTS SITUATIONS SITUATION_ASKS SUMMARY_FORMS TASKS "
             "THINGS TIMES TOPICS UNITS").split()
OLD_ITEMS = 602
OLD_SHA256 = "ada2a524e9172de393aecfcfb12ef4fa5a03876d62cd0fb5461c7c4160132e54"
# The sentence-form lists that were written inline in the template functions moved to the
# file too; what the templates make of all of it is pinned by the corpus built from seed 0,
# without the two sources read from the interpreter's stdlib (computed on the old module):
#   mix = {k: v for k, v in MIX.items() if k not in ("stdlib", "summarisation")}
#   sha256(json.dumps(build_prompts(0, 2000, mix=mix), ensure_ascii=False))
OLD_CORPUS_SHA256 = "2098b7cec24dab5462835bcfcc026356aceaf35f2254c5ba66349c8cb4f47251"


def test_word_lists_load_from_the_packaged_data_as_they_were():
    data = resources.files("training").joinpath(prompts.WORDS)
    assert data.is_file() and Path(str(data)).parent.name == "words"
    words = json.loads(data.read_text(encoding="utf-8"))
    assert vars(prompts.W) == words  # what the templates use is the file, read at run time
    old = {name: words[name.lower()] for name in OLD_LISTS}
    assert len(old) == 36 and sum(len(v) for v in old.values()) == OLD_ITEMS
    blob = json.dumps(old, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert hashlib.sha256(blob.encode()).hexdigest() == OLD_SHA256
    mix = {k: v for k, v in prompts.MIX.items() if k not in ("stdlib", "summarisation")}
    corpus = json.dumps(prompts.build_prompts(0, 2000, mix=mix), ensure_ascii=False)
    assert hashlib.sha256(corpus.encode()).hexdigest() == OLD_CORPUS_SHA256
    # no word list is left in the code: the module's constants are the lists read from the
    # file (W), its name, the dev set's location and the mix
    consts = {n for n, v in vars(prompts).items() if n.isupper()}
    assert consts == {"W", "WORDS", "DEV_SET", "MIX"}


def test_the_distribution_packages_training_and_its_word_lists():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    assert "training*" in cfg["setuptools"]["packages"]["find"]["include"]
    assert f"{Path(prompts.WORDS).parent}/*.json" in cfg["setuptools"]["package-data"]["training"]
