"""TLGA / J-TLGA / J-TLAT (arXiv 2602.01369) at small scale: a space-time ViT-MoE
(moejax/models/vit.py, model.vit.frames) classifying moving-digit videos
(moejax/data/moving_digits.py) attacked by PGD, the router attack and the joint attack
(moejax/attacks/), and defended by PGD adversarial training or J-TLAT
(moejax/train/adversarial.py).

Arms name a defence (None: the standard model) and the attack that measures it:
pgd, tlga_r, j_tlga attack the standard model; pgd_at and j_tlat are the defended
models under j_tlga. Draw d is seed settings.seed + d: the videos, the standard
model (settings.steps Adam steps) and the defended models (settings.defence_steps
adversarial steps from the standard model); every arm of a draw scores the same
test videos (pairing key: their labels and the standard model's weights).

Metrics: clean_accuracy; robust_accuracy_low / _high: accuracy on the attack's
x_adv at epsilon_low / epsilon_high; flip_rate: the fraction of routing decisions
the attack changes at epsilon_high (moejax/attacks/base.py routing_flip_rate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.studies import report
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

INTEGER_SETTINGS = (
  "seed",
  "train_videos",
  "test_videos",
  "d_model",
  "layers",
  "heads",
  "head_dim",
  "experts",
  "top_k",
  "expert_d_ff",
  "patch",
  "steps",
  "batch",
  "defence_steps",
  "attack_steps",
  "train_attack_steps",
)
METRICS = ("clean_accuracy", "robust_accuracy_low", "robust_accuracy_high", "flip_rate")


def video_model_config(s, frames: int, size: int) -> ml_collections.ConfigDict:
  """The `model` section of the study's ViT-MoE: every block MoE, mean pooling."""
  from moejax.config import base_config
  from moejax.data.moving_digits import NUM_CLASSES

  m = base_config().model
  m.d_model, m.num_layers, m.num_heads = s["d_model"], s["layers"], s["heads"]
  m.num_kv_heads, m.head_dim, m.d_ff = s["heads"], s["head_dim"], 2 * s["d_model"]
  m.moe.num_experts, m.moe.top_k, m.moe.expert_d_ff = s["experts"], s["top_k"], s["expert_d_ff"]
  m.moe.first_dense, m.moe.every_n = 0, 1
  m.vit.update(
    dict(
      image_size=size,
      patch_size=s["patch"],
      num_channels=1,
      num_classes=NUM_CLASSES,
      pooling="mean",
      frames=frames,
    )
  )
  return m


@SCORERS.register("video_attacks")
class VideoAttacks(Scorer):
  settings = {
    "seed": 0,
    "train_videos": 2048,
    "test_videos": 256,
    "shrink": False,  # every other frame, row and column: 4 frames of 8x8 (tests)
    "d_model": 32,
    "layers": 2,
    "heads": 4,
    "head_dim": 8,
    "experts": 4,
    "top_k": 2,
    "expert_d_ff": 32,
    "patch": 4,
    "steps": 800,
    "batch": 64,
    "lr": 3e-3,
    "defence_steps": 100,
    "epsilon_low": 2 / 255,
    "epsilon_high": 8 / 255,
    "attack_steps": 10,
    "train_attack_steps": 3,
  }
  arm_settings = {"defence": None, "attack": None}

  def __init__(self, spec):
    super().__init__(spec)
    self.cache: tuple[int, dict] | None = None

  def metrics(self):
    return METRICS

  def arm(self, name: str) -> tuple[str | None, str]:
    """(defence or None, attack) of arm `name` (attack: the arm's name by default)."""
    a = self.spec.arm(name)
    return a["defence"], a["attack"] or name

  def check(self) -> None:
    from moejax.attacks import ATTACKS
    from moejax.train.adversarial import DEFENCES

    s = self.settings
    self.check_integers({key: int(key != "seed") for key in INTEGER_SETTINGS})
    self.check_numbers(("lr", "epsilon_low", "epsilon_high"), positive=False)
    if s["top_k"] > s["experts"]:
      raise ConfigError(f"study.settings.top_k={s['top_k']} exceeds experts={s['experts']}")
    if (8 if s["shrink"] else 16) % s["patch"]:
      raise ConfigError(f"study.settings.patch={s['patch']} must divide the frame size")
    for i, (name, _) in enumerate(self.spec.arms):
      defence, attack = self.arm(name)
      if attack not in ATTACKS:
        raise ConfigError(
          f"study.arms[{i}].attack={attack!r} (arm {name!r}) must be one of {', '.join(ATTACKS)}"
        )
      if defence is not None and defence not in DEFENCES:
        raise ConfigError(
          f"study.arms[{i}].defence={defence!r} (arm {name!r}) must be one of "
          f"{', '.join(DEFENCES)} or None"
        )

  def draw(self, draw: int) -> dict:
    """The draw's videos and its standard model (cached for the draw's arms)."""
    from moejax.data.moving_digits import moving_digits
    from moejax.models.vit import VisionTransformer
    from moejax.train.adversarial import train_classifier

    if self.cache is not None and self.cache[0] == draw:
      return self.cache[1]
    s, seed = self.settings, self.settings["seed"] + draw
    (xtr, ytr), (xte, yte) = (
      moving_digits(split, s[f"{split}_videos"], seed) for split in ("train", "test")
    )
    if s["shrink"]:
      xtr, xte = xtr[:, ::2, ::2, ::2], xte[:, ::2, ::2, ::2]
    m = video_model_config(s, xtr.shape[1], xtr.shape[2])
    model = VisionTransformer(ml_collections.FrozenConfigDict(m), rngs=nnx.Rngs(seed))
    model = train_classifier(
      model, xtr, ytr, steps=s["steps"], batch=s["batch"], learning_rate=s["lr"], seed=seed
    )
    weights = jax.tree.leaves(nnx.state(model, nnx.Param))
    data = {
      "seed": seed,
      "train": (xtr, ytr),
      "test": (jnp.asarray(xte), jnp.asarray(yte)),
      "models": {None: model},
      "key": digest(yte, *[np.asarray(w) for w in weights]),
    }
    self.cache = draw, data
    return data

  def defended(self, data: dict, defence: str | None):
    """The standard model, or it after settings.defence_steps of `defence`."""
    from moejax.train.adversarial import train_classifier

    if defence not in data["models"]:
      s = self.settings
      data["models"][defence] = train_classifier(
        data["models"][None],
        *data["train"],
        steps=s["defence_steps"],
        batch=s["batch"],
        learning_rate=s["lr"],
        seed=data["seed"],
        defence=defence,
        epsilon=s["epsilon_high"],
        attack_steps=s["train_attack_steps"],
      )
    return data["models"][defence]

  def score(self, level, draw, arms):
    from moejax.attacks import attack_inputs, routing_flip_rate

    s, data = self.settings, self.draw(draw)
    x, y = data["test"]
    out: dict[str, dict] = {}
    for name in arms:
      defence, attack = self.arm(name)
      model = self.defended(data, defence)

      def accuracy(inputs, model=model):
        return float(jnp.mean(jnp.argmax(model(inputs)[0], axis=-1) == y))

      adv = {
        level: attack_inputs(
          attack, model, x, y, epsilon=s[f"epsilon_{level}"], steps=s["attack_steps"]
        )
        for level in ("low", "high")
      }
      out[name] = {
        "clean_accuracy": accuracy(x),
        "robust_accuracy_low": accuracy(adv["low"]),
        "robust_accuracy_high": accuracy(adv["high"]),
        "flip_rate": routing_flip_rate(model, x, adv["high"]),
        PAIRING: data["key"],
      }
      data.setdefault("samples", {})[name] = np.asarray(adv["high"][:2])
    return out

  def notes(self, results):
    """The metrics no claim tests (clean accuracy), mean ± std over draws."""
    return report.unclaimed_summaries(self.spec, results["runs"], METRICS)

  def plot(self, results, path) -> bool:
    """Two test videos of the last draw scored: clean, then each arm's x_adv at
    epsilon_high, then its perturbation scaled to [0, 1] (gray: 0). With nothing scored
    in this process (a resume of a finished study) the picture at `path` is kept."""
    if self.cache is None or "samples" not in self.cache[1]:
      import os

      return os.path.exists(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data, eps = self.cache[1], self.settings["epsilon_high"]
    clean = np.asarray(data["test"][0][:2])
    rows = [("clean", clean)]
    for name, adv in data["samples"].items():
      rows += [(name, adv), (f"{name} delta", 0.5 + (adv - clean) / (2 * eps))]
    frames = clean.shape[1]
    fig, axes = plt.subplots(
      2 * len(rows), frames, figsize=(frames * 0.9, 2 * len(rows) * 0.9), squeeze=False
    )
    for v in range(2):
      for r, (label, videos) in enumerate(rows):
        for t in range(frames):
          ax = axes[v * len(rows) + r, t]
          ax.imshow(videos[v, t, :, :, 0], cmap="gray", vmin=0, vmax=1)
          ax.set_xticks([]), ax.set_yticks([])
        axes[v * len(rows) + r, 0].set_ylabel(label, fontsize=6, rotation=0, ha="right")
    fig.suptitle(f"video {{0, 1}} x frames; attacks at epsilon = {eps:.4f}", fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True
