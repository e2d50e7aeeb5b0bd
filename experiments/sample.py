r"""Sample text from the latest checkpoint of a training workdir.

  python -m experiments.sample --workdir=runs/moe --prompt="ROMEO:" \
      --max_new_tokens=300 --temperature=0.8 --top_k=40
"""
from absl import app, flags, logging

from moejax.errors import ConfigError
from moejax.inference.restore import load_from_workdir
from moejax.inference.sampling import generate
from moejax.routing import get_router

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir with checkpoints.")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 300, "Tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 40, "Sample among the k likeliest tokens; 0 = all.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  config, graphdef, params, rest, tokenizer = load_from_workdir(_WORKDIR.value,
                                                                       for_generation=True)
  moe = config.model.moe
  if config.model.ffn_type == "moe" and not get_router(moe.router).causal:
    raise ConfigError(f"model.moe.router={moe.router!r} is not causal; it cannot generate")
  ids = generate(graphdef, params, rest, tokenizer.encode(_PROMPT.value),
                 max_new_tokens=_MAX_NEW.value, window=config.data.seq_len,
                 temperature=_TEMPERATURE.value, top_k=_TOP_K.value, seed=_SEED.value)
  print(tokenizer.decode(ids))


if __name__ == "__main__":
  app.run(main)
