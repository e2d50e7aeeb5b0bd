r"""As-COOT semi-relaxed optimal-transport routing (TiME) on a trained MoE LM, against
its own top-k (moejax/studies/scorers/router_inference.py).

  python -m experiments.study --config=configs/studies/router_inference_as_coot.py

The model: the routers study's top-k run (configs/studies/routers.py, seed 0). Draw d
is held-out play d: 2 batches of consecutive 128-token windows of that play (a shifted
batch, every token of a call from one text).
  top_k         the model's own router
  as_coot_tau1  semi-relaxed Sinkhorn, tau 1 (the token side relaxed)
  as_coot_inf   tau = infinity: balanced Sinkhorn, every expert's column sum fixed
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "router_inference_as_coot"
  c.description = (
    "As-COOT (TiME) routes a batch by a semi-relaxed optimal-transport plan whose expert "
    "marginal is uniform, so on a shifted batch (one text per call) the load stays near "
    "balanced where argmax routing piles onto a few experts. The trained default MoE LM, "
    "re-routed at inference only; draw d is held-out play d."
  )
  c.scorer = "router_inference_as_coot"
  c.settings = {"workdir": "runs/routers/topk/seed_0", "play_batches": 2}
  c.arms = [
    {"name": "top_k", "router": "model"},
    {"name": "as_coot_tau1", "router": "as_coot", "tau": 1.0},
    {"name": "as_coot_inf", "router": "as_coot", "tau": 0.0},
  ]
  c.draws = 4
  c.reference = "top_k"
  c.claims = [
    {
      "arm": arm,
      "reference": "top_k",
      "metric": "max_over_mean_load",
      "expect": "lower",
      "text": f"As-COOT ({label}) balances a shifted batch",
    }
    for arm, label in (("as_coot_inf", "tau = inf"), ("as_coot_tau1", "tau = 1"))
  ] + [
    {
      "arm": "as_coot_inf",
      "reference": "top_k",
      "metric": "bpb",
      "expect": None,
      "source": "ours",
      "text": "the bpb cost of balanced routing",
    }
  ]
  return c
