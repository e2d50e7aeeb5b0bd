r"""SMoPE (Sparse Mixture of Prompt Experts, ICLR; arXiv 2509.24483) on a class-incremental
digits stream, against one shared prompt and task-specific prompts with key matching
(moejax/studies/scorers/smope.py, moejax/continual/prompt_experts.py).

  python -m experiments.study --config=configs/studies/smope.py
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "smope"
  c.description = (
    "SMoPE puts one shared prefix of N prompt experts in the attention of a frozen ViT and "
    "lets each image attend to the K with the highest proxy score (the mean query's logit); "
    "usage-based penalties steer new tasks to experts earlier tasks used little. The paper "
    "reports accuracy competitive with the state of the art in class-incremental learning "
    "with 0.38M prompt parameters and up to 50% less compute; the claims below test the "
    "direction our spec expects at small scale (SMoPE above one shared prompt and above "
    "task-specific prompts, less forgetting). Here, per "
    "seed: scikit-learn's 8x8 digits, the training images split in half; a 4-block ViT "
    "(width 64, 4 heads, 2x2 patches) pretrained without labels on one half (which of 4 "
    "rotations) and frozen; the other half as 5 tasks of 2 classes in a shuffled order. "
    "Each method trains only its prompts and the head (Adam, 100 steps of 32 images per "
    "task, the other classes' logits masked) and is tested after each task on the test "
    "images of the tasks so far, without the task identity, by the nearest class mean "
    "of its prompted feature (head_*: by the head). smope: N = 10, K = 2 in the first 2 "
    "blocks, the official usage penalties, 50 dense warm-up steps and the official router "
    "losses (margin cross-entropy and old-key prototype loss, weights 1e-5); "
    "smope_no_router_losses: the same without them; shared: the same "
    "10 experts all used, per-query logits "
    "(dense prefix tuning); task_prompts: 2 experts per task, chosen at test time by the "
    "cosine between the frozen feature and each task's key (the mean feature)."
  )
  c.scorer = "smope"
  c.settings = {"seed": 0}  # the rest: the scorer's defaults (moejax/studies/scorers/smope.py)
  c.arms = [
    {"name": name} for name in ("smope", "smope_no_router_losses", "shared", "task_prompts")
  ]
  c.levels = [{}]
  c.draws = 3
  c.reference = "shared"
  versus = [("shared", "one shared prompt"), ("task_prompts", "task-specific prompts")]
  c.claims = []
  for reference, words in versus:
    c.claims += [
      {
        "arm": "smope",
        "reference": reference,
        "metric": "final_accuracy",
        "expect": "higher",
        "source": "spec",
        "text": f"SMoPE reaches a higher final average accuracy than {words}",
      },
      {
        "arm": "smope",
        "reference": reference,
        "metric": "forgetting",
        "expect": "lower",
        "source": "spec",
        "text": f"SMoPE forgets less than {words}",
      },
    ]
  return c
