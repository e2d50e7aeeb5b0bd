r"""Train, cache, verify and evaluate the checkpoint zoo (configs/zoo.py).

  python -m experiments.zoo --models=xs --zoo_dir=runs/zoo            # train + evaluate
  python -m experiments.zoo --models=xs --zoo_dir=runs/zoo --verify   # retrain, compare digests
  python -m experiments.zoo --models=xs,s,s_dense --time_steps=50     # 50-step timing only

Writes ZOO_DIR/<model>/ (the training workdir, snapshots every 10%) with
zoo.json (snapshot digests, training time, evaluation) and ZOO_DIR/zoo.md (the
tables of every model given). s_upcycled needs s_dense first (give both, in
that order). See moejax/train/zoo.py.
"""
import json
import os
import tempfile

from absl import flags

from moejax import cli
from moejax.configs.zoo import MODELS
from moejax.train import zoo

_MODELS = flags.DEFINE_list("models", ["xs"], f"Zoo models, in order: {', '.join(MODELS)}.")
_ZOO_DIR = flags.DEFINE_string("zoo_dir", "runs/zoo", "Where the zoo lives.")
_VERIFY = flags.DEFINE_bool("verify", False, "Retrain each (cached) model in a temporary "
                            "directory and compare every snapshot's digest.")
_TIME_STEPS = cli.checked(flags.DEFINE_integer("time_steps", 0, "Only time this many steps "
                                               "of each model (nothing kept)."), cli.at_least(0))
_BYTES = cli.checked(flags.DEFINE_integer("bytes_per_domain", 65536, "Held-out bytes per "
                                          "domain for the evaluation."), cli.at_least(1))
_PROBE_COUNT = cli.checked(flags.DEFINE_integer("probe_count", 32, "Examples per probe group."),
                           cli.at_least(1))


def check_models(names):
  for name in names:
    if name not in MODELS:
      raise cli.flag_error(_MODELS, f"expected models among {', '.join(MODELS)}, got {name!r}")
  if not names:
    raise cli.flag_error(_MODELS, "expected at least one model")


def time_steps(names, steps):
  from moejax.train.loop import train_and_evaluate
  for name in names:
    config = zoo.model_config(name, _ZOO_DIR.value)
    config.train.steps, config.train.eval_every = steps, 10 * steps
    with tempfile.TemporaryDirectory() as scratch:
      run = train_and_evaluate(config, scratch, write_metrics=False)
    print(f"{name}: {steps} steps, {run.tokens_per_second:.0f} tokens/s")


def main(argv):
  del argv
  names = _MODELS.value
  check_models(names)
  if _TIME_STEPS.value:
    return time_steps(names, _TIME_STEPS.value)
  if _VERIFY.value:
    missing = [n for n in names if not os.path.exists(os.path.join(_ZOO_DIR.value, n, zoo.ZOO_JSON))]
    if missing:
      raise cli.flag_error(_ZOO_DIR, f"expected a built zoo holding {', '.join(missing)}")
    for name in names:
      result = zoo.verify(name, _ZOO_DIR.value)
      print(f"{name}: {json.dumps(result)}")
      if not result["bit_exact"]:
        raise SystemExit(1)
    return None
  entries = [zoo.build(n, _ZOO_DIR.value, _BYTES.value, _PROBE_COUNT.value) for n in names]
  text = zoo.table(entries)
  with open(os.path.join(_ZOO_DIR.value, "zoo.md"), "w") as f:
    f.write(text)
  print(text)
  return None


if __name__ == "__main__":
  cli.run(main)
