"""RepetitionCurse (arXiv 2512.23995) on a trained MoE LM: attack prompts against held-out
text, by the time-to-first-token model and the routing figures of
moejax/analysis/repetition.py.

Arms (arm setting `prompt`), settings.num_prompts rows of `length` tokens each:
  natural    held-out windows (block d of the eval split, phenomena.HeldOut), the benign text
  repeated   one token repeated, no BOS (the paper's prompt; the identity case: every
             position is position 0 again, forced_identical = 1)
  prefixed   the separator (BOS) id and settings.prefix_text, then one token repeated
  pattern    the same prefix, then a unit of settings.pattern tokens repeated
  chat       the same prefix, then settings.chat_open, one token repeated, settings.chat_close
Draw d draws the repeated tokens with numpy default_rng(d) from the byte values 32..126
and reads held-out block d. Metrics: same_set_fraction over the repeated span (mean
over MoE layers), forced_identical, max_over_mean_load (mean over layers),
ttft_over_balanced (simulated_ttft over settings.expert_shards devices), prefill_seconds
(measured, one device: expert parallelism is not simulated in it), drop_rate of capacity
dispatch at settings.capacity_factor and busiest_device_capped (means over layers).
"""

from __future__ import annotations

import functools

import numpy as np

from moejax.errors import ConfigError
from moejax.studies.scoring import SCORERS, Scorer, digest

PROMPTS = ("natural", "repeated", "prefixed", "pattern", "chat")


@SCORERS.register("repetition_curse")
class RepetitionCurse(Scorer):
  settings = {
    "workdir": "runs/zoo/s",
    "length": 0,
    "num_prompts": 8,
    "expert_shards": 8,
    "capacity_factor": 1.25,
    "bytes_per_domain": 16384,
    "pattern": 3,
    "prefix_text": "The story so far: ",
    "chat_open": "User: ",
    "chat_close": "\nAssistant:",
    "prefill_repeats": 5,
  }
  arm_settings = {"prompt": "natural"}

  def metrics(self):
    return (
      "same_set_fraction",
      "forced_identical",
      "max_over_mean_load",
      "ttft_over_balanced",
      "prefill_seconds",
      "drop_rate",
      "busiest_device_capped",
    )

  @functools.cached_property
  def held_out(self):
    from moejax.analysis.phenomena import HeldOut

    return HeldOut.of_study(self.settings, "length")

  def check(self):
    s = self.settings
    for key in (
      "length",
      "num_prompts",
      "expert_shards",
      "bytes_per_domain",
      "pattern",
      "prefill_repeats",
    ):
      low = 0 if key == "length" else 1
      if not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < low:
        raise ConfigError(f"study.settings.{key}={s[key]!r} must be an integer >= {low}")
    if not s["capacity_factor"] > 0:
      raise ConfigError(f"study.settings.capacity_factor={s['capacity_factor']!r} must be > 0")
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["prompt"] not in PROMPTS:
        raise ConfigError(
          f"study.arms[{i}].prompt={arm['prompt']!r} (arm {name!r}) must be "
          f"one of {', '.join(PROMPTS)}"
        )
    m = self.held_out.config.model
    if m.ffn_type != "moe" or m.moe.expert_counts:
      raise ConfigError(
        f"study.settings.workdir={s['workdir']!r}: needs an MoE model with one expert count"
      )
    if m.moe.num_experts % s["expert_shards"]:
      raise ConfigError(
        f"study.settings.expert_shards={s['expert_shards']} must divide the "
        f"{m.moe.num_experts} experts"
      )
    for draw in range(self.spec.draws):
      self.prompts(draw)

  @functools.cached_property
  def model(self):
    from moejax.analysis.super_experts import model_of

    h = self.held_out
    return model_of((h.config, h.params, h.rest))

  @functools.cache
  def prompts(self, draw: int) -> dict:
    """{prompt kind: (tokens [N, length], span)} of draw `draw` (ConfigError when the
    held-out block has fewer than num_prompts windows or a prompt does not fit)."""
    from moejax.analysis import repetition as rep

    s, h = self.settings, self.held_out
    count, length = s["num_prompts"], h.context
    _, windows, _ = h.windows(
      draw,
      s["bytes_per_domain"],
      f"(study.settings.length={s['length']}, bytes_per_domain={s['bytes_per_domain']})",
    )
    if len(windows) < count:
      raise ConfigError(
        f"study.settings.num_prompts={count} must be at most the "
        f"{len(windows)} held-out windows of block {draw}"
      )

    def encode(text):
      return list(h.tokenizer.encode(text))

    prefix = [h.separator, *encode(s["prefix_text"])]
    chat = (encode(s["chat_open"]), encode(s["chat_close"]))
    ids = np.random.default_rng(draw).integers(32, 127, count * s["pattern"])
    try:
      return {
        "natural": (windows[np.linspace(0, len(windows) - 1, count).astype(int)], slice(None)),
        "repeated": rep.attack_prompts(ids[:count], length),
        "prefixed": rep.attack_prompts(ids[:count], length, prefix=prefix),
        "pattern": rep.attack_prompts(ids, length, prefix=prefix, pattern=s["pattern"]),
        "chat": rep.attack_prompts(ids[:count], length, prefix=prefix, chat=chat),
      }
    except ValueError as e:
      raise ConfigError(f"{e} (study.settings.length={s['length']}, pattern={s['pattern']})")

  def score(self, level, draw, arms):
    import jax.numpy as jnp
    from moejax.analysis import repetition as rep
    from moejax.dispatch.capacity import expert_capacity

    s, (m, graphdef, params, rest) = self.settings, self.model
    moe, prompts, out = m.moe, self.prompts(draw), {}
    for name, arm in arms.items():
      tokens, span = prompts[arm["prompt"]]
      routing = rep.routing_of(graphdef, params, rest, jnp.asarray(tokens))
      capacity = expert_capacity(
        tokens.size, moe.num_experts, moe.top_k, s["capacity_factor"], moe.capacity.min
      )
      layers = rep.kind_report(
        routing, len(tokens), moe.num_experts, s["expert_shards"], capacity, span
      )

      def mean(key, layers=layers):
        return float(np.mean([layer[key] for layer in layers]))

      out[name] = {
        "same_set_fraction": mean("same_set_fraction"),
        "forced_identical": rep.forced_identical(tokens),
        "max_over_mean_load": mean("max_over_mean_load"),
        "ttft_over_balanced": rep.simulated_ttft(routing, moe.num_experts, s["expert_shards"])[
          "over_balanced"
        ],
        "prefill_seconds": rep.prefill_seconds(
          graphdef, params, rest, tokens, s["prefill_repeats"]
        ),
        "drop_rate": mean("drop_rate"),
        "busiest_device_capped": mean("busiest_device_capped"),
        "pairing": digest(prompts["natural"][0]),
      }
    return out
