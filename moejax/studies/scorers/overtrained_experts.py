"""Overtrained experts merge worse (arXiv 2506.14126) on a zoo model and the mix
corpus's domains: K experts fine-tuned from one base for many epochs over a small
pool of windows each, checkpointed every `checkpoint_every` steps, merged at every
checkpoint (moejax/merging/overtraining.py, posttrain/domain_finetune.py, the shared
setup in domain_runs.py).

Draw d (the seed of the pools, the epoch orders and the step keys): expert k trains
`steps` steps of `batch` rows cycling over `pool` windows of domain k's training
stream. At each checkpoint the K experts are merged by the level's method
(task_arithmetic or ties) over the uniform weights 1/K, the merge scale tuned among
`scales` on the selection windows (the mean loss over the K domains). Metrics are
on the test windows, losses in nats per token:
  experts_early / experts_final  the mean over the K experts of each one's loss on
                 its own domain at step `early` / at the last step
  merged_early / merged_final    the merged model's mean loss over the K domains
  merged_peak    at the checkpoint of its lowest selection loss; peak_fraction: that
                 step over the last
  merged_stopped the experts each kept at its own early_stop checkpoint (own-domain
                 selection loss, `tolerance`), then merged; stop/<domain>: the steps
  base           the base model
merged_final also holds the forgetting analysis on the experts' own training pools:
late_fraction (examples learned late: more than `late_share` of their gain after
the middle checkpoint), retention_late / retention_early (the share of the experts'
gain the final merge keeps on each set), forgetting_gap (early - late) and
hardness_gap (the base's mean loss on the late-learned examples minus the
early-learned ones). Curves: loss@<step> (the experts' mean own loss on
experts_final, the merge's loss on merged_final, with scale@<step>).
"""

from __future__ import annotations

import functools

import numpy as np

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report
from moejax.studies.scorers.domain_runs import DomainRunScorer
from moejax.studies.scoring import PAIRING, SCORERS, digest

ARMS = (
  "experts_early",
  "experts_final",
  "merged_early",
  "merged_final",
  "merged_peak",
  "merged_stopped",
  "base",
)
METHODS = ("task_arithmetic", "ties")
FORGETTING = (
  "late_fraction",
  "retention_late",
  "retention_early",
  "forgetting_gap",
  "hardness_gap",
)


@SCORERS.register("overtrained_experts")
class OvertrainedExperts(DomainRunScorer):
  settings = {
    **DomainRunScorer.settings,
    "steps": 240,
    "checkpoint_every": 30,
    "early": 60,
    "pool": 128,
    "scales": [0.5, 1.0, 2.0, 4.0],
    "density": 0.2,
    "tolerance": 0.1,
    "late_share": 0.5,
  }
  arm_settings = {}
  INTEGERS = DomainRunScorer.INTEGERS + ("steps", "checkpoint_every", "early", "pool")

  @property
  def checkpoints(self) -> list[int]:
    """The steps merged at, the base's 0 first."""
    s = self.settings
    return list(range(0, s["steps"] + 1, s["checkpoint_every"]))

  def metrics(self):
    steps = self.checkpoints if _is_int(self.settings["checkpoint_every"]) else []
    return (
      ("loss", "peak_fraction")
      + FORGETTING
      + tuple(f"stop/{d}" for d in self.domains)
      + tuple(f"{kind}@{step}" for kind in ("loss", "scale") for step in steps)
    )

  def check(self) -> None:
    super().check()
    s = self.settings
    if s["steps"] % s["checkpoint_every"] or s["early"] not in self.checkpoints[1:-1]:
      raise ConfigError(
        f"study.settings.steps={s['steps']} must be a multiple of checkpoint_every="
        f"{s['checkpoint_every']}, and early={s['early']} a checkpoint before the last"
      )
    scales = s["scales"]
    if not isinstance(scales, list) or not scales or not all(_positive(v) for v in scales):
      raise ConfigError(f"study.settings.scales={scales!r} must be a list of numbers > 0")
    for key, high in (("density", 1.0), ("late_share", 1.0), ("tolerance", None)):
      value = s[key]
      if not _positive(value, allow_zero=key == "tolerance") or (high and value > high):
        raise ConfigError(f"study.settings.{key}={value!r} must be a number in range")
    unknown = [a for a in self.spec.arm_names if a not in ARMS]
    if unknown:
      raise ConfigError(
        f"study.arms: {unknown[0]!r} is not an arm of scorer 'overtrained_experts'; "
        f"arms: {', '.join(ARMS)}"
      )
    if self.spec.axes != ["merge"] or any(lv["merge"] not in METHODS for lv in self.spec.levels):
      raise ConfigError(
        f"study.levels must give the one axis merge, each one of {', '.join(METHODS)}"
      )

  def merged(self, method: str, experts: list, scale: float) -> dict:
    from moejax.merging import bind

    settings = {
      "scale": scale,
      **({"density": self.settings["density"]} if method == "ties" else {}),
    }
    return bind(method, settings)(self.source.params, experts)

  def tuned(self, method: str, experts: list) -> tuple[float, dict, float, dict]:
    """(scale, merged params, mean selection loss, test losses per domain) of the scale
    whose merge has the lowest mean selection loss over the K domains."""
    best = None
    for scale in self.settings["scales"]:
      params = self.merged(method, experts, float(scale))
      selection = self.losses(params, None, self.domains, halves=("selection",))
      value = float(np.mean(list(selection.values())))
      if best is None or value < best[0]:
        best = (value, float(scale), params)
    assert best is not None
    value, scale, params = best
    return scale, params, value, self.losses(params, None, self.domains, halves=("test",))

  @functools.lru_cache(maxsize=1)
  def _pass(self, draw: int) -> dict:
    """Every run, merge and score of draw `draw` (module doc)."""
    from moejax.merging import overtraining
    from moejax.posttrain.calibration import calibration_windows
    from moejax.posttrain.domain_finetune import SEED_STRIDE, pool_batches

    s, base, steps = self.settings, self.source, self.checkpoints
    seq = self.data.seq_len + 1
    pools, snaps, own, pool_nats = [], [], [], []
    for k, (domain, stream) in enumerate(zip(self.domains, self.streams)):
      pool = calibration_windows(stream, s["pool"], seq, SEED_STRIDE * draw + k)
      batches = pool_batches(pool, s["steps"], s["batch"], SEED_STRIDE * draw + k)
      runs = self.finetuner.run(base.params, base.rest, batches, seed=draw, snapshot_at=steps[1:])
      runs[0] = (base.params, base.rest)
      models = [runs[t] for t in steps]  # (params, rest) per checkpoint
      pools.append(pool)
      snaps.append([params for params, _ in models])
      own.append([self.losses(params, rest, [domain]) for params, rest in models])
      pool_nats.append([self.window_nats(params, rest, pool) for params, rest in models])
    curves = {}
    for method in METHODS:
      if not any(lv["merge"] == method for lv in self.spec.levels):
        continue
      per_step = [self.tuned(method, [snap[c] for snap in snaps]) for c in range(1, len(steps))]
      stops = [
        overtraining.early_stop([o[(d, "selection")] for o in own[k]], s["tolerance"])
        for k, d in enumerate(self.domains)
      ]
      stopped = self.tuned(method, [snaps[k][c] for k, c in enumerate(stops)])
      final = per_step[-1][1]
      merged_pool = [self.window_nats(final, base.rest, pool) for pool in pools]
      curves[method] = {"per_step": per_step, "stops": stops, "stopped": stopped}
      curves[method]["forgetting"] = self.forgetting(pool_nats, merged_pool)
    return {
      "own": own,
      "curves": curves,
      "base": self.losses(base.params, base.rest, self.domains, halves=("test",)),
      "pairing": digest(*self.digest_inputs(), *pools),
    }

  def forgetting(self, pool_nats: list, merged_pool: list) -> dict:
    """The FORGETTING metrics over every expert's pool (module doc)."""
    from moejax.merging import overtraining

    middle = (len(self.checkpoints) - 1) // 2
    base, mid, final = (np.concatenate([p[c] for p in pool_nats]) for c in (0, middle, -1))
    merged = np.concatenate(merged_pool)
    late, early = overtraining.late_learned(base, mid, final, self.settings["late_share"])
    kept = {
      name: overtraining.retention(base, final, merged, mask)
      for name, mask in (("late", late), ("early", early))
    }
    hardness = np.mean(base[late]) - np.mean(base[early]) if late.any() and early.any() else np.nan
    return {
      "late_fraction": float(late.sum() / max(late.sum() + early.sum(), 1)),
      "retention_late": kept["late"],
      "retention_early": kept["early"],
      "forgetting_gap": kept["early"] - kept["late"],
      "hardness_gap": float(hardness),
    }

  def score(self, level, draw, arms):
    found = self._pass(draw)
    steps, s = self.checkpoints, self.settings
    curve = found["curves"][level["merge"]]
    early = steps.index(s["early"])

    def own_mean(c):
      return float(np.mean([o[c][(d, "test")] for o, d in zip(found["own"], self.domains)]))

    def merged_mean(c):  # c: checkpoint index >= 1
      return float(np.mean(list(curve["per_step"][c - 1][3].values())))

    peak = 1 + int(np.argmin([entry[2] for entry in curve["per_step"]]))
    out = {
      "experts_early": {"loss": own_mean(early)},
      "experts_final": {
        "loss": own_mean(-1),
        **{f"loss@{t}": own_mean(c) for c, t in enumerate(steps)},
      },
      "merged_early": {"loss": merged_mean(early)},
      "merged_final": {
        "loss": merged_mean(len(steps) - 1),
        **{f"loss@{t}": merged_mean(c) for c, t in enumerate(steps) if c},
        **{f"scale@{t}": curve["per_step"][c - 1][0] for c, t in enumerate(steps) if c},
        **curve["forgetting"],
      },
      "merged_peak": {"loss": merged_mean(peak), "peak_fraction": steps[peak] / steps[-1]},
      "merged_stopped": {
        "loss": float(np.mean(list(curve["stopped"][3].values()))),
        **{f"stop/{d}": float(steps[c]) for d, c in zip(self.domains, curve["stops"])},
      },
      "base": {"loss": float(np.mean(list(found["base"].values())))},
    }
    return {arm: self.finite({**out[arm], PAIRING: found["pairing"]}) for arm in arms}

  def curve(self, results: dict, arm: str, level: dict, kind: str = "loss") -> np.ndarray:
    """[draws, checkpoints] of `kind`@<step> of `arm` (NaN where missing)."""
    by_key = report.index_runs(results["runs"])
    out = np.full((self.spec.draws, len(self.checkpoints)), np.nan)
    for draw in range(self.spec.draws):
      run = by_key.get((arm, report.level_key(level), 0, draw))
      for c, step in enumerate(self.checkpoints):
        value = None if run is None else run["metrics"].get(f"{kind}@{step}")
        out[draw, c] = np.nan if value is None else value
    return out

  def notes(self, results: dict) -> str:
    """Per method and draw: the merged curve's best step, the experts' stops, forgetting."""
    by_key = report.index_runs(results["runs"])
    rows = []
    for level in self.spec.levels:
      for draw in range(self.spec.draws):

        def get(arm, metric):
          run = by_key.get((arm, report.level_key(level), 0, draw))
          return None if run is None else run["metrics"].get(metric)

        if get("merged_final", "loss") is None:
          continue
        stops = ", ".join(f"{int(get('merged_stopped', f'stop/{d}') or 0)}" for d in self.domains)
        peak = get("merged_peak", "peak_fraction")
        rows.append(
          [
            level["merge"],
            draw,
            "—" if peak is None else int(round(peak * self.checkpoints[-1])),
            f"({stops})",
            *(
              _text(get("merged_final", m))
              for m in ("late_fraction", "retention_early", "retention_late", "hardness_gap")
            ),
          ]
        )
    table = stats.markdown_table(
      [
        "merge",
        "draw",
        "merged best step (selection)",
        f"stops ({', '.join(self.domains)})",
        "late-learned fraction",
        "retention early-learned",
        "retention late-learned",
        "hardness gap (nats)",
      ],
      rows,
    )
    return (
      "## Per draw\n\nThe forgetting columns are over the experts' own training pools: an "
      "example is learned late when more than "
      f"{self.settings['late_share']} of its loss gain (base to final expert) comes after "
      "the middle checkpoint; retention is the share of the experts' summed gain on the "
      "set that the final merge keeps; the hardness gap is the base's mean loss on the "
      f"late-learned examples minus the early-learned ones.\n\n{table}"
    )

  def plot(self, results: dict, path: str) -> bool:
    """Left: the experts' mean own-domain loss and each merge's loss against the step
    (every draw); right: the chosen task-arithmetic scale per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.asarray(self.checkpoints)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=(2, 1))
    first = self.spec.levels[0]
    for draw, row in enumerate(self.curve(results, "experts_final", first)):
      left.plot(
        steps,
        row,
        "k-",
        marker="o",
        ms=3,
        alpha=0.8,
        label="experts, own domain" if draw == 0 else None,
      )
    for m, level in enumerate(self.spec.levels):
      for draw, row in enumerate(self.curve(results, "merged_final", level)):
        left.plot(
          steps[1:],
          row[1:],
          f"C{m}-",
          marker="s",
          ms=3,
          alpha=0.8,
          label=f"merged ({level['merge']}), all K domains" if draw == 0 else None,
        )
        right.plot(
          steps[1:],
          self.curve(results, "merged_final", level, "scale")[draw, 1:],
          f"C{m}-",
          marker="s",
          ms=3,
          label=level["merge"] if draw == 0 else None,
        )
    left.set(
      xlabel="fine-tuning step",
      ylabel="held-out loss (nats/token)",
      title=f"experts against their merge ({self.spec.draws} seeds)",
    )
    left.legend(fontsize=7)
    right.set(
      xlabel="fine-tuning step",
      ylabel="scale chosen on selection windows",
      title="tuned merge scale",
    )
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive(value, allow_zero: bool = False) -> bool:
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  return number and np.isfinite(value) and (value >= 0 if allow_zero else value > 0)


def _text(value) -> str:
  return "—" if value is None else f"{value:.3f}"
