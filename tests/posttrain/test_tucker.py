"""TD-MoE's whitened joint Tucker decomposition (moejax/posttrain/tucker.py)
against Eckart-Young, the activation error computed directly, brute force over
every rank triple, and per-expert SVD at equal parameters."""

import itertools

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import tucker as tk


def decaying_tensor(shape, seed):
  """Random orthogonal factors around a core whose energy decays at a different
  rate along each mode (so the best rank triple is not a cube)."""
  rng = np.random.default_rng(seed)
  decay = [np.exp(-rate * np.arange(d)) for rate, d in zip((0.5, 0.25, 0.15), shape)]
  core = rng.normal(size=shape) * np.einsum("a,b,c->abc", *decay)
  factors = [np.linalg.qr(rng.normal(size=(d, d)))[0] for d in shape]
  return tk.reconstruct(core, *factors)


def anisotropic_inputs(n, d, seed, spread=2.0):
  """X [n, d] whose covariance eigenvalues span 10^(2 spread), in a random basis."""
  rng = np.random.default_rng(seed)
  basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
  return rng.normal(size=(n, d)) * np.logspace(0, -spread, d) @ basis.T


def relative(a, b):
  return np.linalg.norm(a - b) / np.linalg.norm(b)


def fit_error(tensor, ranks, iterations=5):
  return float(np.sum((tensor - tk.tucker(tensor, ranks, iterations).reconstruct()) ** 2))


@pytest.mark.parametrize("whitening", ["none", "input", "input_and_output"])
def test_full_ranks_reconstruct_exactly(whitening):
  rng = np.random.default_rng(0)
  W = rng.normal(size=(4, 6, 5))
  if whitening == "none":
    model = tk.tucker(W, W.shape)
  else:
    outputs = anisotropic_inputs(50, 5, seed=2) if whitening == "input_and_output" else None
    model = tk.td_moe(W, anisotropic_inputs(80, 6, seed=1), W.shape, output_samples=outputs)
  assert relative(model.reconstruct(), W) < 1e-5
  assert (
    relative(
      np.einsum("ia,eab,ob->eio", model.input_factor, model.expert_cores(), model.output_factor), W
    )
    < 1e-5
  )
  assert model.parameters == tk.tucker_parameters(W.shape, W.shape) == 4 * 6 * 5 + 16 + 36 + 25
  assert relative(tk.per_expert_svd(W, 5).reconstruct(), W) < 1e-5


def test_one_truncated_mode_is_eckart_young_and_per_expert_svd_keeps_the_top_values():
  W = decaying_tensor((4, 7, 6), seed=3)
  sigma2 = np.linalg.svd(W.transpose(1, 0, 2).reshape(7, -1), compute_uv=False) ** 2
  # full expert and output ranks: the best rank-3 fit of the input-mode unfolding
  assert fit_error(W, (4, 3, 6)) == pytest.approx(sigma2[3:].sum(), rel=1e-9)
  np.testing.assert_allclose(tk.mode_spectra(W)[1], sigma2, rtol=1e-9)
  per_expert = np.linalg.svd(W, compute_uv=False) ** 2  # [E, 6]
  error = np.sum((W - tk.per_expert_svd(W, 2).reconstruct()) ** 2)
  assert error == pytest.approx(per_expert[:, 2:].sum(), rel=1e-9)
  assert tk.per_expert_svd(W, 2).parameters == tk.svd_parameters(W.shape, 2) == 4 * 2 * 13


def test_hooi_lowers_the_hosvd_error_and_truncation_errors_are_the_hosvd_errors():
  W = decaying_tensor((5, 8, 7), seed=4)
  table = tk.truncation_errors(W)
  assert table.shape == (6, 9, 8) and table[5, 8, 7] == pytest.approx(0.0, abs=1e-9)
  cases = [(1, 1, 1), (2, 3, 2), (3, 5, 4), (5, 2, 6), (4, 8, 3)]
  hooi_gain = sum(fit_error(W, r, 5) for r in cases) / sum(fit_error(W, r, 0) for r in cases)
  print(f"HOOI / HOSVD error, summed over {len(cases)} rank triples: {hooi_gain:.3f}")
  assert hooi_gain < 0.97  # the sweeps do something
  for ranks in cases:
    hosvd, hooi = tk.tucker(W, ranks, iterations=0), tk.tucker(W, ranks, iterations=5)
    for model in (hosvd, hooi):
      for factor in (model.expert_factor, model.input_factor, model.output_factor):
        np.testing.assert_allclose(factor.T @ factor, np.eye(factor.shape[1]), atol=1e-10)
      # orthonormal factors and G the projection: the error is the energy left out
      error = np.sum((W - model.reconstruct()) ** 2)
      assert error == pytest.approx(np.sum(W**2) - np.sum(model.core**2), rel=1e-8, abs=1e-10)
    assert fit_error(W, ranks, 0) == pytest.approx(table[ranks], rel=1e-8, abs=1e-10)
    assert fit_error(W, ranks, 5) <= table[ranks] * (1 + 1e-10)
    assert table[ranks] <= tk.spectral_bound(tk.mode_spectra(W), ranks) * (1 + 1e-10)


def test_whitened_error_times_n_is_the_activation_error():
  rng = np.random.default_rng(5)
  W = rng.normal(size=(4, 9, 6))
  X = anisotropic_inputs(120, 9, seed=6, spread=1.5)
  S = tk.whitening(X, damping=0.0)
  np.testing.assert_allclose(S @ S.T, X.T @ X / 120, rtol=1e-12, atol=1e-14)
  for W_hat in (
    tk.td_moe(W, X, (2, 4, 3), damping=0.0).reconstruct(),
    tk.per_expert_svd(W, 2).reconstruct(),
    W + rng.normal(size=W.shape),
  ):
    direct = tk.activation_error(W, W_hat, X)
    loop = sum(np.sum((X @ W[e] - X @ W_hat[e]) ** 2) for e in range(4))
    assert direct == pytest.approx(loop, rel=1e-12)
    assert 120 * tk.whitened_error(W, W_hat, S) == pytest.approx(direct, rel=1e-6)
    # with damping: the exact identity of the module doc
    damped = tk.whitening(X, damping=1e-2)
    lam = 1e-2 * np.mean(np.sum(X**2, axis=0) / 120)
    assert 120 * tk.whitened_error(W, W_hat, damped) == pytest.approx(
      direct + 120 * lam * np.sum((W - W_hat) ** 2), rel=1e-9
    )


def test_td_moe_error_is_the_tucker_error_of_the_whitened_tensor():
  """Un-whitening U_in (and U_out) maps the whitened fit back exactly."""
  rng = np.random.default_rng(7)
  W = rng.normal(size=(5, 8, 6))
  X, Y = anisotropic_inputs(100, 8, seed=8), anisotropic_inputs(90, 6, seed=9)
  S, R = tk.whitening(X), tk.whitening(Y)
  ranks = (3, 4, 3)
  whitened = tk.whiten(W, S)
  expected = fit_error(whitened, ranks)
  assert tk.whitened_error(W, tk.td_moe(W, X, ranks).reconstruct(), S) == pytest.approx(
    expected, rel=1e-8
  )
  both = np.einsum("ejo,ol->ejl", whitened, R)
  W_hat = tk.td_moe(W, X, ranks, output_samples=Y).reconstruct()
  assert np.sum(np.einsum("ejo,ol->ejl", tk.whiten(W - W_hat, S), R) ** 2) == pytest.approx(
    fit_error(both, ranks), rel=1e-8
  )


@pytest.mark.parametrize("shape", [(8, 32, 32), (4, 7, 6), (2, 5, 20)])
def test_a_factorisation_never_costs_more_than_the_dense_tensor(shape):
  """Full Tucker ranks cost E d_in d_out + E^2 + d_in^2 + d_out^2, more than dense
  (tiny zoo experts: 8 x 32 x 32 = 8,192 dense, 10,304 at full rank); the ranks
  allocated at any budget, or capped from full ranks, never exceed the dense size;
  budgets split per tensor are (1 - removed) of each tensor's dense size."""
  from moejax.posttrain import factorise

  W = decaying_tensor(shape, seed=3)
  dense = tk.dense_parameters(shape)
  assert tk.tucker_parameters(shape, shape) > dense
  for budget in (dense // 2, dense, 2 * dense, 10 * dense):
    ranks = tk.allocate_ranks(W, budget)
    assert tk.tucker_parameters(shape, ranks) <= min(budget, dense)
    assert is_maximal(shape, ranks, min(budget, dense))
  capped = tk.capped_ranks(W, shape)
  assert tk.tucker_parameters(shape, capped) <= dense and is_maximal(shape, capped, dense)
  assert tk.capped_ranks(W, (1, 2, 2)) == (1, 2, 2)  # under dense: kept
  e, d, f = shape
  experts = {"w_gate": W, "w_up": W, "w_down": np.swapaxes(W, 1, 2)}
  full = factorise.resolve_ranks(
    {p: np.shape(v) for p, v in experts.items()}, (0, 0, 0), experts, cap=True
  )
  assert all(tk.tucker_parameters(np.shape(experts[p]), r) <= dense for p, r in full.items())
  assert tk.tensor_budgets([shape, (e, f, d)], 0.4) == [int(0.6 * dense)] * 2


def is_maximal(shape, ranks, budget):
  for k in range(3):
    if ranks[k] < shape[k]:
      bigger = list(ranks)
      bigger[k] += 1
      if tk.tucker_parameters(shape, bigger) <= budget:
        return False
  return True


def low_multilinear_rank(shape, ranks, seed):
  """Exactly of Tucker ranks `ranks`: every larger triple has zero error (ties)."""
  rng = np.random.default_rng(seed)
  return tk.reconstruct(
    rng.normal(size=ranks), *[rng.normal(size=(d, r)) for d, r in zip(shape, ranks)]
  )


@pytest.mark.parametrize("method", tk.ALLOCATIONS)
@pytest.mark.parametrize(
  "shape, planted",
  [((4, 7, 6), None), ((8, 16, 12), None), ((3, 5, 20), None), ((6, 9, 8), (2, 2, 3))],
)
def test_allocation_meets_the_budget_and_is_maximal(method, shape, planted):
  W = (
    decaying_tensor(shape, seed=sum(shape))
    if planted is None
    else low_multilinear_rank(shape, planted, seed=1)
  )
  full = tk.tucker_parameters(shape, shape)
  minimum = tk.tucker_parameters(shape, (1, 1, 1))
  for budget in sorted(
    {minimum, minimum + 1, int(0.2 * full), int(0.5 * full), full - 1, full, 10 * full}
  ):
    if budget < minimum:
      continue
    ranks = tk.allocate_ranks(W, budget, method)
    within = min(budget, tk.dense_parameters(shape))  # never above the dense tensor
    assert tk.tucker_parameters(shape, ranks) <= within, (budget, ranks)
    assert is_maximal(shape, ranks, within), (budget, ranks)
  assert full > tk.dense_parameters(shape)  # so full ranks are never allocated


def hand_choices(shape, budget):
  """Rules a person might use: equal ranks (capped by the dims), all experts
  with equal in/out ranks, and ranks proportional to the dims; each the largest
  that fits."""
  e, di, do = shape
  rules = {
    "cube": lambda r: (min(r, e), min(r, di), min(r, do)),
    "all_experts": lambda r: (e, min(r, di), min(r, do)),
    "proportional": lambda r: tuple(max(1, round(r * d / max(shape))) for d in shape),
  }
  out = {}
  for name, rule in rules.items():
    fits = [
      rule(r) for r in range(1, max(shape) + 1) if tk.tucker_parameters(shape, rule(r)) <= budget
    ]
    if fits:
      out[name] = fits[-1]
  return out


@pytest.mark.parametrize("seed", range(3))
def test_allocation_matches_brute_force_over_every_rank_triple(seed):
  shape = (4, 7, 6)
  W = decaying_tensor(shape, seed)
  triples = list(itertools.product(*[range(1, d + 1) for d in shape]))
  hosvd = {r: fit_error(W, r, 0) for r in triples}
  hooi = {r: fit_error(W, r, 5) for r in triples}
  for budget in (40, 60, 90, 130):
    feasible = [r for r in triples if tk.tucker_parameters(shape, r) <= budget]
    ranks, greedy = tk.allocate_ranks(W, budget), tk.allocate_ranks(W, budget, "greedy")
    # exact on its objective, the truncated HOSVD error, over all feasible triples
    assert hosvd[ranks] == pytest.approx(min(hosvd[r] for r in feasible), rel=1e-9, abs=1e-12)
    best = min(hooi[r] for r in feasible)
    hands = hand_choices(shape, budget)
    print(
      f"seed {seed} budget {budget}: exact {ranks} HOOI error / brute-force best "
      f"{hooi[ranks] / best:.3f}, greedy {greedy} {hooi[greedy] / best:.3f}, "
      + ", ".join(f"{k} {r} {hooi[r] / best:.3f}" for k, r in hands.items())
    )
    # it ranks triples by the HOSVD error, HOOI's start: near the HOOI optimum,
    # and no worse than a hand rule beyond that gap (seed 2, budget 90: 0.5%)
    assert hooi[ranks] <= 1.05 * best
    for r in hands.values():
      assert hooi[ranks] <= 1.01 * hooi[r]
    assert hooi[greedy] <= 1.6 * best
    bound = {r: tk.spectral_bound(tk.mode_spectra(W), r) for r in feasible}
    assert bound[greedy] <= 1.1 * min(bound.values())


def test_allocate_layers_shares_one_budget_and_favours_the_energetic_layer():
  shapes = [(4, 10, 8), (4, 10, 8), (6, 8, 12)]
  tensors = [
    scale * decaying_tensor(s, seed) for seed, (s, scale) in enumerate(zip(shapes, (1.0, 4.0, 0.5)))
  ]
  budget = sum(tk.tucker_parameters(s, s) for s in shapes) // 3
  ranks = tk.allocate_layers(tensors, budget)
  used = [tk.tucker_parameters(s, r) for s, r in zip(shapes, ranks)]
  assert sum(used) <= budget
  for s, r in zip(shapes, ranks):  # no rank of any layer fits one more
    assert is_maximal(s, r, budget - sum(used) + tk.tucker_parameters(s, r))
  assert used[1] > used[0]  # same shape, 4x the weights
  joint = sum(fit_error(t, r) for t, r in zip(tensors, ranks))
  equal_split = sum(fit_error(t, tk.allocate_ranks(t, budget // 3)) for t in tensors)
  print(
    f"ranks {ranks}, parameters {used} of {budget}; error global / equal split "
    f"{joint / equal_split:.3f}"
  )
  assert joint < equal_split


@pytest.mark.parametrize(
  "shapes, scales",
  [
    ([(4, 7, 6), (3, 4, 12)], (1.0, 1.0)),
    ([(4, 7, 6), (3, 4, 12)], (3.0, 0.5)),
    ([(2, 5, 5), (4, 8, 6)], (1.0, 2.0)),
    ([(6, 3, 10), (2, 9, 4)], (1.0, 1.0)),
  ],
)
def test_allocate_layers_is_near_the_brute_force_best_spectral_bound(shapes, scales):
  """Every pair of rank triples of two tensors: the greedy's total HOSVD bound
  against the least one within the budget (either greedy order alone: up to 1.2x)."""
  worst = 1.0
  for seed in range(3):
    tensors = [
      s * decaying_tensor(shape, 7 * seed + i) for i, (shape, s) in enumerate(zip(shapes, scales))
    ]
    spectra = [tk.mode_spectra(t) for t in tensors]
    tables = []
    for shape, spectrum in zip(shapes, spectra):
      triples = list(itertools.product(*[range(1, d + 1) for d in shape]))
      tables.append(
        (
          np.array([tk.tucker_parameters(shape, r) for r in triples]),
          np.array([tk.spectral_bound(spectrum, r) for r in triples]),
        )
      )
    params = tables[0][0][:, None] + tables[1][0][None, :]
    bounds = tables[0][1][:, None] + tables[1][1][None, :]
    for fraction in (0.15, 0.3, 0.5):
      budget = int(fraction * sum(tk.tucker_parameters(s, s) for s in shapes))
      ranks = tk.allocate_layers(tensors, budget)
      assert sum(tk.tucker_parameters(s, r) for s, r in zip(shapes, ranks)) <= budget
      total = sum(tk.spectral_bound(s, r) for s, r in zip(spectra, ranks))
      worst = max(worst, total / bounds[params <= budget].min())
  print(f"{shapes} scales {scales}: greedy / best total bound, worst of 9: {worst:.3f}")
  assert worst <= 1.05


def shared_output_basis_experts(seed, experts=8, d_in=16, d_out=48, rank=4, noise=0.05):
  """W_e = A_e @ B: every expert's rows lie in one shared rank-4 subspace, plus noise."""
  rng = np.random.default_rng(seed)
  shared = rng.normal(size=(rank, d_out))
  return rng.normal(size=(experts, d_in, rank)) @ shared + noise * rng.normal(
    size=(experts, d_in, d_out)
  )


@pytest.mark.parametrize("svd_rank", [2, 3])
def test_joint_decomposition_beats_per_expert_svd_at_equal_parameters(svd_rank):
  for seed in range(3):
    W = shared_output_basis_experts(seed)
    X = np.random.default_rng(100 + seed).normal(size=(200, 16))
    budget = tk.svd_parameters(W.shape, svd_rank)
    assert tk.svd_rank_for_budget(W.shape, budget) == svd_rank
    joint = tk.compress(W, X, budget)
    assert joint.parameters <= budget
    errors = {
      name: tk.activation_error(W, model.reconstruct(), X)
      for name, model in [
        ("td_moe", joint),
        ("svd", tk.per_expert_svd(W, svd_rank)),
        ("whitened_svd", tk.whitened_per_expert_svd(W, X, svd_rank)),
      ]
    }
    print(
      f"seed {seed} budget {budget}: td_moe ranks {joint.core.shape} ({joint.parameters}); "
      f"activation error td_moe / per-expert SVD {errors['td_moe'] / errors['svd']:.4f}, "
      f"/ whitened per-expert SVD {errors['td_moe'] / errors['whitened_svd']:.4f}"
    )
    assert errors["td_moe"] < 0.05 * errors["whitened_svd"]
    assert errors["whitened_svd"] <= errors["svd"] * (1 + 1e-9)


def test_whitening_helps_on_anisotropic_inputs():
  for seed in range(3):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(6, 16, 12))
    X = anisotropic_inputs(400, 16, seed=50 + seed)
    ranks = (4, 6, 6)
    whitened, plain = tk.td_moe(W, X, ranks), tk.tucker(W, ranks)
    ratio = tk.activation_error(W, whitened.reconstruct(), X) / tk.activation_error(
      W, plain.reconstruct(), X
    )
    svd_ratio = tk.activation_error(
      W, tk.whitened_per_expert_svd(W, X, 4).reconstruct(), X
    ) / tk.activation_error(W, tk.per_expert_svd(W, 4).reconstruct(), X)
    print(
      f"seed {seed}: activation error whitened / plain joint Tucker {ratio:.3f}, "
      f"whitened / plain per-expert SVD {svd_ratio:.3f}"
    )
    assert ratio < 0.8 and svd_ratio < 0.8


W_SMALL = np.ones((4, 6, 5))


@pytest.mark.parametrize(
  "call, named",
  [
    (lambda: tk.allocate_ranks(W_SMALL, 15), "budget=15"),  # minimum 1 + 4 + 6 + 5 = 16
    (lambda: tk.allocate_layers([W_SMALL, W_SMALL], 31), "budget=31"),
    (lambda: tk.allocate_ranks(W_SMALL, 100, "optimal"), "method='optimal'"),
    (lambda: tk.tucker(W_SMALL, (5, 2, 2)), "expert=5"),
    (lambda: tk.tucker(W_SMALL, (2, 0, 2)), "in=0"),
    (lambda: tk.td_moe(W_SMALL, np.ones((3, 6)), (2, 2, 6)), "out=6"),
    (lambda: tk.tucker(W_SMALL, (2, 2)), r"ranks=\(2, 2\)"),
    (lambda: tk.per_expert_svd(W_SMALL, 6), "rank=6"),
    (lambda: tk.whitened_per_expert_svd(W_SMALL, np.ones((3, 6)), 0), "rank=0"),
    (lambda: tk.svd_rank_for_budget(W_SMALL.shape, 43), "budget=43"),  # one rank: 44
  ],
)
def test_bad_budgets_and_ranks_are_refused(call, named):
  with pytest.raises(ConfigError, match=named):
    call()
