r"""Prism-MoE (ICML 2026) dense-to-MoE conversion against random and MoEfication
(balanced k-means, Lloyd and Hartigan) partitions, each with and without
confidence-adaptive routing supervision, on a dense zoo model (s_dense, or xs_dense
with the arg model=xs_dense) converted to 8 experts, top-3 (37.5% active),
fine-tuned for 10% of its steps (moejax/studies/scorers/prism_moe.py).

  python -m experiments.zoo --models=s_dense --seeds=0,1,2
  python -m experiments.study --config=configs/studies/prism_moe.py:seeds=3

Args: seeds=N (the zoo training seeds 0..N-1), model=s_dense|xs_dense.
"""

import ml_collections

from moejax.config import parse_config_arg
from moejax.errors import choice_error
from moejax.studies import scoring
from moejax.train import zoo

PARTITIONS = ("random", "kmeans_lloyd", "kmeans_hartigan", "trajectory")
SUPERVISION = 1.0  # weight of the routing KL in the supervised arms (our choice)


def arms():
  out = []
  for kind in PARTITIONS:
    out.append({"name": kind, "partition": kind, "supervision": 0.0})
    out.append({"name": f"{kind}_supervised", "partition": kind, "supervision": SUPERVISION})
  return out


# (arm, reference, metric, expected direction, text, source)
CLAIMS = (
  (
    "trajectory",
    "random",
    "kl0",
    "lower",
    "the trajectory-fitted init is closer to the dense model than a random partition at step 0",
    "paper",
  ),
  (
    "trajectory",
    "kmeans_hartigan",
    "kl0",
    "lower",
    "... and than MoEfication's balanced k-means (Hartigan)",
    "paper",
  ),
  (
    "trajectory",
    "kmeans_lloyd",
    "kl0",
    "lower",
    "... and than MoEfication's balanced k-means (Lloyd)",
    "paper",
  ),
  (
    "kmeans_hartigan",
    "kmeans_lloyd",
    "kl0",
    "lower",
    "Hartigan's k-means gives a better MoEfication init than Lloyd's",
    "ours",
  ),
  (
    "trajectory_supervised",
    "random",
    "bpb",
    "lower",
    "Prism-MoE (fitted init + supervision) beats a random conversion after 10% of the dense budget",
    "paper",
  ),
  (
    "trajectory_supervised",
    "trajectory",
    "bpb",
    "lower",
    "confidence-adaptive supervision lowers bpb after fine-tuning",
    "paper",
  ),
  (
    "random_supervised",
    "random",
    "bpb",
    None,
    "supervision on a random partition (no expected direction)",
    "ours",
  ),
)
KEYS = ("arm", "reference", "metric", "expect", "text", "source")


DENSE_MODELS = {  # zoo name: its description (configs/zoo.py)
  "s_dense": "a byte-level 6-block dense LM, d_model 128, d_ff 512",
  "xs_dense": "a byte-level 4-block dense LM, d_model 64, d_ff 256",
}


def get_config(arg=None):
  a = parse_config_arg(arg, {"seeds": 1, "model": "s_dense"})
  if a.model not in DENSE_MODELS:
    raise choice_error("config arg model", a.model, DENSE_MODELS)
  c = ml_collections.ConfigDict()
  c.name = "prism_moe"
  c.description = (
    f"zoo {a.model} ({DENSE_MODELS[a.model]}, trained on the mix corpus) converted into an "
    "MoE of 8 experts per layer (an eighth of the neurons each), top-3 (37.5% of the FFN active): "
    "random partition; MoEfication's balanced k-means of the neurons' gate columns "
    "(Lloyd, Hartigan; equal groups by an optimal assignment and a balanced refinement); "
    "Prism-MoE's partition and router fitted to 16 sequences of 64 tokens the dense "
    "model samples itself (our reading of an abstract: co-activation clustering and a "
    "ridge-regressed router, chosen by top-k output error). Then fine-tuned for 10% of "
    f"{a.model}'s steps (the run's AdamW schedule), with (weight 1) or without the routing "
    "KL weighted by 1 - the dense model's max next-token probability. kl0 / mse0: KL "
    "to the dense model and FFN output error at step 0 on 16 held-out trajectories; kl, "
    "bpb: after fine-tuning."
  )
  c.scorer = "prism_moe"
  c.settings = scoring.defaults_with(
    c.scorer,
    {
      "workdir": zoo.workdir_of(a.model, "runs/zoo"),
    },
  )
  c.arms = arms()
  c.draws = 1
  c.reference = "random"
  c.claims = [dict(zip(KEYS, claim)) for claim in CLAIMS]
  return zoo.over_seeds(c, f"seeds={a.seeds}", name=a.model)
