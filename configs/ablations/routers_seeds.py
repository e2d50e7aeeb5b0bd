r"""The router ablation on several seeds, each research router against top-k with
its paper's claimed direction (issue 13, parts 4 and 6).

  python -m experiments.ablate --config=configs/ablations/routers_seeds.py:base=zoo_xs \
      --workdir=runs/routers_zoo_xs
  python -m experiments.ablate --config=configs/ablations/routers_seeds.py:base=polyglot \
      --workdir=runs/routers_polyglot
  python -m experiments.ablate --config=configs/ablations/routers_seeds.py:base=shakespeare \
      --workdir=runs/routers5

Same variants and overrides as configs/ablations/routers.py, minus topk_seed1
(the seeds replace it), on a base model chosen by arg:

  base=zoo_xs       zoo-xs (configs/zoo.py: 4 layers, d 64, 8 experts, top-2) on the
                    mix corpus, 600 steps, seeds 0-2; compared on the harness's bpb
                    of the first 32 KiB of every held-out domain (heldout_bpb)
  base=polyglot     configs/polyglot_synth.py, 600 steps, seeds 0-2; val bpb on all
                    512 held-out documents (the Bayes floor is the same for every arm)
  base=shakespeare  the default MoE LM, 600 steps, seeds 0-4
  arms=baseline     only topk (the baseline's seed noise: with seeds=5 and the same
                    workdir, the finished seeds are re-used)
  seeds=N           seeds 0..N-1 (default above)

The table gives the paired per-seed difference to topk, its 95% t-interval
and a verdict: "reproduces" only when the interval lies below 0 (every claim
here is "lower bpb than top-k"). expert_choice claims balance, not bpb: no
direction.
"""
from moejax.config import parse_config_arg
from moejax.configs.ablations import routers

EXPECT = {"probmoe_exact": "lower", "probmoe_dynamic": "lower", "smooth_topk": "lower",
          "dpsl": "lower", "mahalanobis": "lower"}
# base: (config file, its own arg, default seeds, held-out bytes per domain, title)
BASES = {
    "shakespeare": (routers.MOE, "", 5, 0, "the Shakespeare MoE LM"),
    "zoo_xs": ("configs/zoo.py", "model=xs", 3, 32768, "zoo-xs on mix"),
    "polyglot": ("configs/polyglot_synth.py", "", 3, 0, "polyglot-synth"),
}


def get_config(arg=None):
  a = parse_config_arg(arg, dict(base="shakespeare", arms="all", seeds=0))
  if a.base not in BASES or a.arms not in ("all", "baseline"):
    from moejax.errors import ConfigError
    raise ConfigError(f"config arg {arg!r}: base must be one of {sorted(BASES)}, arms "
                      "all or baseline")
  path, base_arg, default_seeds, heldout, title = BASES[a.base]
  c = routers.get_config()
  del c.seed
  c.seeds = tuple(range(a.seeds or default_seeds))  # --config.seeds="(0, 1, 2)" overrides it
  c.title = f"Router ablation on {title}, {len(c.seeds)} seeds"
  if heldout:
    c.heldout_bytes_per_domain = heldout
  variants = []
  for name, spec, overrides in c.variants:
    if name == "topk_seed1" or (a.arms == "baseline" and name != "topk"):
      continue
    arg = ",".join(filter(None, [base_arg, spec.partition(":")[2]]))
    spec = f"{path}:{arg}" if arg else path
    variants.append((name, spec, overrides, EXPECT.get(name)))
  c.variants = tuple(variants)
  return c
