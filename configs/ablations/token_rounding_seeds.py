r"""Token rounding (SonicMoE) against top-k on several seeds (issue 13, part 6).

  python -m experiments.ablate --config=configs/ablations/token_rounding_seeds.py:base=zoo_xs \
      --workdir=runs/routers_zoo_xs

The bases, seeds and held-out scoring of configs/ablations/routers_seeds.py
(so on the same workdir the topk runs of the router sweep are re-used). The
paper claims no loss against top-k while padding nothing, not a gain: the arms
carry no direction and the table reports the interval for what it is.

  topk              the baseline
  rounded_tile32    router=topk_rounded, tile 32 (dropless_tile 32: waste exactly 0)
  rounded_tile16    the same with tile 16
"""
from moejax.configs.ablations import routers_seeds


def get_config(arg=None):
  c = routers_seeds.get_config(arg)
  c.title = c.title.replace("Router ablation", "Token rounding")
  topk = next(v for v in c.variants if v[0] == "topk")
  path = topk[1]
  rounded = path + ("," if ":" in path else ":") + "router=topk_rounded"
  c.variants = (topk,) + tuple(
      (f"rounded_tile{tile}", rounded,
       (f"model.moe.topk_rounded.tile={tile}", f"model.moe.dropless_tile={tile}"), None)
      for tile in (32, 16))
  return c
