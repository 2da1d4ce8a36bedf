"""Training prompts for the block drafter, built offline and deterministically from a seed.

Sources (nothing is downloaded):
- templates written for this project in the five request categories (code, chat, math,
  summarisation, long-form) with their own word lists: not the sealed set's generator, and
  the committed dev prompts (used to measure τ) are excluded by exact text;
- instructions written for the project (`INSTRUCTIONS`);
- the Python standard library of the running interpreter: module and function docstrings
  and function sources, read with `ast` from its folder (never imported).
The drafter learns from the target's own greedy answers to these prompts (train_block.py).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

PEOPLE = ["Ada", "Bruno", "Carmen", "Dmitri", "Esther", "Femi", "Greta", "Hugo", "Ines",
          "Jonas", "Kira", "Luis", "Mira", "Nils", "Olga", "Pavel", "Rita", "Sven", "Tariq"]
THINGS = ["books", "pencils", "oranges", "stamps", "marbles", "cookies", "shells", "coins",
          "buttons", "cards", "eggs", "bottles", "flowers", "boxes", "ribbons"]
ENTITIES = ["user", "product", "city", "employee", "course", "movie", "device", "order",
            "measurement", "event", "message", "file", "transaction", "animal", "vehicle"]
ATTRS = ["name", "size", "cost", "height", "speed", "count", "temperature", "level", "year"]
TASKS = [
    "returns the second largest number in a list",
    "counts how many words in a sentence start with a capital letter",
    "removes duplicate items from a list while keeping their order",
    "checks whether two strings are anagrams of each other",
    "returns the sum of the digits of a positive integer",
    "converts a number of seconds into hours, minutes and seconds",
    "finds the longest word in a sentence",
    "reverses the order of words in a sentence",
    "returns all prime numbers below n",
    "computes the greatest common divisor of two integers",
    "splits a list into two lists of even and odd numbers",
    "returns the most frequent character in a string",
    "checks whether a year is a leap year",
    "computes the median of a list of numbers",
    "capitalises the first letter of every word",
    "returns the n-th Fibonacci number iteratively",
    "counts the lines, words and characters of a text",
    "merges two dictionaries, adding the values of shared keys",
    "validates that a string is a well-formed email address (simple rules)",
    "returns the running maximum of a list",
    "turns a list of pairs into a dictionary",
    "finds the index of the first negative number, or -1",
    "compresses a string like 'aaabcc' into 'a3b1c2'",
    "rounds every number in a list to two decimals",
    "checks that brackets in a string are balanced",
]
CHAT = [
    "How can I make my mornings less rushed?",
    "What are some good habits for learning a new language?",
    "Can you explain what inflation is in simple words?",
    "What should I pack for a three-day hiking trip?",
    "How do I politely decline an invitation from a friend?",
    "Why do cats purr?",
    "What is a good way to start journaling?",
    "How do airplanes stay in the air?",
    "Can you recommend a few ways to reduce screen time?",
    "What is the difference between a virus and a bacterium?",
    "How do I keep houseplants alive while travelling?",
    "Why do we have leap years?",
    "What are some tips for a first day at a new job?",
    "How does a rainbow form?",
    "What can I cook with rice, eggs and spinach?",
    "How do I prepare for a long train journey?",
    "Why do leaves change colour in autumn?",
    "How can I become a better listener?",
    "What is the best way to organise a small kitchen?",
    "How do noise-cancelling headphones work?",
    "What are some fun things to do on a rainy weekend?",
    "How do I write a thank-you note to a teacher?",
    "Why is sleep important for memory?",
    "How can I save energy at home in winter?",
    "What is the difference between a comet and an asteroid?",
]
TOPICS = ["glaciers", "the printing press", "honeybees", "lighthouses", "the human heart",
          "recycling plastic", "tides", "the history of tea", "wind turbines", "octopuses",
          "public libraries", "the Silk Road", "earthquakes", "photosynthesis", "trains",
          "the invention of paper", "deserts", "owls", "compound interest", "rainforests"]
INSTRUCTIONS = [
    "List five tips for writing clear Python code, with one sentence on each.",
    "Explain the difference between a process and a thread in a few paragraphs.",
    "Describe how a hash table works and why lookups are usually fast.",
    "Write a short guide to using git branches for a beginner.",
    "Explain what a unit test is and give a small example in Python.",
    "Summarise the rules of chess in about one hundred words.",
    "Explain big-O notation with three examples.",
    "Write step-by-step instructions for making a cup of tea.",
    "Explain what an API is to someone who does not program.",
    "Describe the water cycle in four steps.",
    "Give three reasons why version control is useful, with an example for each.",
    "Explain how binary numbers work and convert 13 to binary.",
    "Write a short dialogue between a teacher and a student about fractions.",
    "Explain the difference between a list, a set and a dictionary in Python.",
    "Describe what happens when you type a web address into a browser.",
    "Explain recursion and show a recursive function that sums a list.",
    "Write a checklist for reviewing someone else's code.",
    "Explain what a regular expression is with two Python examples.",
    "Describe how to read a CSV file in Python and compute the average of a column.",
    "Explain what a decorator is in Python and write a timing decorator.",
]


def _code(rng: random.Random) -> str:
    task, ent, attr = rng.choice(TASKS), rng.choice(ENTITIES), rng.choice(ATTRS)
    kind = rng.randrange(5)
    if kind == 0:
        return f"Write a Python function that {task}. Add a docstring and two example calls."
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
        return f"Explain, step by step, how you would write a Python function that {task}."
    return (f"Write pytest tests for a function `{ent}_{attr}(value)` that {task}, covering "
            f"normal input, empty input and one edge case.")


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    who, what = rng.choice(PEOPLE), rng.choice(THINGS)
    kind = rng.randrange(6)
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


def _chat(rng: random.Random) -> str:
    q = rng.choice(CHAT)
    return rng.choice([q, f"{q} Please keep it short.", f"Hi! {q}", f"{q} Give me a few ideas."])


def _long_form(rng: random.Random) -> str:
    topic = rng.choice(TOPICS)
    return rng.choice([
        f"Write an essay of several paragraphs about {topic}.",
        f"Write a short story in which a child discovers something surprising about {topic}.",
        f"Write an informative article for teenagers about {topic}, with a title and headings.",
        f"Write a letter to a friend describing what you learned about {topic}.",
    ])


def stdlib_snippets(limit_files: int | None = None) -> list[tuple[str, str, str]]:
    """(kind, name, text) for module docstrings and function sources of the stdlib folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip"}
    files = sorted(p for p in root.rglob("*.py")
                   if not skip.intersection(p.relative_to(root).parts) and len(p.parts) < 40)
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
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                seg = ast.get_source_segment(src, node) or ""
                if 4 <= seg.count("\n") <= 30:
                    out.append(("func", f"{mod}.{node.name}", seg))
    return out


def _stdlib(rng: random.Random, snippets) -> str:
    kind, name, text = rng.choice(snippets)
    if kind == "doc":
        return rng.choice([
            f"Summarise this documentation of the Python module `{name}` in a few sentences:\n\n{text}",
            f"Here is the documentation of `{name}`:\n\n{text}\n\nExplain what the module is for "
            f"and give a small usage example.",
        ])
    return rng.choice([
        f"Explain what this Python function from `{name.rsplit('.', 1)[0]}` does:\n\n```python\n{text}\n```",
        f"Add type hints and a docstring to this function:\n\n```python\n{text}\n```",
        f"Write pytest tests for this function:\n\n```python\n{text}\n```",
    ])


def build_prompts(seed: int, n: int, stdlib_fraction: float = 0.3,
                  exclude: set[str] = frozenset(), limit_files: int | None = None) -> list[tuple[str, str]]:
    """`n` distinct (category, prompt) pairs, fixed by `seed`, none in `exclude`."""
    rng = random.Random(seed)
    snippets = stdlib_snippets(limit_files) if stdlib_fraction > 0 else []
    makers = [("code", _code), ("math", _math), ("chat", _chat), ("long-form", _long_form),
              ("instruction", lambda r: r.choice(INSTRUCTIONS))]
    out: list[tuple[str, str]] = []
    seen = set(exclude)
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        if snippets and rng.random() < stdlib_fraction:
            cat, text = "stdlib", _stdlib(rng, snippets)
        else:
            cat, make = rng.choice(makers)
            text = make(rng)
        if text not in seen:
            seen.add(text)
            out.append((cat, text))
    return out
