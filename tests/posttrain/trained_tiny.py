"""The tiny MoE LM trained on a random bigram chain until it is near the chain's
entropy: the model the pruning scores are checked against brute-force loss
changes on (tests/posttrain/test_atoms.py, test_taylor.py). Trained once per
test run (`trained`, the `trained_tiny` fixture of tests/posttrain/conftest.py)."""

import fcntl
import functools
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import init_state

STEPS = 200


def mean_loss(graphdef, params, rest, tokens):
  """The mean next-token loss of the model on tokens [B, L]."""
  logits, _, _ = nnx.merge(graphdef, params, rest)(tokens)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))


def bigram_source(seed, vocab=16, concentration=0.5):
  """A random bigram chain over `vocab` tokens: sample(n, length) -> int32 [n, length]."""
  rng = np.random.default_rng(seed)
  cumulative = np.cumsum(rng.dirichlet(np.full(vocab, concentration), vocab), axis=1)

  def sample(n, length=64):
    out = np.zeros((n, length), np.int32)
    out[:, 0] = rng.integers(vocab, size=n)
    for i in range(1, length):
      u = rng.random(n)[:, None]
      out[:, i] = np.minimum((u > cumulative[out[:, i - 1]]).sum(1), vocab - 1)
    return out

  return sample


@functools.cache
def trained(shared_dir: str):
  """(config, graphdef, host params, rest, calibration windows int32 [32, 64]) of the
  tiny MoE (2 MoE layers, 8 experts of 32 atoms) after STEPS Adam steps on fresh
  samples of bigram chain 0; the windows are fresh samples of the same chain.
  shared_dir: a directory of this test run that every worker process sees (the
  `trained_tiny` fixture's): the first process to ask trains and saves the params
  and windows there, the others wait for them and load them."""
  config = lm_shakespeare_moe.get_config("size=tiny")
  graphdef, state, _ = init_state(config)
  path = os.path.join(shared_dir, f"trained_tiny_{STEPS}_steps.pkl")
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not os.path.exists(path):
      with open(path + ".partial", "wb") as f:
        pickle.dump(_train(graphdef, state), f)
      os.replace(path + ".partial", path)
    with open(path, "rb") as f:
      params, windows = pickle.load(f)
  return config, graphdef, params, state.rest, windows


def _train(graphdef, state):
  """(host params, calibration windows) of `trained`."""
  params, rest = jax.tree.map(np.asarray, state.params), state.rest
  sample = bigram_source(0)
  optimizer = optax.adam(optax.cosine_decay_schedule(1e-2, STEPS))

  @jax.jit
  def train_step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(mean_loss, argnums=1)(graphdef, params, rest, tokens)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  for _ in range(STEPS):
    params, opt_state, _ = train_step(params, opt_state, jnp.asarray(sample(16)))
  return jax.tree.map(np.asarray, params), sample(32)
