"""Training prompts for the block drafter, built offline and deterministically from a seed.

Sources (nothing is downloaded):
- templates written for this project in the five request categories (code, chat, math,
  summarisation, long-form) with their own word lists: not the sealed set's generator, and
  the committed dev prompts (used to measure τ) are excluded by exact text;
- instructions written for the project (`INSTRUCTIONS`);
- the Python standard library of the running interpreter: module and function docstrings
  and function sources, read with `ast` from its folder (never imported), and the reference
  text it ships for `help()` (pydoc_data/topics.py) as passages to summarise or explain.
The drafter learns from the target's own greedy answers to these prompts (training/cli.py).
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
    "returns the k smallest numbers of a list without sorting the whole list",
    "counts how often each letter occurs in a text, ignoring case",
    "converts a Roman numeral to an integer",
    "converts an integer to its binary representation as a string",
    "checks whether a number is a perfect square",
    "returns the intersection of two lists without duplicates",
    "groups a list of words by their first letter",
    "finds all pairs in a list that add up to a target",
    "returns the factorial of n using a loop",
    "chunks a list into pieces of a given size",
    "removes all vowels from a string",
    "returns the difference in days between two dates given as strings",
    "finds the first repeated character in a string",
    "checks whether a list is sorted in ascending order",
    "returns the transpose of a matrix given as a list of rows",
    "converts a temperature between Celsius and Fahrenheit",
    "parses a line of comma-separated values into a list of numbers",
    "returns a dictionary that counts word lengths in a sentence",
    "flattens a nested list of any depth",
    "returns the longest common prefix of a list of strings",
    "rotates a list to the right by k places",
    "computes a moving average over a window of size k",
    "finds the missing number in a list of 1 to n",
    "checks whether a string is a palindrome, ignoring spaces and case",
    "returns the number of times a substring occurs in a string",
    "sorts a list of dictionaries by one of their keys",
    "returns the cumulative sum of a list",
    "validates a password: length, a digit and an upper-case letter",
    "simulates rolling two dice a thousand times and counts the totals",
    "reads a text file and returns its ten most common words",
]
# (signature, what it does): tasks named the way a user names the function they want
NAMED_TASKS = [
    ("count_words(text)", "returns how many words a string contains, treating runs of spaces as one"),
    ("is_prime(n)", "returns True when n is a prime number and False otherwise"),
    ("average(values)", "returns the mean of a list of numbers, or None for an empty list"),
    ("title_case(sentence)", "capitalises every word except short words such as 'a', 'of' and 'the'"),
    ("unique_sorted(items)", "returns the distinct items of a list in ascending order"),
    ("digits_to_words(n)", "spells out each digit of a number, so 42 becomes 'four two'"),
    ("safe_divide(a, b)", "divides a by b and returns None instead of failing when b is zero"),
    ("count_by_type(values)", "returns a dictionary counting how many values of each type a list holds"),
    ("longest_run(numbers)", "returns the length of the longest run of equal neighbouring numbers"),
    ("mask_email(address)", "hides all but the first letter of the name part of an email address"),
    ("seconds_to_clock(total)", "formats a number of seconds as a string like '01:05:09'"),
    ("pairwise_sums(numbers)", "returns the sums of each pair of neighbouring numbers"),
    ("invert_dict(mapping)", "swaps the keys and values of a dictionary, collecting repeated values in lists"),
    ("char_histogram(text)", "prints a bar of stars for each letter, as long as its count"),
    ("nth_largest(values, n)", "returns the n-th largest distinct value of a list"),
    ("normalise_spaces(text)", "trims a string and replaces every run of whitespace with one space"),
    ("to_snake_case(name)", "turns a name like 'MyVariableName' into 'my_variable_name'"),
    ("dedupe_emails(emails)", "removes e-mail addresses that differ only in letter case"),
    ("grade(score)", "turns a score from 0 to 100 into a letter grade from A to F"),
    ("shopping_total(prices, quantities)", "returns the total cost of a shopping list"),
    ("vowel_positions(word)", "returns the indexes of the vowels in a word"),
    ("split_sentences(text)", "splits a paragraph into sentences at full stops, question and exclamation marks"),
    ("bmi(weight_kg, height_m)", "computes the body mass index and rounds it to one decimal"),
    ("days_in_month(month, year)", "returns the number of days in a month, leap years included"),
    ("closest_to_zero(numbers)", "returns the number nearest to zero, preferring the positive one on ties"),
    ("interleave(a, b)", "merges two lists by alternating their items, appending what is left"),
    ("word_lengths(sentence)", "returns a list with the length of every word in a sentence"),
    ("common_letters(a, b)", "returns the letters two words share, in alphabetical order"),
    ("percent_change(old, new)", "returns the percentage change between two values"),
    ("fill_template(template, values)", "replaces each {name} in a string by its value from a dictionary"),
    ("matrix_sum(matrix)", "adds up every number in a list of rows"),
    ("is_valid_date(text)", "checks whether a string in the form YYYY-MM-DD is a real date"),
    ("batch(items, size)", "yields successive lists of at most size items"),
    ("stars_pyramid(height)", "prints a centred pyramid of stars of the given height"),
    ("count_islands(grid)", "counts groups of neighbouring 1s in a grid of 0s and 1s"),
    ("queue_simulation(arrivals)", "simulates a queue at a counter and returns the average waiting time"),
]
NAMED_FORMS = [
    "Write a Python function `{sig}` that {desc}.",
    "Write a Python function `{sig}` that {desc}. Include a docstring and two example calls.",
    "Write a Python function `{sig}` that {desc}, then show three example calls with their results.",
    "Implement `{sig}` in Python: it {desc}. Add comments explaining each step.",
    "Write `{sig}` in Python. It {desc}. Also write a few pytest tests for it.",
    "Write a Python function `{sig}` that {desc}. Handle empty or invalid input sensibly.",
]
CODE_FORMS = [
    "Write a Python function that {task}. {extra}",
    "Implement a function in Python that {task}, and explain how it works.",
    "Show two different ways to write a Python function that {task}, and compare them.",
    "Write a Python function that {task}. Then write three assert statements that test it.",
    "I need a Python helper that {task}. Can you write it with a docstring?",
    "Write a Python function that {task}, and say what its time complexity is.",
]
CODE_EXTRAS = ["Add a docstring and two example calls.", "Use type hints.",
               "Explain the code afterwards.", "Handle empty input.",
               "Keep it short and readable.", "Add comments to each step.",
               "Raise a ValueError for invalid input.", "Do not use any imports."]
CONCEPTS = ["list comprehensions", "dictionaries", "exceptions", "generators", "decorators",
            "classes and objects", "inheritance", "f-strings", "the `with` statement",
            "lambda functions", "sets", "tuples", "slicing", "recursion", "modules and imports",
            "`*args` and `**kwargs`", "default arguments", "the `enumerate` function",
            "the `zip` function", "type hints", "dataclasses", "iterators", "string methods",
            "sorting with a key function", "virtual environments", "unit tests with pytest",
            "reading and writing files", "JSON in Python", "the `collections` module",
            "variable scope"]
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
MECHANISMS = ["a refrigerator", "a bicycle's gears", "a vaccine", "GPS", "a microwave oven",
              "a solar panel", "a compass", "a thermostat", "a credit card payment",
              "an electric car battery", "a dishwasher", "Wi-Fi", "a camera lens", "a lock and key",
              "a touch screen", "a hot-air balloon", "a submarine", "an elevator", "a smoke detector",
              "the stock market", "a heat pump", "a search engine", "a 3D printer", "email",
              "a pressure cooker", "a wind-up watch", "the human immune system", "a dam",
              "noise in a city", "a library catalogue"]
PAIRS = [("a lake", "a pond"), ("a crocodile", "an alligator"), ("a loan", "a mortgage"),
         ("baking soda", "baking powder"), ("a hurricane", "a tornado"), ("a psychologist",
         "a psychiatrist"), ("speed", "velocity"), ("a fruit", "a vegetable"), ("weather",
         "climate"), ("a democracy", "a republic"), ("an ocean", "a sea"), ("a frog", "a toad"),
         ("RAM", "storage"), ("a meteor", "a meteorite"), ("a simile", "a metaphor"),
         ("a debit card", "a credit card"), ("an epidemic", "a pandemic"), ("butter",
         "margarine"), ("a college", "a university"), ("a hill", "a mountain"), ("yeast",
         "sourdough starter"), ("a rabbit", "a hare"), ("a cold", "the flu"), ("a poem",
         "a song"), ("renting", "buying a home")]
ACTIVITIES = ["learning to swim as an adult", "saving money each month", "studying for exams",
              "starting a vegetable garden", "running a first 5 km race", "learning to cook",
              "keeping a tidy desk", "giving a presentation", "travelling on a budget",
              "learning to draw", "making friends in a new city", "sleeping better",
              "writing a CV", "reading more books", "learning to play the guitar",
              "taking care of a puppy", "preparing for a job interview", "working from home",
              "planning a birthday party", "staying focused while studying", "moving house",
              "cycling to work", "learning a second language", "eating more vegetables",
              "organising family photos", "starting a small business", "camping with kids",
              "reducing stress before exams", "learning to type faster", "volunteering"]
PHENOMENA = ["the sea is salty", "we get goosebumps", "bread goes stale", "the moon has phases",
             "onions make us cry", "we yawn", "ice floats", "the sky is dark at night",
             "birds migrate", "metal feels colder than wood", "we dream", "popcorn pops",
             "the wind blows", "some people are left-handed", "cats land on their feet",
             "stars twinkle", "hair turns grey", "we hiccup", "soap removes grease",
             "mountains have snow on top"]


SITUATIONS = ["I have a job interview next week", "my neighbour plays loud music late at night",
              "I keep putting off my homework", "I want to ask for a pay rise",
              "my best friend is moving abroad", "I have to give a speech at a wedding",
              "I feel nervous before exams", "I bought a bike but rarely use it",
              "my flatmate never does the dishes", "I want to learn to bake bread at home",
              "I'm starting university in another city", "my phone battery drains very fast",
              "I can't decide between two job offers", "I want to run a marathon next year",
              "my grandmother wants to learn to use a smartphone", "I am adopting a cat",
              "I have a long flight next month", "my garden is full of weeds",
              "I want to read more but never find the time", "my team at work misses deadlines",
              "I have to look after my little cousins for a weekend", "I spend too much money on takeaway food",
              "I'm hosting dinner for eight people", "I want to start learning to code",
              "I get headaches when I work at my computer", "I'm planning my first trip abroad alone",
              "my child does not want to read books", "I want to make my small flat feel bigger",
              "I always arrive late to meetings", "I'm going camping for the first time"]
SITUATION_ASKS = ["What should I do?", "Do you have any practical tips?",
                  "How should I prepare?", "What would you suggest?",
                  "Can you give me a simple plan?", "Where should I start?",
                  "What are a few things I could try?"]


def _chat_question(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind >= 6:
        return f"{rng.choice(SITUATIONS)}. {rng.choice(SITUATION_ASKS)}"
    if kind == 0:
        return rng.choice(CHAT)
    if kind == 1:
        return f"How does {rng.choice(MECHANISMS)} work?"
    if kind == 2:
        a, b = rng.choice(PAIRS)
        return f"What is the difference between {a} and {b}?"
    if kind == 3:
        return rng.choice(["Can you give me some tips for {a}?", "I want to get better at {a}. "
                           "Where should I start?", "What are common mistakes when {a}?",
                           "Can you make a simple plan for {a}?"]).format(a=rng.choice(ACTIVITIES))
    if kind == 4:
        return f"Why {rng.choice(PHENOMENA)}?"
    return f"What is {rng.choice(TOPICS)}, and why is it interesting?"


TOPICS = ["glaciers", "the printing press", "honeybees", "lighthouses", "the human heart",
          "recycling plastic", "tides", "the history of tea", "wind turbines", "octopuses",
          "public libraries", "the Silk Road", "earthquakes", "photosynthesis", "trains",
          "the invention of paper", "deserts", "owls", "compound interest", "rainforests",
          "volcanoes", "the Moon landing", "coral reefs", "bridges", "the Roman roads",
          "electric cars", "vaccines", "chess", "the Olympic Games", "maps", "clocks",
          "bread baking", "the internet", "penguins", "the solar system", "rivers",
          "ancient Egypt", "bicycles", "coffee", "the piano", "migration of birds",
          "the periodic table", "cities of the future", "music in films", "sleep",
          "the ocean floor", "robots", "ants", "the Great Wall of China", "weather forecasts",
          "the printing of money", "languages", "space telescopes", "forests in winter",
          "the history of football"]
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
    kind = rng.randrange(9)
    if kind >= 7:
        sig, desc = rng.choice(NAMED_TASKS)
        return rng.choice(NAMED_FORMS).format(sig=sig, desc=desc)
    if kind == 0:
        return rng.choice(CODE_FORMS).format(task=task, extra=rng.choice(CODE_EXTRAS))
    if kind == 5:
        return rng.choice([
            "Explain {c} in Python with a short example.",
            "What are {c} in Python, and when should I use them? Show code.",
            "Give a beginner-friendly explanation of {c} in Python, with two examples.",
            "What are common mistakes with {c} in Python? Show how to avoid them."]).format(
                c=rng.choice(CONCEPTS))
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
        lang = rng.choice(["Python", "Python 3", "plain Python without imports"])
        return (f"Explain, step by step, how you would write a function in {lang} that {task}, "
                f"then show it working on a {ent} example.")
    return (f"Write pytest tests for a function `{ent}_{attr}(value)` that {task}, covering "
            f"normal input, empty input and one edge case.")


MATH_CLOSERS = ["Show your working.", "Explain each step.", "Solve it step by step.",
                "Show your steps.", "Explain how you got the answer.", "Explain your reasoning."]
ITEMS = [("jacket", 80), ("lamp", 30), ("pair of shoes", 60), ("bicycle", 240), ("book", 20),
         ("backpack", 45), ("watch", 120), ("kettle", 25), ("chair", 70), ("board game", 36)]
UNITS = [("metres", "centimetres", 100), ("kilograms", "grams", 1000),
         ("hours", "minutes", 60), ("litres", "millilitres", 1000), ("kilometres", "metres", 1000),
         ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7)]


def _math_more(rng: random.Random, kind: int) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    who, who2 = rng.sample(PEOPLE, 2)
    what = rng.choice(THINGS)
    close = rng.choice(MATH_CLOSERS)
    if kind == 0:
        item, price = rng.choice(ITEMS)
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
        ev = rng.choice(["A concert", "A bus trip", "A football match", "A film", "A flight"])
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
        stat = rng.choice(["mean", "median", "mean and the median", "range and the mean"])
        return f"{who}'s test scores are {', '.join(map(str, vals))}. What is the {stat}? {close}"
    if kind == 6:
        big, small, f = rng.choice(UNITS)
        x = rng.choice([1.5, 2, 2.5, 3, 4, 0.75, 6, 12])
        return f"How many {small} are there in {x} {big}? {close}"
    if kind == 7:
        v, t, m = rng.randint(8, 90), rng.randint(1, 5), rng.choice([15, 20, 30, 45])
        who_ = rng.choice(["A cyclist", "A car", "A runner", "A boat", "A bus"])
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
    who, what = rng.choice(PEOPLE), rng.choice(THINGS)
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
CHARACTERS = ["a retired sailor", "a young baker", "a shy robot", "a lost puppy", "a school caretaker",
              "a girl who collects maps", "an old clockmaker", "a bus driver", "a curious fox",
              "a new teacher", "a forgetful wizard", "twin brothers", "a night-shift nurse",
              "a village postman", "a child who cannot whistle", "a gardener", "a lonely whale",
              "a street musician", "an astronaut on her first mission", "a grumpy cat"]
EVENTS = ["finds a key that opens no door in town", "wakes up to a town covered in snow in summer",
          "has to deliver a parcel across the mountains", "discovers a hidden room at home",
          "enters a baking competition", "gets lost in a big city", "befriends an unlikely neighbour",
          "receives a letter written fifty years ago", "must save the school fair",
          "learns to be brave during a storm", "finds a strange egg in the garden",
          "swaps lives with someone else for a day", "builds a boat from old doors",
          "meets a talking bird", "tries to break a world record"]
DEBATES = ["schools should start later in the morning", "cities should ban cars from their centres",
           "homework should be abolished", "every child should learn a musical instrument",
           "people should work four days a week", "zoos should still exist",
           "mobile phones should be banned in classrooms", "public transport should be free",
           "tourists should pay a fee to visit popular cities", "school uniforms are a good idea",
           "everyone should learn to swim at school", "video games can be good for children",
           "people should grow some of their own food", "museums should be free to visit",
           "students should learn about money at school"]
RECIPIENTS = ["the local council", "the head teacher of a school", "a newspaper editor",
              "the manager of a supermarket", "a neighbour", "the director of a museum",
              "a sports club", "the owner of a restaurant", "a landlord", "a bus company"]
ISSUES = ["asking for more bicycle parking", "complaining about a late delivery",
          "suggesting a weekly farmers' market", "asking for longer opening hours",
          "reporting a broken street light", "proposing a litter clean-up day",
          "thanking them for their help after a storm", "asking for a refund",
          "suggesting healthier food options", "asking to use a room for a chess club"]
PLACES = ["a busy market", "a quiet beach", "a train station", "an old library", "a mountain village",
          "a city park", "a school playground", "a harbour", "a forest path", "a night-time city street"]
TIMES = ["at dawn", "on a rainy afternoon", "in the middle of winter", "on a summer evening",
         "during a festival", "late at night", "on the first day of spring"]


def _long_form_more(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice([
            "Write a short story about {c} who {e}.",
            "Write a story for young children about {c} who {e}. Give it a happy ending.",
            "Write a short story of a few paragraphs in which {c} {e}.",
            "Tell a bedtime story about {c} who {e}."]).format(
                c=rng.choice(CHARACTERS), e=rng.choice(EVENTS))
    if kind == 1:
        return rng.choice([
            "Some people think that {d}. Write an essay giving arguments for and against, and "
            "end with your own opinion.",
            "Write a persuasive essay arguing that {d}. Use three clear reasons.",
            "Do you agree that {d}? Write a balanced essay with examples."]).format(
                d=rng.choice(DEBATES))
    if kind == 2:
        return rng.choice([
            "Write a formal letter to {r} {i}. Explain the situation and what you would like "
            "them to do.",
            "Write a polite email to {r} {i}.",
            "Write a letter to {r} {i}. Keep a friendly but clear tone."]).format(
                r=rng.choice(RECIPIENTS), i=rng.choice(ISSUES))
    if kind == 3:
        return rng.choice([
            "Describe {p} {t} in a few vivid paragraphs.",
            "Write a descriptive piece about {p} {t}, using all five senses.",
            "Write the opening of a novel set in {p} {t}."]).format(
                p=rng.choice(PLACES), t=rng.choice(TIMES))
    return rng.choice([
        "Write a blog post giving advice to someone who is {a}.",
        "Write a step-by-step guide for beginners about {a}.",
        "Write a magazine article about the benefits and difficulties of {a}."]).format(
            a=rng.choice(ACTIVITIES))


INSTRUCTION_STYLES = ["", " Keep it concise.", " Use headings.", " Use a numbered list where it "
                      "helps.", " Give one example at the end.", " Write for a beginner."]


def _chat(rng: random.Random) -> str:
    return rng.choice(CHAT_OPENERS) + _chat_question(rng) + rng.choice(CHAT_CLOSERS)


def _long_form(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return _long_form_more(rng)
    return rng.choice(FORMS).format(t=rng.choice(TOPICS), a=rng.choice(AUDIENCES))


def _instruction(rng: random.Random) -> str:
    return rng.choice(INSTRUCTIONS) + rng.choice(INSTRUCTION_STYLES)


@functools.lru_cache(maxsize=4)
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


SUMMARY_FORMS = [
    "Summarise the following text in three sentences:\n\n{t}",
    "Summarise this passage from the Python documentation for a beginner:\n\n{t}",
    "Read this text and list its main points as bullet points:\n\n{t}",
    "Write a one-paragraph summary of the following:\n\n{t}",
    "Explain the following passage in simple words, then give a short example:\n\n{t}",
]


# second stage of training (--summaries): passages are the target's own prose answers
PROSE_SUMMARY_FORMS = [
    "Summarise the text below in two or three sentences.\n\n{t}",
    "{t}\n\nWhat is the main idea of this text? Answer in a short paragraph.",
    "Here is a text:\n\n{t}\n\nList its three most important points.",
    "{t}\n\nSummarise the text above in one sentence, then explain it in a little more detail.",
    "{t}\n\nGive this text a short title and write a brief summary of it.",
    "{t}\n\nRetell this text in simple words for a ten-year-old.",
    "Read this carefully.\n\n{t}\n\nWhat is it about, and what is the most important detail? "
    "Be brief.",
    "{t}\n\nWrite a summary of this text in bullet points.",
]


def prose_summary_prompt(rng: random.Random, passage: str) -> str:
    """A summarisation prompt around a prose passage (one of the target's own answers)."""
    return rng.choice(PROSE_SUMMARY_FORMS).format(t=passage.strip())


def _summarisation(rng: random.Random, passages) -> str:
    return rng.choice(SUMMARY_FORMS).format(t=rng.choice(passages)[1])


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
        f"Explain this code line by line:\n\n```python\n{text}\n```",
        f"Refactor this function to make it easier to read, and explain your changes:\n\n"
        f"```python\n{text}\n```",
        f"What could go wrong with this function? Point out edge cases and suggest fixes:"
        f"\n\n```python\n{text}\n```",
    ])


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


def build_prompts(seed: int, n: int, exclude: set[str] = frozenset(),
                  limit_files: int | None = None, mix: dict[str, float] | None = None
                  ) -> list[tuple[str, str]]:
    """Up to `n` distinct (source, prompt) pairs in the proportions of `mix`, fixed by
    `seed`, none in `exclude`. A source whose templates run out of new prompts gives fewer."""
    mix = dict(MIX if mix is None else mix)
    rng = random.Random(seed)
    snippets = stdlib_snippets(limit_files) if mix.get("stdlib") else []
    passages = reference_passages() if mix.get("summarisation") else []
    makers = {"code": _code, "math": _math, "chat": _chat, "long-form": _long_form,
              "instruction": _instruction, "stdlib": lambda r: _stdlib(r, snippets),
              "summarisation": lambda r: _summarisation(r, passages)}
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
    rng.shuffle(out)
    return out


def prompt_group(source: str, text: str) -> str:
    """The content a prompt shares with its near-duplicates (the same question under another
    opener, the same task in another form, the same passage under another instruction), so
    that validation holds out whole groups: answers to a held-out group's prompts are not
    near-copies of training answers."""
    if source in ("stdlib", "summarisation"):
        return source + ":" + text.split("\n\n", 1)[-1][:400]
    if source == "math":  # one template: numbers, names, objects and closers blanked
        key = re.sub(r"#(?:[.,/:]#)+", "#", re.sub(r"\d+", "#", text))
        for word in sorted(PEOPLE + THINGS + [i for i, _ in ITEMS] + MATH_CLOSERS, key=len,
                           reverse=True):
            key = key.replace(word, "_")
        return "math:" + key.split(".")[0][:40]
    items = {"code": TASKS + CONCEPTS + [d for _, d in NAMED_TASKS],
             "chat": CHAT + MECHANISMS + ACTIVITIES + PHENOMENA + SITUATIONS
             + [f"{a} and {b}" for a, b in PAIRS] + TOPICS,
             "long-form": TOPICS + EVENTS + DEBATES + ISSUES + PLACES + ACTIVITIES,
             "instruction": INSTRUCTIONS}.get(source, [])
    found = [item for item in items if item in text]
    return f"{source}:{max(found, key=len)}" if found else f"{source}:{text}"

