r"""RepetitionCurse on a trained model: repeated-token prompts against natural text.

  python -m experiments.repetition_curse --workdir=runs/zoo/xs --expert_shards=4 --out=rc.json

Repeated prompts: --num_prompts rows, row i one token (drawn with --seed from
the vocabulary, no BOS) repeated --length times. Natural text: the first
--num_prompts windows of --length tokens of the held-out documents (as
experiments.profile_phenomena reads them). Per MoE layer, for both: the
fraction of positions on their row's most common top-k set, max/mean expert
load, and the latency model's busiest device (experts in --expert_shards
contiguous blocks) over the balanced count, without and with capacity
dropping at --capacity_factor (moejax/analysis/repetition.py).
"""

import json

from absl import flags
import numpy as np

from moejax import cli, cli_files
from moejax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (checkpoints/).")
_LENGTH = cli.checked(
  flags.DEFINE_integer("length", 0, "Tokens per prompt; 0 = the training seq_len."), cli.at_least(0)
)
_NUM_PROMPTS = cli.checked(
  flags.DEFINE_integer("num_prompts", 8, "Prompts of each kind."), cli.at_least(1)
)
_EXPERT_SHARDS = cli.checked(
  flags.DEFINE_integer("expert_shards", 8, "Devices the experts are split over."), cli.at_least(1)
)
_CAPACITY_FACTOR = cli.checked(
  flags.DEFINE_float("capacity_factor", 1.25, "Capacity of the defence."),
  cli.in_range(0, float("inf"), low_open=True),
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Draw of the repeated tokens."), cli.in_range(0, 2**32 - 1)
)
_OUT = flags.DEFINE_string("out", None, "Write the report here as JSON.")
flags.mark_flag_as_required("workdir")


def table(report: dict) -> str:
  lines = [
    f"{report['prompts']} prompts of {report['length']} tokens; experts over "
    f"{report['expert_shards']} devices; capacity {report['capacity']} rows per expert",
    "layer | same top-k set: repeated / natural | max/mean load: repeated / natural | "
    "busiest device: repeated / natural | repeated with capacity",
  ]
  for i, (r, n) in enumerate(zip(report["repeated"], report["natural"])):
    lines.append(
      f"{i} | {r['same_set_fraction']:.3f} / {n['same_set_fraction']:.3f} | "
      f"{r['max_over_mean_load']:.2f} / {n['max_over_mean_load']:.2f} | "
      f"{r['busiest_device']:.2f} / {n['busiest_device']:.2f} | "
      f"{r['busiest_device_capped']:.2f}"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  cli_files.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli_files.output_file("out", _OUT.value)
  import jax.numpy as jnp
  from moejax.analysis import repetition as rep
  from moejax.data.pipeline import split_documents
  from moejax.evaluation.bpb import domain_windows
  from moejax.dispatch.capacity import expert_capacity
  from moejax.train.restore import load_from_workdir

  config, graphdef, params, rest, tokenizer = load_from_workdir(_WORKDIR.value, for_generation=True)
  moe = config.model.moe
  if config.model.ffn_type != "moe" or config.model.moe.expert_counts:
    raise ConfigError(f"needs an MoE model with one expert count (--workdir={_WORKDIR.value})")
  if moe.num_experts % _EXPERT_SHARDS.value:
    raise cli.flag_error(_EXPERT_SHARDS, f"expected a divisor of the {moe.num_experts} experts")
  length = _LENGTH.value or config.data.seq_len
  if length > config.model.max_seq_len:
    raise cli.flag_error(_LENGTH, f"expected at most model.max_seq_len={config.model.max_seq_len}")
  count = _NUM_PROMPTS.value
  ids = np.random.default_rng(_SEED.value).integers(0, config.model.vocab_size, count)
  repeated = np.repeat(ids[:, None], length, axis=1).astype(np.int32)
  windows, _ = domain_windows(split_documents(config.data), tokenizer, tokenizer.eos_id, length)
  if len(windows) < count:
    raise cli.flag_error(_NUM_PROMPTS, f"expected at most the {len(windows)} held-out windows")
  natural = windows[np.linspace(0, len(windows) - 1, count).astype(int)]
  capacity = expert_capacity(
    count * length, moe.num_experts, moe.top_k, _CAPACITY_FACTOR.value, moe.capacity.min
  )
  report = {
    "model": _WORKDIR.value,
    "prompts": count,
    "length": length,
    "expert_shards": _EXPERT_SHARDS.value,
    "capacity": capacity,
    "repeated_tokens": ids.tolist(),
  }
  for kind, tokens in (("repeated", repeated), ("natural", natural)):
    routing = rep.routing_of(graphdef, params, rest, jnp.asarray(tokens))
    report[kind] = rep.kind_report(routing, count, moe.num_experts, _EXPERT_SHARDS.value, capacity)
  print(table(report))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
