"""Cross-layer contributions to routing (ICLR 2026 list, OpenReview BqyPLOkxFY): the
causal check of the decomposition and the paper's headline, on a trained MoE LM.

Per draw (a block of held-out bytes per domain), every MoE block's router logits are
split over the components of the stream (moejax/analysis/routing_attribution.py) and,
recursively through attention, over the sources that wrote it (routing_paths.py).
Each arm removes n components from the model for each MoE block in turn: the n of
largest influence on that block ('top'), the n of least ('bottom') or n drawn at random
('random'), among the attention heads and the earlier blocks' experts; flip_rate is the
fraction of tokens whose routed set at that block changes, averaged over MoE blocks.
Draw-level measurements, the same for every arm (claims against a null):
  moe_minus_attention     influence share of earlier MoE layers' experts minus that of
                          attention heads, over MoE blocks with an earlier MoE block
                          (the paper's headline: MoE outputs contribute more);
  moe_share_recursive     the same blocks' share written by earlier MoE layers when
                          attention's outputs are split into what they moved.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest


def _share(layer: dict, prefix: str, earlier_than: int | None = None) -> float:
  """Fraction of a block's summed influence held by components named prefix<j>.…"""
  total = float(np.sum(layer["influence"]))
  picked = 0.0
  for name, value in zip(layer["names"], layer["influence"]):
    source = name.split(".")[0]
    if source.startswith(prefix) and (
      earlier_than is None or int(source[len(prefix) :]) < earlier_than
    ):
      picked += float(value)
  return picked / total


@SCORERS.register("routing_attribution")
class RoutingAttribution(Scorer):
  settings = {"workdir": "runs/zoo/s", "bytes_per_domain": 512, "context": 0, "n": 4}
  arm_settings = {"ablate": "top"}

  def metrics(self):
    return ("flip_rate", "ablated_share", "moe_minus_attention", "moe_share_recursive")

  def check(self):
    from moejax.analysis.routing_attribution import ABLATION_RANKS, check_supported

    s = self.settings
    for key, low in (("bytes_per_domain", 1), ("context", 0), ("n", 1)):
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < low:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {low}")
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["ablate"] not in ABLATION_RANKS:
        raise ConfigError(
          f"study.arms[{i}].ablate={arm['ablate']!r} (arm {name!r}) must be one of "
          f"{', '.join(ABLATION_RANKS)}"
        )
    if self.spec.axes:
      raise ConfigError(f"study.levels have axes {self.spec.axes}; this scorer has none")
    check_supported(self.model)
    moe_blocks = [i for i, block in enumerate(self.model.blocks) if block.is_moe]
    if len(moe_blocks) < 2:
      raise ConfigError(
        f"study.settings.workdir={s['workdir']!r}: the model has {len(moe_blocks)} MoE "
        "block(s); the headline compares earlier MoE layers with attention (at least 2)"
      )
    heads = sum(self.model.blocks[j].attn.num_heads for j in range(moe_blocks[0] + 1))
    if s["n"] > heads:
      raise ConfigError(
        f"study.settings.n={s['n']} must be at most {heads}, the candidates of the first "
        "MoE block (the attention heads up to it)"
      )
    for draw in range(self.spec.draws):
      self.held_out.windows(draw, s["bytes_per_domain"], f"(study.settings, draw {draw})")

  @functools.cached_property
  def held_out(self):
    from moejax.analysis.phenomena import HeldOut

    return HeldOut.of_study(self.settings)

  @functools.cached_property
  def parts(self) -> tuple[Any, Any, Any]:
    """(graphdef, params, rest) of the model (loop layout)."""
    from moejax.analysis.super_experts import model_of

    h = self.held_out
    _, graphdef, params, rest = model_of((h.config, h.params, h.rest))
    return graphdef, params, rest

  @property
  def model(self):
    return nnx.merge(*self.parts)

  @functools.cache
  def decomposition(self, draw: int) -> dict:
    """The draw's tokens, direct and recursive decompositions and routed sets."""
    from moejax.analysis import routing_attribution as ra
    from moejax.analysis.routing_paths import recursive_attribute

    _, windows, _ = self.held_out.windows(draw, self.settings["bytes_per_domain"])
    tokens = jnp.asarray(windows, jnp.int32)
    direct = ra.attribute(*self.parts, tokens)
    recursive = recursive_attribute(*self.parts, tokens)
    later = [i for i, layer in enumerate(direct) if i > 0]  # blocks after the first MoE block
    return {
      "tokens": tokens,
      "direct": direct,
      "sets": ra.routed_sets(*self.parts, tokens),
      "moe_minus_attention": float(
        np.mean(
          [_share(direct[i], "moe", direct[i]["block"]) - _share(direct[i], "attn") for i in later]
        )
      ),
      "moe_share_recursive": float(
        np.mean([_share(recursive[i], "moe", recursive[i]["block"]) for i in later])
      ),
      "digest": digest(windows),
    }

  def score(self, level, draw, arms):
    from moejax.analysis import routing_attribution as ra

    graphdef, params, rest = self.parts
    d = self.decomposition(draw)
    cfg = self.model.cfg
    out = {}
    for name, arm in arms.items():
      flips, shares = [], []
      for index, layer in enumerate(d["direct"]):
        picked = ra.pick_for_ablation(layer, self.settings["n"], arm["ablate"], seed=draw)
        ablated = params
        for component in picked:
          ablated = ra.ablate_component(cfg, ablated, component)
        sets = ra.routed_sets(graphdef, ablated, rest, d["tokens"])[index]
        flips.append(ra.flip_rate(d["sets"][index], sets))
        influence = dict(zip(layer["names"], layer["influence"]))
        shares.append(sum(float(influence[c]) for c in picked) / float(np.sum(layer["influence"])))
      out[name] = {
        "flip_rate": float(np.mean(flips)),
        "ablated_share": float(np.mean(shares)),
        "moe_minus_attention": d["moe_minus_attention"],
        "moe_share_recursive": d["moe_share_recursive"],
        PAIRING: d["digest"],
      }
    return out
