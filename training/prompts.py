"""Training prompts for the block drafter, built offline and deterministically from a seed.

Sources (nothing is downloaded):
- templates written for this project in the five request categories (code, chat, math,
  summarisation, long-form) with their own word lists: not the sealed set's generator, and
  the committed dev prompts (used to measure τ) are excluded by exact text;
- instructions written for the project (`W.instructions`);
- the Python standard library of the running interpreter: module and function docstrings
  and function sources, read with `ast` from its folder (never imported), and the reference
  text it ships for `help()` (pydoc_data/topics.py) as passages to summarise or explain.
The drafter learns from the target's own greedy answers to these prompts (training/cli.py).

The word lists, and the lists of sentence forms the templates choose from, are data:
training/words/prompts.json (packaged with `training`), read once into `W` on import; the
code here only chooses from them and fills them in. Edit that file to change the corpus.
"""

from __future__ import annotations

import ast
import functools
import json
import random
import re
import sysconfig
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

# Every word list and template list of the templates below, by name: one JSON object in this
# package (name -> list of strings, or of [string, ...] rows such as [signature, task]).
WORDS = "words/prompts.json"


def load_words() -> SimpleNamespace:
    """The word lists of the prompt templates, read from the packaged data file."""
    text = resources.files("training").joinpath(WORDS).read_text(encoding="utf-8")
    return SimpleNamespace(**json.loads(text))


W = load_words()


def _chat_question(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind >= 6:
        return f"{rng.choice(W.situations)}. {rng.choice(W.situation_asks)}"
    if kind == 0:
        return rng.choice(W.chat)
    if kind == 1:
        return f"How does {rng.choice(W.mechanisms)} work?"
    if kind == 2:
        a, b = rng.choice(W.pairs)
        return f"What is the difference between {a} and {b}?"
    if kind == 3:
        return rng.choice(W.activity_questions).format(a=rng.choice(W.activities))
    if kind == 4:
        return f"Why {rng.choice(W.phenomena)}?"
    return f"What is {rng.choice(W.topics)}, and why is it interesting?"


def _code(rng: random.Random) -> str:
    task, ent, attr = rng.choice(W.tasks), rng.choice(W.entities), rng.choice(W.attrs)
    kind = rng.randrange(9)
    if kind >= 7:
        sig, desc = rng.choice(W.named_tasks)
        return rng.choice(W.named_forms).format(sig=sig, desc=desc)
    if kind == 0:
        return rng.choice(W.code_forms).format(task=task, extra=rng.choice(W.code_extras))
    if kind == 5:
        return rng.choice(W.concept_forms).format(c=rng.choice(W.concepts))
    if kind == 6:
        return (f"Write a Python function that {task}. Then write a second function that uses "
                f"it on a list of {ent}s and prints the result for each {ent}.")
    if kind == 1:
        return (f"Write a Python class `{ent.title()}` with attributes `{attr}` and `id`, a "
                f"method that returns a readable description, and a function that sorts a list "
                f"of {ent}s by {attr}.")
    if kind == 2:
        n = rng.randint(2, 6)
        return (f"Here is some code:\n\n```python\ndef total_{attr}(items):\n    result = 0\n"
                f"    for i in range({n}, len(items)):\n        result += items[i].{attr}\n"
                f"    return result\n```\n\nIt should add the {attr} of every {ent}. Explain the "
                f"bug and fix it.")
    if kind == 3:
        lang = rng.choice(W.code_languages)
        return (f"Explain, step by step, how you would write a function in {lang} that {task}, "
                f"then show it working on a {ent} example.")
    return (f"Write pytest tests for a function `{ent}_{attr}(value)` that {task}, covering "
            f"normal input, empty input and one edge case.")


def _code_wide(rng: random.Random) -> str:
    """The wide corpus's code tasks: an input, an operation and a condition over an entity
    and an attribute, in one of several task forms and languages (combinations, so they do
    not run out as the fixed task list does)."""
    e, a = rng.choice(W.entities), rng.choice(W.attrs)
    fill = {"e": e, "a": a}
    extra = rng.choice(W.code_extras + W.code_extras_more)
    return rng.choice(W.code_task_forms).format(
        lang=rng.choice(W.code_langs_wide), inp=rng.choice(W.code_inputs).format(**fill),
        op=rng.choice(W.code_operations).format(**fill),
        cond=rng.choice(W.code_conditions).format(**fill), extra=extra).strip()


def _long_form_wide(rng: random.Random) -> str:
    """The wide corpus's long-form requests: a genre, a topic, an audience, a constraint."""
    topic = rng.choice(W.topics + W.long_topics_more)
    return (f"Write {rng.choice(W.long_genres)} about {topic} for {rng.choice(W.audiences)}, "
            f"{rng.choice(W.long_constraints)}.")


def _math_more(rng: random.Random, kind: int) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    who, who2 = rng.sample(W.people, 2)
    what = rng.choice(W.things)
    close = rng.choice(W.math_closers)
    if kind == 0:
        item, price = rng.choice(W.items)
        pct = rng.choice([10, 15, 20, 25, 30, 40, 50])
        return f"A {item} costs {price} dollars and is sold at {pct} percent off. What is the new price? {close}"
    if kind == 1:
        d = rng.choice([2, 3, 4, 5, 8])
        n = rng.randint(1, d - 1)
        total = d * rng.randint(5, 30)
        return (f"{who} has {total} {what}. {who} gives {n}/{d} of them to {who2} and then "
                f"uses {c} more. How many {what} are left? {close}")
    if kind == 2:
        h1, m1 = rng.randint(6, 14), rng.choice([0, 5, 10, 15, 20, 30, 45, 50])
        h2, m2 = h1 + rng.randint(1, 6), rng.choice([0, 10, 25, 35, 40, 55])
        ev = rng.choice(W.timed_events)
        return (f"{ev} starts at {h1}:{m1:02d} and ends at {h2}:{m2:02d}. How long does it last "
                f"in hours and minutes? {close}")
    if kind == 3:
        return (f"{who} is {c} years older than {who2}. Together they are {2 * a + c} years old. "
                f"How old is each of them? {close}")
    if kind == 4:
        r1, r2 = rng.randint(1, 5), rng.randint(1, 5)
        return (f"{who} and {who2} share {(r1 + r2) * b} {what} in the ratio {r1}:{r2}. "
                f"How many does each of them get? {close}")
    if kind == 5:
        vals = [rng.randint(40, 100) for _ in range(rng.randint(4, 7))]
        stat = rng.choice(W.statistics)
        return f"{who}'s test scores are {', '.join(map(str, vals))}. What is the {stat}? {close}"
    if kind == 6:
        big, small, f = rng.choice(W.units)
        x = rng.choice([1.5, 2, 2.5, 3, 4, 0.75, 6, 12])
        return f"How many {small} are there in {x} {big}? {close}"
    if kind == 7:
        v, t, m = rng.randint(8, 90), rng.randint(1, 5), rng.choice([15, 20, 30, 45])
        who_ = rng.choice(W.travellers)
        return (f"{who_} travels at {v} kilometres per hour for {t} hours and {m} minutes. "
                f"How far does it go? {close}")
    if kind == 8:
        n, p = rng.randint(2, 9), rng.randint(2, 15)
        note = rng.choice([50, 100, 200])
        return (f"{who} buys {n} {what} at {p} dollars each and pays with a {note}-dollar "
                f"note. How much change does {who} get? {close}")
    if kind == 9:
        r = rng.randint(2, 20)
        return (f"A circle has a radius of {r} cm. What are its area and circumference? Use "
                f"3.14 for pi. {close}")
    if kind == 10:
        return (f"A triangle has a base of {a} cm and a height of {b} cm. What is its area? "
                f"{close}")
    if kind == 11:
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        seq = ([start + step * i for i in range(5)] if rng.random() < 0.5
               else [start * (2 ** i) for i in range(5)])
        return (f"What is the next number in the sequence {', '.join(map(str, seq))}? "
                f"Explain the pattern.")
    if kind == 12:
        w, d = rng.randint(2, 8), rng.randint(3, 12)
        return (f"{w} workers can paint a fence in {d} days. How long would {w * 2} workers "
                f"take if they all work at the same speed? {close}")
    if kind == 13:
        money, rate, years = rng.choice([200, 500, 1000, 1500, 2000]), rng.randint(2, 8), c
        return (f"{who} puts {money} dollars in a savings account that pays {rate} percent "
                f"simple interest per year. How much is there after {years} years? {close}")
    if kind == 14:
        x, y = rng.randint(5, 60), rng.randint(2, 40)
        return (f"The sum of two numbers is {x + y} and their difference is {abs(x - y)}. "
                f"What are the two numbers? {close}")
    if kind == 15:
        x, y = rng.randint(11, 99), rng.randint(11, 99)
        return f"Calculate {x} times {y} by breaking it into easier parts. {close}"
    if kind == 16:
        n, pct = rng.choice([20, 25, 30, 40, 50, 60]), rng.choice([10, 20, 25, 40, 50, 75])
        return (f"In a class of {n} students, {pct} percent walk to school and the rest come "
                f"by bus. How many students come by bus? {close}")
    if kind == 17:
        n, m, g = rng.randint(2, 6), rng.randint(3, 12), rng.choice([150, 200, 250, 300, 400])
        return (f"A recipe for {n} people needs {g} grams of flour. How much flour is needed "
                f"for {m} people? {close}")
    sold = rng.randint(2, a + b)
    return (f"A shop has {a + b + c} {what}. It sells {sold} on Monday and half of the rest "
            f"on Tuesday. How many {what} are left? {close}")


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    who, what = rng.choice(W.people), rng.choice(W.things)
    kind = rng.randrange(25)
    if kind >= 6:
        return _math_more(rng, kind - 6)
    if kind == 0:
        return (f"{who} has {a} {what} and buys {b} more, then gives away {c}. How many {what} "
                f"does {who} have now? Explain each step.")
    if kind == 1:
        return f"What is {a} multiplied by {b}, minus {c}? Show your working."
    if kind == 2:
        return (f"A train travels {a * 5} kilometres in {c} hours. What is its average speed? "
                f"Explain the calculation.")
    if kind == 3:
        return (f"{who} shares {a * c} {what} equally among {c} friends. How many does each "
                f"friend get, and how many are left over if {b} more are added first?")
    if kind == 4:
        return f"Solve for x: {c}x + {a} = {c * b + a}. Explain each step."
    return (f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter? "
            f"Show the formulas you use.")


def _long_form_more(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice(W.story_forms).format(c=rng.choice(W.characters),
                                                e=rng.choice(W.events))
    if kind == 1:
        return rng.choice(W.debate_forms).format(d=rng.choice(W.debates))
    if kind == 2:
        return rng.choice(W.letter_forms).format(r=rng.choice(W.recipients),
                                                 i=rng.choice(W.issues))
    if kind == 3:
        return rng.choice(W.description_forms).format(p=rng.choice(W.places),
                                                      t=rng.choice(W.times))
    return rng.choice(W.activity_forms).format(a=rng.choice(W.activities))


def _chat(rng: random.Random) -> str:
    return rng.choice(W.chat_openers) + _chat_question(rng) + rng.choice(W.chat_closers)


def _long_form(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return _long_form_more(rng)
    return rng.choice(W.forms).format(t=rng.choice(W.topics), a=rng.choice(W.audiences))


def _instruction(rng: random.Random) -> str:
    return rng.choice(W.instructions) + rng.choice(W.instruction_styles)


@functools.lru_cache(maxsize=4)
def stdlib_snippets(limit_files: int | None = None,
                    methods: bool = False) -> list[tuple[str, str, str]]:
    """(kind, name, text) for module docstrings and function sources of the stdlib folder;
    with `methods` (the wide corpus) public classes' public methods too."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip"}
    files = sorted(p for p in root.rglob("*.py")
                   if not skip.intersection(p.relative_to(root).parts)
                   and p.stat().st_size < 150_000)
    out = []
    for path in files[:limit_files]:
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        mod = str(path.relative_to(root).with_suffix("")).replace("/", ".")
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 200:
            out.append(("doc", mod, doc[:1500]))
        defs = [(mod, node) for node in tree.body]
        if methods:
            defs += [(f"{mod}.{node.name}", m) for node in tree.body
                     if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
                     for m in node.body]
        lines = _source_lines(src)
        for where, node in defs:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                seg = _segment(lines, node)
                if 4 <= seg.count("\n") <= 30:
                    out.append(("func", f"{where}.{node.name}", seg))
    return out


def _source_lines(src: str) -> list[str]:
    """`src`'s lines with their ends, split as `ast.get_source_segment` splits them (CR LF,
    CR and LF end a line, a form feed does not): once a file, where get_source_segment
    splits the whole file again for every function (90 % of the wide corpus's build)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", src)


def _segment(lines: list[str], node: ast.AST) -> str:
    """`ast.get_source_segment(src, node)` over `_source_lines(src)` ("" without positions)."""
    if getattr(node, "end_lineno", None) is None or getattr(node, "end_col_offset", None) is None:
        return ""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


@functools.lru_cache(maxsize=2)
def reference_passages(max_chars: int = 1200) -> list[tuple[str, str]]:
    """(topic, passage) from the Python reference text the interpreter ships for `help()`
    (pydoc_data/topics.py, read with `ast`, never imported): paragraphs joined up to
    `max_chars`; empty where the file is missing."""
    path = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    topics = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            try:
                topics = ast.literal_eval(node.value)
            except ValueError:
                return []
    out = []
    for name in sorted(topics):
        part = ""
        for para in str(topics[name]).split("\n\n"):
            para = para.strip()
            if not para or set(para) <= set("*=-"):
                continue
            if part and len(part) + len(para) > max_chars:
                if len(part) > 300:
                    out.append((name, part))
                part = ""
            part = f"{part}\n\n{para}" if part else para[:max_chars]
        if len(part) > 300:
            out.append((name, part))
    return out


def prose_summary_prompt(rng: random.Random, passage: str) -> str:
    """A summarisation prompt around a prose passage (one of the target's own answers)."""
    return rng.choice(W.prose_summary_forms).format(t=passage.strip())


def _summarisation(rng: random.Random, passages, wide: bool = False) -> str:
    forms = W.summary_forms + W.summary_forms_more if wide else W.summary_forms
    return rng.choice(forms).format(t=rng.choice(passages)[1])


def _stdlib(rng: random.Random, snippets, wide: bool = False) -> str:
    kind, name, text = rng.choice(snippets)
    if kind == "doc":  # name: the module
        forms = W.stdlib_doc_forms + W.stdlib_doc_forms_more if wide else W.stdlib_doc_forms
        return rng.choice(forms).format(name=name, text=text)
    forms = W.stdlib_func_forms + W.stdlib_func_forms_more if wide else W.stdlib_func_forms
    return rng.choice(forms).format(module=name.rsplit(".", 1)[0], text=text)


# The committed dev request set (prompts that measure τ, never trained on), read as data:
# training depends on stock only (ARCHITECTURE.md, "Layout"), not on specpilot.requests'
# code. resources.files("specpilot") imports that package's __init__ alone (a version
# string); the file's format is specpilot/requests/sets.py's JSON Lines.
DEV_SET = ("specpilot", "requests/data/dev.jsonl")


def dev_prompts() -> set[str]:
    """The prompt texts of the committed dev request set (excluded from training)."""
    package, name = DEV_SET
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return {json.loads(line)["prompt"] for line in text.splitlines() if line.strip()}


# Share of each source in the prompt mix (stdlib: documentation summaries and code).
MIX = {"code": 0.24, "math": 0.16, "chat": 0.18, "long-form": 0.12, "instruction": 0.02,
       "summarisation": 0.12, "stdlib": 0.16}


def parse_mix(text: str) -> dict[str, float] | None:
    """"chat=0.3,code=0.2,...": the share of each prompt category (normalised by their sum
    in `build_prompts`), or None for "" (the corpus's own mix). ValueError, in one line,
    for an unknown category or a share that is not a positive number."""
    if not text.strip():
        return None
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        cat, sep, val = part.partition("=")
        cat = cat.strip()
        if not sep or cat not in MIX:
            raise ValueError(f"{part!r} is not category=share; categories: {', '.join(MIX)}")
        try:
            share = float(val)
        except ValueError:
            share = -1.0
        if not share > 0:
            raise ValueError(f"{cat}'s share {val.strip()!r} is not a positive number")
        out[cat] = share
    return out


def build_prompts(seed: int, n: int, exclude: set[str] = frozenset(),
                  limit_files: int | None = None, mix: dict[str, float] | None = None,
                  corpus: str = "base",
                  asked: dict[str, tuple[int, int]] | None = None) -> list[tuple[str, str]]:
    """Up to `n` distinct (source, prompt) pairs in the proportions of `mix`, fixed by
    `seed`, none in `exclude`. A source whose templates run out of new prompts gives fewer.

    `corpus`: "base" (the templates the shipped drafter trained on; a seed gives the same
    prompts as before "wide" existed), or "wide": the base templates plus combinatorial code
    tasks (inputs x operations x conditions x languages) and long-form requests (genres x
    topics x audiences x constraints), public methods of stdlib classes beside functions,
    more task forms over stdlib code and documentation and over summarised passages, and
    its own mix (W.wide_mix, more code and long-form, less chat). Asked for 300,000 from
    seed 0 (dev prompts excluded, Python 3.11's stdlib) it gives 269,984 distinct prompts,
    the base corpus 101,010 (issue 24's 5x data); the stdlib sources, and so the counts,
    depend on the interpreter. Summarisation is short of its share (the reference passages
    run out): stage 2 (--summaries) adds the target's own prose as passages. `asked`, if
    given, is filled with each source's (prompts its share asks for, prompts it gave)."""
    if corpus not in ("base", "wide"):
        raise ValueError(f"unknown corpus {corpus!r}; known: base, wide")
    wide = corpus == "wide"
    mix = dict((W.wide_mix if wide else MIX) if mix is None else mix)
    rng = random.Random(seed)
    snippets = stdlib_snippets(limit_files, methods=wide) if mix.get("stdlib") else []
    passages = reference_passages() if mix.get("summarisation") else []
    makers = {"code": _code, "math": _math, "chat": _chat, "long-form": _long_form,
              "instruction": _instruction, "stdlib": lambda r: _stdlib(r, snippets, wide),
              "summarisation": lambda r: _summarisation(r, passages, wide)}
    if wide:   # the combinations three times in four; the base templates stay in the mix
        makers["code"] = lambda r: _code_wide(r) if r.random() < 0.75 else _code(r)
        makers["long-form"] = lambda r: _long_form_wide(r) if r.random() < 0.75 else _long_form(r)
    if not snippets:
        mix.pop("stdlib", None)
    if not passages:
        mix.pop("summarisation", None)
    total = sum(mix.values())
    out: list[tuple[str, str]] = []
    seen = set(exclude)
    for cat, share in mix.items():
        want, got, misses = round(n * share / total), 0, 0
        while got < want and misses < 200:
            text = makers[cat](rng)
            if text in seen:
                misses += 1
                continue
            seen.add(text)
            out.append((cat, text))
            got, misses = got + 1, 0
        if asked is not None:
            asked[cat] = (want, got)
    rng.shuffle(out)
    return out


def shortfalls(asked: dict[str, tuple[int, int]], tolerance: float = 0.05) -> list[str]:
    """One line a source that gave fewer than its share asked (by more than `tolerance` of
    the ask): its templates ran out of distinct prompts."""
    return [f"{cat}: {got:,} prompts of the {want:,} its share asks for (its templates ran "
            f"out of distinct prompts)" for cat, (want, got) in asked.items()
            if want and got < (1 - tolerance) * want]


def prompt_group(source: str, text: str) -> str:
    """The content a prompt shares with its near-duplicates (the same question under another
    opener, the same task in another form, the same passage under another instruction), so
    that validation holds out whole groups: answers to a held-out group's prompts are not
    near-copies of training answers."""
    if source in ("stdlib", "summarisation"):
        return source + ":" + text.split("\n\n", 1)[-1][:400]
    if source == "math":  # one template: numbers, names, objects and closers blanked
        key = re.sub(r"#(?:[.,/:]#)+", "#", re.sub(r"\d+", "#", text))
        for word in sorted(W.people + W.things + [i for i, _ in W.items] + W.math_closers,
                           key=len, reverse=True):
            key = key.replace(word, "_")
        return "math:" + key.split(".")[0][:40]
    items = {"code": W.tasks + W.concepts + [d for _, d in W.named_tasks],
             "chat": W.chat + W.mechanisms + W.activities + W.phenomena + W.situations
             + [f"{a} and {b}" for a, b in W.pairs] + W.topics,
             "long-form": W.topics + W.events + W.debates + W.issues + W.places + W.activities,
             "instruction": W.instructions}.get(source, [])
    found = [item for item in items if item in text]
    return f"{source}:{max(found, key=len)}" if found else f"{source}:{text}"

