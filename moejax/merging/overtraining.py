"""Merging experts checkpointed through fine-tuning (Horoi et al., arXiv 2506.14126):
long fine-tuning keeps improving each expert on its own task while the merge of
the experts peaks early; the late steps are spent on a few hard examples that the
merge then forgets; a task-dependent, aggressive early stop of each expert fixes it.

  early_stop        the checkpoint each expert keeps: the first checkpoint c >= 1 whose
                    gain over checkpoint c - 1 is below `tolerance` times the gain
                    since the start (L[c-1] - L[c] < tolerance (L[0] - L[c])), or the
                    last; then the best of checkpoints 1..c by the same loss. The rule
                    reads only the expert's own held-out loss, so each task stops at
                    its own step. The paper's exact rule is not given in its abstract:
                    this one is our guess.
  late_learned      which examples an expert learns late: of an example's loss gain
                    from the base to the final checkpoint, more than `share` comes
                    after the middle checkpoint (examples without gain are neither)
  retention         the fraction of the experts' summed gain on a set of examples that
                    the merged model keeps: sum(base - merged) / sum(base - expert)

Losses are per example (a window's mean next-token loss); lower is better.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError


def _finite(name: str, values) -> np.ndarray:
  out = np.asarray(values, np.float64)
  if out.size == 0 or not np.all(np.isfinite(out)):
    raise ConfigError(f"{name} must be non-empty and finite, got {out.tolist()}")
  return out


def early_stop(curve, tolerance: float) -> int:
  """The checkpoint index kept for one expert from its held-out loss `curve` [C + 1]
  (index 0: the base); see the module doc. tolerance >= 0 (0: stop only at a rise)."""
  curve = _finite("the loss curve", curve)
  if curve.ndim != 1 or curve.size < 2:
    raise ConfigError(f"the loss curve needs the base and >= 1 checkpoint, got {curve.size}")
  if not (np.isfinite(tolerance) and tolerance >= 0):
    raise ConfigError(f"tolerance={tolerance!r} must be a finite number >= 0")
  stop = curve.size - 1
  for c in range(1, curve.size):
    if curve[c - 1] - curve[c] < tolerance * (curve[0] - curve[c]):
      stop = c
      break
  return 1 + int(np.argmin(curve[1 : stop + 1]))


def late_learned(base, middle, final, share: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
  """(late, early) bool masks over examples from their losses under the base, the
  middle and the final checkpoint: of the gain base - final > 0, more than `share`
  (late) or at most `share` (early) comes after the middle checkpoint."""
  base, middle, final = (
    _finite(n, v) for n, v in (("base", base), ("middle", middle), ("final", final))
  )
  if not base.shape == middle.shape == final.shape:
    raise ConfigError(f"losses of different shapes: {base.shape}, {middle.shape}, {final.shape}")
  gain = base - final
  learned = gain > 0
  late_gain = middle - final
  late = learned & (late_gain > share * gain)
  return late, learned & ~late


def retention(base, expert, merged, mask=None) -> float:
  """sum(base - merged) / sum(base - expert) over the examples in `mask` (all by
  default); NaN when the experts gained nothing there."""
  base, expert, merged = (
    _finite(n, v) for n, v in (("base", base), ("expert", expert), ("merged", merged))
  )
  keep = np.ones(base.shape, bool) if mask is None else np.asarray(mask, bool)
  gained = float(np.sum((base - expert)[keep]))
  if gained <= 0:
    return float("nan")
  return float(np.sum((base - merged)[keep])) / gained
