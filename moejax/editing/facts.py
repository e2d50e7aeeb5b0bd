"""Edit requests on the facts domain of the mix corpus (moejax/data/mix_synthetic.py):
a subject (a synthetic person), one of their attributes and a new value.

A fact file is JSON lines {"subject": "Kalo Mirten", "attribute": "profession",
"target": "potter"}; every subject must be one of the corpus's people (the facts
the model learnt). `draw_facts` picks `count` people with `seed`, one attribute
each and a new value of that attribute that differs from the true one.

Prompts, as the probes split a fact sentence (mix_synthetic.fact_prompt):
  edit_rows       both TRAIN_TEMPLATES of the attribute, the new value (the rows
                  the edit is computed on, and its efficacy)
  paraphrase_rows the HELD_OUT_TEMPLATES paraphrase, never seen in training
  true_rows       the true value in the training templates (unedited facts)
"""

from __future__ import annotations

import dataclasses
import functools
import random

from moejax.data import mix_synthetic as ms
from moejax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Fact:
  subject: str
  attribute: str
  target: str  # the new value
  true: str  # the value in the corpus


@functools.cache
def people() -> dict[str, ms.Person]:
  return {p.name: p for p in ms.people(ms.SEED, ms.NUM_PEOPLE)}


def _values(attribute: str) -> list[str]:
  if attribute == "birth_year":
    return [str(y) for y in range(1600, 2000)]
  if attribute == "birthplace":
    return sorted({p.attributes["birthplace"] for p in people().values()})
  return list(ms.VALUES[attribute] or ())


def make_fact(subject: str, attribute: str, target: str, where: str = "") -> Fact:
  """A Fact checked against the corpus; ConfigError naming `where` (file and line)."""
  person = people().get(subject)
  if person is None:
    raise ConfigError(
      f"the subject {subject!r} is missing from the model's facts (the facts "
      f"domain's {ms.NUM_PEOPLE} people){where}"
    )
  if attribute not in ms.TRAIN_TEMPLATES:
    raise ConfigError(
      f"attribute {attribute!r} is not known; valid: {', '.join(ms.TRAIN_TEMPLATES)}{where}"
    )
  if not isinstance(target, str) or not target.strip() or "." in target:
    raise ConfigError(f"target {target!r} must be a non-empty value without '.'{where}")
  return Fact(subject, attribute, target, person.attributes[attribute])


def read_facts(path: str, flag: str = "--facts") -> list[Fact]:
  """The facts of a JSON-lines file (module doc); blank lines are skipped."""
  from moejax import cli_files

  fields = ("subject", "attribute", "target")
  out = [
    make_fact(record["subject"], record["attribute"], record["target"], f" {where}")
    for where, record in cli_files.json_lines(flag.lstrip("-"), path, fields)
  ]
  if not out:
    raise ConfigError(f"no facts in the file ({flag}={path})")
  return out


def draw_facts(count: int, seed: int, exclude=()) -> list[Fact]:
  """`count` edits of distinct people (none in `exclude`), drawn with `seed`."""
  rng = random.Random(seed)
  names = [n for n in people() if n not in set(exclude)]
  if not 1 <= count <= len(names):
    raise ConfigError(f"{count} edits: the facts domain has {len(names)} people to draw from")
  out = []
  for name in rng.sample(names, count):
    attribute = rng.choice(sorted(ms.TRAIN_TEMPLATES))
    true = people()[name].attributes[attribute]
    target = rng.choice([v for v in _values(attribute) if v != true])
    out.append(Fact(name, attribute, target, true))
  return out


def _rows(facts, templates_of, value_of):
  rows = []
  for i, fact in enumerate(facts):
    for template in templates_of(fact):
      prompt, answer = ms.fact_prompt(template, fact.subject, value_of(fact))
      rows.append((prompt, answer, fact.subject, i))
  return rows


def edit_rows(facts) -> list[tuple[str, str, str, int]]:
  """(prompt, continuation, subject, fact index) in both training templates, new value."""
  return _rows(facts, lambda f: ms.TRAIN_TEMPLATES[f.attribute], lambda f: f.target)


def paraphrase_rows(facts):
  return _rows(facts, lambda f: (ms.HELD_OUT_TEMPLATES[f.attribute],), lambda f: f.target)


def true_rows(facts, paraphrase: bool = False):
  """The true values (training templates, or the held-out paraphrase)."""
  templates = (
    (lambda f: (ms.HELD_OUT_TEMPLATES[f.attribute],))
    if paraphrase
    else (lambda f: ms.TRAIN_TEMPLATES[f.attribute])
  )
  return _rows(facts, templates, lambda f: f.true)
