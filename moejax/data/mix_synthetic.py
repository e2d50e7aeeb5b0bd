"""Synthetic domains of the ``mix`` corpus, generated from a seed (no download).

facts: invented people (syllable names) with five attributes. Training
  documents state every fact with each of two TRAIN_TEMPLATES; held-out
  documents state the same facts with a HELD_OUT_TEMPLATES paraphrase that
  never occurs in training, so recall can be probed on seen and unseen wording.
  Every template names the person before ' {value}', so a fact splits into a
  prompt (the sentence up to the space before the value) and an answer (' ',
  the value and the rest of the sentence): ``fact_prompt``. No template's
  prompt begins another's, so each prompt has one right answer (1.1.0 reworded
  'was born in {value}' and 'In {value}, {name} came ...', which did not).
  Answers start at a space, where sentencepiece pieces start too, so a prompt
  and its answer encoded apart give the tokens of the whole sentence.
arithmetic: lines 'a op b = c' with 2- or 3-digit operands and op in + - *;
  a problem is held out when sha256('a op b') is 0 mod 10, so no held-out
  problem appears in training. 32 problems per document, one per line; as a
  probe, prompt 'a op b =' and answer ' c\n' (``problem_prompt``).

SEED, NUM_PEOPLE and NUM_PROBLEMS are those of the built corpus
(``mix.MixSources``); the probes of ``moejax.evaluation.probe_data`` read the
same people and problems through this module.

Both use ``random.Random(seed)`` (stable across Python versions for these calls).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from moejax.data.mix_sources import Document

_SYLLABLES = (
  'ka',
  'lo',
  'mir',
  'ten',
  'vas',
  'ru',
  'bel',
  'dor',
  'fi',
  'gan',
  'hel',
  'jo',
  'kes',
  'lun',
  'mo',
  'nav',
  'or',
  'pel',
  'quin',
  'ras',
  'sol',
  'tav',
  'ul',
  'ver',
  'wen',
  'yal',
  'zor',
  'an',
  'bri',
  'cor',
)
_PLACE_ENDINGS = ('ford', 'vale', 'mouth', 'wick', 'holm', 'stead', 'bury', 'mere')
VALUES = {
  'birthplace': None,  # invented places, see _place
  'profession': (
    'baker',
    'cartographer',
    'violinist',
    'beekeeper',
    'glassblower',
    'clockmaker',
    'botanist',
    'tailor',
    'mason',
    'weaver',
    'surveyor',
    'puppeteer',
    'ferry pilot',
    'lighthouse keeper',
    'navigator',
    'potter',
  ),
  'birth_year': None,  # 1600-1999
  'colour': (
    'amber',
    'teal',
    'crimson',
    'ochre',
    'violet',
    'slate',
    'olive',
    'coral',
    'indigo',
    'ivory',
  ),
  'pet': (
    'heron',
    'ferret',
    'tortoise',
    'goat',
    'lynx',
    'parrot',
    'hare',
    'toad',
    'magpie',
    'badger',
  ),
}
TRAIN_TEMPLATES = {
  'birthplace': ('{name} is a native of {value}.', '{name} grew up in the town of {value}.'),
  'profession': ('{name} works as a {value}.', 'By trade, {name} is a {value}.'),
  'birth_year': ('{name} was born in the year {value}.', "{name}'s year of birth is {value}."),
  'colour': ("{name}'s favourite colour is {value}.", 'Of all colours, {name} likes {value} best.'),
  'pet': ('{name} keeps a {value} as a pet.', '{name} owns a pet {value}.'),
}
HELD_OUT_TEMPLATES = {
  'birthplace': 'The birthplace of {name} is {value}.',
  'profession': '{name} earns a living as a {value}.',
  'birth_year': '{name} came into the world in {value}.',
  'colour': 'The colour that {name} prefers is {value}.',
  'pet': 'The animal {name} looks after at home is a {value}.',
}
OPERATORS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}
PROBLEMS_PER_DOCUMENT = 32
SEED, NUM_PEOPLE, NUM_PROBLEMS = 0, 3000, 40000


@dataclasses.dataclass(frozen=True)
class Person:
  name: str
  attributes: dict[str, str]


def _word(rng: random.Random, syllables: int) -> str:
  return ''.join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _place(rng: random.Random) -> str:
  return _word(rng, 2) + rng.choice(_PLACE_ENDINGS)


def people(seed: int, count: int) -> list[Person]:
  """``count`` invented people with unique names, in generation order."""
  rng = random.Random(seed)
  places = sorted({_place(rng) for _ in range(80)})
  names: set[str] = set()
  result: list[Person] = []
  while len(result) < count:
    name = f'{_word(rng, rng.choice((2, 3)))} {_word(rng, rng.choice((2, 3)))}'
    if name in names:
      continue
    names.add(name)
    attributes = {
      attribute: rng.choice(options) if options else ''  # '': set below
      for attribute, options in VALUES.items()
    }
    attributes.update(birthplace=rng.choice(places), birth_year=str(rng.randrange(1600, 2000)))
    result.append(Person(name, attributes))
  return result


def fact_documents(seed: int, count: int) -> list[Document]:
  """Per person: a training document ('facts/<name>', every fact in both training
  templates, sentences shuffled) and a held-out one ('facts/<name>/paraphrase')."""
  rng = random.Random(seed + 1)
  documents = []
  for person in people(seed, count):
    facts = [
      (template, value)
      for attribute, value in person.attributes.items()
      for template in TRAIN_TEMPLATES[attribute]
    ]
    rng.shuffle(facts)
    train = ' '.join(t.format(name=person.name, value=v) for t, v in facts)
    held = ' '.join(
      HELD_OUT_TEMPLATES[a].format(name=person.name, value=v) for a, v in person.attributes.items()
    )
    documents += [
      Document('facts', f'facts/{person.name}', train, False),
      Document('facts', f'facts/{person.name}/paraphrase', held, True),
    ]
  return documents


def fact_prompt(template: str, name: str, value: str) -> tuple[str, str]:
  """(prompt, answer) of a fact sentence: 'X works as a' and ' baker.'."""
  prompt = template[: template.index(' {value}')].format(name=name)
  return prompt, template.format(name=name, value=value)[len(prompt) :]


def problem_prompt(line: str) -> tuple[str, str]:
  """(prompt, answer) of a problem line: '12 + 34 =' and ' 46\\n'."""
  problem, answer = line.split(' = ')
  return f'{problem} =', f' {answer}\n'


def is_held_out_problem(problem: str) -> bool:
  return int(hashlib.sha256(problem.encode()).hexdigest(), 16) % 10 == 0


def line_is_held_out(line: str) -> bool:
  return is_held_out_problem(line.split(' = ')[0])


def arithmetic_lines(seed: int, count: int) -> list[str]:
  """``count`` distinct problems 'a op b = c', half 2-digit and half 3-digit operands."""
  rng = random.Random(seed)
  seen: set[str] = set()
  lines: list[str] = []
  while len(lines) < count:
    digits = rng.choice((2, 3))
    a, b = (rng.randrange(10 ** (digits - 1), 10**digits) for _ in range(2))
    op = rng.choice(tuple(OPERATORS))
    problem = f'{a} {op} {b}'
    if problem not in seen:
      seen.add(problem)
      lines.append(f'{problem} = {OPERATORS[op](a, b)}')
  return lines


def arithmetic_documents(seed: int, count: int) -> list[Document]:
  """Problems split by ``is_held_out_problem``, PROBLEMS_PER_DOCUMENT per document,
  titled 'arithmetic/train/NNNN' and 'arithmetic/held_out/NNNN'."""
  lines = arithmetic_lines(seed, count)
  documents = []
  for held_out, part in ((False, 'train'), (True, 'held_out')):
    chosen = [line for line in lines if line_is_held_out(line) == held_out]
    for start in range(0, len(chosen), PROBLEMS_PER_DOCUMENT):
      text = '\n'.join(chosen[start : start + PROBLEMS_PER_DOCUMENT])
      title = f'arithmetic/{part}/{start // PROBLEMS_PER_DOCUMENT:04d}'
      documents.append(Document('arithmetic', title, text, held_out))
  return documents
