"""Adversarial training (min-max) of a classifier: each step first finds an attack's
x_adv at the current parameters (the inner max, moejax/attacks/), then takes the
ordinary classifier step (moejax/train/classifier.py) on (x_adv, labels) (the outer
min; Madry et al. 2018, eq. 2.1).

Defences (`DEFENCES`, by name):
  pgd_at  PGD adversarial training: every step against `pgd`.
  j_tlat  J-TLAT (arXiv 2602.01369): the steps cycle through a router stage
          (`tlga_r`), an expert stage (`j_tlga` with lambda_router = 0: CE plus the
          expert term) and a joint stage (`j_tlga`), one stage per step. The paper's
          stage lengths and weights are not reproduced: the one-step cycle is our guess.
"""

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.attacks import attack_inputs
from moejax.errors import choice_error
from moejax.train import classifier

DEFENCES = {
  "pgd_at": (("pgd", ()),),
  "j_tlat": (("tlga_r", ()), ("j_tlga", (("lambda_router", 0.0),)), ("j_tlga", ())),
}


def stage_of(defence: str, step: int) -> tuple[str, dict]:
  """(attack name, its settings) of `defence` at train step `step`."""
  if defence not in DEFENCES:
    raise choice_error("defence", defence, DEFENCES)
  name, settings = DEFENCES[defence][step % len(DEFENCES[defence])]
  return name, dict(settings)


def adversarial_inputs(defence: str, *, epsilon: float, steps: int):
  """(model, x, y, step) -> the stage's attack on x at the model's current parameters
  (the inner max): classifier.trained_steps's before_step."""
  stage_of(defence, 0)  # a bad name fails here, before any step

  def attacked(model, x, y, step: int):
    name, settings = stage_of(defence, step)
    return attack_inputs(name, model, x, y, epsilon=epsilon, steps=steps, settings=settings)

  return attacked


def train_classifier(
  model,
  inputs,
  labels,
  *,
  steps: int,
  batch: int,
  learning_rate: float,
  seed: int,
  defence: str | None = None,
  epsilon: float = 0.0,
  attack_steps: int = 3,
):
  """`model` (an nnx classifier, e.g. the ViT) trained, as a new module, for `steps` Adam
  steps of the cross-entropy plus its router losses on batches of `batch` rows of
  (inputs, labels) drawn with `seed` (moejax/train/classifier.py); with a defence, each
  step on the stage's attack (adversarial_inputs, epsilon, attack_steps)."""
  every_class = jnp.ones((), bool)  # broadcast: no class masked
  data = classifier.batches(np.random.default_rng(seed), inputs, labels, steps, batch, every_class)
  before = None
  if defence is not None:
    before = adversarial_inputs(defence, epsilon=epsilon, steps=attack_steps)
  return classifier.trained_steps(
    model,
    nnx.Param,
    optax.adam(learning_rate),
    data,
    before_step=before,
    router_losses=True,
    seed=seed,
  )
