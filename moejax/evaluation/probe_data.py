"""Small seeded generators of probe examples (evaluation/probes.py Example).

  fact_examples        invented entities and attributes; each fact asked with
                       TRAIN_TEMPLATES (group 'train_template') and the held-out
                       paraphrases HELDOUT_TEMPLATES (group 'heldout_template')
  arithmetic_examples  'a+b=' -> 'c\\n' for a, b of 2 and 3 digits (groups '2-digit', '3-digit')
  next_passage_examples  a passage of a document and four candidates for what
                       follows: the true next passage and three passages of other
                       documents of the same domain (group: the domain)
  last_word_examples   a passage cut before its last word; the target is ' word'
                       (LAMBADA style; group: the domain)
Same seed, same examples. The corpus-side facts of the mix corpus are its own;
a probe takes any list of Examples.
"""
import random
import re

from moejax.errors import ConfigError
from moejax.evaluation.probes import Example

SYLLABLES = ("ka", "lo", "mir", "ten", "zu", "vor", "pel", "dra", "quin", "sa", "bo", "rith")
ATTRIBUTES = {"capital": ("Olvane", "Derith", "Maskel", "Porvin", "Tulsa", "Wenmark"),
              "colour": ("amber", "violet", "teal", "crimson", "ochre", "silver"),
              "river": ("Anset", "Brevo", "Caldor", "Dunmere", "Elsk", "Fallow")}
TRAIN_TEMPLATES = ("The {attribute} of {entity} is",)
HELDOUT_TEMPLATES = ("{entity}'s {attribute} is", "Q: What is the {attribute} of {entity}? A:")
CHOICES = 4


def make_facts(seed: int, num_entities: int) -> list[tuple[str, str, str]]:
  """(entity, attribute, value) for num_entities invented entities, every attribute."""
  rng = random.Random(seed)
  names = set()
  while len(names) < num_entities:
    names.add("".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize())
  return [(name, attribute, rng.choice(values)) for name in sorted(names)
          for attribute, values in ATTRIBUTES.items()]


def fact_examples(facts) -> list[Example]:
  """Each fact under every training and held-out template; the answer is ' value.'."""
  return [Example(template.format(entity=e, attribute=a), (f" {v}.",), 0, group)
          for group, templates in (("train_template", TRAIN_TEMPLATES),
                                   ("heldout_template", HELDOUT_TEMPLATES))
          for e, a, v in facts for template in templates]


def arithmetic_examples(seed: int, per_size: int) -> list[Example]:
  """per_size additions of two d-digit numbers for d = 2 and 3."""
  rng, out = random.Random(seed), []
  for digits in (2, 3):
    low, high = 10 ** (digits - 1), 10 ** digits - 1
    for _ in range(per_size):
      a, b = rng.randint(low, high), rng.randint(low, high)
      out.append(Example(f"{a}+{b}=", (f"{a + b}\n",), 0, f"{digits}-digit"))
  return out


def passages(text: str, size: int) -> list[str]:
  """Consecutive pieces of `size` characters (the last shorter piece dropped)."""
  return [text[i:i + size] for i in range(0, len(text) - size + 1, size)]


def next_passage_examples(documents, seed: int, per_domain: int, size: int = 200) -> list[Example]:
  """Per domain up to per_domain examples from (domain, text) documents; each needs
  two passages in one document and three from other documents of its domain."""
  rng, out = random.Random(seed), []
  by_domain = {}
  for domain, text in documents:
    by_domain.setdefault(domain, []).append(passages(text, size))
  for domain in sorted(by_domain):
    docs = by_domain[domain]
    usable = [i for i, p in enumerate(docs) if len(p) >= 2]
    others = lambda i: [p for j, ps in enumerate(docs) if j != i for p in ps]
    for _ in range(per_domain):
      if not usable:
        break
      i = rng.choice(usable)
      pool = others(i)
      if len(pool) < CHOICES - 1:
        break
      k = rng.randrange(len(docs[i]) - 1)
      choices = [docs[i][k + 1]] + rng.sample(pool, CHOICES - 1)
      rng.shuffle(order := list(range(CHOICES)))
      out.append(Example(docs[i][k], tuple(choices[j] for j in order), order.index(0), domain))
  return out


def last_word_examples(documents, seed: int, per_domain: int, size: int = 200) -> list[Example]:
  """Per domain up to per_domain passages of about `size` characters that end in a
  word of 3+ letters; the prompt stops before the space that precedes it."""
  rng, out = random.Random(seed), []
  by_domain = {}
  for domain, text in documents:
    for match in re.finditer(r"(?<=\S) ([A-Za-z]{3,})(?=[.,;:!?\n])", text):
      if match.start() >= size:
        by_domain.setdefault(domain, []).append(
            Example(text[match.start() - size:match.start()], (match.group(0),), 0, domain))
  for domain in sorted(by_domain):
    found = by_domain[domain]
    out += rng.sample(found, min(per_domain, len(found)))
  return out


PROBES = {"facts": "greedy", "arithmetic": "greedy", "next_passage": "choice",
          "last_word": "greedy"}


def probe_examples(name: str, documents, seed: int, count: int,
                   context: int = 400) -> list[Example]:
  """The examples of probe `name` (PROBES): count per group (facts: count entities),
  from (domain, text) documents; passages are up to context // 2 characters (200 at most)."""
  size = max(1, min(200, context // 2))
  if name == "facts":
    return fact_examples(make_facts(seed, count))
  if name == "arithmetic":
    return arithmetic_examples(seed, count)
  if name == "next_passage":
    return next_passage_examples(documents, seed, count, size)
  if name == "last_word":
    return last_word_examples(documents, seed, count, size)
  raise ConfigError(f"probe {name!r} is not known; valid: {', '.join(sorted(PROBES))}")
