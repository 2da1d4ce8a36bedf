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
        extra = rng.choice(["Add a docstring and two example calls.", "Use type hints.",
                            "Explain the code afterwards.", "Handle empty input.",
                            "Keep it short and readable.", "Add comments to each step."])
        return f"Write a Python function that {task}. {extra}"
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
        lang = rng.choice(["Python", "Python 3", "plain Python without imports"])
        return (f"Explain, step by step, how you would write a function in {lang} that {task}, "
                f"then show it working on a {ent} example.")
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


CHAT_OPENERS = ["", "Hi! ", "Hello, quick question. ", "I was wondering about something. ",
                "My friend and I were arguing about this. ", "Sorry if this is a silly question. ",
                "Good morning! ", "I'm curious: "]
CHAT_CLOSERS = ["", " Please keep it short.", " Give me a few ideas.", " Explain it simply.",
                " A list would be great.", " Thanks!", " Answer in two or three sentences.",
                " Please explain it as if I were twelve."]
AUDIENCES = ["children", "teenagers", "adults", "a school newsletter", "a science blog",
             "tourists", "beginners"]
FORMS = ["Write an essay of several paragraphs about {t} for {a}.",
         "Write a short story for {a} in which someone discovers something surprising about {t}.",
         "Write an informative article about {t} for {a}, with a title and headings.",
         "Write a letter to a friend describing what you learned about {t}.",
         "Write a detailed explanation of {t} for {a}, ending with a short summary.",
         "Write a speech for {a} about why {t} matters.",
         "Write a diary entry of someone spending a day learning about {t}.",
         "Describe the history and the future of {t} in a long answer for {a}."]
INSTRUCTION_STYLES = ["", " Keep it concise.", " Use headings.", " Use a numbered list where it "
                      "helps.", " Give one example at the end.", " Write for a beginner."]


def _chat(rng: random.Random) -> str:
    return rng.choice(CHAT_OPENERS) + rng.choice(CHAT) + rng.choice(CHAT_CLOSERS)


def _long_form(rng: random.Random) -> str:
    return rng.choice(FORMS).format(t=rng.choice(TOPICS), a=rng.choice(AUDIENCES))


def _instruction(rng: random.Random) -> str:
    return rng.choice(INSTRUCTIONS) + rng.choice(INSTRUCTION_STYLES)


def stdlib_snippets(limit_files: int | None = None) -> list[tuple[str, str, str]]:
    """(kind, name, text) for module docstrings and function sources of the stdlib folder."""
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


# Share of each source in the prompt mix (stdlib: documentation summaries and code).
MIX = {"code": 0.22, "math": 0.18, "chat": 0.18, "long-form": 0.14, "instruction": 0.08,
       "stdlib": 0.20}


def build_prompts(seed: int, n: int, exclude: set[str] = frozenset(),
                  limit_files: int | None = None, mix: dict[str, float] | None = None
                  ) -> list[tuple[str, str]]:
    """Up to `n` distinct (source, prompt) pairs in the proportions of `mix`, fixed by
    `seed`, none in `exclude`. A source whose templates run out of new prompts gives fewer."""
    mix = dict(MIX if mix is None else mix)
    rng = random.Random(seed)
    snippets = stdlib_snippets(limit_files) if mix.get("stdlib") else []
    makers = {"code": _code, "math": _math, "chat": _chat, "long-form": _long_form,
              "instruction": _instruction, "stdlib": lambda r: _stdlib(r, snippets)}
    if not snippets:
        mix.pop("stdlib", None)
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
    rng.shuffle(out)
    return out
