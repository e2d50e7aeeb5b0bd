"""The mixture studies (configs/studies/{kmeans,fedgem,mgfa}.py) through the runner at tiny
settings, against oracles: a perfect partition's NMI and ARI are 1, Wilson intervals of
the 0/1 metrics on their counts, each draw's figures rebuilt from its documented seed by
the library functions (a float64 objective by hand), the Frechet slope by least squares,
which arms run where, and bad settings refused in one line before any run."""
import importlib.util
import math

import numpy as np
import pytest
import scipy.stats

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.evaluation.partitions import adjusted_rand_index, nmi
from moejax.studies import report, runner


def load_config(name):
  spec = importlib.util.spec_from_file_location(name, f"configs/studies/{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def run(config, tmp_path):
  return runner.run(*runner.prepare(config), str(tmp_path / "out"), plot=False,
                    log=lambda _: None)


def metric(results, arm, name, **level):
  """{draw: value} of `name` for `arm` at the level matching `level`."""
  return {r["draw"]: r["metrics"][name] for r in results["runs"]
          if r["arm"] == arm and name in r["metrics"]
          and all(r["level"][k] == v for k, v in level.items())}


def claim_row(results, text_start, **level):
  rows = [r for r in results["claims"] if r["text"].startswith(text_start)
          and all(r["level"][k] == v for k, v in level.items())]
  assert len(rows) == 1, rows
  return rows[0]


def refused(config, *names):
  with pytest.raises(ConfigError) as error:
    runner.prepare(config)
  message = str(error.value)
  assert "\n" not in message and all(n in message for n in names), message


# ---- kmeans -----------------------------------------------------------------------------

def test_kmeans_study_against_its_oracles(tmp_path):
  from moejax.mixtures import kmeans, synthetic
  config = load_config("kmeans")
  config.levels = [{"d": 2, "separation": 20.0}, {"d": 2000, "separation": 10.0}]
  config.draws = 3
  results = run(config, tmp_path)
  # a perfect partition (well separated, d = 2): NMI exactly 1 for both algorithms
  for arm in ("lloyd", "hartigan"):
    assert metric(results, arm, "nmi", d=2) == {0: 1.0, 1: 1.0, 2: 1.0}
  stuck = metric(results, "lloyd", "returns_initial", d=2000)
  assert stuck == {0: 1.0, 1: 1.0, 2: 1.0}  # the paper's failure, n=40, d=2000
  row = claim_row(results, "at d=2000 Lloyd returns", d=2000)
  assert row["interval"] == stats.wilson(3, 3, null=0.9).as_dict()
  # 3 of 3 at z = 1.96: Wilson's lower end n / (n + z^2) in closed form
  assert row["interval"]["lo"] == pytest.approx(3 / (3 + 1.959963984540054 ** 2))
  # draw 1 rebuilt from its documented seed: same partition, objective by hand in float64
  rng = np.random.default_rng((0, 2000, 10000, 1))
  X, truth, init = synthetic.two_clusters(rng, 40, 2000, 10.0)
  hartigan = kmeans.hartigan(X, init, seed=int(rng.integers(2**31)))
  labels = np.asarray(hartigan.labels)
  X64 = X.astype(np.float64)
  objective = sum(((X64[labels == c] - X64[labels == c].mean(0)) ** 2).sum() for c in (0, 1))
  assert metric(results, "hartigan", "objective", d=2000)[1] == pytest.approx(objective,
                                                                               rel=1e-4)
  assert metric(results, "hartigan", "nmi", d=2000)[1] == pytest.approx(nmi(truth, labels))
  assert metric(results, "initial", "nmi", d=2000)[1] == pytest.approx(nmi(truth, init))


def test_kmeans_draws_do_not_depend_on_how_many_run(tmp_path):
  config = load_config("kmeans")
  config.levels = [{"d": 200, "separation": 10.0}]  # Lloyd sometimes stuck, sometimes not
  config.claims = []
  config.draws = 4
  four = run(config, tmp_path / "four")
  config.draws = 2
  two = run(config, tmp_path / "two")
  for arm in ("lloyd", "hartigan", "initial"):
    for name in ("nmi", "returns_initial", "iterations"):
      whole, part = metric(four, arm, name), metric(two, arm, name)
      assert part == {d: whole[d] for d in part}


@pytest.mark.parametrize("edit, names", [
    (lambda c: c.settings.update(n=1), ["study.settings.n=1"]),
    (lambda c: c.arms[0].update(algorithm="elkan"), ["study.arms[0].algorithm='elkan'"]),
    (lambda c: setattr(c, "levels", [{"d": 2, "separation": 1.0}, {"d": 2000, "separation": 1.0},
                                     {"d": 0, "separation": 1.0}]), ["study.levels[2].d=0"]),
    (lambda c: setattr(c, "levels", [{"d": 2, "separation": -1.0},
                                     {"d": 2000, "separation": 1.0}]),
     ["study.levels[0].separation=-1.0"]),
])
def test_kmeans_refusals(edit, names):
  config = load_config("kmeans")
  edit(config)
  refused(config, *names)


# ---- fedgem -----------------------------------------------------------------------------

def test_fedgem_study_against_its_oracles(tmp_path):
  from moejax.mixtures import fedgem, synthetic
  config = load_config("fedgem")
  config.levels = [{"separation": 12.0}]
  config.draws = 2
  config.settings.points = 30
  config.settings.max_rounds = 30
  results = run(config, tmp_path)
  # far-apart clusters: every method finds the true partition (ARI of a perfect one is 1)
  for arm in ("fedgem", "fedgem_pooled", "kfed"):
    assert metric(results, arm, "ari") == pytest.approx({0: 1.0, 1: 1.0}), arm
  for arm in ("fedgem", "fedgem_pooled"):
    k_hat = metric(results, arm, "k_hat")
    assert metric(results, arm, "k_hat_correct") == {d: float(k == 8) for d, k in k_hat.items()}
  assert "k_hat" not in metric(results, "kfed", "ari") and not metric(results, "kfed", "k_hat")
  hits = sum(metric(results, "fedgem", "k_hat_correct").values())
  row = claim_row(results, "FedGEM finds the number")
  assert row["interval"] == stats.wilson(int(hits), 2, null=0.8).as_dict()
  # draw 1 rebuilt from its documented seed: centralised EM's ARI
  rng = np.random.default_rng([0, 12000, 1])
  data, labels, _ = synthetic.federated_clusters(rng, 12.0, clusters=8, clients=5,
                                                 held=(3, 4), dim=2, points=30)
  _, em_labels = fedgem.centralised_em(data, 8, seed=1, max_steps=30)
  expected = adjusted_rand_index(np.concatenate(labels), np.concatenate(em_labels))
  assert metric(results, "central_em", "ari")[1] == pytest.approx(expected)


@pytest.mark.parametrize("edit, names", [
    (lambda c: c.settings.update(min_held=5), ["study.settings", "min_held=5", "max_held=4"]),
    (lambda c: c.settings.update(clients=1), ["study.settings", "clients=1"]),
    (lambda c: c.settings.update(points=0), ["study.settings.points=0"]),
    (lambda c: c.arms[2].update(method="em"), ["study.arms[2].method='em'"]),
    (lambda c: setattr(c, "levels", [{"separation": 0.0}]), ["study.levels[0]"]),
])
def test_fedgem_refusals(edit, names):
  config = load_config("fedgem")
  edit(config)
  refused(config, *names)


# ---- mgfa -------------------------------------------------------------------------------

def mgfa_tiny():
  config = load_config("mgfa")
  config.levels = [{"n": n, "d": 3, "major": m} for n in (40, 160, 640) for m in (0.5, 0.05)]
  config.draws = 2
  config.settings.update(points=160, restarts=1, max_steps=40, frechet_samples=3)
  config.claims = [c for c in config.claims if c["metric"] != "ari" or c["expect"]]
  for claim in config.claims:
    if claim.get("at") and "n" in claim["at"]:
      claim["at"] = {"n": 160, "major": 0.5}
  return config


def test_mgfa_study_against_its_oracles(tmp_path):
  from moejax.mixtures import sphere, synthetic
  results = run(mgfa_tiny(), tmp_path)
  # which arms run where: clustering at n = points, the Frechet arm at the headline major
  ran = {(r["arm"], r["level"]["n"], r["level"]["major"]) for r in results["runs"]}
  assert {(a, n, m) for a, n, m in ran if a != "frechet"} == {
      (a, 160, m) for a in ("mgfa", "mgfa_q0", "vmf", "gmm_diag") for m in (0.5, 0.05)}
  assert {(n, m) for a, n, m in ran if a == "frechet"} == {(n, 0.5) for n in (40, 160, 640)}
  # parallel bands: MGFA (q = 1) separates them, the vMF mixture cuts across
  assert min(metric(results, "mgfa", "ari", major=0.5).values()) > 0.9
  assert max(metric(results, "vmf", "ari", major=0.5).values()) < 0.5
  # the slope claim: per-draw least-squares slopes of log error on log n, t over draws
  log_n = np.log([40, 160, 640])
  slopes = [np.polyfit(log_n, [metric(results, "frechet", "log_error", n=n)[d]
                               for n in (40, 160, 640)], 1)[0] for d in range(2)]
  row = claim_row(results, "the mean direction's error")
  assert row["interval"]["mean"] == pytest.approx(np.mean(slopes))
  half = scipy.stats.t.ppf(0.975, 1) * np.std(slopes, ddof=1) / math.sqrt(2)
  assert row["interval"]["hi"] == pytest.approx(np.mean(slopes) + half)
  # draw 1 at n = 40 rebuilt from its documented seed
  rng = np.random.default_rng((0, 3, 40, 500, 1, 1))
  errors = []
  for _ in range(3):
    x, _, means = synthetic.sphere_bands(rng, 3, 1, 40, spacing=0.0, major=0.5, minor=0.05)
    errors.append(float(sphere.geodesic_distance(sphere.frechet_mean(x), means[0])))
  assert metric(results, "frechet", "error", n=40)[1] == pytest.approx(np.mean(errors))
  assert "mgfa" in report.markdown(runner.prepare(mgfa_tiny())[0], results, [])


@pytest.mark.parametrize("edit, names", [
    (lambda c: c.arms[0].update(factors=2), ["study.arms[0].factors=2", "d-2 = 1"]),
    (lambda c: c.settings.update(points=300), ["study.settings.points=300"]),
    (lambda c: c.settings.update(frechet_major=0.3), ["study.settings.frechet_major=0.3"]),
    (lambda c: c.settings.update(restarts=0), ["study.settings.restarts=0"]),
    (lambda c: c.arms[2].update(method="kent"), ["study.arms[2].method='kent'"]),
    (lambda c: setattr(c, "levels", [{"n": 200, "d": 2, "major": 0.5},
                                     {"n": 200, "d": 3, "major": 0.05}]),
     ["study.levels[0]", "integer >= 3"]),
])
def test_mgfa_refusals(edit, names):
  config = load_config("mgfa")
  edit(config)
  refused(config, *names)
