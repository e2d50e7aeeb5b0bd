"""Per-task figures of a fine-tuning run whose tasks are polyglot-synth's languages
(moejax/data/polyglot.py) or domains of mix (moejax/data/mix.py), and how an attention
adapter's routing follows them.

`task_report(workdir)` (polyglot-synth: every evaluated window of the eval split) and
`mix_task_report(workdir, domains, bytes_per_domain)` (mix: the first bytes of each
named domain's held-out documents, each domain's tokens cut into windows of
data.seq_len + 1) score with the latest checkpoint:
  loss/<k>, accuracy/<k>   mean next-token cross-entropy (nats) and argmax accuracy
                           over the target tokens of task k (a language's documents,
                           a document's separator counting for it; a domain's windows)
  task_loss, task_accuracy their mean over the tasks
  mi_bits                  I(task; top-1 expert) in bits of the adapter's routing
                           (moejax/evaluation/routing.py), one value per (block,
                           adapted projection), averaged; absent without an adapter
                           (mi_bits/<block>/<projection>: each one)
  trainable_params         the parameter values train.trainable trains
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.analysis.polyglot_floor import load_run
from moejax.errors import ConfigError
from moejax.evaluation import bpb
from moejax.train.restore import load_from_workdir
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


def task_figures(config, params, nll, correct, experts, token_task, names) -> dict:
  """The module doc's figures from per-token nll, correct and top-1 experts and each
  token's task index into `names` (the tasks' names in the metric keys)."""
  token_task = np.asarray(token_task).reshape(nll.shape)
  out: dict = {}
  for k, name in enumerate(names):
    here = token_task == k
    out[f"loss/{name}"] = float(nll[here].mean())
    out[f"accuracy/{name}"] = float(correct[here].mean())
  out["task_loss"] = float(np.mean([out[f"loss/{name}"] for name in names]))
  out["task_accuracy"] = float(np.mean([out[f"accuracy/{name}"] for name in names]))
  if experts:
    num_experts = config.model.attention[config.model.attention.adapter].num_experts
    for (block, name), top1 in experts.items():
      counts = domain_expert_counts(top1[:, None], token_task.reshape(-1), len(names), num_experts)
      out[f"mi_bits/{block}/{name}"] = mutual_information(counts)
    out["mi_bits"] = float(np.mean([v for key, v in out.items() if key.startswith("mi_bits/")]))
  out["trainable_params"] = trained_count(params, config.train.get("trainable", "all"))
  return out


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
  names = list(range(settings["num_languages"]))
  return task_figures(config, params, nll, correct, experts, languages, names)


def task_windows(tokenizer, documents, domains, seq_len: int):
  """(windows [N, seq_len + 1] int32, task index into `domains` [N]) of held-out
  (domain, text) documents of the named domains: evaluation.bpb's per-domain streams
  (each document after the separator) cut into whole windows."""
  chosen = [(d, text) for d, text in documents if d in domains]
  windows, counts = bpb.domain_windows(chosen, tokenizer, tokenizer.eos_id, seq_len + 1)
  for domain in domains:
    if not counts.get(domain):
      raise ConfigError(f"the held-out {domain!r} documents hold no window of {seq_len + 1} tokens")
  labels = np.concatenate([np.full(n, list(domains).index(d)) for d, n in counts.items()])
  return windows, labels


def mix_task_report(workdir: str, domains, bytes_per_domain: int) -> dict:
  """The figures of the module doc for one mix training workdir, the tasks being
  `domains`, on the first `bytes_per_domain` bytes of each one's held-out documents."""
  from moejax.train.sweep import heldout_documents

  config, graphdef, params, rest, tokenizer = load_from_workdir(workdir)
  documents = heldout_documents(config, bytes_per_domain)
  windows, domain = task_windows(tokenizer, documents, list(domains), config.data.seq_len)
  size = config.data.batch_size
  batches = [
    {"inputs": windows[i : i + size, :-1], "targets": windows[i : i + size, 1:]}
    for i in range(0, len(windows), size)
  ]
  nll, correct, experts = scored_batches(graphdef, params, rest, batches)
  token_task = np.repeat(domain, config.data.seq_len)
  return task_figures(config, params, nll, correct, experts, token_task, list(domains))
