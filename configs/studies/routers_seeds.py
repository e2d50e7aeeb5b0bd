r"""The router study on several seeds and another base model, chosen by arg
(moejax/studies/scorers/training.py; the arms and claims of configs/studies/routers.py).

  python -m experiments.study --config=configs/studies/routers_seeds.py:base=zoo_xs
  python -m experiments.study --config=configs/studies/routers_seeds.py:base=polyglot
  python -m experiments.study --config=configs/studies/routers_seeds.py:base=shakespeare

  base=zoo_xs       zoo-xs (configs/zoo.py: 4 layers, d 64, 8 experts, top-2) on the
                    mix corpus, 600 steps, 3 draws; compared on the harness's bpb of the
                    first 32 KiB of every held-out domain (heldout_bpb)
  base=polyglot     configs/polyglot_synth.py, 600 steps, 3 draws; val bpb on all 512
                    held-out documents (the Bayes floor is the same for every arm)
  base=shakespeare  the default MoE LM, 600 steps, 5 draws
  arms=baseline     only topk: the baseline's seed noise (same workdir, so the finished
                    seeds are re-used), no claims
  seeds=N           N draws (seeds 0..N-1) instead of the base's default
Committed results of the old runner: docs/results/ablations/routers_zoo_xs.md,
routers_polyglot.md, routers_zoo_xs_baseline5.md.
"""

import ml_collections

from moejax.config import parse_config_arg
from moejax.data.mix import DOMAINS
from moejax.configs.studies.routers import router_arms, router_claims

# base: (config file, its own arg, default draws, held-out bytes per domain, workdir, title)
BASES = {
  "shakespeare": (
    "configs/lm_shakespeare_moe.py",
    "",
    5,
    0,
    "runs/routers5",
    "the Shakespeare MoE LM",
  ),
  "zoo_xs": ("configs/zoo.py", "model=xs", 3, 32768, "runs/routers_zoo_xs", "zoo-xs on mix"),
  "polyglot": ("configs/polyglot_synth.py", "", 3, 0, "runs/routers_polyglot", "polyglot-synth"),
}


def base_settings(arg, name: str):
  """(parsed arg, base tuple, study name, settings) shared with token_rounding_seeds."""
  a = parse_config_arg(arg, dict(base="zoo_xs", arms="all", seeds=0))
  if a.base not in BASES or a.arms not in ("all", "baseline"):
    from moejax.errors import ConfigError

    raise ConfigError(
      f"config arg {arg!r}: base must be one of {sorted(BASES)}, arms all or baseline"
    )
  base = BASES[a.base]
  settings = {
    "workdir": base[4],
    "steps": 600,
    "seeds": (),
    "common": ("train.eval_every=100",),
    "heldout_bytes_per_domain": base[3],
    "domains": DOMAINS if base[3] else (),
  }
  suffix = "_baseline" if a.arms == "baseline" else ""
  return a, base, f"{name}_{a.base}{suffix}", settings


def get_config(arg=None):
  a, (path, base_arg, draws, heldout, _, title), name, settings = base_settings(arg, "routers")
  metric = "heldout_bpb" if heldout else "val_bpb"
  c = ml_collections.ConfigDict()
  c.name = name
  c.description = (
    f"Trainable routers against softmax top-k on {title}, 600 steps. Each paper claims "
    f"lower bpb than top-k at the same budget; draw d trains every arm on seed d, so the "
    f"arms pair by seed. Compared on {metric}"
    + (" (the harness's bpb on the first 32 KiB of every held-out domain)." if heldout else ".")
  )
  c.scorer = "training"
  c.settings = settings
  c.arms = router_arms(path, base_arg, only=("topk",) if a.arms == "baseline" else None)
  c.draws = a.seeds or draws
  c.reference = "topk"
  c.claims = router_claims(metric, c.arms)
  return c
