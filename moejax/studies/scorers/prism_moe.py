"""Dense-to-MoE conversion (Prism-MoE, ICML 2026; MoEfication, arXiv 2110.01786): a
dense training workdir converted at every arm's partition (moejax/conversion/),
then fine-tuned with or without confidence-adaptive routing supervision.

Arms: `partition` (random | kmeans_lloyd | kmeans_hartigan | trajectory) and
`supervision` (the weight of the routing KL; 0 = none). Draw d: the conversion seed
(partition and fitting trajectories), the fine-tuning windows (seed d) and the
held-out trajectories (seed 10_000 + d), shared by every arm of the draw (their
digest is the pairing key); the conversion is computed once per partition and draw.

Metrics: kl0, mse0 (KL to the dense model per token and FFN output error at step 0,
on the held-out trajectories, conversion/measure.py); kl, and bpb / bpb/<domain>
(posttrain/measure.Bench) after fine-tuning for settings.budget of the dense run's
steps (conversion/finetune.py).
"""

from __future__ import annotations

import functools

from moejax.conversion.partition import KINDS
from moejax.errors import ConfigError
from moejax.studies.scorers.pruning import SourceScorer
from moejax.studies.scoring import PAIRING, SCORERS, digest

HELD_OUT_SEED = 10_000


@SCORERS.register("prism_moe")
class PrismMoEScorer(SourceScorer):
  settings = {
    "workdir": "runs/zoo/s_dense",
    "num_windows": 16,
    "bytes_per_domain": 4096,
    "probes": "",
    "probe_count": 1,
    "experts": 8,
    "top_k": 3,
    "trajectories": 16,
    "length": 64,
    "held_out": 16,
    "budget": 0.1,
  }
  arm_settings = {"partition": "random", "supervision": 0.0}

  def extra_metrics(self):
    return ("kl0", "mse0", "kl")

  def check(self) -> None:
    from moejax.conversion import convert

    super().check()
    s = self.settings
    self.check_integers({"experts": 1, "top_k": 1, "trajectories": 1, "length": 1, "held_out": 1})
    if not isinstance(s["budget"], (int, float)) or not 0 < s["budget"] <= 1:
      raise ConfigError(f"study.settings.budget={s['budget']!r} must be in (0, 1]")
    convert.check_source(
      self.source_config.model,
      s["experts"],
      s["top_k"],
      f"{self.WORKDIR}={s['workdir']}, study.settings.experts",
    )
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["partition"] not in KINDS:
        raise ConfigError(
          f"study.arms[{i}].partition={arm['partition']!r} (arm {name!r}) "
          f"must be one of {', '.join(KINDS)}"
        )
      w = arm["supervision"]
      if not isinstance(w, (int, float)) or isinstance(w, bool) or not w >= 0:
        raise ConfigError(f"study.arms[{i}].supervision={w!r} (arm {name!r}) must be a number >= 0")

  @functools.cached_property
  def dense(self):
    """(model config, params, rest, start-of-document id) of the source, loop layout."""
    from moejax.models.decoder import unstack_layers

    src = self.bench.source
    m, params, rest = unstack_layers(src.model, src.params, src.rest)
    return m, params, rest, src.eos_id if src.eos_id is not None else 0

  def score(self, level, draw, arms):
    from moejax.conversion import convert, finetune, measure, trajectory

    s, (m, params, rest, prefix) = self.settings, self.dense
    length = min(s["length"], m.max_seq_len - 1)
    held = trajectory.generate_trajectories(
      m, params, rest, s["held_out"], length, HELD_OUT_SEED + draw, prefix
    )
    config = convert.training_config(
      self.bench.source.config, convert.moe_model(m, s["experts"], s["top_k"]), s["budget"]
    )
    t = config.train
    batches = finetune.windows(
      self.bench.train_stream, t.steps, config.data.batch_size, config.data.seq_len, seed=draw
    )
    pairing = digest(held, batches)
    converted, out = {}, {}
    for name, arm in arms.items():
      kind = arm["partition"]
      if kind not in converted:
        moe_m, moe_params, _ = convert.convert(
          m,
          params,
          rest,
          kind,
          s["experts"],
          s["top_k"],
          seed=draw,
          trajectories=s["trajectories"],
          length=length,
          prefix_id=prefix,
        )
        converted[kind] = (moe_params, measure.held_out(m, params, rest, moe_m, moe_params, held))
      moe_params, at0 = converted[kind]
      tuned, _ = finetune.finetune(
        config, m, params, rest, moe_params, rest, batches, float(arm["supervision"])
      )
      got = {
        "kl0": at0["kl"],
        "mse0": at0["mse"],
        "kl": measure.held_out(m, params, rest, config.model, tuned, held)["kl"],
      }
      got.update(self.bench.evaluate(config.model, tuned, rest))
      got[PAIRING] = pairing
      out[name] = got
    return out
