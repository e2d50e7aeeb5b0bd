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
from absl import app, flags, logging
import numpy as np

from moejax.errors import ConfigError
from moejax.inference.generate import generate
from moejax.interop.load import load_model

_WORKDIR = flags.DEFINE_string("workdir", None, "Training or converted workdir.")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory.")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "Text to continue (repeat for a batch).")
_PROMPT_IDS = flags.DEFINE_multi_string("prompt_ids", [], "Comma-separated token ids "
                                        "(repeat for a batch); for models without a tokenizer.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest tokens; 0 = all.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_SERE = flags.DEFINE_string("sere_similarity", None, "Decode with SERE re-routing using this "
                            "[MoE layers, E, E] similarity (experiments.calibrate_sere).")
_SERE_RHO = flags.DEFINE_float("sere_rho", 0.3, "SERE similarity threshold rho.")


def parse_ids(text: str) -> list[int]:
  try:
    return [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError as e:
    raise ConfigError(f"--prompt_ids={text!r} must be comma-separated integers") from e


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  loaded, tokenizer, eos_id = load_model(_WORKDIR.value, _HF_DIR.value)
  m, rest = loaded.config, loaded.rest
  if _SERE.value:
    from moejax.analysis.router_inference import with_sere
    m, rest = with_sere(m, rest, np.load(_SERE.value), _SERE_RHO.value)
  prompts = [parse_ids(ids) for ids in _PROMPT_IDS.value]
  if _PROMPT.value:
    if tokenizer is None:
      raise ConfigError("this model has no tokenizer (tokenizer.json); use --prompt_ids")
    prompts += [[int(i) for i in tokenizer.encode(text)] for text in _PROMPT.value]
  if not prompts:
    prompts = [[int(i) for i in tokenizer.encode("\n")]] if tokenizer else [[0]]
  out = generate(m, loaded.params, rest, prompts,
                 max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                 top_k=_TOP_K.value, top_p=_TOP_P.value, seed=_SEED.value, eos_id=eos_id)
  for i, prompt in enumerate(prompts):
    ids = out.row(i, eos_id)
    text = (tokenizer.decode(prompt) + tokenizer.decode(ids)) if tokenizer else f"{prompt} -> {ids}"
    print(f"--- [{i}]\n{text}")
  steps = out.distinct_experts
  if steps.size:
    counts = [f"layer {layer}: mean {steps[:, j].mean():.2f} max {steps[:, j].max()}"
              for j, layer in enumerate(loaded.config.moe_layers)]
    print(f"decode routing, distinct experts per step (batch {len(prompts)}, "
          f"{steps.shape[0]} steps): " + "; ".join(counts))


if __name__ == "__main__":
  app.run(main)
