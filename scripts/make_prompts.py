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
            "public speaking", "bicycle", "cats purr",
            # benchmarks/real_model.py's EVAL_MORE
            "argentina", "everest", "breakfast", "french revolution", "weekend", "learn to cook", "jungle",
            "telescope", "saturn", "oldest tree", "sky blue", "refrigerator", "thunder", "hot-air", "balloon",
            "a lake", "a pond", "onion", "inflation", "microwave", "city at night", "neighbour", "holiday",
            "guacamole", "romeo", "juliet", "desk lamp", "exercise", "stress", "beach trip", "adopt a cat",
            "laptop", "is_even", "count_characters", "triangle", "send_email", "sumarray", "invoices",
            "fizzbuzz"]

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

#: `--more_subjects` (a lever of issue 77, measured and not the default): the forms crossed with 3.7x the subjects
#: (each seen about twice rather than six times) and more chat requests, tasks and functions; on SmolLM2-135M the
#: README's recipe on such a file measured +0.010 tokens per step (paired s.e. 0.021) on benchmarks/real_model.py's
#: 48 prompts (benchmarks/results/heads_levers.json, `more_subjects`)
SUBJECTS_MORE = [
    # science and the body
    "atoms in a crystal", "magnetism in rocks", "friction", "pressure", "temperature", "energy", "heat",
    "evaporation", "condensation", "erosion", "fossils", "DNA", "genes", "cells", "enzymes", "proteins",
    "vitamins", "the immune system", "bones", "muscles", "the lungs", "the liver", "the kidneys", "blood",
    "the skin", "teeth", "the ear", "memory", "dreams", "emotions", "hormones", "allergies", "fevers",
    "antibiotics", "microscopes", "lasers", "radar", "x-rays", "nuclear power", "hydrogen", "oxygen",
    "carbon", "nitrogen", "salt", "sugar", "acids", "crystals", "diamonds", "gold", "silver", "copper",
    "iron", "steel", "aluminium", "concrete", "rubber", "leather", "silk", "wood", "bamboo", "clay",
    "the periodic table", "chemical reactions", "the water cycle", "the carbon cycle", "evolution",
    "ecosystems", "food chains", "pollination", "migration", "hibernation", "camouflage", "symbiosis",
    "the speed of light", "orbits", "eclipses", "meteors", "asteroids", "the Milky Way", "galaxies",
    "the Big Bang", "space telescopes", "rockets", "satellites", "the International Space Station",
    "the sun", "northern lights", "seasons", "time zones", "leap years",
    # nature and animals
    "lions", "tigers", "giraffes", "zebras", "kangaroos", "koalas", "pandas", "gorillas", "chimpanzees",
    "dolphins", "seals", "turtles", "crocodiles", "snakes", "lizards", "parrots", "eagles", "crows",
    "hummingbirds", "flamingos", "ostriches", "bats", "rabbits", "squirrels", "foxes", "bears", "deer",
    "camels", "goats", "sheep", "cows", "chickens", "ducks", "salmon", "jellyfish", "starfish", "crabs",
    "spiders", "beetles", "mosquitoes", "worms", "snails", "moss", "ferns", "cacti", "roses", "tulips",
    "sunflowers", "oak trees", "pine forests", "grasslands", "wetlands", "swamps", "canyons", "valleys",
    "beaches", "sand dunes", "icebergs", "geysers", "hot springs", "tornadoes", "fog",
    "hail", "droughts", "floods", "wildfires", "monsoons", "ocean currents", "the deep sea",
    # food and home
    "pasta", "pizza", "noodles", "dumplings", "curry", "salads", "sandwiches", "cakes", "cookies",
    "ice cream", "yogurt", "butter", "eggs", "beans", "potatoes", "tomatoes", "apples", "bananas",
    "oranges", "lemons", "grapes", "strawberries", "mangoes", "coconuts", "nuts", "honey", "vinegar",
    "herbs", "garlic", "ginger", "pepper", "fermentation", "baking", "grilling", "street food",
    "school lunches", "table manners", "kitchens", "furniture", "carpets", "windows", "doors", "roofs",
    "plumbing", "heating", "candles", "mirrors", "umbrellas", "shoes", "hats", "jeans",
    "uniforms", "fashion", "perfume", "soap", "toothpaste", "laundry", "dishwashers", "vacuum cleaners",
    # history and society
    "ancient Greece", "ancient Rome's roads", "the Maya", "the Aztecs", "the Incas", "the Silk Road",
    "the Middle Ages", "knights", "pirates", "samurai", "the Ottoman Empire", "the Mongol Empire",
    "the age of exploration", "the American Revolution", "the Cold War", "the Moon landing",
    "the Great Wall of China", "the pyramids", "Stonehenge", "the Olympic Games", "the Red Cross",
    "the United Nations", "human rights", "laws", "police", "firefighters", "hospitals", "doctors",
    "nurses", "teachers", "engineers", "architects", "farmers", "fishermen", "pilots", "chefs",
    "lawyers", "journalists", "scientists", "inventors", "explorers", "artists", "musicians", "writers",
    "volunteering", "charity", "taxes and public services", "trade", "shipping", "ports", "factories",
    "supply chains", "advertising", "brands", "shopping malls", "online shopping", "credit cards",
    "loans", "interest rates", "savings", "insurance", "pensions", "startups", "unions", "careers",
    "job interviews", "remote work", "teamwork", "leadership", "negotiation", "meetings", "deadlines",
    # places
    "Paris", "London", "Tokyo", "New York", "Rome", "Cairo", "Beijing", "Moscow", "Sydney", "Toronto",
    "Berlin", "Madrid", "Istanbul", "Mumbai", "Lagos", "Nairobi", "Lima", "Chile",
    "Greece", "Spain", "France", "Germany", "China", "Korea", "Vietnam", "Thailand", "Indonesia",
    "Nigeria", "Ghana", "Morocco", "Turkey", "Iran", "Russia", "Poland", "Sweden", "Finland", "Ireland",
    "Scotland", "New Zealand", "Greenland", "Antarctica", "the Alps", "the Andes",
    "the Rocky Mountains", "the Mediterranean Sea", "the Pacific Ocean", "the Atlantic Ocean",
    "the Mississippi River", "the Danube", "the Great Barrier Reef", "Venice", "Hawaii", "Madagascar",
    # technology
    "the cloud", "databases", "spreadsheets", "web browsers", "search engines", "social media",
    "operating systems", "Linux", "open source software", "apps", "websites", "cybersecurity",
    "viruses on computers", "backups", "Wi-Fi", "Bluetooth", "GPS", "3D printing", "drones",
    "self-driving cars", "virtual reality", "machine learning", "chatbots", "data privacy", "algorithms",
    "compilers", "version control", "unit tests", "APIs", "microchips", "transistors", "keyboards",
    "cameras", "headphones", "televisions", "printers", "routers", "electric bikes", "scooters", "buses",
    "subways", "ships", "canals", "tunnels", "highways", "traffic lights", "parking", "elevators",
    "escalators", "power plants", "dams", "water towers", "sewers", "recycling plants", "nuclear fusion",
    # arts, leisure and life
    "opera", "ballet", "hip hop", "rock music", "folk songs", "the piano", "the violin", "drums",
    "choirs", "orchestras", "film", "cartoons", "comics", "fairy tales", "myths", "legends", "fables",
    "mystery novels", "science fiction", "poetry slams", "calligraphy", "pottery",
    "knitting", "sewing", "woodworking", "origami", "board games", "card games", "puzzles", "magic tricks",
    "tennis", "golf", "cricket", "baseball", "rugby", "cycling", "skiing", "surfing", "sailing",
    "climbing", "boxing", "martial arts", "marathons", "the gym", "stretching", "meditation",
    "birthdays", "weddings", "festivals", "holidays abroad", "New Year", "gifts", "letters", "postcards",
    "diaries", "childhood", "old age", "families", "siblings", "grandparents", "neighbours' gardens",
    "moving house", "first days at school", "homework", "exams", "graduation", "learning to drive",
    "road trips", "picnics", "beaches in summer", "snow days", "public transport", "city parks",
    "volunteering at a shelter", "happiness", "patience", "courage", "honesty", "gratitude", "curiosity",
    "creativity", "boredom", "loneliness", "procrastination", "time management", "goals", "routines",
    "saving money", "personal finance", "minimalism", "sustainability", "composting", "veganism",
    "first aid", "hydration", "posture", "screen time", "reading aloud", "handwriting", "spelling",
    "grammar", "punctuation", "vocabulary", "idioms", "proverbs", "sign language", "Latin", "Spanish",
    "Chinese characters", "alphabets", "numbers", "zero", "infinity", "probability", "percentages",
    "algebra", "calculus", "logic", "puzzles with numbers", "maps of the world", "flags", "coins",
    "stamps", "collections", "antiques", "architecture", "gothic cathedrals", "temples", "mosques",
    "gardens in Japan", "bonsai", "tea ceremonies", "coffee shops", "bakeries", "markets in Morocco",
]

#: more chat requests, the kinds of thing users ask an assistant (a subject fills {s})
FORMS_MORE = [
    "Can you explain {s} simply?", "I want to learn about {s}. Where should I start?",
    "What are the main benefits of {s}?", "What are the risks of {s}?", "List some interesting facts about {s}.",
    "Give me a fun fact about {s}.", "What is the history of {s}?", "How has {s} changed over time?",
    "Write a paragraph about {s} for a school report.", "Write an introduction for an article about {s}.",
    "Write a blog post title and first sentence about {s}.", "Write a slogan about {s}.",
    "Write a riddle about {s}.", "Write a short song about {s}.", "Write a rhyming couplet about {s}.",
    "Give me a short quiz about {s} with answers.", "What questions could I ask an expert on {s}?",
    "What is a common misconception about {s}?", "Explain {s} like I am five.", "Define {s} in one sentence.",
    "What would happen if there were no {s}?", "Why should children learn about {s}?",
    "Recommend three books about {s}.", "What jobs involve {s}?", "Brainstorm ideas for a project on {s}.",
    "Write a short speech about {s}.", "Describe {s} to someone who has never seen them.",
    "What do you think about {s}?", "Tell me a short story that involves {s}.",
    "Make a list of words related to {s}.", "Rewrite this sentence more formally: {S} are really cool.",
    "Correct the grammar: {s} is very interesting and they was studied for years.",
    "Is this sentence true or false? {S} were invented in the last ten years.",
    "Summarize what is known about {s} in three bullet points.", "How are {s} and {t} different?",
    "Write an email to a friend about {s}.", "Plan a one-hour lesson about {s}.",
    "What is the best way to study {s}?", "Classify {s}: natural or man-made?",
]

TASKS_MORE = [
    "bake a cake", "change a tyre", "wash a car", "iron a shirt", "tie a tie", "paint a room",
    "learn to play chess", "learn to juggle", "meditate", "fall asleep faster", "wake up early",
    "drink more water", "stop procrastinating", "give a presentation", "write a cover letter",
    "ask for a raise", "negotiate a price", "apologize to a friend", "make a cup of coffee",
    "sharpen a knife", "build a birdhouse", "start a podcast", "learn to code", "set up a website",
    "make a smoothie", "boil an egg", "keep houseplants alive", "train a dog to sit", "write a poem",
    "choose a good watermelon", "memorize a speech", "get better at math", "improve my handwriting",
    "teach a child to read", "back up my phone", "choose a password", "save for a holiday",
    "move to a new country", "make new friends at work", "host a dinner party",
]

FUNCS_MORE = [
    ("reverse_string", "s"), ("factorial", "n"), ("gcd", "a, b"), ("lcm", "a, b"), ("is_prime", "n"),
    ("flatten", "nested"), ("zip_lists", "a, b"), ("max_subarray", "nums"), ("two_sum", "nums, target"),
    ("celsius_to_fahrenheit", "c"), ("word_count", "path"), ("unique_words", "text"), ("caesar_cipher", "text, shift"),
    ("matrix_multiply", "a, b"), ("cumulative_sum", "values"), ("group_by", "items, key"), ("top_k", "items, k"),
    ("parse_csv_line", "line"), ("to_title_case", "text"), ("bmi", "weight, height"), ("days_between", "d1, d2"),
    ("safe_divide", "a, b"), ("retry", "func, attempts"), ("memoize", "func"), ("validate_password", "password"),
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


def generate(seed: int = 0, more_subjects: bool = False) -> dict[str, list[str]]:
    rng = random.Random(seed)
    subjects = SUBJECTS + (SUBJECTS_MORE if more_subjects else [])
    forms = FORMS + (FORMS_MORE if more_subjects else [])
    tasks = TASKS + (TASKS_MORE if more_subjects else [])
    funcs = FUNCS + (FUNCS_MORE if more_subjects else [])
    out: dict[str, list[str]] = {"subject": [], "story": [], "task": [], "code": [], "math": []}
    for form in forms:
        for s in subjects:
            t = rng.choice(subjects)
            out["subject"].append(form.format(s=s, S=s[0].upper() + s[1:], t=t))
    for form in STORY_FORMS:
        for p in PEOPLE:
            q, place = rng.choice(PEOPLE), rng.choice(PLACES)
            out["story"].append(form.format(p=p, P=p[0].upper() + p[1:], q=q, l=place))
    for form in TASK_FORMS:
        for k in tasks:
            out["task"].append(form.format(k=k))
    for form in CODE_FORMS:
        for f, a in funcs:
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
    ap.add_argument("--more_subjects", action="store_true", help="cross the forms with SUBJECTS_MORE and the other "
                    "*_MORE lists too (issue 77's lever; not the packaged files)")
    args = ap.parse_args(argv)
    reserved = {line.strip().lower() for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()}
    words = re.compile("|".join(re.escape(w) for w in RESERVED), re.IGNORECASE)
    rng = random.Random(args.seed)
    seen: set[str] = set()
    chosen: list[str] = []
    kinds = generate(args.seed, args.more_subjects)
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
