#!/usr/bin/env python3
"""Procedural corpus generator for the cmf demo model family (Python stdlib only).

Produces English text in four clearly different domains, each document a
plain string:
  story   - short children's stories (characters, places, a small problem,
            its resolution, a moral);
  recipe  - cooking recipes (title, ingredient list with quantities,
            numbered steps, serving note);
  math    - arithmetic word problems with a worked, correct answer;
  chat    - ChatML dialogues (<|im_start|>user ... <|im_end|>) whose assistant
            turns tell stories, give recipes, solve sums, answer simple facts.

Everything is drawn from one random.Random(seed) per shard, so the output is a
pure function of (seed, shard, size): `--seed 1` is the training corpus,
`--seed 2` the held-out slice.  The text is produced by this program and is
licensed like the repository (Apache-2.0); it contains no third-party text.

Usage:
  gen_corpus.py --seed 1 --mb 40 --out corpus.txt [--shards 16]
  gen_corpus.py --seed 2 --heldout 32768 --out heldout.txt
Documents in the training corpus are separated by "<|endoftext|>\n"; the
held-out slice (no chat, no special tokens) separates them by a blank line.
"""
import argparse
import multiprocessing
import os
import random

EOT = "<|endoftext|>"

# ---------------------------------------------------------------- vocabulary
NAMES_GIRL = ["Lily", "Mia", "Emma", "Sara", "Nora", "Zoe", "Ava", "Lucy", "Ella", "Rosa",
              "Maya", "Anna", "Ivy", "Ruby", "Hana", "Lena", "Tess", "Clara", "Daisy", "June"]
NAMES_BOY = ["Tom", "Ben", "Sam", "Leo", "Max", "Jack", "Finn", "Omar", "Theo", "Eli",
             "Noah", "Kai", "Hugo", "Liam", "Ravi", "Oscar", "Pablo", "Milo", "Jonas", "Felix"]
ANIMALS = [("fox", "red"), ("rabbit", "white"), ("bear", "brown"), ("cat", "grey"),
           ("dog", "spotted"), ("owl", "wise"), ("duck", "yellow"), ("mouse", "tiny"),
           ("turtle", "slow"), ("frog", "green"), ("squirrel", "quick"), ("hedgehog", "prickly"),
           ("pig", "pink"), ("lamb", "fluffy"), ("goat", "stubborn"), ("bird", "blue")]
ANIMAL_NAMES = ["Pip", "Bo", "Toby", "Fluff", "Sunny", "Button", "Maple", "Pebble", "Nutmeg",
                "Biscuit", "Clover", "Dot", "Hazel", "Olive", "Rusty", "Willow"]
PLACES = [("the park", "big trees and a pond"), ("the forest", "tall pine trees"),
          ("the beach", "warm sand and blue waves"), ("the garden", "bright flowers"),
          ("the farm", "a red barn and many animals"), ("the village", "small houses with red roofs"),
          ("the meadow", "soft grass and butterflies"), ("the hill", "a view of the whole town"),
          ("the river", "cool water and round stones"), ("the library", "rows of old books"),
          ("the school", "a big yard and a bell"), ("the market", "fruit stalls and music")]
OBJECTS = [("ball", "red"), ("kite", "yellow"), ("box", "wooden"), ("key", "golden"),
           ("hat", "blue"), ("book", "old"), ("shell", "shiny"), ("boat", "little"),
           ("drum", "loud"), ("map", "secret"), ("feather", "long"), ("lamp", "bright"),
           ("scarf", "warm"), ("cup", "small"), ("bell", "silver"), ("stone", "smooth")]
FEELINGS_GOOD = ["happy", "proud", "glad", "excited", "calm", "thankful"]
FEELINGS_BAD = ["sad", "worried", "scared", "upset", "lonely", "grumpy"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy", "snowy", "bright"]
TIMES = ["One day", "One morning", "One sunny afternoon", "One evening", "Last summer",
         "On a rainy day", "Early one morning", "One cold winter day"]
OPENINGS = ["Once upon a time", "Long ago", "Many years ago", "In a faraway land"]
MORALS = ["Sharing makes everyone happy.", "It is good to ask for help.",
          "Being kind is always the right choice.", "Friends help each other.",
          "If you keep trying, you can do hard things.", "It is brave to say sorry.",
          "Listening to others is important.", "Patience brings good things."]

# ------------------------------------------------------------------- helpers


_CUM = {}


def pick(r, seq):
    """Choose from seq with Zipf weights 1/(k+1): the first items are the most
    likely, so a model's greedy path is decisive (top-1 vs top-2 probability
    about 2:1) instead of a tie between equally likely choices."""
    n = len(seq)
    cum = _CUM.get(n)
    if cum is None:
        cum, acc = [], 0.0
        for k in range(n):
            acc += 1.0 / (k + 1)
            cum.append(acc)
        _CUM[n] = cum
    return r.choices(seq, cum_weights=cum)[0]


def prange(r, a, b=None):
    """Zipf-weighted integer in [a, b) (or [0, a) like randrange)."""
    if b is None:
        a, b = 0, a
    return pick(r, range(a, b))


def a_an(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def cap(s):
    return s[0].upper() + s[1:]


def make_hero(r):
    """Return (name, subject pronoun, object pronoun, possessive, description)."""
    kind = r.random()
    if kind < 0.6:
        g = r.random() < 0.6
        name = pick(r, NAMES_GIRL if g else NAMES_BOY)
        desc = "a little " + ("girl" if g else "boy") + " named " + name
        return name, ("she" if g else "he"), ("her" if g else "him"), ("her" if g else "his"), desc
    animal, adj = pick(r, ANIMALS)
    name = pick(r, ANIMAL_NAMES)
    g = r.random() < 0.6
    desc = a_an(adj) + " " + animal + " named " + name
    return name, ("she" if g else "he"), ("her" if g else "him"), ("her" if g else "his"), desc


# --------------------------------------------------------------- domain: story


def story(r, hero=None):
    name, he, him, his, desc = hero or make_hero(r)
    fname, fhe, fhim, fhis, fdesc = make_hero(r)
    while fname == name:
        fname, fhe, fhim, fhis, fdesc = make_hero(r)
    place, place_desc = pick(r, PLACES)
    obj, oadj = pick(r, OBJECTS)
    good = pick(r, FEELINGS_GOOD)
    bad = pick(r, FEELINGS_BAD)
    s = []
    s.append(f"{pick(r, OPENINGS)}, there was {desc}. {cap(he)} lived near {place}, "
             f"a place with {place_desc}.")
    s.append(pick(r, [
        f"{name} loved to play outside every day.",
        f"{name} liked to sing songs and look at the sky.",
        f"{name} was curious and always asked questions.",
        f"Every morning, {name} went for a walk near {place}.",
    ]))
    plot = prange(r, 4)
    t = pick(r, TIMES)
    if plot == 0:  # lost object
        s.append(f"{t}, {name} found {a_an(oadj)} {obj} in {place}. {cap(he)} was very {good}.")
        s.append(f"But then the wind blew, and the {obj} was gone. {name} felt {bad}.")
        s.append(f"{cap(he)} looked under the trees and behind the rocks, but {he} could not find it.")
        s.append(f"Then {fdesc} came by. \"Why are you {bad}?\" asked {fname}.")
        s.append(f"\"I lost my {obj},\" said {name}. \"I will help you,\" said {fname}.")
        s.append(f"Together they looked and looked. At last, {fname} saw the {obj} "
                 f"{pick(r, ['in a bush', 'near the water', 'on a branch', 'under a big leaf'])}.")
        s.append(f"{name} smiled and said, \"Thank you, {fname}!\" From that day on, they were best friends.")
    elif plot == 1:  # sharing
        food = pick(r, ["apples", "cookies", "berries", "sandwiches", "cakes", "carrots"])
        n = prange(r, 2, 9)
        s.append(f"{t}, {name} had {n} {food}. {cap(he)} wanted to eat them all.")
        s.append(f"Then {fdesc} came by. {fname} saw the {food} and looked hungry, but {fhe} did not say anything.")
        s.append(f"{name} thought for a moment. Then {he} gave some {food} to {fname}.")
        s.append(f"\"You are so kind,\" said {fname}. They sat together in {place} and ate.")
        s.append(f"{name} felt {good}. The {food} tasted even better when {he} shared them.")
    elif plot == 2:  # fear overcome
        thing = pick(r, ["the dark", "the big dog", "the loud thunder", "the deep water",
                          "the tall slide", "the old bridge"])
        s.append(f"{t}, the weather was {pick(r, WEATHER)}. {name} wanted to go to {place}, "
                 f"but {he} was {pick(r, ['afraid', 'scared'])} of {thing}.")
        s.append(f"{cap(his)} mother said, \"It is okay to be scared. Take a deep breath.\"")
        s.append(f"{name} took a deep breath. {cap(he)} walked slowly, one step at a time.")
        s.append(f"Soon {he} saw that {thing} was not so bad after all. {cap(he)} even laughed.")
        s.append(f"When {he} came home, {he} told everyone what happened. {cap(he)} felt very {good}.")
    else:  # helping someone
        s.append(f"{t}, {name} heard a small cry in {place}. It was {fdesc}.")
        s.append(f"{fname} was stuck {pick(r, ['in a tree', 'behind a fence', 'in the mud', 'on a rock in the river'])}"
                 f" and could not get out.")
        s.append(f"{name} wanted to help. {cap(he)} found {a_an(oadj)} {obj} and had an idea.")
        s.append(f"{cap(he)} used the {obj} to help {fname}, and soon {fhe} was free.")
        s.append(f"\"Thank you!\" said {fname}. \"You are a true friend.\" {name} was {good}.")
    if r.random() < 0.7:
        s.append(pick(r, MORALS))
    if r.random() < 0.3:
        s.append("The end.")
    return " ".join(s)


# -------------------------------------------------------------- domain: recipe
BASES = [("pancakes", "cup", "flour", "bake"), ("soup", "cup", "broth", "simmer"),
         ("salad", "cup", "lettuce", "toss"), ("bread", "cup", "flour", "bake"),
         ("omelette", "egg", "eggs", "fry"), ("rice bowl", "cup", "rice", "cook"),
         ("pasta", "gram", "pasta", "boil"), ("muffins", "cup", "flour", "bake"),
         ("stew", "cup", "broth", "simmer"), ("smoothie", "cup", "milk", "blend")]
EXTRAS = ["carrots", "tomatoes", "onions", "spinach", "mushrooms", "potatoes", "peas",
          "cheese", "apples", "bananas", "blueberries", "garlic", "beans", "corn",
          "lentils", "pumpkin", "zucchini", "strawberries", "honey", "oats"]
SPICES = ["salt", "black pepper", "cinnamon", "basil", "thyme", "paprika", "cumin",
          "oregano", "vanilla", "ginger", "parsley", "nutmeg"]
SWEET = {"pancakes", "muffins", "smoothie"}
COUNTABLE = {"carrots", "tomatoes", "onions", "potatoes", "apples", "bananas", "mushrooms"}


def recipe_parts(r):
    base, unit, main, method = pick(r, BASES)
    extras = r.sample(EXTRAS, prange(r, 2, 5))
    spices = r.sample(SPICES, prange(r, 1, 3))
    title = f"{cap(extras[0])} {base}" if r.random() < 0.6 else f"{cap(extras[0])} and {extras[1]} {base}"
    serves = prange(r, 2, 7)
    ing = []
    if unit == "gram":
        ing.append(f"{pick(r, [200, 250, 300, 400, 500])} grams of {main}")
    elif unit == "egg":
        ing.append(f"{prange(r, 2, 5)} eggs")
    else:
        ing.append(f"{pick(r, ['1', '2', '3', '1 1/2', '2 1/2'])} cups of {main}")
    for e in extras:
        if e in COUNTABLE and r.random() < 0.5:
            ing.append(f"{prange(r, 2, 6)} {e}")
        else:
            q = pick(r, ['1', '2', '3', '1/2'])
            ing.append(f"{q} cup{'' if q in ('1', '1/2') else 's'} of {e}")
    if base in SWEET:
        ing.append(f"{pick(r, ['1', '2', '3'])} tablespoons of sugar")
    ing.append(f"{pick(r, ['1', '2'])} tablespoons of {pick(r, ['butter', 'olive oil'])}")
    for sp in spices:
        ing.append(f"{pick(r, ['1/2', '1', 'a pinch of'])}{' teaspoon of' if not sp.startswith('a') else ''} {sp}"
                   .replace("a pinch of teaspoon of", "a pinch of"))
    steps = []
    if method == "bake":
        temp = pick(r, [170, 180, 190, 200])
        steps.append(f"Heat the oven to {temp} degrees.")
        steps.append(f"Mix the {main} with the sugar and a little salt in a large bowl." if base in SWEET
                     else f"Mix the {main} with a little salt in a large bowl.")
        steps.append(f"Add the {extras[0]} to the bowl and stir gently.")
        steps.append("Stir in the butter and enough water to make a soft dough.")
        steps.append(f"Bake for {pick(r, [15, 20, 25, 30, 40])} minutes, until golden brown.")
    elif method == "simmer":
        steps.append(f"Warm the oil in a big pot and cook the {extras[0]} for {prange(r, 3, 8)} minutes.")
        steps.append(f"Add the {main} and the {extras[1]}.")
        steps.append(f"Add the {' and the '.join(spices)}, then bring it to a boil.")
        steps.append(f"Turn the heat down and simmer for {pick(r, [20, 25, 30, 45])} minutes.")
        steps.append("Taste it and add more salt if needed.")
    elif method == "toss":
        steps.append(f"Wash the {main} and tear it into small pieces.")
        steps.append(f"Slice the {extras[0]} and the {extras[1]}.")
        steps.append(f"Mix the olive oil with the {' and the '.join(spices)} to make a dressing.")
        steps.append("Toss everything together in a large bowl and serve right away.")
    elif method == "fry":
        steps.append("Beat the eggs in a bowl with a pinch of salt.")
        steps.append(f"Melt the butter in a pan and cook the {extras[0]} for {prange(r, 2, 6)} minutes.")
        steps.append("Pour in the eggs and cook on low heat until they are just set.")
        steps.append(f"Sprinkle the {spices[0]} on top, fold it in half and serve.")
    elif method == "blend":
        steps.append(f"Put the {main}, the {extras[0]} and the {extras[1]} in a blender.")
        steps.append(f"Add the {spices[0]} and blend for {prange(r, 1, 3)} minutes until smooth.")
        steps.append("Pour into glasses and serve cold.")
    else:  # boil / cook
        steps.append(f"Cook the {main} in salted water for {pick(r, [8, 10, 12, 15, 18])} minutes.")
        steps.append(f"Meanwhile, fry the {extras[0]} in the oil until soft.")
        steps.append(f"Add the {extras[1]} and the {' and the '.join(spices)}.")
        steps.append(f"Drain the {main}, mix everything together and serve warm.")
    return title, serves, ing, steps, base


def recipe(r):
    title, serves, ing, steps, _ = recipe_parts(r)
    lines = [f"Recipe: {title}", f"Serves {serves}.", "", "Ingredients:"]
    lines += [f"- {i}" for i in ing]
    lines += ["", "Steps:"]
    lines += [f"{k + 1}. {s}" for k, s in enumerate(steps)]
    lines += ["", pick(r, ["Enjoy your meal!", "Serve and enjoy.", "It is best eaten fresh.",
                            "Leftovers keep in the fridge for two days."])]
    return "\n".join(lines)


# ---------------------------------------------------------------- domain: math
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "coins",
         "flowers", "cards", "eggs", "shells", "toy cars", "balloons", "oranges"]


def math_problem(r):
    """Return (question, worked answer, final number)."""
    name = r.choice(NAMES_GIRL + NAMES_BOY)
    he = "she" if name in NAMES_GIRL else "he"
    item = r.choice(ITEMS)
    kind = r.randrange(5)
    if kind == 0:
        a, b = r.randrange(2, 60), r.randrange(2, 40)
        q = f"{name} has {a} {item}. {cap(he)} gets {b} more. How many {item} does {name} have now?"
        return q, f"{a} + {b} = {a + b}. {name} has {a + b} {item} now.", a + b
    if kind == 1:
        a = r.randrange(10, 90)
        b = r.randrange(1, a)
        q = f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?"
        return q, f"{a} - {b} = {a - b}. There are {a - b} {item} left.", a - b
    if kind == 2:
        a, b = r.randrange(2, 10), r.randrange(2, 10)
        q = f"There are {a} boxes. Each box has {b} {item}. How many {item} are there in total?"
        return q, f"{a} x {b} = {a * b}. There are {a * b} {item} in total.", a * b
    if kind == 3:
        b = r.randrange(2, 10)
        c = r.randrange(2, 10)
        a = b * c
        q = f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
        return q, f"{a} / {b} = {c}. Each friend gets {c} {item}.", c
    a, b, c = r.randrange(5, 40), r.randrange(2, 20), r.randrange(1, 10)
    q = (f"{name} has {a} {item}. {cap(he)} buys {b} more and then loses {c}. "
         f"How many {item} does {he} have?")
    return q, f"{a} + {b} = {a + b}, and {a + b} - {c} = {a + b - c}. {cap(he)} has {a + b - c} {item}.", a + b - c


def math_doc(r):
    out = []
    for k in range(r.randrange(1, 4)):
        q, ans, _ = math_problem(r)
        out.append(f"Problem: {q}\nAnswer: {ans}")
    return "\n\n".join(out)


# ---------------------------------------------------------------- domain: chat
FACTS = [
    ("What sound does a cow make?", "A cow says moo."),
    ("What sound does a dog make?", "A dog says woof."),
    ("What sound does a cat make?", "A cat says meow."),
    ("What color is the sky?", "On a clear day the sky is blue."),
    ("What color is grass?", "Grass is green."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("How many months are in a year?", "There are twelve months in a year."),
    ("What do bees make?", "Bees make honey."),
    ("Where do fish live?", "Fish live in water, in rivers, lakes and the sea."),
    ("What do plants need to grow?", "Plants need water, sunlight and good soil to grow."),
    ("What is ice?", "Ice is frozen water. Water turns into ice when it gets very cold."),
    ("Why do we sleep?", "We sleep so our body and mind can rest and grow."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What is the opposite of big?", "The opposite of big is small."),
    ("Which season is the coldest?", "Winter is the coldest season."),
    ("What does a caterpillar turn into?", "A caterpillar turns into a butterfly."),
]
# Questions the demo model cannot answer: it learns to say so politely.
OUT_OF_DOMAIN = ["What is the capital of France?", "Who won the football match yesterday?",
                 "Can you write a computer program?", "What is the weather like today?",
                 "Translate this sentence into German.", "What is the meaning of life?",
                 "How far away is the moon?", "Who invented the telephone?",
                 "What is the square root of 2?", "Can you help me with my taxes?",
                 "What time is it?", "Tell me about quantum physics.", "What is the best phone to buy?",
                 "Who wrote Hamlet?", "How do airplanes fly?", "What is the price of gold?"]
OOD_ANSWER = ("I am sorry, I do not know about that. I am a small demo model: I can tell short stories, "
              "share simple recipes, solve easy arithmetic problems and answer simple questions.")
GREETINGS = ["Hello!", "Hi!", "Hi there.", "Good morning!", "Hello, who are you?", "Hey!"]
SELF_INTRO = ("Hello! I am a small demo model made by the cmf project. I can tell short stories, "
              "share simple recipes, solve easy arithmetic problems and answer simple questions.")


def chat_turn(r):
    """Return one (user, assistant) pair."""
    k = r.randrange(8)
    if k == 0:
        hero = make_hero(r)
        about = hero[4].split(" named ")[0]  # "a little girl", "a red fox"
        if r.random() < 0.3:
            about = "a " + about.split(" ")[-1]  # "a girl", "a fox"
        u = pick(r, [f"Tell me a story about {about}.", f"Can you tell me a short story about {about}?",
                     f"Write a story about {about}, please."])
        return u, "Sure! Here is a story.\n\n" + story(r, hero)
    if k == 1:
        title, serves, ing, steps, base = recipe_parts(r)
        dish = title.lower() if r.random() < 0.6 else base  # "carrots soup" or just "soup"
        u = r.choice([f"How do I make {dish}?", f"Give me a recipe for {dish}.",
                      f"Can you share a recipe for {dish}?"])
        a = (f"Here is a simple recipe for {title.lower()}. It serves {serves}.\n\nIngredients:\n"
             + "\n".join(f"- {i}" for i in ing) + "\n\nSteps:\n"
             + "\n".join(f"{j + 1}. {s}" for j, s in enumerate(steps)))
        return u, a
    if k == 2:
        q, ans, _ = math_problem(r)
        return q, ans
    if k == 3:
        a, b = r.randrange(1, 100), r.randrange(1, 100)
        op = r.randrange(3)
        if op == 0:
            return r.choice([f"What is {a} plus {b}?", f"What is {a} + {b}?"]), f"{a} + {b} = {a + b}."
        if op == 1:
            a, b = max(a, b), min(a, b)
            return r.choice([f"What is {a} minus {b}?", f"What is {a} - {b}?"]), f"{a} - {b} = {a - b}."
        a, b = a % 13, b % 13
        return r.choice([f"What is {a} times {b}?", f"What is {a} x {b}?"]), f"{a} x {b} = {a * b}."
    if k == 4:
        q, a = r.choice(FACTS)
        return q, a
    if k == 5:
        return r.choice(GREETINGS), SELF_INTRO
    if k == 7:
        return r.choice(OUT_OF_DOMAIN), OOD_ANSWER
    return (r.choice(["What can you do?", "What are you?", "Who made you?", "What is your name?"]),
            pick(r, [SELF_INTRO, "I am the cmf demo model, a small language model trained on stories, "
                      "recipes and arithmetic problems."]))


def chat(r):
    out = []
    if r.random() < 0.3:
        out.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    for _ in range(1 if r.random() < 0.6 else r.randrange(2, 4)):
        u, a = chat_turn(r)
        out.append(f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n")
    return "".join(out)


# ---------------------------------------------------------------- driver
# mixture weights: story, recipe, math, chat
MIX = [(story, 0.40), (recipe, 0.20), (math_doc, 0.15), (chat, 0.25)]
MIX_HELDOUT = [(story, 0.55), (recipe, 0.25), (math_doc, 0.20)]


def doc(r, mix):
    x = r.random()
    for fn, w in mix:
        if x < w:
            return fn(r)
        x -= w
    return mix[-1][0](r)


def shard(args):
    seed, idx, nbytes = args
    r = random.Random(seed * 1000003 + idx)
    parts, n = [], 0
    while n < nbytes:
        d = doc(r, MIX) + EOT + "\n"
        parts.append(d)
        n += len(d)
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mb", type=float, default=40.0, help="training corpus size in MB")
    ap.add_argument("--shards", type=int, default=16, help="independent generator shards (parallel)")
    ap.add_argument("--heldout", type=int, default=0, help="write a held-out slice of this many bytes instead")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = a.out + ".tmp"
    if a.heldout:
        r = random.Random(a.seed)
        parts, n = [], 0
        while True:
            d = doc(r, MIX_HELDOUT) + "\n\n"
            if n + len(d) > a.heldout:
                break
            parts.append(d)
            n += len(d)
        text = "".join(parts).rstrip("\n") + "\n"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        per = int(a.mb * 1e6 / a.shards)
        jobs = [(a.seed, i, per) for i in range(a.shards)]
        with multiprocessing.Pool(min(a.shards, os.cpu_count() or 1)) as p, open(tmp, "w", encoding="utf-8") as f:
            for text in p.imap(shard, jobs):  # imap keeps shard order: deterministic output
                f.write(text)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
