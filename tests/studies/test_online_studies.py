"""The ACE, TMoW and MoLR-MoG studies through moejax.studies.runner at tiny settings:
figures against closed forms (ACE's optimism pays every newcomer, TMoW's true-alpha
mixture error), claim statistics against numpy/scipy by hand, a draw's values
independent of how many draws run, and bad settings refused before any run."""

import importlib
import math

import numpy as np
import pytest
import scipy.special
import scipy.stats

from moejax.errors import ConfigError
from moejax.online import ace
from moejax.studies import runner
from moejax.studies.spec import grid

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def config(name, **overrides):
  c = importlib.import_module(f"moejax.configs.studies.{name}").get_config()
  for key, value in overrides.items():
    c[key] = value
  return c


def run(c, out):
  spec, scorer = runner.prepare(c)
  results = runner.run(spec, scorer, str(out), log=lambda _: None)
  assert (out / runner.PLOT).stat().st_size > 0  # the scorer's own figure
  return results


def metric(results, arm, name, **level):
  return {
    r["draw"]: r["metrics"].get(name)
    for r in results["runs"]
    if r["arm"] == arm and all(r["level"][k] == v for k, v in level.items())
  }


def by_hand_slope_interval(x, y):
  """t-interval of the per-draw least-squares slopes; y [draws, levels]."""
  slopes = np.array([np.polyfit(x, row, 1)[0] for row in y])
  half = scipy.stats.t.ppf(0.975, len(slopes) - 1) * slopes.std(ddof=1) / math.sqrt(len(slopes))
  return slopes.mean(), slopes.mean() - half, slopes.mean() + half


@pytest.mark.integration
def test_ace_study_ucb_closed_form_slopes_by_hand_and_draws_independent(tmp_path):
  horizons = [40, 120, 360]
  c = config(
    "ace",
    draws=4,
    levels=grid(("variant", ["stochastic", "adversarial"]), ("horizon", horizons)),
    settings={"c": 1.0, "block": 8, "decoy": 0.0, "seed": 3, "dense_max_horizon": 40},
  )
  for claim in c.claims:
    if claim.get("at"):
      claim["at"] = {"horizon": 40}
  results = run(c, tmp_path / "a")
  for variant in ("stochastic", "adversarial"):
    for horizon in horizons:  # ucb plays every newcomer: sum_t (max_{i<=t} mu_i - mu_t)
      means = ace.instance(variant, horizon, range(4), seed=3)
      expected = (np.maximum.accumulate(means, axis=1) - means).sum(1)
      got = metric(results, "ucb", "regret", variant=variant, horizon=horizon)
      np.testing.assert_allclose([got[d] for d in range(4)], expected, rtol=1e-12)
      assert metric(results, "ucb_dense", "regret", variant=variant, horizon=horizon) == (
        got if horizon == 40 else {}
      )
    y = np.log(
      [
        [metric(results, "lcb", "regret", variant=variant, horizon=h)[d] for h in horizons]
        for d in range(4)
      ]
    )
    row = next(
      r
      for r in results["claims"]
      if r["arm"] == "lcb" and r["interval"] and r["level"] == {"variant": variant}
    )
    want = by_hand_slope_interval(np.log(horizons), y)
    np.testing.assert_allclose([row["interval"][k] for k in ("mean", "lo", "hi")], want, rtol=1e-9)
  # draw d's values are the same whether 2 or 4 draws run
  fewer = run(
    config("ace", draws=2, levels=c.levels, settings=c.settings, claims=c.claims), tmp_path / "b"
  )
  for arm in ("greedy", "lcb", "lcb_dense"):
    full = metric(results, arm, "regret", variant="stochastic", horizon=40)
    assert metric(fewer, arm, "regret", variant="stochastic", horizon=40) == {
      d: full[d] for d in (0, 1)
    }


def test_ace_interior_variant_lures_greedy_with_lucky_newcomers_and_not_lcb(tmp_path):
  # iid means on [0.25, 0.75]: a newcomer whose one reward is 1 has index 1 > every
  # leader's, so greedy keeps picking newcomers (regret linear in T); LCB does not
  horizons = [300, 900, 2700]
  c = config(
    "ace",
    draws=6,
    levels=grid(("variant", ["interior"]), ("horizon", horizons)),
    arms=[{"name": "greedy"}, {"name": "lcb"}],
    claims=[
      cl
      for cl in config("ace").claims
      if cl["arm"] in ("lcb", "greedy") and cl.get("reference") in (None, "greedy")
    ],
  )
  c.settings.update(block=8)
  means = ace.instance("interior", 2700, range(6), seed=0)
  assert 0.25 <= means.min() and means.max() <= 0.75
  np.testing.assert_array_equal(
    ace.instance("stochastic", 50, range(3), seed=0), ace.stochastic_means(50, 3, seed=0)
  )  # [0, 1] unchanged
  results = run(c, tmp_path / "i")
  greedy = metric(results, "greedy", "regret", horizon=2700)
  lcb = metric(results, "lcb", "regret", horizon=2700)
  assert all(greedy[d] > 3 * lcb[d] for d in range(6)) and min(greedy.values()) > 0.05 * 2700
  rows = {(r["text"][:20], r["level"].get("horizon")): r for r in results["claims"]}
  helps = rows[("pessimism helps: LCB", 2700)]
  assert helps["verdict"] == "reproduces" and helps["source"] == "paper"
  sublinear = rows[("pessimism (LCB) has ", None)]
  assert sublinear["null"] == 1.0 and sublinear["verdict"] == "reproduces"
  assert rows[("greedy's growth expo", None)]["interval"]["lo"] > 0.8


@pytest.mark.integration
def test_tmow_study_true_alpha_mixture_error_matches_its_closed_form(tmp_path):
  # The true-alpha mixture of least-squares experts: E excess = E[sum alpha_d^2] n /
  # (m - n - 1) = 2 / (D + 1) * n / (m - n - 1) (Dirichlet(1); inverse-Wishart mean).
  n, domains, m = 3, 2, 20
  settings = {"dim": n, "domains": domains, "train": m, "unseen": 8, "seed": 1, "headline_shots": 8}
  c = config("tmow", draws=40, levels=grid(("shots", [4, 8])), settings=settings)
  results = run(c, tmp_path / "t")
  values = np.array(list(metric(results, "oracle_alpha", "excess_mse", shots=4).values()))
  expected = 2 / (domains + 1) * n / (m - n - 1)
  assert abs(values.mean() - expected) < 4 * values.std(ddof=1) / math.sqrt(len(values)), (
    values.mean(),
    expected,
  )
  assert metric(results, "refined@tau=0.3", "excess_mse", shots=8) == metric(
    results, "refined", "excess_mse", shots=8
  )  # the sweep's tau = 0.3 is the default arm
  assert metric(results, "refined@tau=0.3", "excess_mse", shots=4) == {}  # headline K only
  assert metric(results, "global", "excess_mse", shots=4) == metric(
    results, "global", "excess_mse", shots=8
  )  # the pooled model does not see the K shots
  kept = metric(results, "tmow_routed", "old_routing_kept", shots=8)
  assert len(kept) == 40 and all(0 <= v <= 1 for v in kept.values())


@pytest.mark.integration
def test_molr_mog_study_metrics_and_slope_by_hand(tmp_path):
  settings = {
    "dim": 6,
    "subspaces": 2,
    "latent_dim": 2,
    "components": 2,
    "steps": 20,
    "eval_samples": 64,
  }
  arms = [{"name": "mog_random"}, {"name": "gaussian_random"}, {"name": "mlp10", "only_n": 64}]
  ns = [16, 32, 64]
  c = config(
    "molr_mog", draws=2, arms=arms, levels=grid(("n", ns), ("sigma", [0.3, 1.0])), settings=settings
  )
  c.claims = [claim for claim in c.claims if claim.get("reference") not in ("mlp", "mlp10")]
  c.claims[0]["at"] = c.claims[1]["at"] = {"n": 64, "sigma": 1.0}
  results = run(c, tmp_path / "m")
  for r in results["runs"]:
    assert r["metrics"]["log_l2_error"] == pytest.approx(
      0.5 * math.log(r["metrics"]["score_error"]), rel=1e-12
    )
    assert ("dsm_excess" in r["metrics"]) == (r["level"]["sigma"] == 1.0)
  assert set(metric(results, "mlp10", "score_error")) == {0, 1}
  assert {tuple(r["level"].values()) for r in results["runs"] if r["arm"] == "mlp10"} == {
    (64, 0.3),
    (64, 1.0),
  }
  y = [
    [metric(results, "mog_random", "log_l2_error", n=k, sigma=1.0)[d] for k in ns] for d in (0, 1)
  ]
  row = next(r for r in results["claims"] if r["interval"] and r["reference"] is None)
  np.testing.assert_allclose(
    [row["interval"][k] for k in ("mean", "lo", "hi")],
    by_hand_slope_interval(np.log(ns), np.asarray(y)),
    rtol=1e-9,
  )


def test_molr_mog_networks_are_trained_from_scratch_at_equal_parameters():
  from moejax.mixtures import molr_mog, score_networks as sn

  c = config("molr_mog")
  s = c.settings
  sizes = {k: s[k] for k in ("subspaces", "latent_dim", "components")}
  data = molr_mog.instance(0, s["dim"], mean_scale=3.0, points=64, **sizes)[1]
  count = {
    name: sn.count_params(molr_mog.build(name, 0, data, dim=s["dim"], **sizes))
    for name in ("mog_random", "gaussian_random", "mlp", "mlp10")
  }
  # one hidden unit of the MLP is 2 D + 2 parameters: equal up to half of one
  assert abs(count["mlp"] - count["mog_random"]) <= s["dim"] + 1, count
  assert abs(count["mlp10"] - 10 * count["mog_random"]) <= s["dim"] + 1, count
  # every claim compares networks trained from scratch, none seeded from the data
  for claim in c.claims:
    for arm in (claim["arm"], claim.get("reference")):
      assert arm is None or arm.endswith("_random") or arm.startswith("mlp"), claim["text"]


def _latent_log_density(mix, k, y):
  """log sum_l pi_kl N(y; mu_kl, S_kl) by scipy (S full or diagonal)."""
  cov = np.asarray(mix.covariances[k], np.float64)
  parts = [
    np.log(float(mix.component_weights[k, comp]))
    + scipy.stats.multivariate_normal(
      np.asarray(mix.means[k, comp], np.float64), cov[comp] if cov.ndim == 3 else np.diag(cov[comp])
    ).logpdf(y)
    for comp in range(len(cov))
  ]
  return scipy.special.logsumexp(parts, axis=0)


@pytest.mark.integration
@pytest.mark.parametrize("rich", [False, True])
def test_molr_mog_data_lie_outside_the_networks_family(rich):
  # the best fit in the networks' family (a 3-component diagonal Gaussian mixture of a
  # subspace's latents, EM with restarts) reaches the truth's held-out log-likelihood
  # for in-family data, and stays measurably below it for the study's data
  from moejax.mixtures import gmm, molr_mog

  s = config("molr_mog").settings
  mix = molr_mog.instance(
    1, 8, 2, 4, 3, mean_scale=3.0, points=8, data_components=s["data_components"] if rich else None
  )[0]
  rng = np.random.default_rng(0)
  cov = np.asarray(mix.covariances[0], np.float64)
  cov = (cov + np.swapaxes(cov, -1, -2)) / 2 if cov.ndim == 3 else cov  # float32 rounding
  weights = np.asarray(mix.component_weights[0], np.float64)
  labels = rng.choice(cov.shape[0], 12000, p=weights / weights.sum())
  y = np.stack(
    [
      rng.multivariate_normal(
        np.asarray(mix.means[0, comp], np.float64),
        cov[comp] if cov.ndim == 3 else np.diag(cov[comp]),
      )
      for comp in labels
    ]
  )
  train, held = y[:8000], y[8000:]
  fits = [gmm.fit(train, 3, seed=seed, diagonal=True, max_steps=300)[0] for seed in range(4)]
  best = max(fits, key=lambda f: float(gmm.log_likelihood(train, f)))
  gap = _latent_log_density(mix, 0, held).mean() - float(gmm.log_likelihood(held, best)) / len(held)
  if rich:
    assert gap > 0.1, gap
  else:
    assert abs(gap) < 0.02, gap


@pytest.mark.parametrize(
  "name, overrides, message",
  [
    ("ace", {"settings": {"c": -1.0}}, r"study.settings.c: .*c=-1.0"),
    ("ace", {"arms": [{"name": "thompson"}]}, r"study.arms\[0\].policy='thompson'"),
    ("ace", {"levels": [{"variant": "adversarial", "horizon": 0}]}, r"study.levels\[0\].horizon=0"),
    ("tmow", {"settings": {"radius": 1.5}}, r"study.settings.radius=1.5 must be in \(0, 1\)"),
    ("tmow", {"settings": {"headline_shots": 5}}, r"study.settings.headline_shots=5"),
    (
      "tmow",
      {"arms": [{"name": "x", "method": "global", "tau": 0.1}]},
      r"study.arms\[0\].tau \(arm 'x'\) is for method 'refined' only",
    ),
    ("molr_mog", {"settings": {"latent_dim": 80}}, r"study.settings: .*latent_dim=80"),
    (
      "molr_mog",
      {"settings": {"sigma_min": 5.0, "sigma_max": 1.0}},
      r"study.settings.sigma_min=5.0 must be <=",
    ),
    ("molr_mog", {"settings": {"report_sigma": 2.0}}, r"study.settings.report_sigma=2.0"),
    ("molr_mog", {"arms": [{"name": "unet"}]}, r"study.arms\[0\].model='unet'"),
    ("molr_mog", {"settings": {"data_components": 0}}, r"study.settings.data_components=0"),
  ],
)
def test_bad_settings_are_refused_before_any_run(tmp_path, name, overrides, message):
  c = config(name, **overrides)
  if "arms" in overrides or "levels" in overrides:  # the claims name other arms and levels
    c.claims = []
  if "arms" in overrides:
    c.reference = overrides["arms"][0]["name"]
  with pytest.raises(ConfigError, match=message) as error:
    runner.prepare(c)
  assert "\n" not in str(error.value)
