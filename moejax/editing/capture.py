"""What an edit reads from the model on its prompts (arXiv 2602.10965; keys and
targets as ROME / MEMIT / AlphaEdit compute them), for the one Decoder (loop layout).

`EditBatch`: N sequences, int32 inputs [N, L] ([prefix] + prompt +
continuation, right-padded), targets and a mask over the continuation's
predictions; and M edit rows, each a (sequence, position): the subject's last
token (`key_position='subject_last'`, the paper's choice), the prompt's last
token ('prompt_last') or every position that predicts a continuation token
('continuation'; our variants, for a byte-level model, where the subject's
last byte barely reaches the answer).

  rows_at        per MoE block asked for, at the rows: the layer input x [M, d],
                 the dense combine weights g [M, E] and the block's output (the
                 residual stream) h [M, d]
  expert_keys    k_tj = silu(x W_gate_j) * (x W_up_j) [M, E, f], the input of
                 expert j's down projection (float64, on the host)
  target_deltas  ROME's target: delta [d] per row added to the output of block
                 `block` there, Adam on each sequence's mean NLL of its
                 continuation + decay ||delta||^2 / ||h||^2,
                 clamped to clamp * ||h|| (h: the block output there). Guesses:
                 no KL term on other prompts (ROME's essence drift), Adam's
                 settings and the decay's form follow the MoEEdit code's config.
  routing        per MoE block, router softmax [T, E] (float32) and top-k sets.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.errors import ConfigError

KEY_POSITIONS = ("subject_last", "prompt_last", "continuation")


@dataclasses.dataclass
class EditBatch:
  """N sequences and M edit rows (a sequence and a position in it)."""

  inputs: np.ndarray  # int32 [N, L]
  targets: np.ndarray  # int32 [N, L]
  mask: np.ndarray  # float32 [N, L]: 1 on the continuation's predictions
  seq: np.ndarray  # int32 [M]: each row's sequence
  position: np.ndarray  # int32 [M]: each row's position in it
  edit: np.ndarray  # int32 [M]: the edit each row belongs to

  @property
  def flat(self) -> np.ndarray:
    """int32 [M]: the rows as indices into the N * L tokens."""
    return self.seq * self.inputs.shape[1] + self.position


def encode_rows(
  tokenizer, prefix_id: int, rows, key_position: str = "subject_last", width: int | None = None
) -> EditBatch:
  """rows: (prompt, continuation, subject, edit index), one sequence each. The
  subject's last token is the last token of encode(prompt up to the subject's
  end) (exact for byte tokenizers; for others a prompt's prefix may tokenize
  differently). 'continuation' (our variant) makes an edit row of every position
  that predicts a token of the continuation."""
  if key_position not in KEY_POSITIONS:
    raise ConfigError(f"key_position={key_position!r}; valid: {', '.join(KEY_POSITIONS)}")
  seqs, out = [], []  # (sequence, first masked prediction); (seq, position, edit)
  for i, (prompt, continuation, subject, edit) in enumerate(rows):
    if subject not in prompt:
      raise ConfigError(f"the subject {subject!r} is not in the prompt {prompt!r}")
    head = tokenizer.encode(prompt[: prompt.index(subject) + len(subject)])
    body = tokenizer.encode(prompt)
    seq = [prefix_id] + list(body) + list(tokenizer.encode(continuation))
    seqs.append((seq, len(body)))
    positions = (
      range(len(body), len(seq) - 1)
      if key_position == "continuation"
      else [len(head) if key_position == "subject_last" else len(body)]
    )
    out += [(i, p, edit) for p in positions]
  longest = max(len(s) for s, _ in seqs) - 1
  width = width or longest
  if longest > width:
    raise ConfigError(f"an edit prompt of {longest} tokens is longer than {width}")
  n = len(seqs)
  inputs, targets = np.full((n, width), prefix_id, np.int32), np.zeros((n, width), np.int32)
  mask = np.zeros((n, width), np.float32)
  for i, (seq, first) in enumerate(seqs):
    inputs[i, : len(seq) - 1], targets[i, : len(seq) - 1] = seq[:-1], seq[1:]
    mask[i, first : len(seq) - 1] = 1.0
  seq_, pos, edit = (np.asarray(c, np.int32) for c in zip(*out))
  return EditBatch(inputs, targets, mask, seq_, pos, edit)


def captured(model, tokens, init=None):
  """(logits, aux, {module path + method: first output}) of one forward pass;
  `init`: MoE output perturbations (MoELayer.gradient_probe)."""
  extra = {} if init is None else {"init": init}
  (logits, aux, _), state = nnx.capture(
    model, nnx.Intermediate, method_outputs=nnx.Intermediate, **extra
  )(tokens)
  return logits, aux, {path: v.get_value()[0] for path, v in nnx.to_flat_state(state)}


def moe_blocks(model) -> list[int]:
  return [i for i, block in enumerate(model.blocks) if block.is_moe]


def dense_gates(aux, num_experts: int) -> jax.Array:
  """float32 [T, E]: each token's combine weight per expert (0: not routed)."""
  index, weight, valid = aux["expert_index"], aux["combine_weight"], aux["valid"]
  rows = jnp.arange(index.shape[0])[:, None]
  return (
    jnp.zeros((index.shape[0], num_experts + 1), jnp.float32)
    .at[rows, jnp.where(valid, index, num_experts)]
    .add(jnp.where(valid, weight, 0).astype(jnp.float32))[:, :num_experts]
  )


@functools.partial(jax.jit, static_argnums=(0, 5))
def rows_at(graphdef, params, rest, tokens, flat, blocks: tuple):
  """{block: (x [M, d], g [M, E], h [M, d])} at the rows, flat indices [M] into
  the tokens [N, L] (EditBatch.flat; module doc)."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured(model, tokens)
  n, length = tokens.shape
  moe = moe_blocks(model)
  out = {}
  for b in blocks:
    layer = model.blocks[b].ffn
    x = outputs[("blocks", b, "ffn_norm", "__call__")].reshape(n * length, -1)[flat]
    g = dense_gates(aux["moe"][moe.index(b)], layer.cfg.num_experts)[flat]
    h = outputs[("blocks", b, "__call__")][0].reshape(n * length, -1)[flat]
    out[b] = (x.astype(jnp.float32), g, h.astype(jnp.float32))
  return out


def expert_keys(experts: dict, x: np.ndarray) -> np.ndarray:
  """float64 [N, E, f]: every expert's down-projection input for rows x [N, d]
  (experts: the layer's host params, w_gate and w_up [E, d, f])."""
  x = np.asarray(x, np.float64)
  gate = np.einsum("nd,edf->nef", x, np.asarray(experts["w_gate"], np.float64))
  up = np.einsum("nd,edf->nef", x, np.asarray(experts["w_up"], np.float64))
  return gate / (1 + np.exp(-gate)) * up


def _nll(logits, targets, mask):
  """float32 [N]: each row's mean NLL over its masked positions."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(token * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def perturbed_nll(graphdef, params, rest, batch: dict, block: int, delta_MxD):
  """[N] NLLs with delta_MxD added to block `block`'s MoE output at the rows."""
  tokens = batch["inputs"]

  def fresh():
    return nnx.merge(graphdef, params, rest)

  _, perturbation = nnx.capture(fresh(), nnx.Perturbation)(tokens)
  pure = nnx.to_pure_dict(perturbation)
  zero = pure["blocks"][block]["ffn"]["output"]
  pure["blocks"][block]["ffn"]["output"] = (
    jnp.zeros_like(zero).at[batch["seq"], batch["position"]].set(delta_MxD.astype(zero.dtype))
  )
  nnx.replace_by_pure_dict(perturbation, pure)
  logits, _, _ = captured(fresh(), tokens, init=perturbation)
  return _nll(logits, batch["targets"], batch["mask"])


def _target_loss(graphdef, params, rest, arrays, block, delta, h_norm, decay):
  nll = perturbed_nll(graphdef, params, rest, arrays, block, delta)
  return jnp.sum(nll) + decay * jnp.sum(jnp.sum(delta**2, -1) / h_norm**2), nll


@functools.partial(jax.jit, static_argnums=(0, 4))
def _target_step(graphdef, params, rest, arrays, block, delta, state, h_norm, lr, decay, clamp):
  (_, nll), grad = jax.value_and_grad(_target_loss, argnums=5, has_aux=True)(
    graphdef, params, rest, arrays, block, delta, h_norm, decay
  )
  updates, state = optax.adam(lr).update(grad, state)
  delta = optax.apply_updates(delta, updates)
  scale = jnp.minimum(1.0, clamp * h_norm / jnp.maximum(jnp.linalg.norm(delta, axis=-1), 1e-12))
  return delta * scale[:, None], state, nll


def target_deltas(
  graphdef,
  params,
  rest,
  batch: EditBatch,
  block: int,
  *,
  steps: int,
  lr: float,
  decay: float,
  clamp: float,
):
  """(delta [M, d] float32, the block outputs h [M, d] at the rows, NLL [N] of the
  sequences before and after): ROME's target at block `block`, one delta per row,
  all of a sequence's rows optimised together (module doc; ROME shares one delta
  across an edit's prompts: a difference, a guess)."""
  arrays = {
    k: jnp.asarray(getattr(batch, k)) for k in ("inputs", "targets", "mask", "seq", "position")
  }
  h = rows_at(graphdef, params, rest, arrays["inputs"], jnp.asarray(batch.flat), (block,))[block][2]
  h_norm = jnp.linalg.norm(h, axis=-1)
  delta = jnp.zeros_like(h)
  state = optax.adam(lr).init(delta)
  nlls = []
  for _ in range(steps + 1):  # the last call only measures
    new, new_state, nll = _target_step(
      graphdef, params, rest, arrays, block, delta, state, h_norm, lr, decay, clamp
    )
    nlls.append(nll)
    if len(nlls) <= steps:
      delta, state = new, new_state
  return np.asarray(delta), np.asarray(h), np.asarray(nlls[0]), np.asarray(nlls[-1])


@functools.partial(jax.jit, static_argnums=0)
def routing(graphdef, params, rest, tokens):
  """Per MoE block (router softmax [T, E] float32, top-k set bool [T, E])."""
  model = nnx.merge(graphdef, params, rest)
  _, aux, outputs = captured(model, tokens)
  out = []
  for b, layer_aux in zip(moe_blocks(model), aux["moe"]):
    logits = outputs[("blocks", b, "ffn", "router_logits")].astype(jnp.float32)
    e = logits.shape[-1]
    out.append((jax.nn.softmax(logits, axis=-1), dense_gates(layer_aux, e) > 0))
  return out
