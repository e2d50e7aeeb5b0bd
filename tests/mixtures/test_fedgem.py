"""FedGEM and its EM (moejax/mixtures/{gmm,fedgem}.py) against oracles: Q evaluated
directly around the closed-form radius, hand-built ball graphs, the true clusters,
centralised EM with one client, EM's monotone likelihood, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.evaluation.partitions import adjusted_rand_index
from moejax.mixtures import fedgem, gmm, synthetic


def blobs(seed, means, points, std=1.0):
  """Points around each mean (float64) and their true labels."""
  rng = np.random.default_rng(seed)
  labels = np.repeat(np.arange(len(means)), points)
  return np.asarray(means)[labels] + std * rng.normal(size=(len(labels), len(means[0]))), labels


def random_model(seed, k, dim, diagonal):
  rng = np.random.default_rng(seed)
  shape = (k, dim) if diagonal else (k,)
  return gmm.GMM(
    weights=jnp.asarray(rng.dirichlet(np.ones(k))),
    means=jnp.asarray(rng.normal(scale=3.0, size=(k, dim))),
    variances=jnp.asarray(rng.uniform(0.5, 3.0, size=shape)),
  )


@pytest.mark.parametrize("diagonal", [False, True])
def test_q_rises_inside_the_radius_and_falls_just_outside(diagonal):
  with jax.enable_x64(True):
    x, _ = blobs(0, [[0.0, 0.0, 0.0], [5.0, 1.0, 0.0], [0.0, 6.0, 2.0]], 60)
    old = random_model(1, 3, 3, diagonal)
    resp, _ = gmm.e_step(jnp.asarray(x), old)
    maximised, resp2, radii = fedgem.local_em(jnp.asarray(x), old)
    np.testing.assert_allclose(resp2, resp, rtol=1e-12)
    q_old = float(gmm.q_function(x, resp, old))

    def q_at(k, mu):
      return float(
        gmm.q_function(
          x,
          resp,
          old._replace(means=old.means.at[k].set(mu)),
        )
      )

    rng = np.random.default_rng(2)
    variances = np.asarray(gmm.per_dim_variances(old.variances, 3))
    for k in range(3):
      centre, eps = np.asarray(maximised.means[k]), float(radii[k])
      assert eps > 0.1
      directions = rng.normal(size=(20, 3))
      directions /= np.linalg.norm(directions, axis=1, keepdims=True)
      worst = np.eye(3)[np.argmin(variances[k])]  # Q falls fastest along the smallest variance
      for u in [*directions, worst]:
        assert q_at(k, centre + 0.999 * eps * u) >= q_old
      assert q_at(k, centre + 1.001 * eps * worst) < q_old
      if not diagonal:  # every direction fails outside, and the closed form holds
        assert all(q_at(k, centre + 1.001 * eps * u) < q_old for u in directions)
        mu = centre + 0.7 * eps * directions[0]
        count, var = float(jnp.sum(resp[:, k])), float(old.variances[k])
        np.testing.assert_allclose(
          q_at(k, mu) - q_at(k, centre), -count / (2 * var) * np.sum((mu - centre) ** 2), rtol=1e-9
        )


def test_means_inside_the_balls_never_lower_the_likelihood():
  """The GEM step: any means inside the balls, then the variances at them, raise log p."""
  with jax.enable_x64(True):
    x, _ = blobs(3, [[0.0, 0.0], [4.0, 0.0], [0.0, 5.0]], 50)
    x = jnp.asarray(x)
    rng = np.random.default_rng(4)
    for trial in range(10):
      old = random_model(10 + trial, 3, 2, diagonal=False)
      maximised, resp, radii = fedgem.local_em(x, old)
      step = rng.normal(size=(3, 2))
      step *= (
        rng.uniform(size=(3, 1))
        * np.asarray(radii)[:, None]
        / np.linalg.norm(step, axis=1, keepdims=True)
      )
      new = fedgem.set_means(x, resp, maximised, maximised.means + step)
      assert float(gmm.log_likelihood(x, new)) >= float(gmm.log_likelihood(x, old)) - 1e-9


def test_server_merge_joins_chains_of_intersecting_balls_of_different_clients():
  centres = [[0.0, 0.0], [1.5, 0.0], [3.0, 0.0], [20.0, 0.0], [23.0, 0.0]]
  radii = [1.0, 1.0, 1.0, 1.0, 1.99]  # 0-1 and 1-2 overlap, 0-2 do not; 3-4 miss by 0.01
  owners = [0, 1, 2, 0, 1]
  np.testing.assert_array_equal(fedgem.server_merge(centres, radii, owners), [0, 0, 0, 1, 2])
  # The same client's balls never join, even through another client's ball.
  merged = fedgem.server_merge([[0.0, 0.0], [2.0, 0.0], [0.8, 0.0]], [1.0, 1.0, 1.0], [0, 0, 1])
  np.testing.assert_array_equal(merged, [0, 1, 0])  # 2 overlaps 1 less deeply than 0
  # Earlier groups stay joined.
  np.testing.assert_array_equal(
    fedgem.server_merge([[0.0], [9.0]], [0.1, 0.1], [0, 1], groups=[4, 4]), [0, 0]
  )


def test_connected_components_are_the_true_clusters_on_separated_data():
  rng = np.random.default_rng(5)
  means = 12.0 * np.array([[i, j] for i in range(4) for j in range(2)], float)  # K = 8
  holdings = [[0, 1, 2], [2, 3, 4, 5], [5, 6, 7], [0, 3, 7], [1, 4, 6, 7]]
  clients, truth = [], []
  for held in holdings:
    x, labels = blobs(int(rng.integers(1 << 30)), means[held], 80)
    clients.append(x.astype(np.float32))
    truth.append(np.asarray(held)[labels])
  result = fedgem.fedgem(clients, [len(h) for h in holdings], seed=0)
  assert result.num_clusters == 8
  pairs = set()
  for g, held in enumerate(holdings):
    predicted = result.labels[g]
    for k in range(len(held)):  # each local component covers one true cluster
      assert len(set(truth[g][predicted == result.component_cluster[g][k]])) == 1
    pairs |= set(zip(truth[g].tolist(), predicted.tolist()))
  assert len(pairs) == 8 and len({p for _, p in pairs}) == 8  # a bijection
  np.testing.assert_allclose(
    np.sort(result.global_model.means[:, 0]), np.sort(means[:, 0]), atol=0.5
  )


@pytest.mark.parametrize("diagonal", [False, True])
def test_one_client_fedgem_is_centralised_em(diagonal):
  with jax.enable_x64(True):
    x, _ = blobs(6, [[0.0, 0.0], [2.5, 0.5], [0.5, 3.0]], 70)
    init = gmm.init_gmm(x, 3, seed=0, diagonal=diagonal)
    result = fedgem.fedgem([x], [3], init=[init], max_rounds=40, tol=0)
    central, _ = gmm.fit(x, 3, init=init, max_steps=40, tol=0)
    assert result.rounds == 40 and result.num_clusters == 3
    for ours, theirs in zip(result.local_models[0], central):
      np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.global_model.means, central.means, atol=1e-6)


@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_log_likelihood_never_decreases(diagonal, seed):
  with jax.enable_x64(True):
    x, _ = blobs(seed, [[0.0, 0.0], [1.5, 0.0], [0.0, 2.0], [2.0, 2.0]], 40, std=0.8)
    _, history = gmm.fit(x, 4, seed=seed, max_steps=60, tol=0, diagonal=diagonal)
    assert len(history) == 61
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[:-1])), np.diff(history).min()
    assert history[-1] > history[0] + 1.0


def test_kfed_and_centralised_em_recover_separated_clusters():
  x, truth = blobs(7, [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], 60)
  clients = [x[:90], x[90:]]
  _, labels = fedgem.kfed(clients, [2, 2], 3, seed=0)
  assert adjusted_rand_index(truth, np.concatenate(labels)) == pytest.approx(1.0)
  _, labels = fedgem.centralised_em(clients, 3, seed=0)
  assert adjusted_rand_index(truth, np.concatenate(labels)) == pytest.approx(1.0)


def test_refusals():
  x = np.zeros((5, 2))
  for k in (0, 6):
    with pytest.raises(ConfigError, match=f"K={k}"):
      gmm.fit(x, k)
    with pytest.raises(ConfigError, match=f"K={k}"):
      gmm.init_gmm(x, k, seed=0)
  with pytest.raises(ConfigError, match="client 1 holds no points"):
    fedgem.fedgem([x, np.zeros((0, 2))], [2, 1])
  with pytest.raises(ConfigError, match="client 0: .*K=6"):
    fedgem.fedgem([x], [6])
  with pytest.raises(ConfigError, match="local_ks"):
    fedgem.fedgem([x], [2, 2])
  with pytest.raises(ConfigError, match="server_step"):
    fedgem.fedgem([x], [2], server_step="mean")
  with pytest.raises(ConfigError, match="client 1 holds no points"):
    fedgem.kfed([x, np.zeros((0, 2))], [2, 1], 2)
  with pytest.raises(ConfigError, match="K=5"):
    fedgem.kfed([x], [2], 5)


@pytest.mark.parametrize("seed", range(4))
def test_federated_clusters_hold_every_cluster_at_the_given_separation(seed):
  rng = np.random.default_rng(seed)
  data, labels, local_ks = synthetic.federated_clusters(
    rng, 2.5, clusters=8, clients=5, held=(3, 4), dim=2, points=4000
  )
  assert sorted(set(np.concatenate(labels).tolist())) == list(range(8))
  assert local_ks == [len(set(y.tolist())) for y in labels] and all(3 <= k <= 4 for k in local_ks)
  for x, y in zip(data, labels):
    assert x.dtype == np.float32 and len(x) == 4000 * len(set(y.tolist()))
  x, y = np.concatenate(data).astype(np.float64), np.concatenate(labels)
  means = np.stack([x[y == k].mean(0) for k in range(8)])  # noise std 1: error ~ 0.01
  gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)[~np.eye(8, dtype=bool)]
  assert abs(gaps.min() - 2.5) < 0.1
  residual = np.concatenate([x[y == k] - means[k] for k in range(8)])
  np.testing.assert_allclose(residual.std(0), 1.0, atol=0.02)


@pytest.mark.parametrize(
  "held, clients, match",
  [
    ((5, 4), 5, "min_held=5, max_held=4"),
    ((0, 2), 5, "min_held=0"),
    ((3, 9), 5, "max_held=9, clusters=8"),
    ((1, 2), 3, "clients=3, max_held=2"),
  ],
)
def test_federation_refusals_name_the_values(held, clients, match):
  with pytest.raises(ConfigError, match=match):
    synthetic.federated_clusters(
      np.random.default_rng(0), 2.0, clusters=8, clients=clients, held=held, dim=2, points=5
    )


def test_the_stopping_rule_is_relative_to_the_size_of_the_means():
  """One client (FedGEM = centralised EM) with its data 1000 away from the origin:
  the rounds stop at the first EM step whose largest mean move is at most
  tol * (1 + max |mean|), replayed here with gmm.em_step from the same start. At
  this offset an absolute rule (tol alone) would run many more rounds."""
  tol = 1e-5
  with jax.enable_x64(True):
    x, _ = blobs(3, [[1000.0, 1000.0], [1003.0, 1000.5], [1000.5, 1003.5]], 50)
    init = gmm.init_gmm(x, 3, seed=0)
    model, means, stop, absolute = init, np.asarray(init.means), None, None
    for step in range(1, 200):
      model, _ = gmm.em_step(x, model)
      new = np.asarray(model.means)
      move = np.max(np.abs(new - means))
      if stop is None and move <= tol * (1 + np.abs(means).max()):
        stop = step
      if absolute is None and move <= tol:
        absolute = step
        break
      means = new
    assert stop is not None and absolute is not None and absolute > stop + 3, (stop, absolute)
    result = fedgem.fedgem([x], [3], init=[init], tol=tol)
    assert result.rounds == stop
