"""What the RandOpt study measures (Neural Thickets, arXiv 2603.12228): for one
checkpoint, N perturbations and the base scored on a selection set and on a disjoint
held-out set of each probe task, then per task

  improving           fraction of the N whose selection accuracy beats the base's
  improving_held_out  the same on the held-out examples
  best_single         the top-1 member by selection accuracy, on the held-out set
  topk_vote           the majority vote of the top-K members (randopt.majority_vote)

Tasks: arithmetic (greedy decoding of the answer) and next_passage (choice among 4
passages), examples from moejax/evaluation/probe_data.py. Disjoint sets: the held-out
documents are split by position (even: selection, odd: held-out) before next-passage
examples are drawn from each half; arithmetic examples are drawn once, twice as many,
and split in halves per operand size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.ensembles import probes, randopt
from moejax.evaluation import probe_data

TASKS = ("arithmetic", "next_passage")


def split_examples(
  documents, seed: int, *, per_domain: int, per_size: int, passage: int
) -> dict[str, tuple[list, list]]:
  """{task: (selection examples, held-out examples)} (module doc)."""
  halves = (
    [d for i, d in enumerate(documents) if i % 2 == 0],
    [d for i, d in enumerate(documents) if i % 2 == 1],
  )
  passages = (
    probe_data.next_passage_examples(halves[0], seed, per_domain, passage),
    probe_data.next_passage_examples(halves[1], seed + 1, per_domain, passage),
  )
  drawn = probe_data.arithmetic_examples(seed, 2 * per_size)
  groups = sorted({e.group for e in drawn})
  parts = [[e for e in drawn if e.group == g] for g in groups]
  arithmetic = (
    [e for p in parts for e in p[: len(p) // 2]],
    [e for p in parts for e in p[len(p) // 2 :]],
  )
  return {"arithmetic": arithmetic, "next_passage": passages}


def encode(examples: dict, tokenizer, prefix_id: int, context: int) -> dict:
  """{task: (selection Task, held-out Task)} for probes.predict."""

  def make(task, ex):
    if task == "arithmetic":
      return probes.greedy_task(ex, tokenizer, prefix_id)
    return probes.choice_task(ex, tokenizer, prefix_id, context)

  return {task: tuple(make(task, ex) for ex in pair) for task, pair in examples.items()}


@dataclasses.dataclass
class Scored:
  """Per task and set ('selection', 'held_out'): the base's predictions [E, ...] and
  the N members' [N, E, ...]."""

  base: dict
  members: dict


def score(
  graphdef,
  params,
  rest,
  tasks: dict,
  *,
  n: int,
  sigma: float,
  key,
  chunk: int,
  width: int = 1,
  log=None,
) -> Scored:
  """The base and members 0..n-1 (randopt.perturb with `key`) on every task and set,
  `chunk` members per call."""
  order = [(task, s) for task in tasks for s in range(2)]
  flat = [tasks[task][s] for task, s in order]
  base = probes.predict(graphdef, params, rest, flat, key=key, indices=[0], sigma=0.0)
  found: list[list] = [[] for _ in flat]
  for i, idx in enumerate(randopt.chunks(n, chunk)):
    out = probes.predict(
      graphdef, params, rest, flat, key=key, indices=idx, sigma=sigma, width=width
    )
    keep = min(chunk, n - i * chunk)
    for j, p in enumerate(out):
      found[j].append(p[:keep])
    if log:
      log(f"  members {i * chunk + keep}/{n}")
  names = ("selection", "held_out")
  return Scored(
    {(t, names[s]): b[0] for (t, s), b in zip(order, base)},
    {(t, names[s]): np.concatenate(f) for (t, s), f in zip(order, found)},
  )


def outcome(tasks: dict, scored: Scored, task: str, k: int) -> dict[str, dict[str, float]]:
  """{arm: {metric: value}} for arms base, perturbations, best_single, topk_vote."""
  selection, held_out = tasks[task]

  def acc(t, p):
    return probes.correct(t, p).mean(-1)

  sel = acc(selection, scored.members[(task, "selection")])
  held = acc(held_out, scored.members[(task, "held_out")])
  base_sel = float(acc(selection, scored.base[(task, "selection")]))
  base_held = float(acc(held_out, scored.base[(task, "held_out")]))
  top = randopt.top_k(sel, k)

  def vote(t, s):
    return float(acc(t, randopt.majority_vote(scored.members[(task, s)][top])))

  return {
    "base": {"accuracy": base_held, "selection_accuracy": base_sel},
    "perturbations": {
      "accuracy": float(held.mean()),
      "selection_accuracy": float(sel.mean()),
      "improving": float(np.mean(sel > base_sel)),
      "improving_held_out": float(np.mean(held > base_held)),
    },
    "best_single": {"accuracy": float(held[top[0]]), "selection_accuracy": float(sel[top[0]])},
    "topk_vote": {
      "accuracy": vote(held_out, "held_out"),
      "selection_accuracy": vote(selection, "selection"),
    },
  }
