#!/usr/bin/env python3
"""Builds the instruction prompt set for self-distilling speculation heads
(`spec_train_common.py gen-data --prompt-set instructions --prompts FILE`): single-turn user
instructions, self-instruct style, from seed material (scripts/instruction_material.py) x task
types x wordings x formats and lengths. Deterministic for a seed.

Task types (category in the output): translation, summarization, qa (closed book),
reading_comprehension (questions over a given passage), rag (a question plus retrieved passages,
some of which do not hold the answer), math (word problems and equations), coding, rewriting,
classification_extraction, creative, open_chat. Passages are rendered from fictional fact records
(towns, companies, people, studies, news events, product reviews, species, meeting notes,
recipes, historical events), so every comprehension and retrieval question is about facts that
are in the prompt.

Two files, one JSON object per line in MT-bench's schema
({"question_id", "category", "subtype", "turns": [text]}), so render_chat_prompts.py renders
either for `arbor spec-bench`:
- --out: the training set (default 12,000 prompts);
- --outside-out: a small evaluation set (default 64 prompts, every category) built only from
  material reserved for it (every 8th entry of the topic, name, sentence, code and wording lists),
  so it shares no entity, topic, sentence or wording variant with the training set; exact
  duplicates of training prompts are also excluded (asserted).
Neither may contain an MT-bench prompt (../shared/data/prompts/mt_bench.jsonl, both turns): an
exact match after normalisation, or a near duplicate (word 3-gram containment of the MT-bench
turn >= 0.5, or content-word Jaccard >= 0.5) stops the build.

  python3 scripts/make_instruction_prompts.py --out .stage/heads/instructions.jsonl \\
      --outside-out .stage/heads/outside.jsonl
"""
import argparse
import collections
import hashlib
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instruction_material as M  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTSIDE_EVERY, OUTSIDE_AT = 8, 5

# Share of the training set per category (normalised).
WEIGHTS = {
    "translation": 7, "summarization": 10, "qa": 8, "reading_comprehension": 10, "rag": 9,
    "math": 9, "coding": 11, "rewriting": 8, "classification_extraction": 8, "creative": 9,
    "open_chat": 11,
}


def split_pool(items, outside):
    """The training part (outside=False) or the reserved part of a list; lists shorter than
    OUTSIDE_EVERY are shared by both sets."""
    items = list(items)
    if len(items) < OUTSIDE_EVERY:
        return items
    return [x for i, x in enumerate(items) if (i % OUTSIDE_EVERY == OUTSIDE_AT) == outside]


class Pools:
    """The material one set may use: every list split by split_pool."""

    def __init__(self, outside):
        self.outside = outside
        self._cache = {}

    def __call__(self, items):
        key = id(items)
        if key not in self._cache:
            self._cache[key] = (items, split_pool(items, self.outside))
        return self._cache[key][1]


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------
def cap(s):
    return s[:1].upper() + s[1:]


def num(n):
    return f"{n:,}"


def pick(r, P, items):
    return r.choice(P(items))


def person(r, P):
    return f"{pick(r, P, M.FIRST_NAMES)} {pick(r, P, M.LAST_NAMES)}"


def town(r, P):
    return cap(pick(r, P, M.SYLLABLES_A) + pick(r, P, M.SYLLABLES_B))


def company(r, P):
    suffix = r.choice(M.COMPANY_SUFFIXES)
    return f"{pick(r, P, M.COMPANY_PREFIXES)} {suffix}", M.COMPANY_PRODUCTS[suffix]


def species_name(r, P):
    genus = cap(pick(r, P, M.SYLLABLES_A) + r.choice(["ia", "us", "ops", "ella", "odon"]))
    return f"{genus} {pick(r, P, M.SYLLABLES_A)}{r.choice(['ensis', 'ica', 'ii', 'ata'])}"


def fmt(r, P, frames, **kw):
    return pick(r, P, frames).format(**kw)


def join_text(r, instruction, text, label_choices=("Text", "Passage", "Article", "Document")):
    """The instruction before or after the text, with one of several separators."""
    label = r.choice(label_choices)
    style = r.randrange(5)
    if style == 0:
        return f"{instruction}\n\n{text}"
    if style == 1:
        return f"{instruction}\n\n{label}:\n{text}"
    if style == 2:
        return f'{instruction}\n\n"""\n{text}\n"""'
    if style == 3:
        return f"{label}:\n{text}\n\n{instruction}"
    return f"{text}\n\n{instruction}"


# ---------------------------------------------------------------------------------------------
# Passages: fictional fact records rendered as text, with questions answerable from them
# ---------------------------------------------------------------------------------------------
class Passage:
    def __init__(self, kind, title, first, sentences, qa, r, keep=None):
        """first: the opening sentence; sentences: the others (a random subset, shuffled);
        qa: (question, answer) pairs; only pairs whose answer is in the kept text are kept."""
        body = list(sentences)
        r.shuffle(body)
        if keep is not None:
            body = body[:keep]
        self.kind, self.title = kind, title
        self.sentences = [first] + body
        self.text = " ".join(self.sentences)
        self.all_qa = list(qa)  # by slot, for distractors taken from other records of a kind
        self.qa = [(q, a) for q, a in qa if str(a) in self.text]

    def short(self, n):
        return " ".join(self.sentences[:n])


def passage_town(r, P):
    name, region = town(r, P), r.choice(M.REGIONS)
    founded, pop = r.randint(1150, 1950), r.randint(12, 4800) * 100
    river = town(r, P) + " River"
    industry = r.choice(["fishing", "tourism", "wine making", "textile mills", "software startups",
                         "cheese production", "shipbuilding", "timber", "glassblowing", "solar farms"])
    landmark = r.choice(["a stone bridge with seven arches", "a clock tower that still runs by hand",
                         "a glass-roofed market hall", "a lighthouse painted in red stripes",
                         "an old salt warehouse turned into a museum", "a botanical garden"])
    festival = r.choice(["a lantern festival", "a cheese fair", "a kite festival", "a folk music week",
                         "a boat race", "an apple harvest fair"])
    month, visitors = r.choice(M.MONTHS), r.randint(2, 90) * 1000
    mayor, elected = person(r, P), r.randint(2008, 2023)
    first = r.choice([f"{name} is a town in {region}, founded in {founded}.",
                      f"Founded in {founded}, {name} lies in {region}."])
    s = [f"It has a population of about {num(pop)}.",
         f"The town grew up along the {river}, which once carried most of its trade.",
         f"Its economy depends mainly on {industry}.",
         f"Visitors often come to see {landmark}.",
         f"Every {month}, {name} hosts {festival} that draws about {num(visitors)} visitors.",
         f"The current mayor, {mayor}, was elected in {elected}."]
    qa = [(f"When was {name} founded?", founded), (f"How many people live in {name}?", num(pop)),
          (f"Which river does {name} lie on?", river),
          (f"What does the economy of {name} mainly depend on?", industry),
          (f"Who is the mayor of {name}?", mayor), (f"In which month is {festival} held in {name}?", month),
          (f"How many visitors does the festival in {name} attract?", num(visitors))]
    return Passage("town", f"{name} ({region})", first, s, qa, r)


def passage_company(r, P):
    name, product = company(r, P)
    founded, founder, hq = r.randint(1985, 2021), person(r, P), town(r, P)
    staff, revenue = r.randint(12, 9000), r.randint(2, 900)
    site, site_year = town(r, P), r.randint(2015, 2025)
    first = r.choice([f"{name} is a company that makes {product}.",
                      f"{name}, based in {hq}, is best known for its {product}."])
    s = [f"It was founded in {founded} by {founder}.",
         f"The company has its headquarters in {hq} and employs about {num(staff)} people.",
         f"Last year it reported revenue of {revenue} million dollars.",
         f"In {site_year} it opened a second site in {site}.",
         f"{founder.split()[0]} started the business after "
         + r.choice(["losing a job at a larger firm", "a year spent travelling",
                     "finishing a degree in engineering", "a failed first startup"]) + ".",
         "Critics say " + r.choice(["its prices are too high", "it grew too fast",
                                    "its products are hard to repair", "it relies on a single supplier"]) + "."]
    qa = [(f"Who founded {name}?", founder), (f"When was {name} founded?", founded),
          (f"How many people does {name} employ?", num(staff)),
          (f"What does {name} make?", product), (f"Where did {name} open its second site?", site),
          (f"What was the revenue of {name} last year?", f"{revenue} million")]
    return Passage("company", name, first, s, qa, r)


def passage_person(r, P):
    name, born, place = person(r, P), r.randint(1890, 1995), town(r, P)
    job = r.choice(M.PROFESSIONS)
    work = r.choice([f"designing the concert hall of {town(r, P)}", "a long study of coral reefs",
                     f"a trilogy of novels set in {town(r, P)}", "a new method for cleaning river water",
                     "photographs of disappearing glaciers", "a children's hospital program"])
    prize, prize_year = f"{pick(r, P, M.COMPANY_PREFIXES)} Prize", born + r.randint(30, 60)
    mentor = person(r, P)
    first = f"{name} (born {born} in {place}) is {'an' if job[0] in 'aeiou' else 'a'} {job}."
    s = [f"{name.split()[0]} is best known for {work}.",
         f"In {prize_year}, {name.split()[0]} received the {prize}.",
         f"Early in life, {name.split()[0]} trained under {mentor}.",
         f"{name.split()[0]} has said that " + r.choice(["curiosity matters more than talent",
                                                         "every project starts with a walk",
                                                         "failure is the best teacher",
                                                         "good work takes patience"]) + ".",
         r.choice(["Today", "These days"]) + f" {name.split()[0]} lives in {town(r, P)} and teaches part-time."]
    qa = [(f"Where was {name} born?", place), (f"What is {name}'s profession?", job),
          (f"When did {name} receive the {prize}?", prize_year),
          (f"Who was {name}'s mentor?", mentor), (f"What is {name} best known for?", work),
          (f"In what year was {name} born?", born)]
    return Passage("person", name, first, s, qa, r)


def passage_study(r, P):
    inst, lead = f"the University of {town(r, P)}", person(r, P)
    n, weeks = r.randint(40, 3200), r.randint(4, 52)
    intervention, outcome = r.choice(M.STUDY_INTERVENTIONS)
    pct, direction = r.randint(4, 38), r.choice(["improved", "reduced", "lowered", "raised"])
    journal = r.choice(["the Journal of Applied Health", "Environmental Letters",
                        "the Review of Education Research", "Public Health Reports"])
    limit = r.choice(["all participants came from a single city", "the results were self-reported",
                      "there was no long-term follow-up", "the sample was mostly university students"])
    first = f"A study led by {lead} at {inst} looked at the effect of {intervention} on {outcome}."
    s = [f"The researchers followed {num(n)} participants for {weeks} weeks.",
         f"They found that the intervention {direction} {outcome} by {pct} percent on average.",
         f"The results were published in {journal}.",
         f"The authors note that {limit}.",
         f"{lead.split()[1]} said the team plans a larger follow-up study."]
    qa = [(f"Who led the study on {intervention}?", lead), ("How many participants took part?", num(n)),
          ("How long did the study last?", f"{weeks} weeks"),
          (f"By how much did {outcome} change?", f"{pct} percent"),
          ("Where were the results published?", journal), ("What limitation do the authors mention?", limit)]
    return Passage("study", f"Study: {intervention} and {outcome}", first, s, qa, r)


def passage_news(r, P):
    place, event = town(r, P), r.choice(M.NEWS_EVENTS)
    day, month = r.randint(1, 28), r.choice(M.MONTHS)
    official, people_n, cost = person(r, P), r.randint(3, 400) * 100, r.randint(2, 250)
    first = f"{place}, {month} {day}: " + {
        "bridge opening": f"A new bridge across the harbour of {place} opened to traffic on {r.choice(M.WEEKDAYS)}.",
        "flood": f"Heavy rain flooded the lower streets of {place} overnight.",
        "music festival": f"The annual music festival in {place} opened with a record crowd.",
        "local election": f"Voters in {place} chose a new town council on {r.choice(M.WEEKDAYS)}.",
        "product launch": f"A local firm in {place} launched its first electric delivery van.",
        "marathon": f"More runners than ever took part in the {place} marathon.",
        "library reopening": f"The central library of {place} reopened after two years of repairs.",
        "factory closure": f"The largest factory in {place} announced it will close next year.",
        "heat wave": f"Temperatures in {place} reached a record high for the month.",
        "science fair": f"Students from across the region presented projects at the {place} science fair.",
        "train strike": f"A train strike left commuters in {place} without service.",
        "new hospital wing": f"A new children's wing opened at the hospital in {place}.",
    }[event]
    s = [f"About {num(people_n)} people were affected or took part, according to local officials.",
         f"The project or response cost roughly {cost} million dollars.",
         f'"{r.choice(["This is an important day for our town", "We were prepared, but not for this much", "We learned a lot and will do better next time", "I want to thank every volunteer"])}," said {official}, a spokesperson for the town.',
         f"A follow-up meeting is planned for {r.choice(M.MONTHS)}.",
         r.choice(["Residents have mixed feelings.", "Local businesses expect more customers.",
                   "Some critics call the plan rushed.", "Schools will stay open as usual."])]
    qa = [(f"When did the {event} in {place} happen?", f"{month} {day}"),
          (f"How many people were affected by or took part in the {event} in {place}?", num(people_n)),
          (f"Who spoke for the town of {place}?", official),
          (f"How much did the {event} response or project cost?", f"{cost} million")]
    return Passage("news", f"{cap(event)} in {place}", first, s, qa, r)


PRODUCT_TYPES = ["robot vacuum", "coffee grinder", "pair of hiking boots", "e-reader", "standing desk",
                 "air fryer", "bike light", "wireless keyboard", "rice cooker", "travel backpack",
                 "smartwatch", "desk lamp", "blender", "rain jacket", "portable speaker", "tent"]


def passage_review(r, P, sentiment=None):
    sentiment = sentiment or r.choice(["positive", "negative", "mixed"])
    brand = pick(r, P, M.COMPANY_PREFIXES)
    product, price = r.choice(PRODUCT_TYPES), r.randint(15, 600)
    weeks, reviewer = r.randint(1, 40), person(r, P)
    good = r.sample(M.REVIEW_POSITIVE, 2)
    bad = r.sample(M.REVIEW_NEGATIVE, 2)
    if sentiment == "positive":
        pts, stars = good + [r.choice(M.REVIEW_POSITIVE)], r.choice([4, 5])
    elif sentiment == "negative":
        pts, stars = bad + [r.choice(M.REVIEW_NEGATIVE)], r.choice([1, 2])
    else:
        pts, stars = [good[0], bad[0], good[1]], 3
    first = f"I bought the {brand} {product} for {price} dollars and have used it for {weeks} weeks."
    s = [f"Honestly, {pts[0]}.", f"Also, {pts[1]}.", f"On top of that, {pts[2]}.",
         f"I would give it {stars} out of 5 stars. - {reviewer}"]
    qa = [(f"How much did the {brand} {product} cost?", f"{price} dollars"),
          ("How long has the reviewer used the product?", f"{weeks} weeks"),
          ("How many stars does the reviewer give?", f"{stars} out of 5")]
    p = Passage("review", f"Review: {brand} {product}", first, s, qa, r)
    p.sentences = [first] + s  # keep the order: the rating closes the review
    p.text = " ".join(p.sentences)
    p.sentiment = sentiment
    return p


def passage_species(r, P):
    name = species_name(r, P)
    kind, habitat, diet = r.choice(M.SPECIES_KINDS)
    size, life = r.randint(2, 60), r.randint(2, 30)
    found, finder = r.randint(1820, 2022), person(r, P)
    trend = r.choice(["declining", "stable", "slowly increasing"])
    threat = r.choice(["habitat loss", "a fungal disease", "invasive predators", "pesticide use",
                       "warmer summers"])
    first = f"{name} is a species of {kind} found in the {habitat} of {r.choice(M.REGIONS)}."
    s = [f"Adults grow to about {size} centimeters.",
         (f"It feeds mainly on {diet}." if diet else "It is pollinated by a single kind of moth."),
         f"Individuals can live for up to {life} years.",
         f"The species was first described in {found} by {finder}.",
         f"Its population is {trend}, and the main threat is {threat}."]
    qa = [(f"Where is {name} found?", habitat), (f"How large does {name} grow?", f"{size} centimeters"),
          (f"Who first described {name}?", finder), (f"When was {name} first described?", found),
          (f"What is the main threat to {name}?", threat), (f"How long can {name} live?", f"{life} years")]
    return Passage("species", name, first, s, qa, r)


def passage_meeting(r, P):
    team = r.choice(["marketing team", "product team", "school board", "volunteer committee",
                     "garden club", "support team", "research group", "event planning group"])
    day, month = r.randint(1, 28), r.choice(M.MONTHS)
    people = [person(r, P) for _ in range(r.randint(3, 5))]
    budget = r.randint(5, 120) * 100
    decisions = r.sample([f"the budget for the spring event is set at {num(budget)} dollars",
                          "the newsletter will go out every two weeks instead of weekly",
                          f"the next meeting moves to {r.choice(M.WEEKDAYS)}",
                          "a shared calendar replaces the old email reminders",
                          "two new volunteers will join in the summer",
                          "the website redesign is postponed until autumn"], 3)
    owners = r.sample(people, 2)
    tasks = [f"{owners[0]} will draft the plan by {r.choice(M.WEEKDAYS)}",
             f"{owners[1]} will contact the venue and report back"]
    first = f"Notes from the {team} meeting on {month} {day}. Present: {', '.join(people)}."
    s = [f"Decision: {cap(d)}." for d in decisions] + [f"Action: {cap(t)}." for t in tasks]
    qa = [("Who attended the meeting?", people[0]), ("Who will draft the plan?", owners[0]),
          ("When did the meeting take place?", f"{month} {day}"),
          ("What is the budget for the spring event?", f"{num(budget)} dollars")]
    p = Passage("meeting", f"{cap(team)} notes, {month} {day}", first, s, qa, r)
    return p


def passage_recipe(r, P):
    main = r.choice(M.INGREDIENTS)
    dish = f"{main} {r.choice(M.DISHES)}"
    ings = [main] + r.sample([i for i in M.INGREDIENTS if i != main], r.randint(4, 7))
    minutes, serves = r.randint(15, 90), r.randint(2, 8)
    first = f"This {dish} serves {serves} and takes about {minutes} minutes."
    s = [f"You will need {', '.join(ings[:-1])} and {ings[-1]}.",
         f"Start by chopping the {ings[1]} and warming a little oil in a large pan.",
         f"Add the {main} and cook for {r.randint(3, 15)} minutes, stirring often.",
         f"Stir in the {ings[2]} and season to taste.",
         f"Let it rest for {r.randint(2, 10)} minutes before serving."]
    qa = [(f"How many people does the {dish} serve?", str(serves)),
          (f"How long does the {dish} take?", f"{minutes} minutes"),
          (f"What is the main ingredient of the {dish}?", main)]
    p = Passage("recipe", cap(dish), first, s, qa, r)
    p.sentences = [first] + s  # steps in order
    p.text = " ".join(p.sentences)
    return p


def passage_history(r, P):
    kind, year = r.choice(M.HISTORY_KINDS), r.randint(1400, 1920)
    place, leader, other = town(r, P), person(r, P), person(r, P)
    years = r.randint(2, 30)
    first = {"treaty": f"The Treaty of {place} was signed in {year}.",
             "expedition": f"In {year}, an expedition led by {leader} set out from {place}.",
             "canal construction": f"Work on the {place} canal began in {year}.",
             "trade fair": f"The first {place} trade fair was held in {year}.",
             "uprising": f"In {year}, the people of {place} rose against heavy new taxes.",
             "university founding": f"The University of {place} was founded in {year}."}[kind]
    s = [f"The key figure was {leader}, supported by {other}.",
         f"The effort took {years} years to complete or settle.",
         r.choice(["It changed trade in the region for a century.",
                   "Historians still debate its causes.",
                   "Most of the original records were lost in a fire.",
                   "It is remembered each year with a public holiday."]),
         f"{other.split()[1]} later wrote a memoir about those years."]
    qa = [(f"When did the {kind} of {place} begin?", year),
          (f"Who was the key figure in the {kind} of {place}?", leader),
          (f"How many years did it take?", f"{years} years")]
    return Passage("history", f"{cap(kind)} of {place}", first, s, qa, r)


PASSAGES = [passage_town, passage_company, passage_person, passage_study, passage_news,
            passage_review, passage_species, passage_meeting, passage_recipe, passage_history]


PASSAGE_BY_KIND = {f.__name__[len("passage_"):]: f for f in PASSAGES}


def random_passage(r, P):
    return r.choice(PASSAGES)(r, P)


# ---------------------------------------------------------------------------------------------
# Format and length requests appended to some prompts
# ---------------------------------------------------------------------------------------------
FORMATS = ["", "", "", "", "Keep it short.", "Be concise.", "Answer in one sentence.",
           "Use bullet points.", "Format the answer as a numbered list.", "Explain your reasoning.",
           "Keep it under 100 words.", "Write about 200 words.", "Use simple language.",
           "Give a detailed answer.", "Answer in two or three sentences.", "Use a table if it helps.",
           "End with a one-line summary.", "Write it for a beginner.", "Include an example."]


def with_format(r, P, text, p=0.5):
    f = pick(r, P, FORMATS) if r.random() < p else ""
    return f"{text} {f}".strip()


# ---------------------------------------------------------------------------------------------
# Task generators: (random, pools) -> (subtype, prompt text)
# ---------------------------------------------------------------------------------------------
TR_TO = ["Translate into {lang}: {text}", "Translate the following sentence into {lang}.\n\n{text}",
         "How would you say this in {lang}? \"{text}\"", "Please translate to {lang}:\n{text}",
         "Can you translate \"{text}\" into {lang}?", "{text}\n\nTranslate the sentence above into {lang}.",
         "Give me the {lang} translation of: {text}", "I need this in {lang}, please: {text}",
         "Translate this to {lang} and keep the tone natural: {text}",
         "What is the {lang} for \"{text}\"?",
         "Translate from English to {lang}. Then explain one word choice you made.\n\n{text}",
         "Render this sentence in {lang}, formal register: {text}"]
TR_FROM = ["Translate this {src} sentence into English: {text}", "What does \"{text}\" mean in English?",
           "Translate from {src} to English:\n{text}", "{text}\n\nWhat does this mean? Translate it to English.",
           "Can you help me understand this {src} sentence? {text}",
           "Please give an English translation and a word-by-word gloss: {text}",
           "My friend sent me this in {src}: \"{text}\" What does it say?",
           "Translate into English and say whether it sounds formal or informal: {text}",
           "I found this sentence in a {src} textbook: {text}\nTranslate it, please."]


def task_translation(r, P):
    kind = r.random()
    if kind < 0.55:
        lang = r.choice(M.LANGUAGES)
        if r.random() < 0.8:
            text = pick(r, P, M.EN_SENTENCES)
        else:
            text = " ".join(r.sample(P(M.EN_SENTENCES), r.randint(2, 3)))
        return "en_to_x", fmt(r, P, TR_TO, lang=lang, text=text)
    src = r.choice(sorted(M.FOREIGN_SENTENCES))
    text = pick(r, P, M.FOREIGN_SENTENCES[src])
    if kind < 0.9:
        return "x_to_en", fmt(r, P, TR_FROM, src=src, text=text)
    lang = r.choice([l for l in M.LANGUAGES if l != src])
    return "x_to_y", f"Translate this {src} sentence into {lang}: {text}"


SUM_FRAMES = ["Summarize the following text.", "Summarize this in one sentence.",
              "Write a two-sentence summary of the passage below.", "Give me a TL;DR of this.",
              "Summarize the key points as three bullet points.", "Write a headline for this article.",
              "Explain what this text is about to a ten-year-old.", "What are the main takeaways here?",
              "Condense this into a short paragraph of no more than 50 words.",
              "Write a short abstract for the following.", "Summarize the text below for a busy manager.",
              "Pull out the three most important facts from this text.",
              "Can you sum this up for me quickly?", "Rewrite this as a one-line summary for a newsletter.",
              "Summarize, then list one question a reader might still have.",
              "Briefly summarize the following passage in your own words.",
              "Give a summary in exactly three sentences.", "What is the gist of this?",
              "Summarize this for a social media post under 280 characters.",
              "Create a short summary followed by a list of keywords."]


def task_summarization(r, P):
    p = random_passage(r, P)
    return p.kind, join_text(r, pick(r, P, SUM_FRAMES), p.text)


QA_FRAMES = {
    "capital": ["What is the capital of {x}?", "Which city is the capital of {x}?",
                "Tell me the capital of {x} and one thing it is known for."],
    "author": ["Who wrote {x}?", "Who is the author of {x}, and what is it about?",
               "Tell me about the book {x}. Who wrote it?"],
    "person": ["Who was {x}?", "Why is {x} famous?", "Give a short biography of {x}.",
               "What were the main achievements of {x}?", "Tell me three interesting facts about {x}."],
    "why": ["What is the reason for {x}?", "What causes {x}?", "Can you explain {x}?",
            "What is the science behind {x}?", "Explain {x} in simple terms."],
    "how": ["How does {x} work?", "Explain how {x} works.", "What is the basic principle behind {x}?",
            "How does {x} work? Explain it like I'm five.", "Describe step by step how {x} works."],
    "term": ["What is {x}?", "Define {x}.", "What does {x} mean?", "Can you explain what {x} is?",
             "Give a simple definition of {x} and an example."],
    "compare": ["What is the difference between {a} and {b}?", "Compare {a} and {b}.",
                "How is {a} different from {b}?", "{A} vs {b}: what are the key differences?",
                "Can you explain the difference between {a} and {b} with an example?"],
    "units": ["How many {u1} are in a {u2}?", "Convert {n} {u2}s to {u1}.",
              "What is {n} {u2}s in {u1}?"],
}
UNITS = [("centimeters", "meter"), ("ounces", "pound"), ("minutes", "day"), ("grams", "kilogram"),
         ("feet", "mile"), ("milliliters", "liter"), ("seconds", "hour"), ("inches", "foot"),
         ("meters", "kilometer"), ("cups", "gallon")]


def task_qa(r, P):
    sub = r.choice(list(QA_FRAMES))
    if sub == "capital":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.COUNTRIES))
    elif sub == "author":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.BOOKS)[0])
    elif sub == "person":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.PEOPLE))
    elif sub == "why":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.PHENOMENA))
    elif sub == "how":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.DEVICES))
    elif sub == "term":
        q = fmt(r, P, QA_FRAMES[sub], x=pick(r, P, M.TERMS))
    elif sub == "compare":
        a, b = pick(r, P, M.CONCEPT_PAIRS)
        q = fmt(r, P, QA_FRAMES[sub], a=a, b=b, A=cap(a))
    else:
        u1, u2 = r.choice(UNITS)
        q = fmt(r, P, QA_FRAMES[sub], u1=u1, u2=u2, n=r.randint(2, 250))
    return sub, with_format(r, P, q, 0.35)


RC_FRAMES = ["Read the passage and answer the question.", "Answer the question using the text below.",
             "Based only on the passage, answer: {q}", "Use the following text to answer the question.",
             "According to the passage, {ql}", "Read this and then answer the questions that follow.",
             "Answer briefly, using only information from the passage.",
             "Answer the question and quote the sentence that supports your answer."]


def task_reading(r, P):
    p = random_passage(r, P)
    while not p.qa:
        p = random_passage(r, P)
    style = r.random()
    if style < 0.6:
        q, _ = r.choice(p.qa)
        frame = pick(r, P, RC_FRAMES)
        ins = frame.format(q=q, ql=q[:1].lower() + q[1:])
        if "{q" not in frame:
            ins = f"{ins}\n\nQuestion: {q}"
        return "single", join_text(r, ins, p.text, ("Passage", "Text", "Context"))
    if style < 0.8:
        qs = r.sample(p.qa, min(len(p.qa), r.randint(2, 3)))
        lines = "\n".join(f"{i + 1}. {q}" for i, (q, _) in enumerate(qs))
        return "multi", f"Passage:\n{p.text}\n\nAnswer the following questions:\n{lines}"
    q, a = r.choice(p.qa)
    # Wrong answers: the answers to the same question about other records of the same kind.
    k = [i for i, (q2, _) in enumerate(p.all_qa) if q2 == q][0]
    wrong = []
    for _ in range(6):
        x = str(PASSAGE_BY_KIND[p.kind](r, P).all_qa[k][1])
        if x != str(a):
            wrong.append(x)
    wrong = list(dict.fromkeys(wrong))
    if style < 0.9 and len(wrong) >= 2:
        opts = [str(a)] + wrong[:3]
        r.shuffle(opts)
        letters = "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(opts))
        return "multiple_choice", (f"{p.text}\n\n{q}\n{letters}\n\n"
                                   + r.choice(["Choose the correct option.", "Answer with the letter.",
                                               "Which option is right? Explain briefly."]))
    claim = a if not wrong or r.random() < 0.5 else wrong[0]
    return "true_false", (f"Text: {p.text}\n\nIs the following statement true or false according to "
                          f"the text? \"The answer to '{q}' is {claim}.\" Explain.")


RAG_FRAMES = [
    "Answer the question using only the search results below. Cite the result numbers you used, like [2].",
    "You are a helpful assistant. Use the retrieved documents to answer the user's question. If the documents do not contain the answer, say that you don't know.",
    "Here are some documents retrieved for a question. Read them and answer the question at the end.",
    "Context information is below. Given the context and no prior knowledge, answer the query.",
    "Using the passages provided, write a short answer with citations.",
    "Answer based on these sources. Ignore sources that are not relevant.",
    "The following snippets were found by a search engine. Answer the question and name the source you relied on.",
    "Use the knowledge base articles below to answer the customer's question.",
]


def task_rag(r, P):
    target = random_passage(r, P)
    while not target.qa:
        target = random_passage(r, P)
    q, _ = r.choice(target.qa)
    unanswerable = r.random() < 0.12
    k = r.randint(3, 5)
    docs = [] if unanswerable else [target]
    while len(docs) < k:
        d = random_passage(r, P)
        if d.title != target.title:
            docs.append(d)
    r.shuffle(docs)
    style = r.randrange(3)
    blocks = []
    for i, d in enumerate(docs):
        body = d.short(r.randint(3, 5)) if d is not target else d.text
        if style == 0:
            blocks.append(f"[{i + 1}] {d.title}\n{body}")
        elif style == 1:
            blocks.append(f"Document {i + 1} (title: {d.title}):\n{body}")
        else:
            blocks.append(f"Source {i + 1}: {body}")
    ctx = "\n\n".join(blocks)
    ins = pick(r, P, RAG_FRAMES)
    if r.random() < 0.5:
        text = f"{ins}\n\n{ctx}\n\nQuestion: {q}"
    else:
        text = f"Question: {q}\n\n{ins}\n\n{ctx}"
    return ("unanswerable" if unanswerable else "answerable"), text


MATH_TEMPLATES = list(range(22))
MATH_TAILS = ["", "", "Solve it step by step.", "Show your work.", "Just give the final answer.",
              "Explain each step.", "Think it through before answering.",
              "Give the answer and a one-line check."]


def task_math(r, P):
    n1, n2, n3 = r.randint(2, 40), r.randint(2, 25), r.randint(2, 12)
    name, other = pick(r, P, M.FIRST_NAMES), pick(r, P, M.FIRST_NAMES)
    price = r.randint(2, 60) + r.choice([0, 0.25, 0.5, 0.75, 0.99])
    t = pick(r, P, MATH_TEMPLATES)
    if t == 0:
        q = f"{name} buys {n1} notebooks at ${price:.2f} each and pays with a ${(int(n1 * price) // 50 + 1) * 50} bill. How much change does {name} get?"
    elif t == 1:
        q = f"A train travels {n1 * 10} kilometers in {n3} hours. What is its average speed in km/h?"
    elif t == 2:
        q = f"A jacket costs ${n1 * 5}. It is on sale for {r.choice([10, 15, 20, 25, 30, 40])}% off. What is the sale price?"
    elif t == 3:
        q = f"{name} is {n2} years old. {other} is {n3} years older than twice {name}'s age. How old is {other}?"
    elif t == 4:
        q = f"A rectangle is {n1} cm long and {n2} cm wide. What are its area and perimeter?"
    elif t == 5:
        q = f"Solve for x: {n3}x + {n1} = {n3 * n2 + n1}."
    elif t == 6:
        q = f"One worker can paint a fence in {n3} hours, another in {n3 + r.randint(1, 6)} hours. How long does it take them together?"
    elif t == 7:
        q = f"The test scores of a class are {', '.join(str(r.randint(55, 100)) for _ in range(r.randint(4, 7)))}. What are the mean and the median?"
    elif t == 8:
        q = f"A recipe needs {n3} cups of flour for {n2} cookies. How much flour is needed for {n2 * r.randint(2, 5)} cookies?"
    elif t == 9:
        q = f"You invest ${n1 * 100} at {r.randint(2, 9)}% simple interest per year. How much interest do you earn after {n3} years?"
    elif t == 10:
        q = f"A bag holds {n1} red and {n2} blue marbles. If you pick one at random, what is the probability that it is blue?"
    elif t == 11:
        q = f"{name} reads {n2} pages a day. The book has {n2 * n1 + r.randint(1, n2 - 1)} pages. How many days does it take to finish?"
    elif t == 12:
        q = f"What is {n1 * n3} divided by {n3}, plus {n2} squared?"
    elif t == 13:
        q = f"A tank holds {n1 * 20} liters and leaks {n3} liters per hour. How many hours until it is empty?"
    elif t == 14:
        q = f"The ratio of cats to dogs at a shelter is {n3}:{n2}. There are {n3 * 4} cats. How many dogs are there?"
    elif t == 15:
        q = f"Convert {n1 * 7} days into weeks and days."
    elif t == 16:
        q = f"A shop sold {n1} items on Monday, {n2} more on Tuesday than on Monday, and half as many on Wednesday as on Tuesday. How many items did it sell in total?"
    elif t == 17:
        q = f"Solve the system: x + y = {n1 + n2}, x - y = {n1 - n2}."
    elif t == 18:
        q = f"What is {r.randint(5, 95)}% of {n1 * 20}?"
    elif t == 19:
        q = f"A car uses {n3} liters of fuel per 100 km. Fuel costs ${r.randint(1, 2)}.{r.randint(10, 99)} per liter. How much does a {n1 * 25} km trip cost?"
    elif t == 20:
        q = f"A circle has a radius of {n2} cm. What is its circumference and area? Use pi = 3.14."
    else:
        q = f"{name} saves ${n2} every week. How many weeks until {name} has ${n2 * n1 + r.randint(0, n2 - 1)}?"
    tail = pick(r, P, MATH_TAILS)
    return f"t{t}", f"{q} {tail}".strip()


CODE_WRITE = ["Write a {lang} function that {task}.", "In {lang}, how do I write a function that {task}?",
              "Can you write {lang} code that {task}?", "Implement a function in {lang} that {task}. Include a short example of how to call it.",
              "Write a {lang} function that {task}. Add comments explaining each step.",
              "I need a {lang} snippet that {task}. Keep it simple.",
              "Show me a {lang} implementation of a function that {task}, and explain its time complexity.",
              "Write a well-tested {lang} function that {task}. Include two test cases."]
CODE_ON_SNIPPET = ["Explain what this code does:\n\n{code}", "Is there a bug in this code? If so, fix it.\n\n{code}",
                   "Add docstrings and comments to this code:\n\n{code}", "Rewrite this code to be more readable:\n\n{code}",
                   "What is the time complexity of this code?\n\n{code}", "Write unit tests for this function:\n\n{code}",
                   "Convert this code to {lang}:\n\n{code}", "Review this code and suggest improvements:\n\n{code}",
                   "{code}\n\nWhat will this print or return for a typical input? Walk through it.",
                   "Can you simplify this?\n\n{code}", "Add type hints to this code:\n\n{code}"]
SQL_FRAMES = ["Write a SQL query on the table {t}({cols}) that {q}.", "Given a table {t} with columns {cols}, write SQL to {q2}.",
              "I have a table {t} ({cols}). How do I {q2} in SQL?"]
SQL_QS = [("returns the five rows with the highest {c}", "get the five rows with the highest {c}"),
          ("counts the rows per {c}", "count rows per {c}"),
          ("returns the average {c}", "compute the average {c}"),
          ("finds duplicate values of {c}", "find duplicate values in {c}"),
          ("deletes rows where {c} is NULL", "delete rows where {c} is NULL")]
SHELL_TASKS = ["find all files larger than 100 MB in a directory", "count the lines in every .txt file",
               "rename all .jpeg files to .jpg", "show the ten largest directories",
               "replace a word in every file of a folder", "list the processes using the most memory",
               "compress a folder into a tar.gz archive", "print the last 50 lines of a log and follow it",
               "find files modified in the last 24 hours", "download a file and check its SHA-256 checksum"]
REGEX_TASKS = ["matches a US ZIP code", "matches dates like 2024-03-15", "extracts all hashtags from a tweet",
               "validates a hex color code", "matches words that start with a capital letter",
               "finds repeated words like 'the the'", "matches an IPv4 address", "extracts numbers with decimals"]


def task_coding(r, P):
    u = r.random()
    if u < 0.45:
        return "write", fmt(r, P, CODE_WRITE, lang=r.choice(M.PROGRAMMING_LANGUAGES),
                            task=pick(r, P, M.CODE_TASKS))
    if u < 0.75:
        code = pick(r, P, M.CODE_SNIPPETS)
        lang = r.choice(["JavaScript", "Go", "Rust", "Java", "C++", "TypeScript"])
        return "snippet", fmt(r, P, CODE_ON_SNIPPET, code=code, lang=lang)
    if u < 0.87:
        t, cols = pick(r, P, M.SQL_TABLES)
        c = r.choice(cols[1:])
        qa, qb = r.choice(SQL_QS)
        return "sql", fmt(r, P, SQL_FRAMES, t=t, cols=", ".join(cols), q=qa.format(c=c), q2=qb.format(c=c))
    if u < 0.94:
        return "shell", r.choice(["How do I {x} from the command line?", "Give me a Bash one-liner to {x}.",
                                  "What's the Linux command to {x}? Explain the flags."]).format(x=pick(r, P, SHELL_TASKS))
    return "regex", r.choice(["Write a regular expression that {x}.", "Give me a regex that {x}, and explain each part.",
                              "In Python, use a regex that {x}."]).format(x=pick(r, P, REGEX_TASKS))


REWRITE_OPS = ["Rewrite this to sound more formal:", "Make this more casual and friendly:",
               "Make this more concise:", "Fix the grammar and spelling:", "Paraphrase the following:",
               "Rewrite this in the passive voice:", "Turn this into a polite email:",
               "Simplify this so a child can understand it:", "Rewrite this with a more positive tone:",
               "Expand this into a longer paragraph:", "Turn this into a bulleted list:",
               "Shorten this to under 25 words:", "Rewrite this for a professional LinkedIn post:",
               "Edit this for clarity and flow:", "Rewrite this as a tweet:",
               "Correct any mistakes in this text and list what you changed:"]


def add_typos(r, text):
    words = text.split()
    for _ in range(max(1, len(words) // 6)):
        i = r.randrange(len(words))
        w = words[i]
        if len(w) > 3:
            j = r.randrange(1, len(w) - 1)
            w = r.choice([w[:j] + w[j + 1:], w[:j] + w[j] + w[j:], w[:j - 1] + w[j] + w[j - 1] + w[j + 1:]])
        words[i] = w
    return " ".join(words)


def task_rewriting(r, P):
    u = r.random()
    if u < 0.35:
        text, sub = pick(r, P, M.CASUAL_MESSAGES), "message"
    elif u < 0.75:
        text, sub = random_passage(r, P).short(r.randint(2, 4)), "passage"
    else:
        text = " ".join(r.sample(P(M.EN_SENTENCES), r.randint(2, 4)))
        sub = "sentences"
    op = pick(r, P, REWRITE_OPS)
    if "grammar" in op or "mistakes" in op:
        text = add_typos(r, text)
    return sub, join_text(r, op.rstrip(":") + ".", text, ("Text", "Original", "Draft"))


HEADLINES = {
    "sports": ["{town} United beat {town2} Rovers 3-1 in the cup final", "{person} breaks the national record in the 400 meters"],
    "technology": ["{company} unveils a phone with a week-long battery", "New chip promises faster laptops at half the power"],
    "health": ["Doctors warn of a rise in seasonal allergies in {town}", "Study links short daily walks to better sleep"],
    "business": ["{company} shares jump after strong quarterly results", "Small bakeries in {town} struggle with rising flour prices"],
    "science": ["Astronomers spot a comet that returns every 300 years", "Researchers in {town} map a new species of deep-sea coral"],
    "politics": ["{town} council votes to expand bus lanes", "Parliament debates a new law on data privacy"],
    "entertainment": ["{person}'s debut film wins the audience award", "Band from {town} announces a world tour"],
    "weather": ["Storm expected to bring heavy snow to {town} this weekend", "Record heat forecast for the coming week"],
    "education": ["Schools in {town} add coding to the curriculum", "University tuition to stay frozen for two years"],
    "travel": ["Night trains return between {town} and {town2}", "Airport in {town} opens a new terminal"],
}
SPAM = ["Congratulations! You have won a free cruise. Click the link within 24 hours to claim your prize.",
        "URGENT: Your account has been suspended. Verify your password here immediately.",
        "Earn $5,000 a week from home! No experience needed. Reply YES to start.",
        "Final notice: your package could not be delivered. Pay a $1.99 fee at this link.",
        "You've been selected for an exclusive investment opportunity with guaranteed returns."]
HAM = ["Hi team, the meeting moved to 3 pm on {day}. Same room.", "Your order {n} has shipped and should arrive on {day}.",
       "Reminder: the library book you borrowed is due on {day}.", "Thanks for your application. We will contact you next week.",
       "Can you bring the projector to the workshop on {day}?"]


def task_classification(r, P):
    u = r.randrange(9)
    if u == 0:
        p = passage_review(r, P)
        return "sentiment", join_text(r, r.choice(["Is the sentiment of this review positive, negative or mixed?",
                                                   "Classify the sentiment of this review.",
                                                   "Read the review and rate its sentiment from 1 (very negative) to 5 (very positive). Explain briefly."]),
                                      p.text, ("Review",))
    if u == 1:
        cat = r.choice(sorted(HEADLINES))
        c, _ = company(r, P)
        h = r.choice(HEADLINES[cat]).format(town=town(r, P), town2=town(r, P), person=person(r, P), company=c)
        return "topic", f"Classify this headline into one of these categories: {', '.join(M.NEWS_CATEGORIES)}.\n\nHeadline: {h}"
    if u == 2:
        msg = r.choice(SPAM) if r.random() < 0.5 else r.choice(HAM).format(day=r.choice(M.WEEKDAYS), n=r.randint(10000, 99999))
        return "spam", r.choice(["Is this message spam or not spam? Explain why.\n\n{m}",
                                 "Classify the following email as spam or legitimate: {m}",
                                 "Message: \"{m}\"\nShould this go to the spam folder?"]).format(m=msg)
    if u == 3:
        intent = r.choice(sorted(M.CUSTOMER_INTENTS))
        msg = r.choice(M.CUSTOMER_INTENTS[intent]).format(n=r.randint(10000, 99999))
        labels = ", ".join(sorted(M.CUSTOMER_INTENTS))
        return "intent", f"Classify the intent of this customer message. Possible intents: {labels}.\n\nMessage: {msg}"
    if u == 4:
        groups = r.choice(list(M.ITEM_GROUPS))
        items = [x for g in M.ITEM_GROUPS[groups] for x in g]
        items = r.sample(items, min(len(items), r.randint(5, 9)))
        return "grouping", f"Classify each item as {', '.join(groups[:-1])} or {groups[-1]}: {', '.join(items)}."
    if u == 5:
        src = r.choice(sorted(M.FOREIGN_SENTENCES))
        return "language_id", r.choice(["What language is this? \"{t}\"", "Identify the language of the following sentence: {t}",
                                        "Which language is this written in, and what does it say? {t}"]).format(t=pick(r, P, M.FOREIGN_SENTENCES[src]))
    p = random_passage(r, P)
    if u == 6:
        return "extract_json", join_text(r, r.choice(["Extract all people, places and numbers from this text as JSON.",
                                                      "Extract the key facts from the text into a JSON object.",
                                                      "List every name and date mentioned in the text."]), p.text)
    if u == 7:
        return "keywords", join_text(r, r.choice(["Extract five keywords from this text.",
                                                  "What are the main topics of this text? Give them as tags.",
                                                  "Which named entities appear in this passage, and what type is each?"]), p.text)
    return "table", join_text(r, r.choice(["Turn the facts in this text into a Markdown table.",
                                           "Make a two-column table of attributes and values from this text."]), p.text)


CREATIVE_FORMS = ["a short poem", "a haiku", "a limerick", "a short story", "a fable", "a song chorus",
                  "a dialogue", "a diary entry", "a letter", "the opening paragraph of a novel",
                  "a bedtime story", "a sonnet", "a short speech", "a riddle", "a product slogan",
                  "a two-sentence horror story", "a motivational quote", "a free-verse poem",
                  "a scene for a play", "a fairy tale"]
CREATIVE_CONSTRAINTS = ["", "", "", "Keep it under 100 words.", "Make it funny.", "Give it a twist ending.",
                        "Write it for children.", "Use vivid imagery.", "Make it rhyme.",
                        "Write it in the first person.", "Set it in the future.", "End on a hopeful note.",
                        "Use no more than five sentences.", "Make it melancholic.", "Include a talking animal."]


def task_creative(r, P):
    form = pick(r, P, CREATIVE_FORMS)
    if r.random() < 0.5:
        subj = pick(r, P, M.CHARACTERS)
        text = r.choice(["Write {f} about {s}.", "Can you write {f} featuring {s}?", "Compose {f} about {s}.",
                         "I'd love {f} about {s}.", "Write {f} from the point of view of {s}."]).format(f=form, s=subj)
    else:
        subj = pick(r, P, M.TOPICS)
        text = r.choice(["Write {f} about {s}.", "Compose {f} inspired by {s}.",
                         "Write {f} that celebrates {s}.", "Create {f} on the theme of {s}."]).format(f=form, s=subj)
    c = pick(r, P, CREATIVE_CONSTRAINTS)
    return form.split()[-1], f"{text} {c}".strip()


CHAT = [
    "I'm trying to get better at {t}. Where should I start?", "Can you give me some tips on {t}?",
    "What are the pros and cons of {t}?", "Explain {t} to me like I'm five.",
    "What are common mistakes people make with {t}?", "Give me 10 ideas related to {t}.",
    "I have 30 minutes a day. How can I learn more about {t}?", "What's a fun fact about {t}?",
    "My friend thinks {t} is a boring subject. How would you change their mind?", "Why should I care about {t}?",
    "Can you recommend a few beginner resources about {t}?", "What is the history of {t} in a nutshell?",
    "Write a short checklist for someone new to {t}.", "How has {t} changed over the last 20 years?",
    "I'm giving a 5-minute talk about {t}. Can you outline it?", "What questions should I ask an expert on {t}?",
    "Is {t} worth the time and money? Give me a balanced view.",
]
PLAN = ["Plan a {n}-day trip to {c} on a budget.", "What should I see in {c} if I only have one day?",
        "Suggest a weekend itinerary for {c} with kids.", "What local foods should I try in {c}?",
        "I'm moving to {c} for work. What should I know before I go?", "Make a packing list for a week in {c} in {m}."]
PRACTICAL = ["Write a short email to my landlord about a broken heater.", "Write a polite message declining a party invitation.",
             "Help me write a thank-you note to a teacher.", "Draft a message asking my manager for a day off next {d}.",
             "Write a short apology to a friend for missing their birthday.",
             "Write a cover letter opening for a junior {j} position.",
             "Help me write a note to my neighbor about their dog barking at night.",
             "Write a LinkedIn recommendation for a colleague who is a great {j}.",
             "Write a short speech for my sister's wedding.", "Write a reminder email for a team lunch on {d}.",
             "What should I say when I call to cancel my gym membership?",
             "Write a complaint to an airline about lost luggage."]
SMALL_TALK = ["Hi! How are you today?", "Tell me a joke.", "What's something interesting you can tell me?",
              "I'm bored. Any ideas?", "Can you recommend a good book for a rainy day?", "What's your favorite season and why?",
              "Good morning! Any advice for a productive day?", "I'm feeling a bit stressed. Can we talk?",
              "If you could visit any place in the world, where would you go?", "What are some good habits for a healthy life?",
              "Give me a random fun fact.", "I just finished a big project at work!", "What should I cook for dinner tonight?",
              "Can you help me decide between learning the piano and the guitar?", "What makes a good friend?",
              "How do I stay motivated when working from home?"]


def task_open_chat(r, P):
    u = r.random()
    if u < 0.5:
        return "topic", with_format(r, P, fmt(r, P, CHAT, t=pick(r, P, M.TOPICS)), 0.3)
    if u < 0.65:
        return "travel", fmt(r, P, PLAN, n=r.randint(2, 7), c=pick(r, P, M.CITIES), m=r.choice(M.MONTHS))
    if u < 0.85:
        return "practical", fmt(r, P, PRACTICAL, d=r.choice(M.WEEKDAYS), j=r.choice(M.PROFESSIONS))
    return "small_talk", pick(r, P, SMALL_TALK)


TASKS = {"translation": task_translation, "summarization": task_summarization, "qa": task_qa,
         "reading_comprehension": task_reading, "rag": task_rag, "math": task_math,
         "coding": task_coding, "rewriting": task_rewriting,
         "classification_extraction": task_classification, "creative": task_creative,
         "open_chat": task_open_chat}


# ---------------------------------------------------------------------------------------------
# Assembly and checks
# ---------------------------------------------------------------------------------------------
def normalise(text):
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


STOP = set("the a an and or of to in on for with is are was were be by at as it this that what "
           "how why which who your you i me my we our from into about can do does should would".split())


def content_words(text):
    return {w for w in normalise(text).split() if len(w) > 2 and w not in STOP}


def trigrams(text):
    w = normalise(text).split()
    return {" ".join(w[i:i + 3]) for i in range(len(w) - 2)}


class NearDupIndex:
    """Exact (normalised), word 3-gram containment and content-word Jaccard against a fixed set of
    reference texts."""

    def __init__(self, refs):
        self.refs = refs
        self.norm = {normalise(t): i for i, t in enumerate(refs)}
        self.grams = [trigrams(t) for t in refs]
        self.words = [content_words(t) for t in refs]
        self.index = collections.defaultdict(set)
        for i, g in enumerate(self.grams):
            for x in g:
                self.index[x].add(i)

    def closest(self, text):
        """(exact ref index or None, max containment, its ref, max jaccard, its ref)."""
        exact = self.norm.get(normalise(text))
        hits = collections.Counter()
        for g in trigrams(text):
            for i in self.index.get(g, ()):
                hits[i] += 1
        cont, cont_i = 0.0, None
        for i, h in hits.items():
            c = h / max(1, len(self.grams[i]))
            if c > cont:
                cont, cont_i = c, i
        cw = content_words(text)
        jac, jac_i = 0.0, None
        for i, w in enumerate(self.words):
            if len(w) >= 5 and len(cw) >= 5:
                j = len(cw & w) / len(cw | w)
                if j > jac:
                    jac, jac_i = j, i
        return exact, cont, cont_i, jac, jac_i


def build(n, seed, outside, exclude=None):
    """n prompts in the training (outside=False) or outside set; categories by WEIGHTS (training)
    or round robin (outside). `exclude`: normalised texts that may not appear."""
    r = random.Random(f"{seed}:{'outside' if outside else 'train'}")
    P = Pools(outside)
    names = list(TASKS)
    if outside:
        cats = [names[i % len(names)] for i in range(n)]
    else:
        total = sum(WEIGHTS.values())
        counts = {c: int(n * WEIGHTS[c] / total) for c in names}
        for c in names[:n - sum(counts.values())]:
            counts[c] += 1
        cats = [c for c in names for _ in range(counts[c])]
        r.shuffle(cats)
    seen, out = set(exclude or ()), []
    for cat in cats:
        for _attempt in range(50):
            sub, text = TASKS[cat](r, P)
            key = normalise(text)
            if key not in seen:
                seen.add(key)
                out.append({"category": cat, "subtype": sub, "turns": [text]})
                break
        else:
            raise RuntimeError(f"category {cat}: 50 duplicates in a row, the material is exhausted")
    return out


def check_against(prompts, index, what, limit=0.5):
    """Asserts no exact or near duplicate of the reference set; returns the worst scores."""
    worst = {"containment": (0.0, None, None), "jaccard": (0.0, None, None)}
    for p in prompts:
        text = p["turns"][0]
        exact, cont, ci, jac, ji = index.closest(text)
        assert exact is None, f"{what}: prompt {p['question_id']} equals reference {exact}: {text[:80]!r}"
        assert cont < limit, (f"{what}: prompt {p['question_id']} contains {cont:.2f} of the 3-grams "
                              f"of {index.refs[ci][:80]!r}: {text[:120]!r}")
        assert jac < limit, (f"{what}: prompt {p['question_id']} has content-word Jaccard {jac:.2f} with "
                             f"{index.refs[ji][:80]!r}: {text[:120]!r}")
        if cont > worst["containment"][0]:
            worst["containment"] = (cont, text, index.refs[ci])
        if jac > worst["jaccard"][0]:
            worst["jaccard"] = (jac, text, index.refs[ji])
    return worst


def write_jsonl(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def describe(rows, tag):
    by = collections.Counter(r["category"] for r in rows)
    lens = sorted(len(r["turns"][0]) for r in rows)
    print(f"{tag}: {len(rows)} prompts; characters mean {sum(lens) / len(lens):.0f}, "
          f"median {lens[len(lens) // 2]}, p90 {lens[int(len(lens) * 0.9)]}, max {lens[-1]}")
    print("  " + ", ".join(f"{c} {by[c]}" for c in TASKS))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="training prompts (JSONL)")
    ap.add_argument("--outside-out", default=None, help="held-out evaluation prompts (JSONL)")
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--outside-n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mt-bench", default=os.path.join(ROOT, "..", "shared", "data", "prompts",
                                                       "mt_bench.jsonl"))
    ap.add_argument("--show", type=int, default=0, help="print N random training prompts")
    args = ap.parse_args()

    mt = []
    for line in open(args.mt_bench):
        mt.extend(json.loads(line)["turns"])
    mt_index = NearDupIndex(mt)

    train = build(args.n, args.seed, outside=False)
    for i, row in enumerate(train):
        row["question_id"] = i
    worst = check_against(train, mt_index, "training set vs MT-bench")
    describe(train, "training set")
    for k, (score, text, ref) in worst.items():
        print(f"  closest to MT-bench by {k}: {score:.2f}: {text[:70]!r} ~ {ref[:70]!r}")
    sha = write_jsonl([{"question_id": r["question_id"], "category": r["category"],
                        "subtype": r["subtype"], "turns": r["turns"]} for r in train], args.out)
    print(f"wrote {args.out} (sha256 {sha})")

    if args.outside_out:
        outside = build(args.outside_n, args.seed, outside=True,
                        exclude={normalise(r["turns"][0]) for r in train})
        for i, row in enumerate(outside):
            row["question_id"] = 100000 + i
        worst = check_against(outside, mt_index, "outside set vs MT-bench")
        train_index = NearDupIndex([r["turns"][0] for r in train])
        closest = max((train_index.closest(r["turns"][0])[1], r["turns"][0][:70]) for r in outside)
        assert all(train_index.closest(r["turns"][0])[0] is None for r in outside)
        describe(outside, "outside set")
        print(f"  closest to MT-bench: containment {worst['containment'][0]:.2f}, "
              f"jaccard {worst['jaccard'][0]:.2f}; closest to the training set (3-gram "
              f"containment, shared wording of the passage templates): {closest[0]:.2f}")
        sha = write_jsonl([{"question_id": r["question_id"], "category": r["category"],
                            "subtype": r["subtype"], "turns": r["turns"]} for r in outside],
                          args.outside_out)
        print(f"wrote {args.outside_out} (sha256 {sha})")

    if args.show:
        r = random.Random(1)
        for row in r.sample(train, args.show):
            print(f"--- {row['category']}/{row['subtype']}\n{row['turns'][0]}")


if __name__ == "__main__":
    main()
