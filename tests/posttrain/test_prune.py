"""The pruning request's rules (moejax/posttrain/prune.py) at their boundaries: the
kept count at exactly top_k and exactly E, fractions at 1.0 and just past it, atom
fractions, and --keep=knee on a layer whose knee is at E - 1 (the last point of
err(m), m = E, must be on the curve)."""

import dataclasses

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import prune
from moejax.posttrain.contributions import LayerStatistics


@pytest.mark.parametrize(
  "keep, count", [("2", 2), ("0.25", 2), ("8", 8), ("1.0", 8), ("0.3", 2), ("0.32", 3)]
)
def test_kept_count_accepts_exactly_top_k_and_exactly_every_expert(keep, count):
  # E = 8, top_k = 2: 0.3 * 8 = 2.4 rounds to 2 (kept), 0.32 * 8 = 2.56 to 3
  assert prune.kept_count(keep, 8, 2) == count


@pytest.mark.parametrize(
  "keep, message",
  [
    ("1", "keeps 1 experts, below the router's top_k=2"),
    ("0.125", "keeps 1 experts, below the router's top_k=2"),  # 0.125 * 8 = 1
    ("9", "larger than the layer's 8 experts"),
    ("1.01", "a fraction must be in \\(0, 1\\]"),
    ("0.0", "a fraction must be in \\(0, 1\\]"),
    ("-0.5", "a fraction must be in \\(0, 1\\]"),
    ("half", "expected a fraction of the experts"),
  ],
)
def test_kept_count_refuses_one_past_each_boundary(keep, message):
  with pytest.raises(ConfigError, match=f"--keep={keep}.*{message}|{message}"):
    prune.kept_count(keep, 8, 2)


def test_atom_fraction_boundaries():
  assert prune.atom_fraction("1.0") == 1.0
  assert prune.atom_fraction("0.001") == 0.001
  for keep in ("1", "0.0", "1.5", "-0.25", "all"):
    with pytest.raises(ConfigError, match=f"--keep={keep}: an atom method keeps a fraction"):
      prune.atom_fraction(keep)


def test_a_request_cannot_change_after_it_is_checked():
  request = prune.Pruning("greedy", "4")
  with pytest.raises(dataclasses.FrozenInstanceError):
    request.keep = "2"
  assert (request.objective, request.rescale, request.seed) == ("rescaled", False, 0)


def test_knee_at_every_expert_but_one_needs_the_curve_to_end_at_every_expert():
  """E = 5, top_k = 2, orthogonal experts (err(S) = dropped energy): four strong
  experts of 100 and one of 1. err(m)/err(0) for m = 2..5 is 201, 101, 1, 0 (/401):
  the knee is m = 4. Without the m = E point the three left are collinear and the
  knee falls to m = 2."""
  order = np.random.default_rng(1).permutation(5)
  energy = np.array([100.0, 100.0, 100.0, 100.0, 1.0])[order]
  stats = [LayerStatistics(0, np.diag(energy), np.ones(5), np.ones(5), 64)]
  for method in ("schur_astar", "output_norm"):
    kept, errors = prune.choose_experts(stats, "knee", 2, method, "rescaled", 0)
    assert kept[0] == tuple(np.flatnonzero(energy > 10)), method
    assert errors[0] == pytest.approx(1 / 401)


@pytest.mark.parametrize("merge", ["", "none", "average"])
def test_every_merge_rule_is_accepted_for_an_expert_method(merge):
  """The merge rules written out here (not read from prune.MERGES); '' is the
  method's own: average for step, none for every other method."""
  prune.check_options(prune.Pruning("step", "4", merge=merge))
  assert prune.merge_rule("step", merge) == (merge or "average")
  assert prune.merge_rule("greedy", merge) == (merge or "none")


@pytest.mark.parametrize(
  "request_, message",
  [
    (prune.Pruning("step", "4", merge="mean"), "--merge"),
    (prune.Pruning("step", "4", partner="gram"), "--partner"),
    (prune.Pruning("heapr", "0.5", merge="average"), "removes atoms, not experts to merge"),
    (prune.Pruning("step", "knee"), "--keep=knee reads err"),
    (prune.Pruning("greedy", "4", rescale=True, merge="average"), "--rescale"),
  ],
)
def test_options_a_request_cannot_take_are_refused(request_, message):
  with pytest.raises(ConfigError, match=message):
    prune.check_options(request_)
  prune.check_options(prune.Pruning("heapr", "0.5"))  # no merge: nothing to refuse
  prune.check_options(prune.Pruning("greedy", "knee"))
