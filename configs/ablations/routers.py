r"""Router ablation (issue 6): the spine's baselines and the trainable research routers.

  python -m experiments.ablate --config=configs/ablations/routers.py --workdir=runs/routers

Every variant is the default MoE LM (configs/lm_shakespeare_moe.py: 4 layers,
d_model 128, 8 SwiGLU experts of width 256, top-2, dropless) trained for the
same 600 steps with seed 0; only the router / loss differs. Evaluation every
100 steps on the held-out plays.

  topk             softmax top-2 + Switch balance 1e-2 + z-loss 1e-3 (the default)
  topk_seed1       the same with seed 1: the seed-to-seed spread every other row is read against
  expert_choice    Zhou et al. 2022; NON-CAUSAL: it ranks tokens across the batch,
                   future tokens included, so its val bpb is not a causal LM figure
  probmoe_exact    ProbMoE conditional-Bernoulli, exactly k=2 sampled experts; weights
                   not renormalised in training or evaluation (see the MoE config)
  probmoe_dynamic  ProbMoE dynamic-k, k sampled in [1, 3] (mean active varies)
  smooth_topk      SmoothSMoE boundary smoothing + its boundary loss, weight 1e-2 (the
                   official auxiliary-loss scale; 1.0 before the fix, 100x too strong)
  dpsl             top-2 + DPSL (symmetric Dir(1) prior, weight 1e-2) beside the balance loss
  mahalanobis      MP-MoE greedy Mahalanobis subset selection (top-k at evaluation)
Not here: as_coot, capacity_aware and sere are inference-time routers
(experiments/router_inference.py).
"""
import ml_collections

MOE = "configs/lm_shakespeare_moe.py"


def get_config():
  c = ml_collections.ConfigDict()
  c.title = "Router ablation on the Shakespeare MoE LM"
  c.steps = 600
  c.seed = 0
  c.common = ("train.eval_every=100",)
  c.variants = (
      ("topk", MOE, ()),
      ("topk_seed1", MOE, ("seed=1",)),
      ("expert_choice", MOE + ":router=expert_choice", ()),
      ("probmoe_exact", MOE + ":router=probmoe", ()),
      ("probmoe_dynamic", MOE + ":router=probmoe",
       ("model.moe.probmoe.k_min=1", "model.moe.probmoe.k_max=3")),
      # boundary loss at the official auxiliary-loss scale, 0.01 (see moejax/routing/smooth_topk.py)
      ("smooth_topk", MOE + ":router=smooth_topk",
       ("model.moe.loss_weights.smooth_boundary=1e-2",)),
      ("dpsl", MOE, ("model.moe.loss_weights.dpsl=1e-2",)),
      ("mahalanobis", MOE + ":router=mahalanobis", ()),
  )
  return c
