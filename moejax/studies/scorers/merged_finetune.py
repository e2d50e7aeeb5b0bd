"""Merged-expert MoE layers fine-tuned on Brown genre classification (NAMEx, arXiv
2510.16138, against SMEAR and EP-CAMEx; moejax/experts/merged.py).

Each (arm, draw) upcycles the dense model of settings.dense_workdir into an MoE of
settings.num_experts merged experts per layer (moejax/train/verbalized.py:
every expert and the base expert a copy of the layer's FFN, routers fresh from seed
d) with the arm's model.moe.merge and momentum, fine-tunes it on Brown passages
labelled by genre (moejax/data/brown_genres.py; training files of `mix`) and scores
the passages of the held-out files. The class logits are the LM's next-token logits
of one letter per genre after the passage (a verbalizer).

Draw d: the training passages, the routers' initialisation and the batch order come
from seed d; the held-out passages are the same in every draw (seed TEST_SEED).
Every arm of a draw sees the same passages in the same order (the pairing digest).
Metrics: accuracy and test_loss on the held-out passages, train_loss (the mean over
the last tenth of the steps).
"""

from __future__ import annotations

import functools
import math

from moejax.errors import ConfigError
from moejax.studies.scoring import PAIRING, SCORERS, Scorer, digest

TEST_SEED = 10_000
INTEGER_SETTINGS = (
  "num_experts",
  "segment_len",
  "passage_len",
  "train_per_genre",
  "test_per_genre",
  "steps",
  "batch_size",
)


@SCORERS.register("merged_finetune")
class MergedFinetune(Scorer):
  settings = {
    "dense_workdir": "runs/zoo/xs_dense",
    "num_experts": 4,
    "segment_len": 16,
    "eta": 0.5,
    "gamma": 1.0,
    "passage_len": 64,
    "train_per_genre": 100,
    "test_per_genre": 24,
    "steps": 100,
    "batch_size": 16,
    "learning_rate": 2e-3,
  }
  arm_settings = {"merge": "smear", "momentum_real": 0.0, "momentum_imag": 0.0}

  def metrics(self):
    return ("accuracy", "test_loss", "train_loss")

  def check(self) -> None:
    from moejax import cli_files
    from moejax.experts.merged import MERGE_RULES

    s = self.settings
    self.check_integers(dict.fromkeys(INTEGER_SETTINGS, 1))
    self.check_numbers(("eta", "gamma", "learning_rate"), positive=True)
    if s["batch_size"] > s["train_per_genre"]:
      raise ConfigError(
        f"study.settings.batch_size={s['batch_size']} exceeds the "
        f"{s['train_per_genre']} training passages of one genre"
      )
    for i, (name, arm) in enumerate(self.spec.arms):
      if arm["merge"] not in MERGE_RULES:
        raise ConfigError(
          f"study.arms[{i}].merge={arm['merge']!r} (arm {name!r}); merges: {', '.join(MERGE_RULES)}"
        )
      for key in ("momentum_real", "momentum_imag"):
        if not (isinstance(arm[key], (int, float)) and math.isfinite(arm[key])):
          raise ConfigError(f"study.arms[{i}].{key}={arm[key]!r} (arm {name!r}) must be a number")
    cli_files.checked_workdir("study.settings.dense_workdir", s["dense_workdir"], ("training",))

  @functools.cached_property
  def dense(self):
    """The dense model's last checkpoint (moejax.train.restore.Restored)."""
    from moejax.train.restore import restore

    return restore(self.settings["dense_workdir"])

  @functools.cached_property
  def documents(self) -> tuple[dict, dict, list[str]]:
    """({genre: training texts}, {genre: held-out texts}, genres sorted)."""
    from moejax.data import brown_genres

    data = self.dense.config.data
    train = brown_genres.genre_documents(data, "train_split")
    test = brown_genres.genre_documents(data, "eval_split")
    return train, test, sorted(train)

  def moe_settings(self, arm: dict) -> dict:
    """{dotted key under model.moe: value} of an arm's upcycled model."""
    s = self.settings
    return {
      "num_experts": s["num_experts"],
      "top_k": 1,
      "loss_weights": {},
      "merge": arm["merge"],
      "merged.segment_len": s["segment_len"],
      "merged.eta": float(s["eta"]),
      "merged.gamma": float(s["gamma"]),
      "merged.momentum_real": float(arm["momentum_real"]),
      "merged.momentum_imag": float(arm["momentum_imag"]),
    }

  def score(self, level, draw, arms):
    from moejax.data.brown_genres import passages
    from moejax.train import verbalized

    s = self.settings
    train_docs, test_docs, genres = self.documents
    train = passages(train_docs, genres, s["passage_len"], s["train_per_genre"], draw)
    test = passages(test_docs, genres, s["passage_len"], s["test_per_genre"], TEST_SEED)
    label_tokens = [ord("a") + i for i in range(len(genres))]
    run = verbalized.Finetuning(s["steps"], s["batch_size"], float(s["learning_rate"]), draw)
    pairing = digest(*train, *test)
    out = {}
    for name, arm in arms.items():
      _, graphdef, params, rest = verbalized.upcycled_model(
        self.dense, self.moe_settings(arm), seed=draw
      )
      found = verbalized.finetune(graphdef, params, rest, train, test, label_tokens, run)
      out[name] = {**found, PAIRING: pairing}
    return out
