r"""ACE: regret against T of optimism (UCB), greedy and pessimism (LCB) when a new
expert arrives every round (moejax/studies/scorers/ace.py, moejax/online/ace.py).

  python -m experiments.study --config=configs/studies/ace.py
"""
import ml_collections

from moejax.studies.spec import grid

DENSE = 1000  # the horizon the dense simulator reruns


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "ace"
  c.description = (
      "The Awakening Crowd of Experts (ICML 2026; abstract only): expert t arrives at round "
      "t and never leaves; the learner sees every available expert's Bernoulli reward after "
      "its pick (full information, a guess). Regret: the pseudo-regret against the best "
      "expert arrived so far, sum_t (max_{i<=t} mu_i - mu_{I_t}). The paper: pessimism has "
      "regret O~(T^{2/3}) in the stochastic setting, optimism fails. Policies pick the "
      "argmax of S/n + b(n) (ucb), S/n (greedy) or S/n - b(n) (lcb), b(n) = sqrt(c log T / "
      "n). Variants: means iid uniform on [0, 1] (stochastic), or an oblivious adversary's "
      "staircase (a better expert every ~T^{2/3} rounds, decoys of mean 0 in between). The "
      "claims' statistic: per draw, the least-squares slope of ln regret on ln T over T = "
      "1e3..1e5, then a t-interval over draws. The *_dense arms rerun the smallest T with "
      "the O(T^2) lax.scan simulator on the same means and their own rewards: the pruned "
      "simulator should have the same law.")
  c.scorer = "ace"
  c.settings = {"c": 1.0, "block": 32, "decoy": 0.0, "seed": 0, "dense_max_horizon": DENSE}
  c.arms = [{"name": "ucb"}, {"name": "greedy"}, {"name": "lcb"}]
  c.arms += [{"name": f"{p}_dense", "policy": p, "simulator": "dense"}
             for p in ("ucb", "greedy", "lcb")]
  c.levels = grid(("variant", ["stochastic", "adversarial"]),
                  ("horizon", [DENSE, 3000, 10000, 30000, 100000]))
  c.draws = 50
  c.reference = "lcb"
  slope = {"metric": "log_regret", "interval": "slope", "over": "horizon", "transform": "log",
           "source": "spec"}
  c.claims = [
      {"arm": "lcb", "null": 0.75, "expect": "lower", **slope,
       "text": "pessimism (LCB): regret grows slower than T^0.75 (paper: O~(T^{2/3}))"},
      {"arm": "ucb", "null": 0.9, "expect": "higher", **slope,
       "text": "optimism (UCB) fails: regret grows faster than T^0.9"},
  ]
  c.claims += [
      {"arm": f"{p}_dense", "reference": p, "metric": "regret", "expect": None,
       "at": {"horizon": DENSE}, "source": "ours",
       "text": f"{p}: the pruned simulator has the dense one's law"}
      for p in ("ucb", "greedy", "lcb")]
  return c
