"""Knowledge editing on a trained workdir (moejax/editing/): every edit method on
the same drawn edits of the facts domain, scored on the paper's axes
(editing/measure.py) and held-out bits per byte (posttrain/measure.Bench).

Arms: `method` (an edit method, editing/methods.py, or 'none': the unedited
model) with `project` (moe_edit's null-space projection). Levels: `edits`, the
number of facts edited at once. Draw d: the edits (facts.draw_facts with seed d),
`unedited` other people's facts (seed 1000 + d), the preserved windows
(`num_preserved` windows of the training split, seed d) and the unrelated
windows of the held-out documents outside the facts domain (seed d), shared by
every arm of the draw (their digest is the pairing key). The target of an edit
and the projectors are computed once per draw and shared by the arms.

Metrics: editing/measure.py's, plus bpb/<domain> and bpb_other (the mean over the
domains other than facts) on the same held-out bytes.
"""

from __future__ import annotations

import functools

import numpy as np

from moejax.studies.scorers.pruning import SourceScorer
from moejax.studies.scoring import PAIRING, SCORERS, digest

FACTS_METRICS = (
  "efficacy",
  "efficacy_score",
  "target_prob",
  "paraphrase",
  "paraphrase_score",
  "unedited_accuracy",
  "unedited_nll_change",
  "routing_kl",
  "topk_change",
)


@SCORERS.register("moe_edit")
class MoEEditScorer(SourceScorer):
  settings = {
    "workdir": "runs/zoo/s",
    "num_windows": 16,
    "bytes_per_domain": 4096,
    "probes": "",
    "probe_count": 1,
    "unedited": 50,
    "unrelated_windows": 8,
    "layers": [1, 2],
  }
  arm_settings = {"method": "none", "project": True}

  def extra_metrics(self):
    return FACTS_METRICS + ("bpb_other",)

  def check(self) -> None:
    from moejax.editing import methods

    super().check()
    self.check_integers({"unedited": 1, "unrelated_windows": 1})
    self.check_levels(("edits",), int)
    for _, arm in self.spec.arms:
      if arm["method"] != "none":
        methods.check_model(self.bound(arm), self.source_config.model)

  def bound(self, arm: dict):
    from moejax.editing import methods

    overrides: dict[str, tuple | bool] = {"layers": tuple(self.settings["layers"])}
    if arm["method"] == "moe_edit":
      overrides["project"] = bool(arm["project"])
      overrides["check_capacity"] = False  # more rows than null-space room: least squares
    return methods.get(arm["method"]).bind(overrides)

  @functools.cached_property
  def graphdef(self):
    return self.bench.graphdef

  @functools.cached_property
  def other_stream(self) -> np.ndarray:
    from moejax.data.pipeline import split_documents

    tokenizer, ids = self.bench.source.tokenizer, []
    for domain, text in split_documents(self.bench.run_config.data):
      if domain != "facts":
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eos_id)
    return np.asarray(ids, np.int32)

  def score(self, level, draw, arms):
    from moejax.editing import edit, facts, measure
    from moejax.posttrain.calibration import calibration_windows

    b, s = self.bench, self.settings
    src, seq_len = b.source, b.source.config.data.seq_len
    edits = facts.draw_facts(level["edits"], draw)
    unedited = facts.draw_facts(s["unedited"], 1000 + draw, exclude=[e.subject for e in edits])
    preserved = calibration_windows(b.train_stream, s["num_windows"], seq_len, seed=draw)
    unrelated = calibration_windows(self.other_stream, s["unrelated_windows"], seq_len, seed=draw)
    pairing = digest(preserved, unrelated, np.asarray([hash(e) % 2**31 for e in edits]))
    reference = measure.routing_reference(self.graphdef, src.params, src.rest, unrelated)
    first = min(s["layers"])
    cache, out = {}, {}
    for name, arm in arms.items():
      params = src.params
      if arm["method"] != "none":
        params, _ = edit.edit_model(
          src.model,
          src.params,
          src.rest,
          src.tokenizer,
          src.eos_id,
          edits,
          self.bound(arm),
          preserved,
          cache=cache,
        )
      got = measure.fact_metrics(
        self.graphdef, src.params, params, src.rest, src.tokenizer, src.eos_id, edits, unedited
      )
      got.update(
        measure.routing_shift(
          self.graphdef, src.params, params, src.rest, unrelated, first, reference=reference
        )
      )
      got.update(b.evaluate(src.model, params, src.rest))
      others = [v for k, v in got.items() if k.startswith("bpb/") and k != "bpb/facts"]
      got["bpb_other"] = float(np.mean(others)) if others else float("nan")
      got[PAIRING] = pairing
      out[name] = got
    return out
