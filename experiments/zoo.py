r"""Train, cache, verify and evaluate the checkpoint zoo (configs/zoo.py).

  python -m experiments.zoo --models=xs --zoo_dir=runs/zoo            # train + evaluate
  python -m experiments.zoo --models=xs --zoo_dir=runs/zoo --verify   # retrain, compare digests
  python -m experiments.zoo --models=xs,s,s_dense --time_steps=50     # 50-step timing only
  python -m experiments.zoo --models=s --seeds=0,1,2                   # three training seeds

Writes ZOO_DIR/<model>/ (the training workdir, snapshots every 10%; ZOO_DIR/<model>_seed<k>/
at training seed k > 0) with
zoo.json (snapshot digests, training time, evaluation) and ZOO_DIR/zoo.md (the
tables of every model given). s_upcycled needs s_dense first (give both, in
that order). See moejax/train/zoo.py.
"""

import json
import os
import tempfile

from absl import flags

from moejax import cli, cli_files
from moejax.configs.zoo import MODELS, model_config
from moejax.train import zoo

_MODELS = flags.DEFINE_list("models", ["xs"], f"Zoo models, in order: {', '.join(MODELS)}.")
_ZOO_DIR = flags.DEFINE_string("zoo_dir", "runs/zoo", "Where the zoo lives.")
_SEEDS = flags.DEFINE_list(
  "seeds",
  ["0"],
  "Training seeds of every model (initialisation and data order); seed 0 is ZOO_DIR/<model>.",
)
_VERIFY = flags.DEFINE_bool(
  "verify",
  False,
  "Retrain each (cached) model in a temporary directory and compare every snapshot's digest.",
)
_TIME_STEPS = cli.checked(
  flags.DEFINE_integer("time_steps", 0, "Only time this many steps of each model (nothing kept)."),
  cli.at_least(0),
)
_BYTES = cli.checked(
  flags.DEFINE_integer("bytes_per_domain", 65536, "Held-out bytes per domain for the evaluation."),
  cli.at_least(1),
)
_PROBE_COUNT = cli.checked(
  flags.DEFINE_integer("probe_count", 32, "Examples per probe group."), cli.at_least(1)
)


def check_models(names):
  for name in names:
    if name not in MODELS:
      raise cli.flag_error(_MODELS, f"expected models among {', '.join(MODELS)}, got {name!r}")
  if not names:
    raise cli.flag_error(_MODELS, "expected at least one model")


def check_seeds(values) -> list[int]:
  if not values:
    raise cli.flag_error(_SEEDS, "expected at least one seed")
  seeds = []
  for value in values:
    try:
      seeds.append(int(value))
    except ValueError:
      raise cli.flag_error(_SEEDS, f"expected integers, got {value!r}") from None
    if not 0 <= seeds[-1] < 2**31:
      raise cli.flag_error(_SEEDS, f"expected seeds in [0, 2**31), got {value}")
  if len(set(seeds)) != len(seeds):
    raise cli.flag_error(_SEEDS, "expected distinct seeds")
  return seeds


def time_steps(names, steps):
  from moejax.train.loop import train_and_evaluate

  for name in names:
    config = model_config(name, _ZOO_DIR.value)
    config.train.steps, config.train.eval_every = steps, 10 * steps
    with tempfile.TemporaryDirectory() as scratch:
      run = train_and_evaluate(config, scratch, write_metrics=False)
    print(f"{name}: {steps} steps, {run.tokens_per_second:.0f} tokens/s")


def main(argv):
  del argv
  names = _MODELS.value
  check_models(names)
  seeds = check_seeds(_SEEDS.value)
  cli_files.output_dir("zoo_dir", _ZOO_DIR.value)
  if _TIME_STEPS.value:
    return time_steps(names, _TIME_STEPS.value)
  if _VERIFY.value:
    missing = [
      zoo.workdir_of(n, _ZOO_DIR.value, s)
      for n in names
      for s in seeds
      if not os.path.exists(os.path.join(zoo.workdir_of(n, _ZOO_DIR.value, s), zoo.ZOO_JSON))
    ]
    if missing:
      raise cli.flag_error(_ZOO_DIR, f"expected a built zoo holding {', '.join(missing)}")
    for name in names:
      for seed in seeds:
        result = zoo.verify(model_config, name, _ZOO_DIR.value, seed=seed)
        print(f"{name} seed {seed}: {json.dumps(result)}")
        if not result["bit_exact"]:
          raise SystemExit(1)
    return None
  entries = [
    zoo.build(model_config, n, _ZOO_DIR.value, _BYTES.value, _PROBE_COUNT.value, seed=s)
    for n in names
    for s in seeds
  ]
  text = zoo.table(entries)
  with open(os.path.join(_ZOO_DIR.value, "zoo.md"), "w") as f:
    f.write(text)
  print(text)
  return None


if __name__ == "__main__":
  cli.run(main)
