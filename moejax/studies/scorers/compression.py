"""Expert compression studies (moejax/posttrain/compress_pipeline.py): every arm at
every level on several calibration draws, each compressed model scored on the same
held-out bytes of the source's eval split (moejax/posttrain/measure.py).

Arms: `method` (compress_pipeline.METHODS: uniform, per_layer, gemq with `quantizer`
rtn or gptq; kmeans, codequant; td_moe, tucker, svd, whitened_svd), or 'none', the
uncompressed model; `fractional_method` replaces `method` at fractional levels
(per-group RTN is uniform at integer bits, GEMQ's allocation with RTN between);
`rounds` of GEMQ's progressive bit reduction (the budget lowered `bit_step` bits a
round down to the level, compress_workdir.budgets); `finetune`: GEMQ's router
fine-tuning (study.settings.finetune_steps x the arm's `finetune_multiple` steps a
round at finetune_lr, through the trainer, on the LM loss alone unless
settings.finetune_aux_losses); on the 'none' arm it is the matched control, the fp32 model's
routers fine-tuned by the same recipe; `damping` of the whitening (td_moe, whitened_svd);
`at`: 'all', 'integer' or 'fractional' levels only; `act_bits`: the expert matmuls'
inputs fake-quantized too (W4A4, W4A8: experts/compressed.py), and such an arm is
scored on its compressed model, not on the float one; codebook options (CodeQuant,
compress_pipeline.Request): `rotation` ('' the method's, none, hadamard, learned),
`per_output_column`, `recluster`; `group_size` (None: settings.group_size; 0: the
whole input dim). Levels: one axis, `bits` (average code
bits per expert weight) or `removed` (the fraction of expert parameters a factorisation
removes). With settings.bracket_bits, every arm at a fractional level allocates
between the two supported widths around it (the codebooks' allocation), so all
arms share one allocation space; else among settings.bit_choices.

Draw d: the calibration windows drawn with seed d (the runs' pairing key) and seed
d of the method. A model that depends on neither (compress_pipeline.
calibration_free, and the 'none' arms) is built once and paired with every draw.
Each model is scored from the float model that equals its compressed one
(dequantized or reconstructed experts, fine-tuned routers).

Metrics: bpb, bpb/<domain>, probe/<name>; rerouted, the fraction of (token, MoE
layer) pairs of settings.reroute_windows held-out windows whose top-k set differs
from the uncompressed model's; with settings.matched_control also rerouted_matched
and bpb_vs_matched, against the matched reference (the fine-tuned control for
fine-tuned arms, the fp32 model for the others); average_bits, expert_parameters
(factorisations), packed_expert_bytes (the expert layers packed) and stored_bytes
(every array of the model as its checkpoint holds them, measure.parameter_bytes);
the SVD baselines have no expert type, so neither byte count.
settings.equal_bytes lists [arm, level, other arm, other level] pairs compared in
the notes: the claims pair arms at one level, these pairs cross levels.
"""

from __future__ import annotations

import functools
import json
import tempfile

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import compress_workdir as cw
from moejax.posttrain import measure
from moejax.studies import report
from moejax.studies.scorers.pruning import NONE, SourceScorer
from moejax.studies.scoring import PAIRING, SCORERS, digest

AT = ("all", "integer", "fractional")
ARM_REQUEST = ("act_bits", "rotation", "per_output_column", "recluster")  # arm -> Request


@SCORERS.register("compression")
class Compression(SourceScorer):
  settings = {
    **SourceScorer.settings,
    "num_windows": 32,
    "group_size": 32,
    "bit_choices": [2, 3, 4, 8],
    "bracket_bits": False,
    "finetune_steps": 32,
    "finetune_lr": 1e-4,
    "finetune_aux_losses": False,
    "reroute_windows": 16,
    "matched_control": False,
    "equal_bytes": [],
  }
  arm_settings = {
    "method": NONE,
    "fractional_method": "",
    "quantizer": "gptq",
    "rounds": 1,
    "bit_step": 0.5,
    "finetune": False,
    "finetune_multiple": 1,
    "damping": 1e-6,
    "at": "all",
    "act_bits": 0,
    "rotation": "",
    "per_output_column": False,
    "recluster": False,
    "group_size": None,
  }

  def __init__(self, spec):
    super().__init__(spec)
    self._draw_free = {}  # (arm, level) -> scores of a model no draw changes

  def extra_metrics(self):
    matched = ("rerouted_matched", "bpb_vs_matched") if self.settings["matched_control"] else ()
    return (
      "rerouted",
      *matched,
      "average_bits",
      "expert_parameters",
      "packed_expert_bytes",
      "stored_bytes",
    )

  @property
  def axis(self) -> str:
    return self.spec.axes[0]

  def check(self) -> None:
    from moejax.posttrain.request import check_request

    super().check()
    s = self.settings
    self.check_integers({"group_size": 0, "finetune_steps": 1, "reroute_windows": 1})
    if not isinstance(s["finetune_lr"], (int, float)) or not s["finetune_lr"] > 0:
      raise ConfigError(f"study.settings.finetune_lr={s['finetune_lr']!r} must be > 0")
    if not isinstance(s["finetune_aux_losses"], bool):
      raise ConfigError(
        f"study.settings.finetune_aux_losses={s['finetune_aux_losses']!r} must be true or false"
      )
    if not isinstance(s["bit_choices"], list) or not all(
      isinstance(b, int) and not isinstance(b, bool) for b in s["bit_choices"]
    ):
      raise ConfigError(
        f"study.settings.bit_choices={s['bit_choices']!r} must be a list of integers"
      )
    axis = self.check_levels(("bits", "removed"), (int, float))
    m = self.source_config.model
    for i, (name, arm) in enumerate(self.spec.arms):
      for key in ("bit_step", "finetune_multiple"):
        value = arm[key]
        if (
          isinstance(value, bool)
          or not isinstance(value, (int, float))
          or not (value > 0 if key == "bit_step" else (isinstance(value, int) and value >= 1))
        ):
          raise ConfigError(
            f"study.arms[{i}].{key}={value!r} (arm {name!r}) must be "
            f"{'> 0' if key == 'bit_step' else 'an integer >= 1'}"
          )
      if arm["at"] not in AT:
        raise ConfigError(
          f"study.arms[{i}].at={arm['at']!r} (arm {name!r}) must be one of {', '.join(AT)}"
        )
      size = arm["group_size"]
      if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ConfigError(
          f"study.arms[{i}].group_size={size!r} (arm {name!r}) must be None or an integer >= 0"
        )
      if arm["method"] == NONE:
        if any(arm[k] != self.arm_settings[k] for k in ARM_REQUEST):
          raise ConfigError(
            f"study.arms[{i}] (arm {name!r}, method none) is the float model: it takes "
            f"none of {', '.join(ARM_REQUEST)}"
          )
        continue
      for j, level in enumerate(self.spec.levels):
        if not self.applies(name, level):
          continue
        r = self.request(arm, level, 0)
        which = "fractional_method" if r.method != arm["method"] else "method"
        factorised = cp.family(r.method) == "factorised" if r.method in cp.METHODS else None
        if factorised is not None and factorised != (axis == "removed"):
          raise ConfigError(
            f"study.arms[{i}].{which}={r.method!r} needs levels of "
            f"{'removed' if factorised else 'bits'}, not {axis}"
          )
        keys = {
          "method": f"study.arms[{i}].{which}",
          "level": f"study.levels[{j}].{axis}",
          "quantizer": f"study.arms[{i}].quantizer",
          "rounds": f"study.arms[{i}].rounds",
          "group_size": "study.settings.group_size",
          "bit_choices": "study.settings.bit_choices",
          "finetune_steps": "study.settings.finetune_steps",
          **{k: f"study.arms[{i}].{k}" for k in ARM_REQUEST},
          **({} if arm["group_size"] is None else {"group_size": f"study.arms[{i}].group_size"}),
          **self.context_keys(),
        }
        check_request(
          m,
          r,
          num_windows=s["num_windows"],
          context=self.source_config.data.seq_len,
          source=self.where,
          keys=keys,
          rounds=arm["rounds"],
          finetune_steps=self.finetune_steps(arm),
        )
    self._check_equal_bytes()

  def _check_equal_bytes(self) -> None:
    values = [level[self.axis] for level in self.spec.levels]
    for k, pair in enumerate(self.settings["equal_bytes"]):
      ok = (
        isinstance(pair, list)
        and len(pair) == 4
        and pair[0] in self.spec.arm_names
        and pair[2] in self.spec.arm_names
        and pair[1] in values
        and pair[3] in values
      )
      if not ok:
        raise ConfigError(
          f"study.settings.equal_bytes[{k}]={pair!r} must be [arm, level, "
          f"other arm, other level] of the study's arms and {self.axis} levels"
        )

  def finetune_steps(self, arm: dict) -> int:
    """Router fine-tuning steps of each of the arm's rounds (0 without fine-tuning)."""
    return self.settings["finetune_steps"] * arm["finetune_multiple"] if arm["finetune"] else 0

  def applies(self, arm: str, level: dict) -> bool:
    at = self.spec.arm(arm)["at"]
    value = level[self.axis]
    return at == "all" or (at == "integer") == (value == int(value))

  def request(self, arm: dict, level: dict, draw: int) -> cp.Request:
    value = float(level[self.axis])
    method = arm["method"]
    if value != int(value) and arm["fractional_method"]:
      method = arm["fractional_method"]
    choices = tuple(self.settings["bit_choices"])
    if self.settings["bracket_bits"] and value != int(value):
      choices = cp.bit_choices_for(cp.Request("kmeans", value))
    group_size = self.settings["group_size"] if arm["group_size"] is None else arm["group_size"]
    return cp.Request(
      method,
      value,
      quantizer=arm["quantizer"],
      group_size=group_size,
      bit_choices=choices,
      seed=draw,
      damping=arm["damping"],
      **{k: arm[k] for k in ARM_REQUEST},
    )

  # ---- the fp32 model and its matched control, each built once ----

  @functools.cached_property
  def fp32(self) -> dict:
    source = self.bench.source
    return {
      **self.bench.evaluate(source.model, source.params, source.rest),
      "rerouted": 0.0,
      "packed_expert_bytes": cw.packed_bytes(source.model, source.params, source.rest),
      "stored_bytes": measure.parameter_bytes(source.params, source.rest),
      "expert_parameters": measure.expert_parameters(source.params),
    }

  @functools.cached_property
  def control(self) -> tuple[dict, np.ndarray]:
    """(scores, routing sets) of the fp32 model with its routers fine-tuned."""
    source, s = self.bench.source, self.settings
    config, step = source.training_run()
    with tempfile.TemporaryDirectory() as scratch:
      tuned, _ = cw.finetune_routers(
        scratch,
        config,
        source.model,
        source.params,
        source.rest,
        step,
        source.data_state,
        s["finetune_steps"],
        s["finetune_lr"],
        s["finetune_aux_losses"],
      )
    sets = self.bench.routing_sets(tuned)
    scores = {
      **self.bench.evaluate(source.model, tuned, source.rest),
      "rerouted": measure.rerouted(self.bench.source_sets, sets),
    }
    return scores, sets

  def _matched(self, scores: dict, sets: np.ndarray, finetuned: bool) -> dict:
    if not self.settings["matched_control"]:
      return {}
    reference, reference_sets = self.control if finetuned else (self.fp32, self.bench.source_sets)
    return {
      "rerouted_matched": measure.rerouted(reference_sets, sets),
      "bpb_vs_matched": scores["bpb"] - reference["bpb"],
    }

  # ---- scoring ----

  def score(self, level, draw, arms):
    pairing = digest(self.bench.calibration(draw).windows)
    return {
      name: {**self._cached(arm, level, draw), PAIRING: pairing} for name, arm in arms.items()
    }

  def _cached(self, arm: dict, level: dict, draw: int) -> dict:
    if arm["method"] == NONE:
      if not arm["finetune"]:
        return {**self.fp32, **self._matched(self.fp32, self.bench.source_sets, False)}
      scores, sets = self.control
      return {**scores, **self._matched(scores, sets, True)}
    r = self.request(arm, level, draw)
    if not cp.calibration_free(r):
      return self._compressed(arm, r, draw)
    key = json.dumps([arm, level], sort_keys=True)
    if key not in self._draw_free:
      self._draw_free[key] = self._compressed(arm, r, draw)
    return self._draw_free[key]

  def _compressed(self, arm: dict, r: cp.Request, draw: int) -> dict:
    bench, s = self.bench, self.settings
    source = bench.source
    out = cw.run(
      r,
      source,
      bench.calibration(draw),
      rounds=arm["rounds"],
      finetune_steps=self.finetune_steps(arm),
      finetune_lr=s["finetune_lr"],
      bit_step=arm["bit_step"],
      aux_losses=s["finetune_aux_losses"],
      log=lambda *_: None,
    )
    if r.act_bits:  # the activation quantizer runs in the compressed model only
      scores = bench.evaluate(*out.compressed())
      sets = bench.routing_sets(out.compressed()[1], *out.compressed()[::2])
    else:
      scores = bench.evaluate(source.model, out.float_params, source.rest)
      sets = bench.routing_sets(out.float_params)
    scores["rerouted"] = measure.rerouted(bench.source_sets, sets)
    scores.update(self._matched(scores, sets, arm["finetune"]))
    for key, name in (("average_bits", "average_bits"), ("parameters", "expert_parameters")):
      if out.report.get(key) is not None:
        scores[name] = out.report[key]
    if out.model is not None:
      m, params, rest = out.compressed()
      scores["packed_expert_bytes"] = cw.packed_bytes(m, params, rest)
      scores["stored_bytes"] = measure.parameter_bytes(params, rest)
    return scores

  def notes(self, results: dict) -> str:
    parts = [self._equal_bytes(results)] if self.settings["equal_bytes"] else []
    return "\n\n".join(parts + [super().notes(results)])

  def _equal_bytes(self, results: dict) -> str:
    """Per pair of (arm, level)s about equal in packed bytes: the bpb difference paired
    by draw, and the verdict for 'the first is lower' (source: ours)."""
    by_key = report.index_runs(results["runs"])

    def size(by_draw):
      return f"{np.mean(list(by_draw.values())):,.0f}" if by_draw else "—"

    rows = []
    for arm, level, other, other_level in self.settings["equal_bytes"]:
      values = [
        report.values(self.spec, by_key, name, {self.axis: lv}, metric)
        for name, lv in ((arm, level), (other, other_level))
        for metric in ("bpb", "packed_expert_bytes")
      ]
      draws = sorted(set(values[0]) & set(values[2]))
      if not draws:
        continue
      diff = stats.paired_difference([values[0][d] for d in draws], [values[2][d] for d in draws])
      rows.append(
        [
          f"{arm} at {level}",
          size(values[1]),
          f"{other} at {other_level}",
          size(values[3]),
          stats.format_interval(diff),
          stats.verdict(diff, "lower", fmt="{:.4f}"),
        ]
      )
    table = stats.markdown_table(
      [
        "arm",
        "packed bytes",
        "against",
        "packed bytes",
        "bpb difference",
        "verdict (expect lower; ours)",
      ],
      rows,
    )
    return f"## At about equal packed expert bytes (bpb)\n\n{table}"
