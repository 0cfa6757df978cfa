#!/usr/bin/env python3
"""Write the training prompts shipped with the package (trtllm_medusa_ports/data/prompts.txt), more
held-out prompts for tuning trees (data/tune_prompts.txt), and a few more for verify to measure the
tuned tree on (data/verify_prompts.txt: what `trtllm-medusa port` verifies on).

`trtllm-medusa train-heads` continues every prompt with the base's own greedy decoding and learns
from those continuations, so the prompts only have to be *varied*: heads trained on a few templates
learn the templates (on SmolLM2-135M, 700 prompts from a handful of templates gave 0.67 top-1 on
their own text against 0.24 on held-out prompts). This script crosses many prompt forms (questions,
instructions, completions, lists, dialogue, stories, code in several languages) with many subjects,
and keeps the first prompts of a seeded shuffle, so the file is reproducible:

    python scripts/make_prompts.py [--count 2400] [--tune_count 270] [--verify_count 16]

The prompts used to tune trees (data/heldout_prompts.txt) and those benchmarks/real_model.py measures
on (EVAL) are excluded, with their subjects, so that tokens per step are measured on unseen text.
One prompt per line; a literal backslash-n stands for a line break inside a prompt.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "trtllm_medusa_ports" / "data" / "prompts.txt"
HELDOUT = ROOT / "trtllm_medusa_ports" / "data" / "heldout_prompts.txt"
TUNE = ROOT / "trtllm_medusa_ports" / "data" / "tune_prompts.txt"
VERIFY = ROOT / "trtllm_medusa_ports" / "data" / "verify_prompts.txt"

#: words of the measured (EVAL) and tuning prompts: a generated prompt containing one is dropped
RESERVED = ["solar system", "planet", "quicksort", "relativity", "pancake", "submarine", "winter",
            "levenshtein", "second language", "atom", "molecule", "chocolate", "compass", "bankaccount",
            "bank account", "rainbow", "elephant", "sahara", "telephone", "healthy eating", "autumn",
            "bubble_sort", "find_max", "queue", "extract_emails", "books", "snake_case", "bake bread",
            "rainy day", "human eye", "tallest mountain", "guitar", "the sea", "busy market", "kingdom",
            "robot", "night's sleep", "virus", "database index", "magnet", "lost key", "7 times 8",
            "public speaking", "bicycle", "cats purr"]

SUBJECTS = [
    "volcanoes", "glaciers", "coral reefs", "deserts", "rivers", "earthquakes", "hurricanes", "tides",
    "the moon", "comets", "black holes", "stars", "gravity", "electricity", "light", "sound waves",
    "photosynthesis", "the human heart", "the brain", "sleep", "vaccines", "bacteria in the gut",
    "dinosaurs", "whales", "honey bees", "ants", "owls", "octopuses", "wolves", "penguins", "sharks",
    "trees", "mushrooms", "seeds", "rainforests", "oceans", "clouds", "snowflakes", "fire", "soil",
    "the Roman Empire", "ancient Egypt", "the Renaissance", "the Industrial Revolution", "the Vikings",
    "the printing press", "the steam engine", "the internet", "smartphones", "electric cars", "trains",
    "airplanes", "bridges", "skyscrapers", "lighthouses", "castles", "maps", "clocks", "calendars",
    "money", "banks", "taxes", "markets", "cities", "villages", "farming", "fishing", "bread", "cheese",
    "coffee", "tea", "rice", "spices", "soup", "olive oil", "recycling", "solar panels", "wind power",
    "batteries", "computers", "programming", "robots in factories", "artificial intelligence",
    "encryption", "passwords", "email", "video games", "chess", "football", "basketball", "swimming",
    "running", "yoga", "painting", "sculpture", "photography", "jazz", "classical music", "poetry",
    "novels", "theatre", "museums", "libraries", "schools", "universities", "languages", "writing",
    "mathematics", "prime numbers", "fractions", "geometry", "statistics", "chemistry", "metals",
    "plastics", "glass", "paper", "cotton", "wool", "democracy", "elections", "courts", "newspapers",
    "radio", "television", "friendship", "kindness", "habits", "budgeting", "cooking at home",
    "gardening", "camping", "hiking", "travel", "airports", "hotels", "maps and navigation",
    "the weather forecast", "climate", "pollution", "clean water", "bees and flowers", "zoos",
    "pets", "dogs", "horses", "birds migrating", "butterflies", "frogs", "the Arctic", "islands",
    "mountains", "caves", "waterfalls", "the Amazon river", "the Nile", "Japan", "Brazil", "Canada",
    "Kenya", "India", "Norway", "Mexico", "Australia", "Italy", "Egypt", "Peru", "Iceland",
]

PEOPLE = ["a young doctor", "an old fisherman", "a curious girl", "a tired teacher", "a lonely king",
          "a brave cat", "two brothers", "a street musician", "a farmer", "an astronaut", "a baker",
          "a detective", "a shy boy", "a grandmother", "a pilot", "a painter", "a librarian", "a nurse",
          "a shopkeeper", "a student", "a dragon", "a small bird", "a clockmaker", "a sailor"]

PLACES = ["a train station", "a quiet beach", "a mountain village", "a school library", "a hospital",
          "a forest at night", "a small bakery", "an old house", "a city park", "a football stadium",
          "a lighthouse", "a space station", "a farm in spring", "a night market", "a museum"]

TASKS = ["plant a tree", "write a resume", "make a budget", "learn to swim", "clean a kitchen",
         "start running", "study for an exam", "make friends in a new city", "cook rice",
         "save energy at home", "plan a trip", "prepare for a job interview", "write a speech",
         "take better photos", "grow tomatoes", "fix a leaking tap", "learn a new word every day",
         "organize a desk", "care for a puppy", "start a small business", "read more books",
         "make a paper plane", "brew tea", "pack a suitcase", "stay focused while working"]

FORMS = [
    "Facts about {s}:", "{S} is a topic that", "Tell me about {s}.", "What are {s}?", "Why are {s} important?",
    "How do {s} work?", "Explain {s} to a child.", "Explain {s} in one paragraph.",
    "Write a short essay about {s}.", "Write two sentences about {s}.", "Describe {s}.",
    "Give three facts about {s}.", "Five things everyone should know about {s}:\\n1.",
    "A short history of {s}:", "The story of {s} starts", "Scientists study {s} because",
    "A teacher explains {s}:", "Q: What should I know about {s}?\\nA:", "Q: Are {s} dangerous?\\nA:",
    "Question: How did people first learn about {s}?\\nAnswer:", "User: Tell me something about {s}.\\nAssistant:",
    "Write a haiku about {s}.", "Write a limerick about {s}.", "Write a four-line poem about {s}.",
    "Write a tweet about {s}.", "Write a headline about {s}.", "Write a quiz question about {s}.",
    "Pros and cons of {s}:\\nPros:", "Key words about {s}:\\n-", "An outline of a lesson on {s}:\\n1.",
    "Summary: {S}", "Title: All about {s}\\n\\n", "# {S}\\n\\n", "Did you know that {s}",
    "My favourite thing about {s} is", "People often ask whether {s}", "In the future, {s} will",
    "Compare {s} and {t}.", "What do {s} and {t} have in common?", "Which came first, {s} or {t}?",
    "Translate into French: I like {s}.", "Write a children's story about {s}.",
    "Here is a simple explanation of {s}:", "The most surprising fact about {s} is",
    "Why do people love {s}?", "Is it true that {s} never change?", "Three questions about {s}:\\n1.",
]

STORY_FORMS = [
    "Write a story about {p} in {l}.", "{P} walked into {l} and", "Once upon a time, {p} lived near {l}.",
    "It was early morning in {l} when {p}", "Describe {l} at sunset.", "Write a letter from {p} to a friend.",
    "A diary entry by {p}:\\nDear diary,", "Write a dialogue between {p} and {q}.",
    "{P} had a secret:", "The day {p} found a map,", "Write a funny story about {p}.",
    "Describe a day in the life of {p}.", "What would {p} say about {l}?",
]

TASK_FORMS = [
    "How do I {k}?", "Steps to {k}:\\n1.", "Tips to {k}:\\n-", "A beginner's guide to how to {k}:",
    "Explain how to {k} in simple steps.", "What is the easiest way to {k}?", "Checklist to {k}:\\n[ ]",
    "Q: How long does it take to {k}?\\nA:", "Write instructions to {k}.", "Common mistakes when you {k}:\\n1.",
]

FUNCS = [
    ("is_palindrome", "s"), ("fibonacci", "n"), ("count_vowels", "text"), ("word_frequencies", "text"),
    ("binary_search", "items, target"), ("insertion_sort", "items"), ("selection_sort", "items"),
    ("is_leap_year", "year"), ("sum_of_digits", "n"), ("average", "numbers"), ("median", "values"),
    ("transpose", "matrix"), ("chunk", "items, size"), ("remove_duplicates", "items"),
    ("capitalize_words", "sentence"), ("read_lines", "path"), ("write_json", "data, path"),
    ("parse_date", "text"), ("fahrenheit_to_celsius", "f"), ("is_anagram", "a, b"), ("power_set", "items"),
    ("permutations", "items"), ("count_lines", "path"), ("normalize", "vector"), ("dot_product", "a, b"),
    ("rotate_list", "items, k"), ("merge_dicts", "a, b"), ("find_duplicates", "items"),
    ("longest_word", "sentence"), ("roman_to_int", "s"), ("int_to_binary", "n"), ("clamp", "x, low, high"),
    ("mean_squared_error", "y_true, y_pred"), ("slugify", "title"), ("validate_email", "address"),
    ("shuffle_deck", ""), ("roll_dice", "sides=6"), ("countdown", "n"), ("greet", "name"),
    ("area_of_circle", "radius"), ("bfs", "graph, start"), ("dfs", "graph, start"), ("is_sorted", "items"),
    ("tokenize", "text"), ("load_csv", "path"), ("moving_average", "values, window"), ("histogram", "values"),
]

CLASSES = ["Stack", "LinkedList", "Matrix", "Vector2D", "Timer", "Inventory", "Student", "Library",
           "ShoppingCart", "TodoList", "Graph", "Counter", "Temperature", "Rectangle", "Player",
           "BinaryTree", "Cache", "EventBus", "Logger", "Point"]

CODE_FORMS = [
    "def {f}({a}):", "def {f}({a}):\\n    \\\"\\\"\\\"", "# {F}\\ndef {f}({a}):", "class {C}:",
    "class {C}:\\n    def __init__(self", "function {j}({a}) {{", "const {j} = ({a}) => {{",
    "// {F} in JavaScript\\nfunction {j}(", "fn {f}(", "public static int {j}(", "func {j}(",
    "SELECT name, COUNT(*) FROM {tbl}", "CREATE TABLE {tbl} (", "import os\\n\\ndef {f}({a}):",
    "from typing import List\\n\\ndef {f}({a}):", "# Test for {f}\\ndef test_{f}():",
    ">>> {f}(", "Write a Python function that {F}.", "Explain what this code does:\\nfor i in range(10):",
    "How do I {F} in Python?", "#include <stdio.h>\\n\\nint main() {{", "<!DOCTYPE html>\\n<html>",
    "git commit -m \\\"", "$ pip install", "for (let i = 0; i < {n}; i++) {{", "while True:",
]

TABLES = ["users", "orders", "products", "employees", "cities", "songs", "movies", "customers"]

MATH = ["What is {x} plus {y}?", "What is {x} times {y}?", "Compute {x} minus {y}.", "Is {x} a prime number?",
        "What is {x} divided by {y}?", "Solve for x: x + {x} = {y}.", "Round {x}.{y} to the nearest whole number.",
        "Convert {x} meters to centimeters.", "What is {x} percent of {y}?", "Count from {x} to {z}:"]


def describe(fname: str) -> str:
    return fname.replace("_", " ")


def camel(fname: str) -> str:
    head, *rest = fname.split("_")
    return head + "".join(w.capitalize() for w in rest)


#: share of each kind of prompt in the file (the subject forms fill the rest)
SHARES = {"code": 0.22, "story": 0.12, "task": 0.09, "math": 0.05}
KINDS = ("code", "story", "task", "math", "subject")


def quota(kind: str, count: int, taken: int) -> int:
    """How many prompts of ``kind`` a file of ``count`` takes, ``taken`` being already chosen."""
    return round(SHARES[kind] * count) if kind in SHARES else count - taken


def generate(seed: int = 0) -> dict[str, list[str]]:
    rng = random.Random(seed)
    out: dict[str, list[str]] = {"subject": [], "story": [], "task": [], "code": [], "math": []}
    for form in FORMS:
        for s in SUBJECTS:
            t = rng.choice(SUBJECTS)
            out["subject"].append(form.format(s=s, S=s[0].upper() + s[1:], t=t))
    for form in STORY_FORMS:
        for p in PEOPLE:
            q, place = rng.choice(PEOPLE), rng.choice(PLACES)
            out["story"].append(form.format(p=p, P=p[0].upper() + p[1:], q=q, l=place))
    for form in TASK_FORMS:
        for k in TASKS:
            out["task"].append(form.format(k=k))
    for form in CODE_FORMS:
        for f, a in FUNCS:
            out["code"].append(form.format(f=f, F=describe(f), a=a, j=camel(f), C=rng.choice(CLASSES),
                                           tbl=rng.choice(TABLES), n=rng.randint(3, 20)))
    for form in MATH:
        for _ in range(12):
            out["math"].append(form.format(x=rng.randint(2, 99), y=rng.randint(2, 99), z=rng.randint(100, 120)))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tune_count", type=int, default=270)
    ap.add_argument("--tune_out", type=Path, default=TUNE)
    ap.add_argument("--verify_count", type=int, default=16)
    ap.add_argument("--verify_out", type=Path, default=VERIFY)
    args = ap.parse_args(argv)
    reserved = {line.strip().lower() for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()}
    words = re.compile("|".join(re.escape(w) for w in RESERVED), re.IGNORECASE)
    rng = random.Random(args.seed)
    seen: set[str] = set()
    chosen: list[str] = []
    kinds = generate(args.seed)
    left: dict[str, list[str]] = {}
    for kind in KINDS:
        pool = []
        for p in kinds[kind]:
            key = p.lower()
            if key in seen or key in reserved or words.search(p):
                continue
            seen.add(key)
            pool.append(p)
        rng.shuffle(pool)
        want = quota(kind, args.count, len(chosen))
        chosen += pool[:want]
        left[kind] = pool[want:]
    rng.shuffle(chosen)
    args.out.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    print(f"wrote {len(chosen)} prompts to {args.out}")
    # more held-out text for tune-tree: prompts of the same kinds the training file left out (a tree
    # tuned on 30 prompts follows their noise), drawn with their own generator so the training file
    # above does not change
    tune_rng = random.Random(args.seed + 1)
    tune: list[str] = []
    for kind in KINDS:
        want = quota(kind, args.tune_count, len(tune))
        tune += left[kind][:want]
        left[kind] = left[kind][want:]
    tune_rng.shuffle(tune)
    args.tune_out.write_text("\n".join(tune) + "\n", encoding="utf-8")
    print(f"wrote {len(tune)} prompts to {args.tune_out}")
    # prompts of the same kinds again, in neither file above, for verify to measure what tune-tree predicted
    # (their own generator: the two files above do not change)
    verify_rng = random.Random(args.seed + 2)
    checks: list[str] = []
    for kind in KINDS:
        checks += left[kind][:quota(kind, args.verify_count, len(checks))]
    verify_rng.shuffle(checks)
    args.verify_out.write_text("\n".join(checks) + "\n", encoding="utf-8")
    print(f"wrote {len(checks)} prompts to {args.verify_out}")

if __name__ == "__main__":
    main()
