"""What the MergeMix and overtrained-experts scorers share (mergemix.py,
overtrained_experts.py): a training workdir read once (its parameters are the base),
its corpus by domain (posttrain/domain_finetune.DomainData), one Finetuner compiled
once, and each domain's held-out windows in two halves: `selection` (the even
windows: what a choice is made on, a mixture, a scale or a stopping step) and `test`
(the odd windows: what is reported). Only the mix corpus has domains to fine-tune on.

Settings: workdir (the base) and step (its checkpoint; 0: the latest), domains (the
K expert domains, moejax/data/mix.py DOMAINS), batch (rows per step), learning_rate
and warmup (constant after a linear warmup), bytes_per_domain (held-out bytes per
domain), seq_len (the windows' length, trained and scored; 0: the run's).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from moejax.errors import ConfigError
from moejax.merging.mergemix import check_domains, positive_int
from moejax.studies.scoring import Scorer

HALVES = ("selection", "test")


class DomainRunScorer(Scorer):
  """A study of fine-tuning runs from one training workdir on its corpus's domains."""

  settings = {
    "workdir": "runs/zoo/xs",
    "step": 0,
    "domains": ["drama", "prose", "code", "facts"],
    "batch": 8,
    "learning_rate": 1e-3,
    "warmup": 4,
    "bytes_per_domain": 8192,
    "seq_len": 0,
  }
  WORKDIR = "study.settings.workdir"
  EVAL_BATCH = 8  # windows per scoring call (one compilation; a held-out half is ~this)
  INTEGERS: tuple[str, ...] = ("batch", "warmup", "bytes_per_domain")
  COUNTS = ("step", "seq_len")  # integers >= 0, 0: the default

  def key(self, name: str) -> str:
    return f"study.settings.{name}"

  def check(self) -> None:
    from moejax.data.mix import DOMAINS
    from moejax.posttrain.source import check_workdir, training_config

    s = self.settings
    for name in self.INTEGERS:
      positive_int(s[name], self.key(name))
    for name in self.COUNTS:
      if isinstance(s[name], bool) or not isinstance(s[name], int) or s[name] < 0:
        raise ConfigError(f"{self.key(name)}={s[name]!r} must be an integer >= 0 (0: default)")
    rate = s["learning_rate"]
    number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
    if not (number and math.isfinite(rate) and rate > 0):
      raise ConfigError(f"{self.key('learning_rate')}={rate!r} must be a finite number > 0")
    check_domains(s["domains"], DOMAINS, self.key("domains"))
    check_workdir(s["workdir"], self.WORKDIR, kinds=("training", "mixed"))
    if s["step"]:
      from moejax.train.checkpoint import Checkpointer

      ckpt = Checkpointer(s["workdir"], read_only=True)
      steps = ckpt.all_steps()
      ckpt.close()
      if s["step"] not in steps:
        raise ConfigError(
          f"{self.key('step')}={s['step']} is not a checkpoint of {self.WORKDIR}="
          f"{s['workdir']}; it holds {list(steps)}"
        )
    corpus = training_config(s["workdir"], self.WORKDIR)[0].data.name
    if corpus != "mix":
      raise ConfigError(
        f"{self.WORKDIR}={s['workdir']} trained on data.name={corpus!r}; the domain "
        "experts need the mix corpus (data.name='mix')"
      )

  @property
  def domains(self) -> list[str]:
    return list(self.settings["domains"])

  def scored_domains(self) -> list[str]:
    """The domains whose held-out windows are scored (the experts' by default)."""
    return self.domains

  @functools.cached_property
  def source(self):
    from moejax.posttrain.source import load_training

    return load_training(self.settings["workdir"], self.WORKDIR, self.settings["step"] or None)

  @functools.cached_property
  def data(self):
    from moejax.posttrain.domain_finetune import domain_data

    s = self.settings
    return domain_data(self.source, s["bytes_per_domain"], self.scored_domains(), s["seq_len"])

  @property
  def graphdef(self):
    """The trainer's graphdef of the base (what every run trains and is scored with)."""
    return self.source.restored.graphdef

  @functools.cached_property
  def finetuner(self):
    from moejax.posttrain.domain_finetune import Finetuner

    s = self.settings
    return Finetuner(
      self.graphdef,
      self.source.config.train,
      learning_rate=s["learning_rate"],
      warmup=s["warmup"],
    )

  @property
  def streams(self) -> list:
    return [self.data.train[d] for d in self.domains]

  def halves(self, domain: str) -> dict[str, np.ndarray]:
    """{'selection': even held-out windows, 'test': odd ones} of `domain`."""
    windows = self.data.held_out[domain]
    return {"selection": windows[0::2], "test": windows[1::2]}

  def losses(
    self, params: dict, rest: dict | None, domains, halves=HALVES
  ) -> dict[tuple[str, str], float]:
    """{(domain, half): mean held-out loss in nats per token} of the model over the
    given halves (rest: the base's when None)."""
    rest = self.source.rest if rest is None else rest
    out = {}
    for domain in domains:
      for half in halves:
        windows = self.halves(domain)[half]
        out[(domain, half)] = float(np.mean(self.window_nats(params, rest, windows)))
    return out

  def window_nats(self, params: dict, rest: dict, windows) -> np.ndarray:
    """Each window's mean loss (posttrain/domain_finetune.window_nats) in EVAL_BATCH rows."""
    from moejax.posttrain.domain_finetune import window_nats

    return window_nats(self.graphdef, params, rest, windows, self.EVAL_BATCH)

  @staticmethod
  def finite(metrics: dict) -> dict:
    """`metrics` without its NaN figures (a figure a run does not have is left out)."""
    return {k: v for k, v in metrics.items() if isinstance(v, str) or math.isfinite(v)}

  def digest_inputs(self) -> list:
    """The held-out windows every arm of a draw is scored on (the pairing key's input)."""
    return [self.data.held_out[d] for d in sorted(self.data.held_out)]
