"""Per-task figures of a polyglot-synth run whose tasks are the languages
(moejax/data/polyglot.py), and how an attention adapter's routing follows them.

`task_report(workdir)` scores every evaluated window of the eval split with the
latest checkpoint:
  loss/<k>, accuracy/<k>   mean next-token cross-entropy (nats) and argmax accuracy
                           over the target tokens of language k's documents (a
                           document's separator counts for it)
  task_loss, task_accuracy their mean over the languages
  mi_bits                  I(language; top-1 expert) in bits of the adapter's
                           routing (moejax/evaluation/routing.py), one value per
                           (block, adapted projection), averaged; absent without an
                           attention adapter (mi_bits/<block>/<projection>: each one)
  trainable_params         the parameter values train.trainable trains
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.analysis.polyglot_floor import load_run
from moejax.data import polyglot
from moejax.evaluation.routing import domain_expert_counts, mutual_information
from moejax.train.optimizer import trained_count


def scored_batches(graphdef, params, rest, batches):
  """(nll [N, L], correct [N, L], {(block, projection): top-1 expert [N * L]}) over the
  batches in order (the adapter's routing: empty without one)."""

  @jax.jit
  def forward(p, r, inputs, targets):
    logits, aux, _ = nnx.merge(graphdef, p, r)(inputs)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
    experts = {
      (i, name): a["expert_index"][:, 0]
      for i, block in enumerate(aux.get("adapters", []))
      for name, a in block["projections"].items()
    }
    return nll, jnp.argmax(logits, -1) == targets, experts

  out = [jax.device_get(forward(params, rest, b["inputs"], b["targets"])) for b in batches]
  experts = {key: np.concatenate([o[2][key] for o in out]) for key in out[0][2]}
  return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out]), experts


def task_report(workdir: str) -> dict:
  """The figures of the module doc for one polyglot_synth training workdir."""
  config, graphdef, params, rest, data = load_run(workdir)
  windows = data.num_eval_batches * config.data.batch_size
  _, splits = polyglot.build(config.data)
  settings = polyglot.settings_of(config.data)
  languages = polyglot.token_languages(
    splits[config.data.eval_split][1], settings["doc_len"], config.data.seq_len, windows
  )
  nll, correct, experts = scored_batches(
    graphdef, params, rest, data.eval_batches(data.num_eval_batches)
  )
  k = settings["num_languages"]
  out: dict = {}
  for lang in range(k):
    here = languages == lang
    out[f"loss/{lang}"] = float(nll[here].mean())
    out[f"accuracy/{lang}"] = float(correct[here].mean())
  out["task_loss"] = float(np.mean([out[f"loss/{lang}"] for lang in range(k)]))
  out["task_accuracy"] = float(np.mean([out[f"accuracy/{lang}"] for lang in range(k)]))
  if experts:
    num_experts = config.model.attention[config.model.attention.adapter].num_experts
    for (block, name), top1 in experts.items():
      counts = domain_expert_counts(top1[:, None], languages.reshape(-1), k, num_experts)
      out[f"mi_bits/{block}/{name}"] = mutual_information(counts)
    out["mi_bits"] = float(np.mean([v for key, v in out.items() if key.startswith("mi_bits/")]))
  out["trainable_params"] = trained_count(params, config.train.get("trainable", "all"))
  return out
