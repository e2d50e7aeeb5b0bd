r"""Expert-type comparison (issue 7) at equal active FLOPs and equal steps.

  python -m experiments.ablate --config=configs/ablations/expert_types.py --workdir=runs/routers

Shares its WORKDIR with configs/ablations/routers.py so the top-k MoE (the
same variant, same config) is trained once. Every variant: 600 steps, seed 0,
32 x 128 bytes per step, evaluation every 100 steps on the held-out plays.
Active FFN FLOPs per token are the default MoE's in every row (each config's
docstring has the arithmetic; dense is 0.5% under, its d_ff being 2 x 256).

  dense          the dense twin (SwiGLU d_ff 512)
  topk           the default MoE: top-2 of 8 SwiGLU experts of width 256
  omnimoe        OmniMoE: shared SwiGLU 448 + top-32 of 4096 atomic experts (64 x 64 grid)
  l3             dense (d_ff 480) + one L3 layer after block 1: 4096 rows, <= 64 per byte id
  l3_iso_params  dense (d_ff 448) + one L3 layer: 12288 rows, <= 256 per byte id, so its
                 total parameters match the MoE's (the paper's iso-sparse comparison)
"""
import ml_collections

from moejax.configs.ablations.routers import get_config as routers_sweep


def get_config():
  c = routers_sweep()
  c.title = "Expert types at the default MoE's active FLOPs"
  c.variants = (
      ("dense", "configs/lm_shakespeare_dense.py", ()),
      ("topk", "configs/lm_shakespeare_moe.py", ()),
      ("omnimoe", "configs/lm_shakespeare_omnimoe.py", ()),
      ("l3", "configs/lm_shakespeare_l3.py", ()),
      ("l3_iso_params", "configs/lm_shakespeare_l3.py:budget=12288,cap=256", ()),
  )
  return c
