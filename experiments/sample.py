r"""Sample text from the latest checkpoint of a training workdir.

  python -m experiments.sample --workdir=runs/moe --prompt="ROMEO:" \
      --max_new_tokens=300 --temperature=0.8 --top_k=40
"""
from absl import flags

from moejax import cli
from moejax.errors import ConfigError
from moejax.inference.restore import load_from_workdir
from moejax.inference.sampling import generate
from moejax.routing import get_router

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir with checkpoints.")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW = cli.checked(flags.DEFINE_integer("max_new_tokens", 300, "Tokens to generate."),
                       cli.at_least(1))
_TEMPERATURE = cli.checked(flags.DEFINE_float("temperature", 0.8, "0 = greedy."),
                           cli.at_least(0.0, float))
_TOP_K = cli.checked(flags.DEFINE_integer("top_k", 40, "Sample among the k likeliest tokens; "
                                          "0 = all."), cli.at_least(0))
_SEED = cli.checked(flags.DEFINE_integer("seed", 0, "Sampling seed."), cli.in_range(0, 2**32 - 1))
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  cli.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  if not _PROMPT.value:
    raise cli.flag_error(_PROMPT, "expected a non-empty prompt")
  config, graphdef, params, rest, tokenizer = load_from_workdir(_WORKDIR.value,
                                                                for_generation=True)
  if _TOP_K.value > config.model.vocab_size:
    raise cli.flag_error(_TOP_K, f"expected at most the vocabulary size {config.model.vocab_size}")
  moe = config.model.moe
  if config.model.ffn_type == "moe" and not get_router(moe.router).causal:
    raise ConfigError(f"model.moe.router={moe.router!r} is not causal; it cannot generate")
  ids = generate(graphdef, params, rest, tokenizer.encode(_PROMPT.value),
                 max_new_tokens=_MAX_NEW.value, window=config.data.seq_len,
                 temperature=_TEMPERATURE.value, top_k=_TOP_K.value, seed=_SEED.value)
  print(tokenizer.decode(ids))


if __name__ == "__main__":
  cli.run(main)
