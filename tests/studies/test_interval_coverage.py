"""The interval-coverage study against its closed forms: the t interval covers 95%, the
normal approximation P(|T_{n-1}| <= z) (moejax/studies/scorers/interval_coverage.py)."""

import importlib.util

from moejax.evaluation import stats
from moejax.studies import runner
from moejax.studies.scorers.interval_coverage import normal_coverage


def load_config():
  spec = importlib.util.spec_from_file_location("coverage", "configs/studies/interval_coverage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_coverage_matches_the_closed_forms(tmp_path):
  config = load_config()
  config.arms = [a for a in config.arms if a["name"] != "bootstrap"]
  config.levels = [{"n": 3}]
  config.draws = 3000
  results = runner.run(*runner.prepare(config), str(tmp_path), plot=False, log=lambda _: None)
  covers = {
    arm: [r["metrics"]["covers"] for r in results["runs"] if r["arm"] == arm]
    for arm in ("t", "normal")
  }
  z = 1.959963984540054  # P(|T_2| <= z) = z / sqrt(2 + z^2) in closed form
  assert abs(normal_coverage(3) - z / (2 + z * z) ** 0.5) < 1e-12
  for arm, expected in (("t", 0.95), ("normal", normal_coverage(3))):
    interval = stats.wilson(int(sum(covers[arm])), len(covers[arm]), confidence=0.999)
    assert interval.lo < expected < interval.hi, (arm, interval, expected)
