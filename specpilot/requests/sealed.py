"""Sealed requests: a procedurally generated test set that is never committed.

``generate_sealed(seed, n)`` builds requests from templates with randomised content using
only ``random.Random(seed)``, so a seed fixes the set exactly. ``ensure_sealed`` keeps one
secret seed per machine (``secrets.randbits(64)``, mode 0600) and the generated file beside
it, in a directory outside any repository (see ``default_sealed_dir``). Stock's references
for the sealed requests (their prompt ids and outputs, ``references_dir``) and the logs of
the workers that ran them (``logs_dir``) live beside them too: every folder there is mode
0700 and every reference 0600, readable only by the controller's user.
"""

from __future__ import annotations

import os
import random
import secrets
from pathlib import Path

from specpilot.requests.sets import CATEGORIES, Request

__all__ = ["REFERENCES_DIR", "SEALED_FILE", "SEED_FILE", "default_sealed_dir", "ensure_sealed",
           "generate_sealed", "logs_dir", "private_dir", "references_dir", "write_private"]

SEED_FILE = "seed"
SEALED_FILE = "sealed_requests.jsonl"
REFERENCES_DIR = "references"
LOGS_DIR = "logs"

NAMES = ["Amara", "Bilal", "Chen", "Dalia", "Elias", "Farah", "Gustav", "Hana", "Ivo", "Jun",
         "Kemal", "Lena", "Marek", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Samir", "Tove",
         "Uma", "Viktor", "Wren", "Yusuf", "Zara"]
PLACES = ["Lisbon", "a fishing village", "the Scottish Highlands", "Kyoto", "a lakeside town",
          "Vienna", "a desert oasis", "Cape Town", "a mountain hut", "Montreal", "a river island"]
NOUNS = ["order", "ticket", "sensor", "invoice", "student", "parcel", "reading", "booking",
         "song", "recipe", "player", "shipment", "task", "review", "account", "visit"]
FIELDS = ["price", "score", "weight", "duration", "rating", "quantity", "distance", "age"]
VERBS = ["filter", "count", "group", "rank", "merge", "clean", "summarise", "validate"]
ITEMS = [("notebooks", 3), ("apples", 1), ("tickets", 12), ("candles", 4), ("mugs", 7),
         ("plants", 9), ("batteries", 2), ("scarves", 15), ("puzzles", 11), ("lamps", 23)]
TOPICS = ["volcanoes", "coral reefs", "the history of bicycles", "how vaccines work",
          "saving money", "keeping bees", "the water cycle", "solar power", "learning chess",
          "bridges", "migrating birds", "old maps", "bread making", "the night sky"]
SKILLS = ["drawing", "playing the guitar", "swimming", "writing poems", "public speaking",
          "knitting", "typing faster", "gardening", "juggling", "baking bread"]
PAIRS = [("a lake", "a sea"), ("a frog", "a toad"), ("a star", "a planet"), ("jam", "jelly"),
         ("a hill", "a mountain"), ("a town", "a city"), ("a moth", "a butterfly"),
         ("a dolphin", "a shark"), ("a pond", "a lake"), ("an alligator", "a crocodile")]
ANIMALS = ["fox", "tortoise", "crow", "hare", "mouse", "lion", "goat", "owl", "heron", "bear"]
MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]


def _code(rng: random.Random) -> tuple[str, int]:
    noun, field = rng.choice(NOUNS), rng.choice(FIELDS)
    fn = f"{rng.choice(VERBS)}_{noun}s"  # random identifiers, repeated in the answer
    k, lim = rng.randint(2, 9), rng.randint(10, 500)
    kind = rng.randrange(6)
    if kind == 0:
        p = (f"Write a Python function `{fn}({noun}s, minimum)` that takes a list of dictionaries, "
             f"each with a `\"{field}\"` key, and returns only the {noun}s whose {field} is at "
             f"least `minimum`, sorted from highest to lowest {field}. Show an example call.")
    elif kind == 1:
        p = (f"This function should return the total {field} of the first {k} {noun}s, but it "
             f"gives the wrong answer:\n\n```python\ndef total_{field}({noun}s):\n"
             f"    total = 0\n    for i in range(1, {k}):\n        total += {noun}s[i][\"{field}\"]\n"
             f"    return total\n```\n\nFind the bug, explain it and write the corrected function.")
    elif kind == 2:
        p = (f"Explain what this Python function does and give an example input and output:"
             f"\n\n```python\ndef {fn}({noun}s):\n    result = {{}}\n    for {noun} in {noun}s:\n"
             f"        key = {noun}[\"{field}\"] // {k}\n"
             f"        result.setdefault(key, []).append({noun})\n    return result\n```")
    elif kind == 3:
        cls = noun.capitalize()
        p = (f"Write a Python class `{cls}` with attributes `name` and `{field}`, and a class "
             f"`{cls}Collection` with methods `add`, `remove(name)`, `average_{field}()` and "
             f"`largest()`. Raise a clear error when removing a name that is not present.")
    elif kind == 4:
        p = (f"Refactor this function so it is shorter and easier to read, keeping its "
             f"behaviour:\n\n```python\ndef {fn}(values):\n    out = []\n    for v in values:\n"
             f"        if v > {lim}:\n            out.append({lim})\n        elif v < 0:\n"
             f"            out.append(0)\n        else:\n            out.append(v)\n    return out\n```")
    else:
        p = (f"Write a Python function `{fn}(text)` that splits a text into lines, ignores lines "
             f"shorter than {k} characters, and returns a dictionary counting how often each "
             f"remaining line occurs. Then write two pytest tests for `{fn}`.")
    return p, rng.choice((384, 448, 512))


def _chat(rng: random.Random) -> tuple[str, int]:
    name, place, month = rng.choice(NAMES), rng.choice(PLACES), rng.choice(MONTHS)
    a, b = rng.choice(PAIRS)
    kind = rng.randrange(6)
    p = [
        f"Hello, I'm {name}. I'm visiting {place} for {rng.randint(2, 9)} days in {month}. "
        f"What should I pack, and what should I be careful about?",
        f"What is the difference between {a} and {b}? Please keep it simple.",
        f"I'd like to get better at {rng.choice(SKILLS)}. I can practise about "
        f"{rng.choice([10, 15, 20, 30, 45])} minutes a day. How should I start?",
        f"My friend {name} is turning {rng.randint(8, 80)} next week. Can you suggest some "
        f"thoughtful gift ideas that cost less than {rng.choice([10, 20, 30, 50])} dollars?",
        f"Can you explain {rng.choice(TOPICS)} to me as if I were {rng.randint(9, 14)} years old?",
        f"I have {rng.randint(2, 6)} hours free on a rainy {month} afternoon. Suggest a few "
        f"relaxing things I could do at home, and say why each one is nice.",
    ][kind]
    return p, rng.choice((192, 256))


def _math(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(NAMES)
    kind = rng.randrange(6)
    if kind == 0:
        (item, price), n = rng.choice(ITEMS), rng.randint(2, 9)
        paid = (price * n // 10 + 1) * 10 + rng.choice((0, 10, 50))
        p = (f"{name} buys {n} {item} at {price} dollars each and pays with {paid} dollars. "
             f"How much change does {name} get? Show your steps.")
    elif kind == 1:
        a, x, b = rng.randint(2, 12), rng.randint(-9, 15), rng.randint(1, 40)
        p = f"Solve for x: {a}x + {b} = {a * x + b}. Explain each step."
    elif kind == 2:
        pct, base = rng.choice((5, 10, 15, 20, 25, 30, 40)), rng.randrange(40, 900, 20)
        p = f"What is {pct} percent of {base}? Then increase {base} by {pct} percent. Show your working."
    elif kind == 3:
        v1, v2 = rng.sample(range(4, 91), 2)
        t1, t2 = rng.choice((1.5, 2, 2.5, 3, 4)), rng.choice((0.5, 1.5, 2, 3))
        p = (f"{name} travels at {v1} km per hour for {t1:g} hours and then at {v2} km per hour for "
             f"{t2:g} hours. What is the total distance and the average speed? Show your steps.")
    elif kind == 4:
        g, b = rng.sample(range(1, 8), 2)
        total = (g + b) * rng.randint(2, 8)
        p = (f"A club has {total} members. The ratio of adults to children is {g} to {b}. "
             f"How many adults and how many children are there? Explain your reasoning.")
    else:
        nums = [rng.randint(1, 60) for _ in range(rng.randint(5, 9))]
        p = (f"Find the mean, the median and the range of these numbers: "
             f"{', '.join(map(str, nums))}. Explain each step.")
    return p, rng.choice((256, 320))


# Sentence banks for summarisation passages: (frame, sentences in a coherent order).
_FRAMES = [
    ("passage", [
        "Last {month}, the town of {town} opened a new {project}.",
        "The idea came from {name}, a retired {job} who had lived there for {years} years.",
        "For a long time the site had been empty, and most people walked past it without a second look.",
        "About {n} volunteers spent several weekends clearing the ground and building what was needed.",
        "Local schools joined in, and pupils helped to plan the first events.",
        "The council gave a small grant of {money} dollars, and local shops donated tools and materials.",
        "Some residents worried about noise and parking, so the organisers agreed on quiet hours.",
        "By the end of the first season more than {m} people had visited.",
        "{name} says the best part has been seeing neighbours who had never spoken start to work together.",
        "The group now hopes to open a second {project} on the other side of {town} next year.",
    ]),
    ("passage", [
        "Scientists at a research station near {town} have been studying {animal} for {years} years.",
        "Each {month} they count the animals and measure how healthy they are.",
        "This year the team, led by {name}, found about {n} animals, more than in any earlier count.",
        "They believe the increase is linked to cleaner water and to new rules that protect nesting areas.",
        "However, the researchers warn that warmer summers could still cause problems in the future.",
        "They are using small tracking devices to learn where the animals travel in winter.",
        "Early results suggest that some of them travel more than {m} kilometres.",
        "The project costs around {money} dollars a year and is paid for by a regional fund.",
        "Visitors can join guided walks in spring, as long as they keep a safe distance.",
        "{name} hopes the results will help other regions protect their own wildlife.",
    ]),
    ("story", [
        "{name} had always wanted to {dream}, but never seemed to find the time.",
        "Working as a {job} in {town} left little energy at the end of each day.",
        "One {month} morning, a letter arrived from an old friend who had moved far away.",
        "The friend wrote that life was too short to keep waiting for the perfect moment.",
        "That evening, {name} made a simple plan and promised to follow it for {n} days.",
        "The first attempts went badly, and more than once {name} thought about giving up.",
        "Slowly, though, things became easier, and small successes began to add up.",
        "Neighbours noticed the change and some of them asked if they could join in.",
        "After {years} months, {name} wrote back to the friend to say thank you.",
        "The letter ended with an invitation to visit {town} and see the results.",
    ]),
]
_FILL = dict(
    project=["community garden", "repair café", "outdoor cinema", "tool library", "skate park"],
    job=["teacher", "nurse", "engineer", "postman", "carpenter", "librarian", "chef"],
    animal=["puffins", "otters", "grey seals", "river turtles", "mountain hares", "storks"],
    dream=["learn the piano", "write a novel", "run a marathon", "build a boat", "speak Spanish"],
    town=["Ashford Bay", "Kellan", "Norrby", "Westmere", "Port Allan", "Dunlow", "Easterhill"],
)
_ASKS = ["Summarise the {kind} above in two or three sentences.",
         "Write a short summary of the {kind} above.", "Summarise the {kind} above in one paragraph.",
         "Give a brief summary of the main points of the {kind} above.",
         "Summarise the {kind} above in no more than 50 words."]


def _summarisation(rng: random.Random) -> tuple[str, int]:
    kind, bank = rng.choice(_FRAMES)
    vals = {k: rng.choice(v) for k, v in _FILL.items()}
    vals.update(name=rng.choice(NAMES), month=rng.choice(MONTHS), years=rng.randint(3, 30),
                n=rng.randint(12, 90), m=rng.randrange(200, 5000, 50),
                money=rng.randrange(1000, 40000, 500))
    keep = sorted(rng.sample(range(2, len(bank)), rng.randint(5, len(bank) - 2)))
    text = " ".join(bank[i].format(**vals) for i in [0, 1, *keep])
    ask = rng.choice(_ASKS).format(kind=kind)
    return f"Read the following {kind}.\n\n{text}\n\n{ask}", rng.choice((160, 192, 256))


def _long_form(rng: random.Random) -> tuple[str, int]:
    name, place, topic = rng.choice(NAMES), rng.choice(PLACES), rng.choice(TOPICS)
    words = rng.choice((300, 350, 400, 450))
    p = rng.choice([
        f"Write a short story of about {words} words about {name}, who finds something "
        f"unexpected while exploring {place}.",
        f"Write an essay of about {words} words explaining why {topic} matters to ordinary "
        f"people. Use an introduction, three main points and a conclusion.",
        f"Write a letter from {name} to a friend describing a week spent in {place}, "
        f"including one thing that went wrong.",
        f"Write a persuasive article for a local newspaper encouraging readers to learn more "
        f"about {topic}.",
        f"Write a diary entry by {name} on the first day of a new job in {place}.",
        "Write a fable about a {} and a {} that ends with a clear lesson about {}.".format(
            *rng.sample(ANIMALS, 2), rng.choice(["honesty", "patience", "sharing", "courage"])),
    ])
    return p, rng.choice((448, 512))


_GENERATORS = {"code": _code, "chat": _chat, "math": _math,
               "summarisation": _summarisation, "long-form": _long_form}


def generate_sealed(seed: int, n: int = 64) -> list[Request]:
    """``n`` requests, deterministic in ``seed``, categories balanced to within one.

    Prompts are unique within a set (a repeat is redrawn). Ids are ``sealed-<category>-<nnn>``;
    the list is ordered by ``CATEGORIES`` and then by id.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    order = list(CATEGORIES)
    rng.shuffle(order)  # which categories get the extra requests when n % 5 != 0
    seen: set[str] = set()
    by_cat: dict[str, list[Request]] = {c: [] for c in CATEGORIES}
    for i in range(n):
        cat = order[i % len(order)]
        for _ in range(1000):
            prompt, mnt = _GENERATORS[cat](rng)
            if prompt not in seen:
                break
        else:  # pragma: no cover - the template space is far larger than any sane n
            raise ValueError(f"cannot draw {n} distinct sealed prompts")
        seen.add(prompt)
        rid = f"sealed-{cat}-{len(by_cat[cat]) + 1:03d}"
        by_cat[cat].append(Request(id=rid, category=cat, prompt=prompt, max_new_tokens=mnt))
    return [r for c in CATEGORIES for r in by_cat[c]]


def default_sealed_dir() -> Path:
    """``$SPECPILOT_SEALED_DIR``, else ``$XDG_DATA_HOME/specpilot/sealed``
    (``~/.local/share/specpilot/sealed`` when XDG_DATA_HOME is unset): outside any repository."""
    explicit = os.environ.get("SPECPILOT_SEALED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.path.expanduser(os.environ.get("XDG_DATA_HOME", ""))
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "specpilot" / "sealed"


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (0700), created where missing."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o777 != 0o700:
        os.chmod(path, 0o700)
    return path


def references_dir(data_dir: Path | None = None) -> Path:
    """Where stock's references for the sealed requests are cached: beside the seed, 0700."""
    data_dir = Path(data_dir) if data_dir is not None else default_sealed_dir()
    private_dir(data_dir)
    return private_dir(data_dir / REFERENCES_DIR)


def logs_dir(name: str) -> Path:
    """A folder (0700) beside the seed for the logs of workers that saw sealed requests:
    what a candidate prints there never lands in the repository."""
    base = private_dir(private_dir(default_sealed_dir()) / LOGS_DIR)
    return private_dir(base / name)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # the umask cannot widen it, but be explicit
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_seed(data_dir: Path) -> int:
    """The seed stored in ``data_dir/seed``; ValueError if it is not an integer."""
    path = Path(data_dir) / SEED_FILE
    text = path.read_text(encoding="utf-8").strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path}: expected an integer seed, got {text[:40]!r}") from None


def ensure_sealed(data_dir: Path | None = None, n: int = 64) -> Path:
    """Make sure ``data_dir`` holds a secret seed and the sealed requests; return the file path.

    Creates ``data_dir`` (0700), ``seed`` (``secrets.randbits(64)``, 0600) and
    ``sealed_requests.jsonl`` (0600) where missing. Existing files are never rewritten, so a
    second call changes nothing. A requests file without its seed is an error: it could not
    be reproduced, and a fresh seed would silently disagree with it.
    """
    data_dir = private_dir(Path(data_dir) if data_dir is not None else default_sealed_dir())
    seed_path, out = data_dir / SEED_FILE, data_dir / SEALED_FILE
    if not seed_path.exists():
        if out.exists():
            raise ValueError(f"{out} exists but {seed_path} is missing; delete {out} to regenerate")
        write_private(seed_path, f"{secrets.randbits(64)}\n")
    if not out.exists():
        reqs = generate_sealed(read_seed(data_dir), n)
        write_private(out, "".join(r.to_json() + "\n" for r in reqs))
    return out
