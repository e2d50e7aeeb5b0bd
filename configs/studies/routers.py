r"""Router ablation: the spine's baselines and the trainable research routers, each
trained from scratch on the same seeds (moejax/studies/scorers/training.py).

  python -m experiments.study --config=configs/studies/routers.py [--config.draws=3]

Every arm is the default MoE LM (configs/lm_shakespeare_moe.py: 4 layers, d_model
128, 8 SwiGLU experts of width 256, top-2, dropless) trained for 600 steps on the
Shakespeare plays; only the router / loss differs. One draw (seed 0), the budget of
the committed sweep (docs/results/ablations/routers.md); with one draw every interval
is undefined: --config.draws=N trains seeds 0..N-1 and pairs the arms by seed (the
draws replace the old one-seed sweep's topk_seed1 arm). Runs go to runs/routers/<arm>/
seed_<s> (configs/studies/expert_types.py shares the topk runs).

  topk             softmax top-2 + Switch balance 1e-2 + z-loss 1e-3 (the default)
  expert_choice    Zhou et al. 2022; NON-CAUSAL: it ranks tokens across the batch,
                   future tokens included, so its bpb is not a causal LM figure
  probmoe_exact    ProbMoE conditional-Bernoulli, exactly k=2 sampled experts; weights
                   not renormalised in training or evaluation (see the MoE config)
  probmoe_dynamic  ProbMoE dynamic-k, k sampled in [1, 3] (mean active varies)
  smooth_topk      SmoothSMoE boundary smoothing + its boundary loss, weight 1e-2 (the
                   official auxiliary-loss scale, moejax/routing/smooth_topk.py)
  dpsl             top-2 + DPSL (symmetric Dir(1) prior, weight 1e-2) beside the balance loss
  mahalanobis      MP-MoE greedy Mahalanobis subset selection (top-k at evaluation)
Not here: as_coot, capacity_aware and sere are inference-time routers
(configs/studies/router_inference_*.py).
"""

import ml_collections

MOE = "configs/lm_shakespeare_moe.py"
# (name, config arg, overrides): the router part each arm swaps in
ROUTERS = (
  ("topk", "", ()),
  ("expert_choice", "router=expert_choice", ()),
  ("probmoe_exact", "router=probmoe", ()),
  ("probmoe_dynamic", "router=probmoe", ("model.moe.probmoe.k_min=1", "model.moe.probmoe.k_max=3")),
  ("smooth_topk", "router=smooth_topk", ("model.moe.loss_weights.smooth_boundary=1e-2",)),
  ("dpsl", "", ("model.moe.loss_weights.dpsl=1e-2",)),
  ("mahalanobis", "router=mahalanobis", ()),
)
PAPERS = {
  "probmoe_exact": "ProbMoE (arXiv 2606.01509)",
  "probmoe_dynamic": "ProbMoE dynamic-k (arXiv 2606.01509)",
  "smooth_topk": "SmoothSMoE (arXiv 2606.19036)",
  "dpsl": "DPSL (arXiv 2510.01185)",
  "mahalanobis": "MP-MoE (OpenReview 7FsbfQgti4)",
}


def router_arms(path: str, base_arg: str = "", only=None) -> list[dict]:
  """The arms on the base config `path` (with its own arg), in table order."""
  arms = []
  for name, arg, overrides in ROUTERS:
    if only is None or name in only:
      arg = ",".join(filter(None, [base_arg, arg]))
      arms.append(
        {"name": name, "config": f"{path}:{arg}" if arg else path, "overrides": list(overrides)}
      )
  return arms


def router_claims(metric: str, arms) -> list[dict]:
  """Each paper's direction against top-k, for the arms present."""
  names = {a["name"] for a in arms}
  claims: list[dict[str, str | None]] = [
    {
      "arm": arm,
      "reference": "topk",
      "metric": metric,
      "expect": "lower",
      "text": f"{paper}: lower bpb than top-k",
    }
    for arm, paper in PAPERS.items()
    if arm in names
  ]
  if "dpsl" in names:
    claims += [
      {
        "arm": "dpsl",
        "reference": "topk",
        "metric": "routing_entropy",
        "expect": "lower",
        "text": "DPSL: more confident routing (lower entropy)",
      },
      {
        "arm": "dpsl",
        "reference": "topk",
        "metric": "max_over_mean_load",
        "expect": "lower",
        "text": "DPSL: better balanced routing",
      },
    ]
  if "expert_choice" in names:
    claims += [
      {
        "arm": "expert_choice",
        "reference": "topk",
        "metric": "max_over_mean_load",
        "expect": "lower",
        "text": "Expert choice (Zhou et al. 2022): balanced load",
      },
      {
        "arm": "expert_choice",
        "reference": "topk",
        "metric": metric,
        "expect": None,
        "source": "ours",
        "text": "expert choice's bpb (non-causal: not a causal LM figure)",
      },
    ]
  return claims


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "routers"
  c.description = (
    "Trainable routers on the default MoE LM (Shakespeare, 600 steps): each paper "
    "claims its router trains a better model than softmax top-k (lower bpb) at the same "
    "budget. Every arm trains from scratch on each draw's seed; the claims pair arm and "
    "top-k by seed, on the training loop's final validation bpb."
  )
  c.scorer = "training"
  c.settings = {
    "workdir": "runs/routers",
    "steps": 600,
    "seeds": (),
    "common": ("train.eval_every=100",),
    "heldout_bytes_per_domain": 0,
    "domains": (),
  }
  c.arms = router_arms(MOE)
  c.draws = 1
  c.reference = "topk"
  c.claims = router_claims("val_bpb", c.arms)
  return c
