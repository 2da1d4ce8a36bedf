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


JOBS = ["teacher", "nurse", "engineer", "baker", "student", "driver", "designer", "farmer",
        "pharmacist", "electrician", "accountant", "gardener", "pilot", "librarian"]
TOWNS = ["Leeds", "Porto", "Graz", "Tartu", "Halifax", "Cork", "Bergen", "Ghent", "Trieste",
         "Dunedin", "Tampere", "Aarhus", "Split", "Malmo", "Galway", "Bruges"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _nums(rng: random.Random, n: int, lo: int = 1, hi: int = 999) -> str:
    """``n`` random integers as English: "4, 17 and 230"."""
    xs = [str(rng.randint(lo, hi)) for _ in range(n)]
    return xs[0] if n == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"


# Every template below has at least ~10^9 variants (tests/test_requests.py draws 20,000 per
# category and finds no repeat): a candidate cannot ship a table of the judge's prompts.

def _code(rng: random.Random) -> tuple[str, int]:
    noun, field = rng.choice(NOUNS), rng.choice(FIELDS)
    fn = f"{rng.choice(VERBS)}_{noun}s"  # random identifiers, repeated in the answer
    k, lim = rng.randint(2, 9), rng.randint(10, 500)
    kind = rng.randrange(6)
    if kind == 0:
        p = (f"Write a Python function `{fn}({noun}s, minimum)` that takes a list of dictionaries, "
             f"each with a `\"{field}\"` key, and returns only the {noun}s whose {field} is at "
             f"least `minimum`, sorted from highest to lowest {field}. Show an example call "
             f"with minimum {lim} on {noun}s whose {field}s are {_nums(rng, 4)}.")
    elif kind == 1:
        p = (f"This function should return the total {field} of the first {k} {noun}s, but it "
             f"gives the wrong answer:\n\n```python\ndef total_{field}({noun}s):\n"
             f"    total = 0\n    for i in range(1, {k}):\n        total += {noun}s[i][\"{field}\"]\n"
             f"    return total\n```\n\nFind the bug, explain it and write the corrected function. "
             f"Then show what it returns for {noun}s whose {field}s are {_nums(rng, k + 1)}.")
    elif kind == 2:
        p = (f"Explain what this Python function does and show its output for {noun}s whose "
             f"{field}s are {_nums(rng, 4)}:"
             f"\n\n```python\ndef {fn}({noun}s):\n    result = {{}}\n    for {noun} in {noun}s:\n"
             f"        key = {noun}[\"{field}\"] // {k}\n"
             f"        result.setdefault(key, []).append({noun})\n    return result\n```")
    elif kind == 3:
        cls = noun.capitalize()
        p = (f"Write a Python class `{cls}` with attributes `name` and `{field}`, and a class "
             f"`{cls}Collection` with methods `add`, `remove(name)`, `average_{field}()` and "
             f"`largest()`. Raise a clear error when removing a name that is not present. "
             f"Show it working with {_nums(rng, 1, 3, 9)} {noun}s whose {field}s are "
             f"{_nums(rng, 3)}.")
    elif kind == 4:
        p = (f"Refactor this function so it is shorter and easier to read, keeping its "
             f"behaviour:\n\n```python\ndef {fn}(values):\n    out = []\n    for v in values:\n"
             f"        if v > {lim}:\n            out.append({lim})\n        elif v < 0:\n"
             f"            out.append(0)\n        else:\n            out.append(v)\n    return out\n```"
             f"\n\nThen show what it returns for [{', '.join(str(rng.randint(-99, 999)) for _ in range(4))}].")
    else:
        p = (f"Write a Python function `{fn}(text)` that splits a text into lines, ignores lines "
             f"shorter than {k} or longer than {rng.randint(40, 400)} characters, and returns the "
             f"{rng.randint(2, 20)} most common remaining lines with how often each occurs. Then "
             f"write two pytest tests for `{fn}`, one on a text of {rng.randint(5, 500)} lines.")
    return p, rng.choice((384, 448, 512))


def _about(rng: random.Random) -> str:
    """A chat user's self-introduction: about 10^7 variants on its own."""
    return (f"I'm {rng.choice(NAMES)}, {rng.randint(16, 90)}, a {rng.choice(JOBS)} from "
            f"{rng.choice(TOWNS)}, with about {rng.randint(1, 60)} free hours a week.")


def _chat(rng: random.Random) -> tuple[str, int]:
    name, place, month = rng.choice(NAMES), rng.choice(PLACES), rng.choice(MONTHS)
    a, b = rng.choice(PAIRS)
    kind = rng.randrange(6)
    p = [
        f"{_about(rng)} I'm visiting {place} for {rng.randint(2, 9)} days in {month}, "
        f"with a budget of {rng.randrange(200, 5000, 50)} dollars. What should I pack, and "
        f"what should I be careful about?",
        f"{_about(rng)} On a {rng.randint(2, 14)}-day trip to {place} in {month} I saw both "
        f"{a} and {b}. What is the difference between them? Please keep it simple.",
        f"{_about(rng)} I'd like to get better at {rng.choice(SKILLS)}. I can practise about "
        f"{rng.choice([10, 15, 20, 30, 45])} minutes a day until {month}. How should I start?",
        f"My friend {name} is turning {rng.randint(8, 80)} on {rng.choice(WEEKDAYS)}, "
        f"{month} {rng.randint(1, 28)}. Can you suggest some thoughtful gift ideas that cost "
        f"less than {rng.randint(10, 99)} dollars? {name} works as a {rng.choice(JOBS)} in "
        f"{rng.choice(TOWNS)}.",
        f"{_about(rng)} Can you explain {rng.choice(TOPICS)} to me as if I were "
        f"{rng.randint(9, 14)} years old?",
        f"{_about(rng)} I have {rng.randint(2, 6)} hours free on a rainy {month} afternoon. "
        f"Suggest a few relaxing things I could do at home, and say why each one is nice.",
    ][kind]
    return p, rng.choice((192, 256))


def _math(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(NAMES)
    kind = rng.randrange(6)
    if kind == 0:
        (i1, _), (i2, _) = rng.sample(ITEMS, 2)
        n1, n2, p1, p2 = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 60), rng.randint(1, 60)
        paid = ((n1 * p1 + n2 * p2) // 10 + 1) * 10 + rng.choice((0, 10, 50, 100))
        p = (f"{name} buys {n1} {i1} at {p1} dollars each and {n2} {i2} at {p2} dollars each, "
             f"and pays with {paid} dollars. How much change does {name} get? Show your steps.")
    elif kind == 1:
        a, x, b = rng.randint(2, 20), rng.randint(-20, 20), rng.randint(1, 99)
        c, d = rng.randint(2, 20), rng.randint(1, 99)
        p = (f"{name} has to solve for x: {a}x + {b} = {a * x + b}. Explain each step, check the "
             f"answer by substituting it back, and then find y = {c}x - {d}.")
    elif kind == 2:
        (p1, b1), (p2, b2) = [(rng.randint(1, 60), rng.randrange(40, 2000, 10)) for _ in range(2)]
        p = (f"{name} asks: what is {p1} percent of {b1}? Then increase {b2} by {p2} percent. "
             f"Show your working.")
    elif kind == 3:
        v1, v2, v3 = rng.sample(range(4, 91), 3)
        t1, t2, t3 = (rng.choice((0.5, 1, 1.5, 2, 2.5, 3, 4)) for _ in range(3))
        p = (f"{name} travels at {v1} km per hour for {t1:g} hours, then at {v2} km per hour for "
             f"{t2:g} hours and finally at {v3} km per hour for {t3:g} hours. What is the total "
             f"distance and the average speed? Show your steps.")
    elif kind == 4:
        g, b = rng.sample(range(1, 13), 2)
        total = (g + b) * rng.randint(2, 20)
        p = (f"{name}'s club in {rng.choice(TOWNS)} has {total} members. The ratio of adults to children "
             f"is {g} to {b}. How many adults and how many children are there? If adults pay "
             f"{rng.randint(5, 80)} dollars a year and children {rng.randint(1, 40)} dollars, "
             f"how much does the club collect? Explain your reasoning.")
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
    month = rng.choice(MONTHS)
    words = rng.randrange(250, 601, 10)
    p = rng.choice([
        f"Write a short story of about {words} words about {name}, who finds something "
        f"unexpected while exploring {place} in {rng.randint(1850, 2030)}.",
        f"Write an essay of about {words} words explaining why {topic} matters to ordinary "
        f"people in {rng.choice(TOWNS)}, for a {rng.choice(JOBS)}'s blog, with one example from "
        f"{rng.randint(1850, 2030)}. Use an introduction, three main points and a conclusion.",
        f"Write a letter of about {words} words from {name} to a friend in {rng.choice(TOWNS)} "
        f"describing a week spent in {place} in {month}, "
        f"including one thing that went wrong on day {rng.randint(1, 7)}.",
        f"Write a persuasive article of about {words} words for the {rng.choice(TOWNS)} "
        f"Gazette, issue {rng.randint(1, 999)}, encouraging readers to learn more about {topic}.",
        f"Write a diary entry by {name}, a {rng.choice(JOBS)}, on the first day of a new job in "
        f"{place}, {month} {rng.randint(1, 28)}, in about {words} words.",
        "Write a fable of about {} words, set near {}, about a {} called {} and a {}, that "
        "ends with a clear lesson about {}.".format(
            words, rng.choice(TOWNS), *rng.sample(ANIMALS, 1), rng.choice(NAMES),
            *rng.sample(ANIMALS, 1), rng.choice(["honesty", "patience", "sharing", "courage",
                                                  "kindness", "humility", "hard work", "trust"])),
    ])
    return (f"{p} Write it for readers aged about {rng.randint(8, 90)}, in "
            f"{rng.randint(3, 9)} paragraphs."), rng.choice((448, 512))


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
