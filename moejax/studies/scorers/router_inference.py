"""Inference-time routers on a trained MoE LM: the same weights, another router at
inference, against the model's own top-k (moejax/analysis/router_inference.py).

Three scorers; every one reads settings.workdir (a training workdir of a byte-level MoE
LM), and an arm with router 'model' is the model's own router (the reference):

  router_inference_capacity  Capacity-aware Token Drop (expand_r 1) and Expanded Drop
      (expand_r 2; arXiv 2503.05066) at the level's capacity factor `gamma`. Draw d is
      validation batch d (one call = one [batch, seq_len] block, as a prefill): bpb,
      max/mean load, max load (assignments to the busiest expert), kept assignments per
      token and their fraction of top-k.
  router_inference_as_coot  As-COOT semi-relaxed Sinkhorn routing (TiME; tau 0 =
      infinity, balanced Sinkhorn). Draw d is held-out play d, settings.play_batches
      batches of consecutive windows of that play (a shifted batch): bpb and load.
  router_inference_sere  SERE re-routing (arXiv 2602.07616): linear CKA between experts
      calibrated once on settings.calibration_batches training batches, then
      teacher-forced KV-cache decoding at the level's decode `batch` and threshold
      `rho`. Draw d decodes validation windows [d W, (d + 1) W), W =
      settings.windows_per_draw, their first decode_len tokens: bpb and the distinct
      experts a decode step reads.
All three routers are non-causal by design (a token's experts depend on the other
tokens of the call); bpb is the model's loss under that routing. The model's own
router does not depend on the level: it is scored once per draw and paired with every
level's arms.
"""

from __future__ import annotations

import functools

import numpy as np

from moejax import cli_files
from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies.scoring import SCORERS, Scorer

DEFAULT_WORKDIR = "runs/routers/topk/seed_0"  # configs/studies/routers.py, topk, draw 0


class _TrainedModel(Scorer):
  """Shared by the three: the model (loaded once) and the checks of its settings."""

  ROUTERS: tuple[str, ...] = ("model",)
  AXES: tuple[str, ...] = ()

  @functools.cached_property
  def model(self):
    from moejax.analysis.router_inference import TrainedMoE

    return TrainedMoE(self.settings["workdir"], key="study.settings.workdir")

  def _positive_int(self, key: str) -> None:
    value = self.settings[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f"study.settings.{key}={value!r} must be an integer >= 1")

  def check(self):
    workdir = self.settings["workdir"]
    if cli_files.workdir_kind(workdir) not in ("training", "mixed"):
      raise ConfigError(
        f"study.settings.workdir={workdir!r} is not a training workdir "
        f"(checkpoints/): {cli_files.workdir_kind(workdir)}"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["router"] not in self.ROUTERS:
        raise ConfigError(
          f"study.arms[{i}].router={arm['router']!r} (arm {name!r}) must be "
          f"one of {', '.join(self.ROUTERS)}"
        )
    if self.spec.axes != list(self.AXES):
      raise ConfigError(
        f"study.levels have axes {self.spec.axes}; this scorer's are {list(self.AXES)}"
      )
    self.model  # loads it: a workdir that is not a byte-level MoE LM is refused here

  def _draws_at_most(self, available: int, what: str) -> None:
    if self.spec.draws > available:
      raise ConfigError(
        f"study.draws={self.spec.draws}: the model's data has {available} {what}, one per draw"
      )


@SCORERS.register("router_inference_capacity")
class Capacity(_TrainedModel):
  settings = {"workdir": DEFAULT_WORKDIR}
  arm_settings = {"router": "model", "expand_r": 1.0}
  ROUTERS, AXES = ("model", "capacity_aware"), ("gamma",)

  def metrics(self):
    return ("bpb", "max_over_mean_load", "max_load", "experts_per_token", "kept_fraction")

  def check(self):
    super().check()
    for i, level in enumerate(self.spec.levels):
      if not (isinstance(level["gamma"], (int, float)) and level["gamma"] > 0):
        raise ConfigError(f"study.levels[{i}].gamma={level['gamma']!r} must be > 0")
    for i, (name, arm) in enumerate(self.spec.arms):
      if not (isinstance(arm["expand_r"], (int, float)) and arm["expand_r"] >= 1):
        raise ConfigError(
          f"study.arms[{i}].expand_r={arm['expand_r']!r} (arm {name!r}) must be >= 1"
        )
    self._draws_at_most(len(self.model.eval_batches()), "validation batches")

  @functools.cache
  def _graphdef(self, router: str, gamma: float, expand_r: float):
    from moejax.analysis.router_inference import with_router

    if router == "model":
      return with_router(self.model.config)[1]
    return with_router(
      self.model.config,
      router=router,
      capacity_aware=dict(gamma=float(gamma), expand_r=float(expand_r)),
    )[1]

  @functools.cache
  def _score(self, router: str, gamma: float, expand_r: float, draw: int) -> dict:
    from moejax.analysis.router_inference import score_batches

    m = self.model
    return score_batches(
      self._graphdef(router, gamma, expand_r),
      m.params,
      m.rest,
      [m.eval_batches()[draw]],
      m.config.model.moe.top_k,
    )

  def score(self, level, draw, arms):
    def key(arm):
      if arm["router"] == "model":
        return arm["router"], 0.0, 0.0
      return arm["router"], level["gamma"], arm["expand_r"]

    return {name: self._score(*key(arm), draw) for name, arm in arms.items()}


@SCORERS.register("router_inference_as_coot")
class AsCoot(_TrainedModel):
  settings = {"workdir": DEFAULT_WORKDIR, "play_batches": 2}
  arm_settings = {"router": "model", "tau": 1.0}
  ROUTERS = ("model", "as_coot")

  def metrics(self):
    return ("bpb", "max_over_mean_load", "max_load")

  def check(self):
    self._positive_int("play_batches")
    super().check()
    for i, (name, arm) in enumerate(self.spec.arms):
      if not (isinstance(arm["tau"], (int, float)) and arm["tau"] >= 0):
        raise ConfigError(
          f"study.arms[{i}].tau={arm['tau']!r} (arm {name!r}) must be >= 0 (0: infinity)"
        )
    self._draws_at_most(len(self.plays), "held-out plays")

  @functools.cached_property
  def plays(self):
    return self.model.play_batches(self.settings["play_batches"])

  def score(self, level, draw, arms):
    from moejax.analysis.router_inference import score_batches, with_router

    m, out = self.model, {}
    for name, arm in arms.items():
      keys = (
        {}
        if arm["router"] == "model"
        else dict(router="as_coot", as_coot=dict(tau=float(arm["tau"])))
      )
      result = score_batches(
        with_router(m.config, **keys)[1],
        m.params,
        m.rest,
        self.plays[draw][1],
        m.config.model.moe.top_k,
      )
      out[name] = {k: result[k] for k in self.metrics()}
    return out

  def notes(self, results):
    return (
      "Draw d is held-out play d: "
      + ", ".join(f"{d} {play}" for d, (play, _) in enumerate(self.plays[: self.spec.draws]))
      + "."
    )


@SCORERS.register("router_inference_sere")
class Sere(_TrainedModel):
  settings = {
    "workdir": DEFAULT_WORKDIR,
    "calibration_batches": 2,
    "windows_per_draw": 64,
    "decode_len": 64,
  }
  arm_settings = {"router": "model"}
  ROUTERS, AXES = ("model", "sere"), ("batch", "rho")

  def metrics(self):
    return ("bpb", "distinct_experts")

  def check(self):
    for key in ("calibration_batches", "windows_per_draw", "decode_len"):
      self._positive_int(key)
    super().check()
    for i, level in enumerate(self.spec.levels):
      batch, rho = level["batch"], level["rho"]
      if not (isinstance(batch, int) and 1 <= batch <= self.settings["windows_per_draw"]):
        raise ConfigError(
          f"study.levels[{i}].batch={batch!r} must be an integer in [1, "
          f"study.settings.windows_per_draw={self.settings['windows_per_draw']}]"
        )
      if not (isinstance(rho, (int, float)) and 0 <= rho <= 1):
        raise ConfigError(f"study.levels[{i}].rho={rho!r} must be in [0, 1]")
    self.model.decode_windows(
      0, self.spec.draws * self.settings["windows_per_draw"], self.settings["decode_len"]
    )

  @functools.cached_property
  def loaded(self):
    from moejax.train.load import from_training_workdir

    return from_training_workdir(self.settings["workdir"])[0]

  @functools.cached_property
  def similarity(self) -> np.ndarray:
    """float32 [MoE layers, E, E]: linear CKA between experts on the calibration tokens."""
    from moejax.analysis.router_inference import calibrate_similarity

    m = self.model
    return np.asarray(
      calibrate_similarity(
        m.graphdef, m.params, m.rest, m.calibration_tokens(self.settings["calibration_batches"])
      )
    )

  @functools.cache
  def _score(self, rho: float | None, batch: int, draw: int) -> dict:
    from moejax.analysis.router_inference import decode_score, with_sere

    w = self.settings["windows_per_draw"]
    windows = self.model.decode_windows(draw * w, w, self.settings["decode_len"])
    m, rest = self.loaded.config, self.loaded.rest
    if rho is not None:
      m, rest = with_sere(m, rest, self.similarity, rho)
    return decode_score(m, self.loaded.params, rest, windows, batch)

  def score(self, level, draw, arms):
    return {
      name: self._score(
        None if arm["router"] == "model" else float(level["rho"]), level["batch"], draw
      )
      for name, arm in arms.items()
    }

  def notes(self, results):
    sim = self.similarity
    off = sim[:, ~np.eye(sim.shape[1], dtype=bool)].astype(np.float64)
    rows = [
      [layer, f"{o.min():.2f}", f"{np.median(o):.2f}", f"{o.max():.2f}"]
      for layer, o in enumerate(off)
    ]
    tokens = int(np.prod(self.model.calibration_tokens(self.settings["calibration_batches"]).shape))
    return (
      f"Linear CKA between experts (off-diagonal), calibrated on {tokens:,} training "
      "tokens:\n\n" + stats.markdown_table(["MoE layer", "min", "median", "max"], rows)
    )
