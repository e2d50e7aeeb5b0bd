"""What an edit did (the MoEEdit paper's axes, measured on the facts domain):

efficacy          greedy decoding of each edit prompt (both training templates)
                  gives the new value's continuation exactly (teacher forced,
                  as the probes score: evaluation/probes.py)
efficacy_score    log p(new continuation) > log p(true continuation) (CounterFact's
                  efficacy score)
target_prob       the new continuation's per-token geometric-mean probability
paraphrase(_score) the same on the held-out paraphrase template, never edited on
unedited_accuracy greedy accuracy of other people's true facts (specificity)
unedited_nll_change their per-token NLL after minus before
routing_kl        KL(router softmax before || after), mean over tokens of
                  unrelated windows and the MoE blocks after the first edited
                  one (the earlier blocks cannot change), float32
topk_change       the fraction of those (token, block) pairs whose top-k set changed
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.editing import capture, facts as facts_lib

ROWS = 32  # rows per scored batch (one compiled shape)
WIDTH = 96  # tokens per row


@functools.partial(jax.jit, static_argnums=0)
def _score(graphdef, params, rest, inputs, targets, mask):
  logits = nnx.merge(graphdef, params, rest)(inputs)[0]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  hit = (jnp.argmax(logits, axis=-1) == targets) | (mask == 0)
  return jnp.sum(token * mask, axis=1), jnp.all(hit, axis=1)


def scores(graphdef, params, rest, tokenizer, prefix_id, rows):
  """(log p of each row's continuation [N], greedy match [N], tokens [N])."""
  batch = capture.encode_rows(tokenizer, prefix_id, rows, "prompt_last", width=WIDTH)
  logp, hit = [], []
  for i in range(0, len(batch.inputs), ROWS):
    part = [getattr(batch, k)[i : i + ROWS] for k in ("inputs", "targets", "mask")]
    pad = ROWS - len(part[0])
    part = [np.pad(a, ((0, pad), (0, 0))) for a in part]
    lp, h = _score(graphdef, params, rest, *(jnp.asarray(a) for a in part))
    logp.append(np.asarray(lp)[: ROWS - pad])
    hit.append(np.asarray(h)[: ROWS - pad])
  return np.concatenate(logp), np.concatenate(hit), batch.mask.sum(1)


def fact_metrics(graphdef, before, after, rest, tokenizer, prefix_id, edits, unedited) -> dict:
  """The facts metrics of the module doc for `edits` and `unedited` facts."""

  def s(params, rows):
    return scores(graphdef, params, rest, tokenizer, prefix_id, rows)

  out = {}
  for name, new_rows, true_rows in (
    ("efficacy", facts_lib.edit_rows(edits), facts_lib.true_rows(edits)),
    ("paraphrase", facts_lib.paraphrase_rows(edits), facts_lib.true_rows(edits, True)),
  ):
    lp_new, hit, n = s(after, new_rows)
    lp_true, _, _ = s(after, true_rows)
    out[name] = float(hit.mean())
    out[f"{name}_score"] = float(np.mean(lp_new > lp_true))
    if name == "efficacy":
      out["target_prob"] = float(np.mean(np.exp(lp_new / n)))
  rows = facts_lib.true_rows(unedited)
  lp_after, hit, n = s(after, rows)
  lp_before, _, _ = s(before, rows)
  out["unedited_accuracy"] = float(hit.mean())
  out["unedited_nll_change"] = float(np.mean((lp_before - lp_after) / n))
  return out


def routing_shift(
  graphdef, before, after, rest, windows, first_block: int, batch_size: int = 8, reference=None
) -> dict:
  """routing_kl and topk_change (module doc) on int32 windows [N, L]; `reference`:
  the unedited model's routing on them (routing_reference), computed if None."""
  reference = reference or routing_reference(graphdef, before, rest, windows, batch_size)
  kls, changed = [], []
  for i, ref in zip(range(0, len(windows), batch_size), reference):
    now = jax.device_get(
      capture.routing(graphdef, after, rest, jnp.asarray(windows[i : i + batch_size]))
    )
    for (p, p_set, block), (q, q_set) in zip(ref, now):
      if block <= first_block:
        continue
      p, q = p.astype(np.float64), np.maximum(q.astype(np.float64), 1e-30)
      kls.append(np.sum(np.where(p > 0, p * (np.log(np.maximum(p, 1e-30)) - np.log(q)), 0), -1))
      changed.append(np.any(p_set != q_set, axis=-1))
  if not kls:
    return {"routing_kl": 0.0, "topk_change": 0.0}
  return {
    "routing_kl": float(np.mean(np.concatenate(kls))),
    "topk_change": float(np.mean(np.concatenate(changed))),
  }


def routing_reference(graphdef, params, rest, windows, batch_size: int = 8) -> list:
  """Per batch of windows, per MoE block (softmax, top-k set, block index)."""
  from moejax.models.structure import moe_layer_indices

  out = []
  for i in range(0, len(windows), batch_size):
    got = jax.device_get(
      capture.routing(graphdef, params, rest, jnp.asarray(windows[i : i + batch_size]))
    )
    out.append(got)
  blocks = [i for i, b in enumerate(nnx.merge(graphdef, params, rest).blocks) if b.is_moe]
  del moe_layer_indices
  return [[(p, s, b) for (p, s), b in zip(batch, blocks)] for batch in out]
