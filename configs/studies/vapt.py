r"""VAPT (ICLR, arXiv 2501.18936) against full fine-tuning, VPT-deep, VPT-shallow and a
linear probe on a
VTAB-1k style few-shot transfer suite from a frozen, pretrained ViT
(moejax/studies/scorers/vapt_transfer.py, moejax/continual/prompt_transfer.py).

  python -m experiments.study --config=configs/studies/vapt.py
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "vapt"
  c.description = (
    "VAPT makes VPT's prompt experts depend on the input: each block's N prompts are "
    "generated from its input patch tokens (LayerNorm, one k x k kernel shared by all "
    "channels over the patch grid, a zero-initialised token-wise projection to N tokens, "
    "plus a shared bottleneck MLP with a residual). The paper reports that VAPT beats "
    "full fine-tuning by 7.34% on VTAB-1k and 1.04% on FGVC, and VPT with fewer added "
    "parameters (abstract; ViT-B/16 pretrained on ImageNet-21k). Here, per seed: a ViT "
    "(width 64, 4 blocks, 4 heads, 20x20 images in 4x4 patches) pretrained with labels on"
    " the train split of Glyph-62 (62 characters, 600 AdamW steps of 64), supervised as "
    "the papers' backbone is and because it reaches usable features in few CPU steps (the"
    " rotation pretraining of the SMoPE study learns less per step), then frozen. "
    "Transfer tasks (moejax/data/vision_streams.py): mnist_digits, glyph_characters "
    "(held-out fonts of the pretraining characters, so close to the pretraining task), "
    "glyph_families, textures, digits_8x8; 1,000 class-balanced training images each "
    "(seeded), the whole test split, every image resized to 20x20 (bilinear; our choice)."
    " Each arm trains only a fresh linear head and its adapter (Adam 1e-2, 200 steps of "
    "32 images; the same batches and the same head initialisation for every arm of a "
    "seed; the papers grid-search SGD per task instead). Arms: linear (the head alone), "
    "vpt_shallow and vpt_deep (N = 10 learned tokens at the first or every block), vapt "
    "(N = 10 generated tokens per block, the adapter's defaults: kernel 2, no padding, "
    "MLP width 8), full (every parameter, backbone and head, Adam at 1e-3: our choice, a "
    "tenth of the adapters' rate, as full fine-tuning is usually run lower; its "
    "added_params counts the backbone it trains). N = 10 is our choice, one count for all"
    " prompt arms as our spec compares them at equal N. Added parameters are counted from"
    " each adapter's parameter tree (head excluded); they are the same on every seed, so "
    "their claim's interval is a single point. At width 64 VAPT's fixed cost (2d per "
    "block for the LayerNorm plus 2dh for the shared MLP) is large against VPT-deep's L N"
    " d: VAPT has fewer parameters than VPT-deep only from N = 9 here (L = 4, g' = 4: "
    "1552 + 68 N against 256 N)."
  )
  c.scorer = "vapt_transfer"
  c.settings = {"seed": 0}  # the rest: the scorer's defaults
  c.arms = [{"name": name} for name in ("linear", "full", "vpt_shallow", "vpt_deep", "vapt")]
  c.levels = [{}]
  c.draws = 3
  c.reference = "vpt_deep"
  c.claims = [
    {
      "arm": "vapt",
      "reference": "full",
      "metric": "mean_accuracy",
      "expect": "higher",
      "source": "paper",
      "text": "VAPT reaches a higher mean test accuracy over the tasks than full fine-tuning "
      "(the paper's headline: +7.34% on VTAB-1k)",
    },
    {
      "arm": "vapt",
      "reference": "vpt_deep",
      "metric": "mean_accuracy",
      "expect": "higher",
      "source": "paper",
      "text": "VAPT reaches a higher mean test accuracy over the tasks than VPT-deep",
    },
    {
      "arm": "vapt",
      "reference": "vpt_deep",
      "metric": "added_params",
      "expect": "lower",
      "source": "paper",
      "text": "VAPT adds fewer parameters than VPT-deep (deterministic: the same on every "
      "draw, so the interval is the difference itself)",
    },
    {
      "arm": "vapt",
      "reference": "linear",
      "metric": "mean_accuracy",
      "expect": "higher",
      "source": "ours",
      "text": "VAPT reaches a higher mean test accuracy than the linear probe",
    },
  ]
  return c
