r"""OmniMoE (arXiv 2602.05711) on the Shakespeare plays at the default MoE's active FLOPs.

OmniMoE is the one MoE layer (moejax/layers/moe.py) with the Cartesian
product router (router 'product_key', moejax/routing/product_key.py), N = n x n
atomic experts (expert type 'atomic', moejax/experts/atomic.py) and one
shared SwiGLU expert of width f_s; no auxiliary loss.

  python -m experiments.train --config=configs/lm_shakespeare_omnimoe.py --workdir=runs/omni

Active FFN multiply-adds per token (x2 for FLOPs), d = d_model:
  default MoE (configs/lm_shakespeare_moe.py): top-2 SwiGLU experts of width
    256 -> 3 d (2 * 256) = 3 * 128 * 512 = 196,608 (+ its router, d * 8 = 1,024)
  OmniMoE: shared SwiGLU 3 d f_s + product router 2 d n + atomic experts 2 d k
    small: f_s = 448, N = 4096 (n = 64), k = 32:
      3*128*448 + 2*128*64 + 2*128*32 = 172,032 + 16,384 + 8,192 = 196,608
    tiny (d = 32, MoE 3*32*64 = 6,144): f_s = 56, N = 64 (n = 8), k = 4:
      3*32*56 + 2*32*8 + 2*32*4 = 5,376 + 512 + 256 = 6,144
  f_s is derived as (3 * 2 * expert_d_ff - 2 n - 2 k) / 3 (rounded), so
  overriding experts / top_k keeps the match. Not counted (no matmuls): the
  BatchNorm + log-softmax over 2n logits and the product-key top-k over the
  per_axis_k^2 = 1024 candidate sums.
Parameters per FFN (small): 172,032 + 16,384 + 2 * 4096 * 128 = 1,236,992,
vs 8 * 3 * 128 * 256 + 1,024 = 787,456 for the default MoE.

Variants by arg (comma-separated key=value):
  :size=tiny                 a seconds-long smoke run
  :schedule=expert_centric   the paper's expert-centric schedule (the same function,
                             model.moe.grouped_matmul='tiled' instead of 'fused';
                             on CPU the token-centric gather is ~2x faster)
  :experts=1024,top_k=64     other grid / sparsity (f_s re-derived)
"""

from moejax.config import apply_size, base_config, parse_config_arg

DEFAULTS = dict(size="small", schedule="naive", experts=0, top_k=0)
PRESETS = {"tiny": (64, 4), "small": (4096, 32)}  # size: (N, top_k)
SCHEDULES = {"naive": "fused", "expert_centric": "tiled"}  # -> model.moe.grouped_matmul
TILE = 8  # rows per expert tile of the expert-centric layout (few rows per atomic expert)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  apply_size(c, a.size)  # the default MoE's model, data and steps
  e = c.model.moe
  active = e.top_k * e.expert_d_ff  # the default MoE's active width, matched below
  preset_n, preset_k = PRESETS.get(a.size, PRESETS["small"])
  e.router, e.experts = "product_key", "atomic"
  e.num_experts = a.experts or preset_n
  e.top_k = a.top_k or preset_k
  if a.schedule not in SCHEDULES:
    from moejax.errors import choice_error

    raise choice_error("config arg schedule", a.schedule, SCHEDULES)
  e.grouped_matmul, e.dropless.tile = SCHEDULES[a.schedule], TILE
  e.loss_weights = {}
  n = int(round(e.num_experts**0.5))  # validate_config checks n * n = N
  e.shared.count = 1
  e.shared.d_ff = max(1, round((3 * active - 2 * n - 2 * e.top_k) / 3))
  return c
