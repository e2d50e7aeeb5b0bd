"""Adversarial training (min-max) on the train step: each step first finds an attack's
x_adv at the current parameters (the inner max, moejax/attacks/), then takes the
ordinary train step (moejax/train/step.py) on {inputs: x_adv, targets} (the outer min;
Madry et al. 2018, eq. 2.1).

Defences (`DEFENCES`, by name):
  pgd_at  PGD adversarial training: every step against `pgd`.
  j_tlat  J-TLAT (arXiv 2602.01369): the steps cycle through a router stage
          (`tlga_r`), an expert stage (`j_tlga` with lambda_router = 0: CE plus the
          expert term) and a joint stage (`j_tlga`), one stage per step. The paper's
          stage lengths and weights are not reproduced: the one-step cycle is our guess.
"""

from flax import nnx

from moejax.attacks import attack_inputs
from moejax.errors import choice_error

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


def adversarial_train_step(defence: str, train_step, graphdef, *, epsilon: float, steps: int):
  """(state, batch) -> (new state, metrics): `train_step` (make_train_step's, over
  `graphdef`) on the batch's inputs replaced by the stage's attack at state's params."""
  stage_of(defence, 0)  # a bad name fails here, before any step

  def step(state, batch):
    name, settings = stage_of(defence, int(state.step))
    model = nnx.merge(graphdef, state.params, state.rest)
    x_adv = attack_inputs(
      name,
      model,
      batch["inputs"],
      batch["targets"],
      epsilon=epsilon,
      steps=steps,
      settings=settings,
    )
    return train_step(state, {**batch, "inputs": x_adv})

  return step


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
  """`model` (an nnx classifier, e.g. the ViT) trained, as a new module, for `steps` Adam steps
  on batches of `batch` rows of (inputs, labels) drawn with `seed`; with a defence,
  each step adversarial (adversarial_train_step, epsilon, attack_steps)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from moejax.train.step import TrainState, make_train_step, split_model

  graphdef, params, rest = jax.tree.map(jnp.copy, split_model(model))  # the step donates
  optimizer = optax.adam(learning_rate)
  state = TrainState(jnp.zeros((), jnp.int32), params, rest, optimizer.init(params))
  step = make_train_step(graphdef, optimizer, seed)
  if defence is not None:
    step = adversarial_train_step(defence, step, graphdef, epsilon=epsilon, steps=attack_steps)
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    rows = rng.choice(len(labels), batch, replace=False)
    state, _ = step(
      state, {"inputs": jnp.asarray(inputs[rows]), "targets": jnp.asarray(labels[rows])}
    )
  return nnx.merge(graphdef, state.params, state.rest)
