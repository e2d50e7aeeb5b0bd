r"""The dense twin of the default MoE: same model, SwiGLU FFN of width
top_k * expert_d_ff, i.e. equal active parameters per token (the router aside).

  python -m experiments.train --config=configs/lm_shakespeare_dense.py --workdir=runs/dense

Args as configs/lm_shakespeare_moe.py (size=tiny, ...).
"""

from moejax.configs import lm_shakespeare_moe


def get_config(arg=None):
  return lm_shakespeare_moe.get_config(",".join(filter(None, [arg, "dense=true"])))
