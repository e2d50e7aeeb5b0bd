r"""The default: a byte-level MoE LM on the embedded Shakespeare plays.

8 SwiGLU experts, top-2, dropless dispatch, Switch balance loss + z-loss.
Small enough to train on 2 CPU cores in under 10 minutes.

  python -m experiments.train --config=configs/lm_shakespeare_moe.py --workdir=runs/moe

Variants by arg (comma-separated key=value):
  :router=expert_choice     expert-choice routing (non-causal, see its doc)
  :router=sigmoid_bias      DeepSeek-V3 aux-loss-free bias routing
  :router=probmoe           ProbMoE conditional-Bernoulli sampling (routing.renormalize off)
  :dispatch=capacity        GShard capacity dispatch (model.moe.capacity.factor 1.25)
  :size=tiny                a seconds-long smoke run
  :shared=1                 one shared expert beside the routed ones
  :experts=16,top_k=4       more, finer experts
  :merge=smear              merge expert weights per segment of `segment` tokens instead of
                            dispatching tokens (SMEAR; ep_camex: CAMEx with a base expert;
                            moejax/experts/merged.py), no routing loss
e.g. --config=configs/lm_shakespeare_moe.py:router=sigmoid_bias,size=tiny
"""

from moejax.config import apply_size, base_config, parse_config_arg

DEFAULTS = dict(
  router="topk",
  dispatch="dropless",
  size="small",
  shared=0,
  experts=8,
  top_k=2,
  dense=False,
  merge="none",
  segment=16,
)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  c.model.moe.num_experts = a.experts
  c.model.moe.top_k = a.top_k
  c.model.moe.router = a.router
  c.model.moe.dispatch = a.dispatch
  c.model.moe.shared.count = a.shared
  if a.router == "sigmoid_bias":
    # Aux-loss-free: the bias balances the load; keep only a tiny z-loss.
    c.model.moe.loss_weights = {"z_loss": 1e-3}
  if a.router == "probmoe":
    # ProbMoE trains with w = z * softmax, never renormalised; evaluating with
    # renormalised top-k weights scales the expert output up (~2x at top-2 of 8)
    # and cost +7% val bpb in the router sweep (2.65 vs 2.47). Keep both alike.
    c.model.moe.routing.renormalize = False
  c.model.moe.merge = a.merge
  c.model.moe.merged.segment_len = a.segment
  if a.merge != "none":  # segments are merged, no token is dispatched: no routing loss
    c.model.moe.loss_weights = {}
  apply_size(c, a.size)
  if a.dense:
    c.model.ffn_type = "dense"
  return c
