r"""RepetitionCurse (arXiv 2512.23995): repeated-token prompts against held-out text on a
trained MoE LM (moejax/studies/scorers/repetition.py).

  python -m experiments.study --config=configs/studies/repetition_curse.py \
      [--config.settings.workdir=runs/zoo/s] [--config.draws=5]
  python -m experiments.study --config=configs/studies/repetition_curse.py:seeds=3

The paper's prompt (one token repeated, no BOS) routes every position alike by
construction (forced_identical = 1), so it is kept as a diagnostic; the claims read the
prompts that break that identity: a BOS and text prefix, a 3-token repeated pattern and
a chat-style turn. Time to first token is simulated over 8 expert-parallel devices
(repetition.simulated_ttft) and measured as prefill time on one device.
"""

import ml_collections

from moejax.studies import scoring
from moejax.train import zoo


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.name = "repetition_curse"
  c.description = (
    "RepetitionCurse (arXiv 2512.23995): a prompt of one repeated token sends every "
    "position to the same top-k experts, so under expert parallelism prefill waits for "
    "one overloaded device and time to first token rises (+20-148% on 8 GPUs). Each arm "
    "is num_prompts prompts of the training seq_len; draw d draws the repeated tokens "
    "with seed d and reads held-out block d for the natural text."
  )
  c.scorer = "repetition_curse"
  c.settings = scoring.defaults_with(c.scorer)
  c.arms = [
    {"name": kind, "prompt": kind}
    for kind in ("natural", "repeated", "prefixed", "pattern", "chat")
  ]
  c.draws = 5
  c.reference = "natural"

  def claim(arm, metric, expect, text, source="paper"):
    return {
      "arm": arm,
      "reference": "natural",
      "metric": metric,
      "expect": expect,
      "source": source,
      "text": text,
    }

  c.claims = [
    *[
      claim(
        arm,
        "ttft_over_balanced",
        "higher",
        f"{arm} prompts raise the simulated time to first token over held-out text",
      )
      for arm in ("prefixed", "pattern", "chat")
    ],
    *[
      claim(
        arm,
        "same_set_fraction",
        "higher",
        f"{arm} prompts put more positions on one top-k set than text",
      )
      for arm in ("prefixed", "pattern", "chat")
    ],
    claim("prefixed", "max_over_mean_load", "higher", "max/mean expert load rises"),
    claim(
      "prefixed",
      "prefill_seconds",
      None,
      "measured prefill time, one device (no expert parallelism: not the paper's setting)",
      "ours",
    ),
    claim(
      "prefixed",
      "busiest_device_capped",
      None,
      "the busiest device under capacity dropping: attack against benign text",
      "ours",
    ),
    claim(
      "prefixed",
      "drop_rate",
      None,
      "capacity dropping's drop rate: attack against benign text",
      "ours",
    ),
    claim(
      "repeated",
      "forced_identical",
      None,
      "the paper's prompt without BOS: every position is position 0 again (identity)",
      "ours",
    ),
  ]
  return zoo.over_seeds(c, arg)
