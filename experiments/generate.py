r"""Generate with a KV cache from any moejax or HF MoE model, batched.

  python -m experiments.generate --workdir=runs/moe --prompt="ROMEO:" --prompt="JULIET:"
  python -m experiments.generate --hf_dir=/ckpt/OLMoE-1B-7B --prompt="The capital of" \
      --max_new_tokens=32 --temperature=0.7 --top_p=0.9
  python -m experiments.generate --workdir=runs/qwen3 --prompt_ids=1,2,3 --prompt_ids=4,5

--workdir: a training workdir (experiments.train) or a converted one
(experiments.convert); --hf_dir: an HF checkpoint directory. Prompts of
different lengths are left padded into one batch. Prints each continuation,
then the routing of the decode steps: distinct experts active per step in
each MoE layer (over the batch).

SERE re-routing (arXiv 2602.07616) while decoding: --sere_similarity=FILE.npy
(from experiments.calibrate_sere) --sere_rho=0.3 switches the MoE layers to
router 'sere' with that calibrated expert similarity.
"""

import os

from absl import flags
import numpy as np

from moejax import cli, cli_files
from moejax.models.structure import moe_layer_indices
from moejax.errors import ConfigError
from moejax.inference.generate import generate
from moejax.train.load import load_model

_WORKDIR = flags.DEFINE_string("workdir", None, "Training or converted workdir.")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory.")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "Text to continue (repeat for a batch).")
_PROMPT_IDS = flags.DEFINE_multi_string(
  "prompt_ids",
  [],
  "Comma-separated token ids (repeat for a batch); for models without a tokenizer.",
)
_MAX_NEW = cli.checked(
  flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate per prompt."), cli.at_least(1)
)
_TEMPERATURE = cli.checked(
  flags.DEFINE_float("temperature", 0.8, "0 = greedy."), cli.at_least(0.0, float)
)
_TOP_K = cli.checked(
  flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest tokens; 0 = all."), cli.at_least(0)
)
_TOP_P = cli.checked(
  flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off."),
  cli.in_range(0, 1, low_open=True),
)
_SEED = cli.checked(flags.DEFINE_integer("seed", 0, "Sampling seed."), cli.in_range(0, 2**32 - 1))
_SERE = flags.DEFINE_string(
  "sere_similarity",
  None,
  "Decode with SERE re-routing using this "
  ".npy file, a [MoE layers, E, E] similarity "
  "(experiments.calibrate_sere).",
)
_SERE_RHO = cli.checked(
  flags.DEFINE_float(
    "sere_rho", 0.3, "SERE similarity threshold rho in [0, 1] (model.moe.sere.rho)."
  ),
  cli.in_range(0, 1),
)


def load_similarity(path: str, m) -> np.ndarray:
  """The --sere_similarity array, checked against the model: float [MoE layers, E, E]."""
  cli_files.input_file("sere_similarity", path)
  try:
    similarity = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    raise ConfigError(f"not a readable .npy file: {e} (--sere_similarity={path})") from e
  want = (len(moe_layer_indices(m)), m.moe.num_experts, m.moe.num_experts)
  if not np.issubdtype(similarity.dtype, np.floating) or similarity.shape != want:
    raise ConfigError(
      f"expected a float array of shape {want} (MoE layers, experts, experts), "
      f"found {similarity.dtype} {similarity.shape} (--sere_similarity={path})"
    )
  return similarity


def main(argv):
  del argv
  if (_WORKDIR.value is None) == (_HF_DIR.value is None):
    raise ConfigError(
      "give exactly one of --workdir and --hf_dir "
      f"(--workdir={_WORKDIR.value}, --hf_dir={_HF_DIR.value})"
    )
  if _WORKDIR.value is not None:
    cli_files.existing_workdir("workdir", _WORKDIR.value)
  elif not os.path.isdir(_HF_DIR.value):
    raise cli.flag_error(_HF_DIR, "expected an existing HF checkpoint directory")
  if _SERE.value is not None:
    cli_files.input_file("sere_similarity", _SERE.value)
  loaded, tokenizer, eos_id = load_model(_WORKDIR.value, _HF_DIR.value)
  m, rest = loaded.config, loaded.rest
  if _TOP_K.value > m.vocab_size:
    raise cli.flag_error(_TOP_K, f"expected at most the vocabulary size {m.vocab_size}")
  if _SERE.value:
    from moejax.analysis.router_inference import with_sere

    m, rest = with_sere(m, rest, load_similarity(_SERE.value, m), _SERE_RHO.value)
  prompts = [cli.token_ids(ids, m.vocab_size, _PROMPT_IDS.name) for ids in _PROMPT_IDS.value]
  if _PROMPT.value:
    if tokenizer is None:
      raise ConfigError(
        "this model has no tokenizer (tokenizer.json); use --prompt_ids "
        f"(--prompt={_PROMPT.value[0]})"
      )
    for text in _PROMPT.value:
      ids = [int(i) for i in tokenizer.encode(text)]
      if not ids:
        raise ConfigError(f"the prompt encodes to no tokens (--prompt={text!r})")
      prompts.append(ids)
  if not prompts:
    prompts = [[int(i) for i in tokenizer.encode("\n")]] if tokenizer else [[0]]
  out = generate(
    m,
    loaded.params,
    rest,
    prompts,
    max_new_tokens=_MAX_NEW.value,
    temperature=_TEMPERATURE.value,
    top_k=_TOP_K.value,
    top_p=_TOP_P.value,
    seed=_SEED.value,
    eos_id=eos_id,
  )
  for i, prompt in enumerate(prompts):
    ids = out.row(i, eos_id)
    text = (tokenizer.decode(prompt) + tokenizer.decode(ids)) if tokenizer else f"{prompt} -> {ids}"
    print(f"--- [{i}]\n{text}")
  steps = out.distinct_experts
  if steps.size:
    counts = [
      f"layer {layer}: mean {steps[:, j].mean():.2f} max {steps[:, j].max()}"
      for j, layer in enumerate(moe_layer_indices(loaded.config))
    ]
    print(
      f"decode routing, distinct experts per step (batch {len(prompts)}, "
      f"{steps.shape[0]} steps): " + "; ".join(counts)
    )


if __name__ == "__main__":
  cli.run(main)
