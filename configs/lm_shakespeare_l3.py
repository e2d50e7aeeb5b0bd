r"""An L3 LM (Large Lookup Layer, arXiv 2601.21461) on the Shakespeare bytes, at
the default MoE's active FLOPs: the dense twin (configs/lm_shakespeare_dense.py)
with a slightly narrower SwiGLU and one L3 layer after block 1.

  python -m experiments.train --config=configs/lm_shakespeare_l3.py --workdir=runs/l3

Active FLOPs per token (2 per multiply-add; attention, embedding and head are
the same in all three models and left out). small: d_model 128, 4 layers.
  default MoE   4 x (top-2 x 3 x 2·128·256  + router 2·128·8)     = 1,581,056
  dense twin    4 x 3 x 2·128·512                                 = 1,572,864
  L3 layer, d_in=d_model=128, d_emb=64, d_up=128, d_t <= cap=64:
    logits 2·64·128 + pool 2·64·64 + up 2·64·128 + mix 2·(128+128)·128 = 106,496
  so d_ff = (1,581,056 - 106,496) / (4 x 3 x 2·128) = 480 (was 512), and the
  L3 LM's active FLOPs are 4 x 3 x 2·128·480 + 106,496 = 1,581,056 exactly.
d_t is counted at the cap (the padded width the lookup computes); the
unigram-weighted mean E_t[d_t] under the LZW allocation is a bit lower, so
the L3 LM is at or under the MoE's active FLOPs. tiny rounds d_ff down to a
multiple of 16 the same way.

Table: budget R rows in all (4096 small, 1024 tiny), >= 1 and <= cap per byte
id, allocated by `allocation` (lzw | frequency | uniform; see
moejax/layers/lookup.py; 'lzw' is a guess at the paper's rule). Only ~85 of
the 256 byte ids occur in the training split; absent ids keep one row.

Args (comma-separated key=value): size=tiny|small, budget=, cap=,
allocation=, l3_layers= (block indices joined by '+', e.g. 1+3).
e.g. --config=configs/lm_shakespeare_l3.py:size=tiny,allocation=frequency
"""

from moejax.config import parse_config_arg
from moejax.configs import lm_shakespeare_moe

DEFAULTS = dict(size="small", budget=0, cap=0, allocation="lzw", l3_layers="1")
# size -> (budget, cap, d_emb, d_up)
L3_SIZES = {"tiny": (1024, 16, 16, 32), "small": (4096, 64, 64, 128)}


def l3_flops(d_model: int, cap: int, d_emb: int, d_up: int) -> int:
  """Active FLOPs per token of one L3 layer with d_t = cap rows."""
  return 2 * (cap * d_model + cap * d_emb + d_emb * d_up + (d_model + d_up) * d_model)


def moe_active_flops(m) -> int:
  """FFN FLOPs per token of the default MoE (top_k experts + router), all layers."""
  e = m.moe
  return m.num_layers * (e.top_k * 6 * m.d_model * e.expert_d_ff + 2 * m.d_model * e.num_experts)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = lm_shakespeare_moe.get_config(f"size={a.size},dense=true")
  m, l3 = c.model, c.model.l3
  budget, cap, l3.d_emb, l3.d_up = L3_SIZES[a.size]
  l3.enabled = True
  l3.budget, l3.cap = a.budget or budget, a.cap or cap
  l3.allocation = a.allocation
  l3.layers = tuple(int(i) for i in a.l3_layers.split("+"))
  # Iso active FLOPs with the default MoE (see module doc).
  spare = moe_active_flops(m) - len(l3.layers) * l3_flops(m.d_model, l3.cap, l3.d_emb, l3.d_up)
  m.d_ff = max(16, spare // (6 * m.d_model * m.num_layers) // 16 * 16)
  return c
