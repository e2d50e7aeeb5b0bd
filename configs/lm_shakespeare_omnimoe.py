r"""OmniMoE (arXiv 2602.05711) on the Shakespeare plays at the default MoE's active FLOPs.

Every FFN is a shared SwiGLU of width f_s plus N = n x n atomic experts, top_k
per token, picked by the Cartesian product router (moejax/experts/atomic.py).

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
  :schedule=expert_centric   the paper's expert-centric schedule (the same function;
                             on CPU the default token-centric gather is ~2x faster)
  :experts=1024,top_k=64     other grid / sparsity (f_s re-derived)
"""
from moejax.config import apply_size, base_config, parse_config_arg

DEFAULTS = dict(size="small", schedule="naive", experts=0, top_k=0)
PRESETS = {"tiny": (64, 4), "small": (4096, 32)}  # size: (N, top_k)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  apply_size(c, a.size)  # the default MoE's model, data and steps
  c.model.ffn_type = "omnimoe"
  o = c.model.omni
  preset_n, preset_k = PRESETS.get(a.size, PRESETS["small"])
  o.num_atomic_experts = a.experts or preset_n
  o.top_k = a.top_k or preset_k
  o.schedule = a.schedule
  n = int(round(o.num_atomic_experts ** 0.5))  # validate_config checks n * n = N
  active = c.model.moe.top_k * c.model.moe.expert_d_ff
  o.shared_d_ff = max(1, round((3 * active - 2 * n - 2 * o.top_k) / 3))
  return c
