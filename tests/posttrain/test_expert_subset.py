"""SCHUR-A* expert selection (moejax/posttrain/expert_subset.py) against brute
force over every subset, least squares on the raw contributions, and closed forms."""

import itertools
import math
import os
import time

import numpy as np
import pytest

from moejax.posttrain import expert_subset as xs
from moejax.posttrain.contributions import load_statistics


def simulated_layer(num_experts, seed, tokens=256, d=8, top_k=2, skew=True):
  """Contributions Z [E, T*d] of a random top-k layer, with routing frequency
  unrelated to output size: popular experts get small output maps, rare ones large
  (so frequency ranking is misled). Also returns per-expert frequency and router mass."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(tokens, d))
  logits = x @ rng.normal(size=(d, num_experts))
  bias = np.linspace(2.0, -2.0, num_experts) if skew else np.zeros(num_experts)
  logits = logits + bias
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  chosen = np.argsort(-probs, axis=1)[:, :top_k]
  scale = np.linspace(0.2, 2.0, num_experts) if skew else np.ones(num_experts)
  maps = rng.normal(size=(num_experts, d, d)) * scale[:, None, None]
  z = np.zeros((num_experts, tokens, d))
  for t in range(tokens):
    for e in chosen[t]:
      z[e, t] = probs[t, e] * (x[t] @ maps[e])
  frequency = np.bincount(chosen.ravel(), minlength=num_experts)
  mass = np.array([probs[:, e][np.any(chosen == e, axis=1)].sum() for e in range(num_experts)])
  return z.reshape(num_experts, -1), frequency, mass


def correlated_experts(num_experts, seed, rank=4, n=64):
  """Contributions of experts that share a rank-4 subspace (near-duplicate experts):
  here greedy selection is often not optimal."""
  rng = np.random.default_rng(seed)
  return rng.normal(size=(num_experts, rank)) @ rng.normal(size=(rank, n)) + 0.3 * rng.normal(
    size=(num_experts, n)
  )


INSTANCES = {
  "routed_layer": lambda e, seed: simulated_layer(e, seed)[0],
  "correlated": correlated_experts,
}


@pytest.mark.parametrize("objective", xs.OBJECTIVES)
def test_error_equals_least_squares_and_dropped_sum_on_the_contributions(objective):
  z, _, _ = simulated_layer(6, seed=1)
  y = z.sum(0)
  gram = xs.gram_of(z)
  for keep in [(0,), (1, 4), (0, 2, 3, 5), tuple(range(6))]:
    if objective == "rescaled":
      coef = np.linalg.lstsq(z[list(keep)].T, y, rcond=None)[0]
      expected = np.sum((y - coef @ z[list(keep)]) ** 2)
      np.testing.assert_allclose(xs.rescale_weights(gram, keep), coef, rtol=1e-8, atol=1e-10)
    else:
      dropped = [e for e in range(6) if e not in keep]
      expected = np.sum(z[dropped].sum(0) ** 2) if dropped else 0.0
    np.testing.assert_allclose(
      xs.subset_error(gram, keep, objective), expected, rtol=1e-9, atol=1e-9 * np.sum(y**2)
    )


@pytest.mark.parametrize("objective", xs.OBJECTIVES)
@pytest.mark.parametrize("instance", INSTANCES)
def test_astar_equals_brute_force_over_924_subsets_and_expands_fewer(objective, instance):
  greedy_gaps = []
  for seed in range(4):
    gram = xs.gram_of(INSTANCES[instance](12, seed))
    _, error = xs.brute_force(gram, 6, objective)
    result = xs.astar(gram, 6, objective)
    greedy = xs.subset_error(gram, xs.greedy_forward(gram, 6, objective), objective)
    print(
      f"{objective} {instance} seed {seed}: expanded {result.expanded}, generated "
      f"{result.generated} of {math.comb(12, 6)} subsets; greedy/optimum {greedy / error:.3f}"
    )
    np.testing.assert_allclose(result.error, error, rtol=1e-10)
    assert xs.subset_error(gram, result.keep, objective) == pytest.approx(error, rel=1e-10)
    assert len(result.keep) == 6
    assert result.expanded < math.comb(12, 6)
    greedy_gaps.append(greedy / error - 1)
  if instance == "correlated":  # instances where the search matters: greedy misses
    assert max(greedy_gaps) > 0.1


@pytest.mark.parametrize("objective", xs.OBJECTIVES)
def test_the_bound_is_admissible_at_every_expanded_node(objective):
  gram = xs.gram_of(correlated_experts(10, seed=0))
  m = 4
  result = xs.astar(gram, m, objective, record_trace=True)
  assert len(result.trace) > 10
  for included, undecided, excluded, f in result.trace:
    # the best completion: m - |included| more experts out of the undecided ones
    best = min(
      xs.subset_error(gram, included + extra, objective)
      for extra in itertools.combinations(undecided, m - len(included))
    )
    assert f <= best + 1e-9 * gram.sum(), (included, excluded, f, best)


def test_astar_beats_greedy_beats_routing_frequency():
  for seed in range(3):
    z, frequency, mass = simulated_layer(16, seed)
    gram = xs.gram_of(z)

    def err(keep):
      return xs.subset_error(gram, keep, "rescaled")

    best = xs.astar(gram, 8).error
    greedy = err(xs.greedy_forward(gram, 8))
    by_frequency = err(xs.top_by_score(frequency, 8))
    print(
      f"seed {seed}: A* {best:.4g} <= greedy {greedy:.4g} <= frequency {by_frequency:.4g}"
      f" (mass {err(xs.top_by_score(mass, 8)):.4g})"
    )
    assert best <= greedy * (1 + 1e-12) and greedy < by_frequency


def test_e16_m8_equals_brute_force_over_12870_subsets():
  gram = xs.gram_of(simulated_layer(16, seed=4)[0])
  _, error = xs.brute_force(gram, 8)
  result = xs.astar(gram, 8)
  print(f"E=16, m=8: expanded {result.expanded} of {math.comb(16, 8)} subsets")
  np.testing.assert_allclose(result.error, error, rtol=1e-10)


ZOO_S = os.path.join(os.path.dirname(__file__), "data", "zoo_s_calibration_seed0.npz")


@pytest.mark.integration
@pytest.mark.parametrize("objective", xs.OBJECTIVES)
def test_equals_brute_force_on_the_six_zoo_s_layers(objective):
  """The Gram matrices of zoo-s's six MoE layers (E=16) on 64 calibration windows,
  captured by `python -m experiments.prune --workdir=runs/zoo/s --keep=0.5
  --save_statistics=tests/posttrain/data/zoo_s_calibration_seed0.npz`: A* keeping 8
  = brute force over all 12,870 subsets, in fewer expansions."""
  stats = load_statistics(ZOO_S)
  assert [len(s.gram) for s in stats] == [16] * 6
  for layer in stats:
    _, error = xs.brute_force(layer.gram, 8, objective)
    result = xs.astar(layer.gram, 8, objective)
    greedy = xs.subset_error(layer.gram, xs.greedy_forward(layer.gram, 8, objective), objective)
    frequency = xs.subset_error(layer.gram, xs.top_by_score(layer.frequency, 8), objective)
    print(
      f"zoo-s block {layer.block} {objective}: expanded {result.expanded} of 12870; "
      f"err A* {result.error:.5g}, greedy {greedy:.5g}, frequency {frequency:.5g}"
    )
    np.testing.assert_allclose(result.error, error, rtol=1e-10)
    assert result.expanded < math.comb(16, 8)
    assert result.error <= greedy * (1 + 1e-12) <= frequency * (1 + 1e-12)


def test_e64_m32_is_solved():
  gram = xs.gram_of(simulated_layer(64, seed=5, tokens=512)[0])
  start = time.perf_counter()
  result = xs.astar(gram, 32, max_expanded=200_000)
  seconds = time.perf_counter() - start
  print(
    f"E=64, m=32: {result.expanded} nodes expanded, {result.generated} generated, "
    f"{seconds:.1f} s (C(64, 32) = {math.comb(64, 32):.3g} subsets)"
  )
  assert len(result.keep) == 32
  assert result.error <= xs.subset_error(gram, xs.greedy_forward(gram, 32)) * (1 + 1e-12)


def test_knee_of_a_two_slope_curve_is_its_corner():
  # err(m) falls by 10 per expert up to m=5, then by 1: the corner is m=5.
  errors = [100 - 10 * m if m <= 5 else 50 - (m - 5) for m in range(1, 17)]
  assert xs.knee(errors) == 5
  assert xs.knee([3.0, 2.0, 1.0]) in (1, 2, 3)  # a straight line: any point is on the chord


def test_bad_sizes_are_refused():
  gram = np.eye(4)
  for m in (0, 5):
    with pytest.raises(ValueError, match=f"m={m}"):
      xs.astar(gram, m)
  with pytest.raises(ValueError, match="objective='l1'"):
    xs.astar(gram, 2, "l1")


def test_choose_runs_each_method_on_layer_statistics():
  from moejax.errors import ConfigError
  from moejax.posttrain.contributions import LayerStatistics

  z, frequency, mass = simulated_layer(12, seed=6)
  stats = LayerStatistics(0, xs.gram_of(z), frequency.astype(float), mass, 256)

  def order(score):
    return tuple(sorted(np.argsort(-score, kind="stable")[:5]))

  assert xs.choose(stats, 5, "frequency") == order(frequency)
  assert xs.choose(stats, 5, "router_mass") == order(mass)
  assert xs.choose(stats, 5, "output_norm") == order(np.sum(z * z, axis=1))
  assert xs.choose(stats, 5, "random", seed=1) != xs.choose(stats, 5, "random", seed=2)
  for objective in xs.OBJECTIVES:
    best = xs.subset_error(stats.gram, xs.brute_force(stats.gram, 5, objective)[0], objective)
    chosen = xs.choose(stats, 5, "schur_astar", objective)
    assert xs.subset_error(stats.gram, chosen, objective) == pytest.approx(best, rel=1e-10)
  with pytest.raises(ValueError, match="step_score"):
    xs.choose(stats, 5, "step")
  stats.step_score = -np.arange(12.0)
  assert xs.choose(stats, 5, "step") == (0, 1, 2, 3, 4)
  with pytest.raises(ConfigError, match="method='obs' is not known; valid: frequency, greedy"):
    xs.choose(stats, 5, "obs")


def test_knee_budgets_follow_each_layers_own_curve():
  """--keep=knee on two planted layers with orthogonal experts (err(S) = the
  energy of the dropped): 3 strong experts in one layer, 8 in the other; each
  layer keeps exactly its strong experts."""
  from moejax.posttrain import prune
  from moejax.posttrain.contributions import LayerStatistics

  energies = {0: [100.0, 90.0, 80.0] + [1.0] * 9, 1: [50.0] * 8 + [1.0] * 4}
  rng = np.random.default_rng(0)
  stats = []
  for block, energy in energies.items():
    order = rng.permutation(12)  # the strong experts are not the first indices
    gram = np.diag(np.asarray(energy)[order])
    stats.append(LayerStatistics(block, gram, np.ones(12), np.ones(12), 256))
  for method in ("schur_astar", "greedy", "output_norm"):
    kept, errors = prune.choose_experts(stats, "knee", 2, method, "rescaled", 0)
    for layer in stats:
      strong = np.flatnonzero(np.diag(layer.gram) > 10)
      assert kept[layer.block] == tuple(strong), (method, layer.block)
    assert errors[0] == pytest.approx(9 / 279) and errors[1] == pytest.approx(4 / 404)


@pytest.mark.parametrize(
  "shift, scale", [(0.0, 1.0), (1000.0, 1.0), (-39.0, 1.0), (0.0, 1e-6), (5.0, 1e4)]
)
def test_knee_is_the_same_on_a_shifted_and_scaled_curve(shift, scale):
  """Kneedle scales both axes to [0, 1], so err(m) * scale + shift has the same
  knee: a relative error curve, an absolute one, or one that ends far above zero
  (the two-slope curve's corner at m = 5; a curve with its knee at m = 2)."""
  two_slopes = np.array([100 - 10 * m if m <= 5 else 50 - (m - 5) for m in range(1, 17)], float)
  early = np.array([10.0, 2.0, 1.5, 1.0, 0.5, 0.0])
  assert xs.knee(two_slopes * scale + shift) == 5
  assert xs.knee(early * scale + shift) == 2
