"""Seeded probe examples (evaluation/probes.py Example).

  fact_examples        facts of the mix corpus's synthetic people
                       (data/mix_synthetic.py): each asked in both TRAIN_TEMPLATES
                       (group 'train_template') and in its HELD_OUT_TEMPLATES
                       paraphrase (group 'heldout_template'); the prompt stops
                       before the value, the answer is ' value.' (fact_prompt)
  arithmetic_examples  the corpus's held-out problems: 'a op b =' -> ' c\\n'
                       (groups '2-digit', '3-digit')
  next_passage_examples  a passage of a document and four candidates for what
                       follows: the true next passage and three passages of other
                       documents of the same domain (group: the domain)
  last_word_examples   a passage cut before its last word; the target is ' word'
                       (LAMBADA style; group: the domain)
Same seed, same examples. facts and arithmetic probe what a model trained on
``data.name=mix`` saw (or, held out, did not); DEFAULT_PROBES says which
probes suit a model by the data it trained on.
"""

import random
import re

from moejax.data import mix_synthetic
from moejax.errors import ConfigError
from moejax.evaluation.probes import Example

CHOICES = 4


def fact_examples(
  seed: int,
  count: int,
  corpus_seed: int = mix_synthetic.SEED,
  num_people: int = mix_synthetic.NUM_PEOPLE,
) -> list[Example]:
  """Every fact of `count` of the corpus's people (drawn with `seed`) in every
  training template and in its held-out paraphrase."""
  everyone = mix_synthetic.people(corpus_seed, num_people)
  out = []
  for person in random.Random(seed).sample(everyone, min(count, len(everyone))):
    for attribute, value in person.attributes.items():
      for group, templates in (
        ("train_template", mix_synthetic.TRAIN_TEMPLATES[attribute]),
        ("heldout_template", (mix_synthetic.HELD_OUT_TEMPLATES[attribute],)),
      ):
        for template in templates:
          prompt, answer = mix_synthetic.fact_prompt(template, person.name, value)
          out.append(Example(prompt, (answer,), 0, group))
  return out


def arithmetic_examples(
  seed: int,
  per_size: int,
  corpus_seed: int = mix_synthetic.SEED,
  num_problems: int = mix_synthetic.NUM_PROBLEMS,
) -> list[Example]:
  """per_size of the corpus's held-out problems with 2-digit and with 3-digit operands."""
  rng, out = random.Random(seed), []
  held = [
    line
    for line in mix_synthetic.arithmetic_lines(corpus_seed, num_problems)
    if mix_synthetic.line_is_held_out(line)
  ]
  for digits in (2, 3):
    sized = [line for line in held if len(line.split()[0]) == digits]
    for line in rng.sample(sized, min(per_size, len(sized))):
      prompt, answer = mix_synthetic.problem_prompt(line)
      out.append(Example(prompt, (answer,), 0, f"{digits}-digit"))
  return out


def passages(text: str, size: int) -> list[str]:
  """Consecutive pieces of `size` characters (the last shorter piece dropped)."""
  return [text[i : i + size] for i in range(0, len(text) - size + 1, size)]


def next_passage_examples(documents, seed: int, per_domain: int, size: int = 200) -> list[Example]:
  """Per domain up to per_domain examples from (domain, text) documents; each needs
  two passages in one document and three from other documents of its domain."""
  rng, out = random.Random(seed), []
  by_domain: dict[str, list[list[str]]] = {}
  for domain, text in documents:
    by_domain.setdefault(domain, []).append(passages(text, size))
  for domain in sorted(by_domain):
    docs = by_domain[domain]
    usable = [i for i, p in enumerate(docs) if len(p) >= 2]
    for _ in range(per_domain):
      if not usable:
        break
      i = rng.choice(usable)
      pool = [p for j, ps in enumerate(docs) if j != i for p in ps]
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
  by_domain: dict[str, list[Example]] = {}
  for domain, text in documents:
    for match in re.finditer(r"(?<=\S) ([A-Za-z]{3,})(?=[.,;:!?\n])", text):
      if match.start() >= size:
        by_domain.setdefault(domain, []).append(
          Example(text[match.start() - size : match.start()], (match.group(0),), 0, domain)
        )
  for domain in sorted(by_domain):
    found = by_domain[domain]
    out += rng.sample(found, min(per_domain, len(found)))
  return out


PROBES = {
  "facts": "greedy",
  "arithmetic": "greedy",
  "next_passage": "choice",
  "last_word": "greedy",
}
MIX_PROBES = ("facts", "arithmetic")  # the mix corpus's own facts and problems


def default_probes(dataset: str | None) -> tuple[str, ...]:
  """Every probe for a model trained on data.name=mix; else (another dataset, or
  unknown) the passage probes only, as it never saw the synthetic facts."""
  return tuple(p for p in PROBES if dataset == "mix" or p not in MIX_PROBES)


def probe_examples(
  name: str, documents, seed: int, count: int, context: int = 400
) -> list[Example]:
  """The examples of probe `name` (PROBES): count per group (facts: count people),
  from (domain, text) documents; passages are up to context // 2 characters (200 at most)."""
  size = max(1, min(200, context // 2))
  if name == "facts":
    return fact_examples(seed, count)
  if name == "arithmetic":
    return arithmetic_examples(seed, count)
  if name == "next_passage":
    return next_passage_examples(documents, seed, count, size)
  if name == "last_word":
    return last_word_examples(documents, seed, count, size)
  raise ConfigError(f"probe {name!r} is not known; valid: {', '.join(sorted(PROBES))}")
