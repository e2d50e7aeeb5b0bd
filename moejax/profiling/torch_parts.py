"""Where a transformers model's time goes: forward hooks timing each module inside
its own generate, summed into the parts of moejax.profiling.xla_parts.PARTS.
"""

import time

from moejax.profiling.xla_parts import PARTS

HF_PART = {
  "embed_tokens": "embedding",
  "rotary_emb": "attention",
  "self_attn": "attention",
  "input_layernorm": "norms",
  "post_attention_layernorm": "norms",
  "norm": "norms",
  "gate": "moe_router",
  "experts": "moe_experts",
  "shared_experts": "moe_experts",
  "lm_head": "lm_head",
}


def hf_hooks(hf_model, totals: dict) -> list:
  """Forward hooks adding each module's inclusive wall time to totals[part]; a
  MoE block's own time (outside gate and experts) goes to moe_dispatch, a dense
  MLP's to dense_ffn."""
  starts, handles = {}, []

  def part_of(name, module):
    path = name.split(".")
    if "mlp" in path[:-1]:  # inside an MLP: a MoE block's router and experts only
      return (
        HF_PART[path[-1]]
        if path[-2] == "mlp" and path[-1] in ("gate", "experts", "shared_experts")
        else None
      )
    if path[-1] == "mlp":
      return "mlp_moe" if hasattr(module, "gate") else "dense_ffn"
    return None if "self_attn" in path[:-1] else HF_PART.get(path[-1])

  for name, module in hf_model.named_modules():
    part = part_of(name, module)
    if part is None:
      continue

    def pre(module, args, _key=name):
      starts[_key] = time.perf_counter()

    def post(module, args, output, _key=name, _part=part):
      totals[_part] = totals.get(_part, 0.0) + time.perf_counter() - starts[_key]

    handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
  return handles


def transformers_run(hf_model, prompts, new_tokens: int):
  """run(hooked) -> a dict, from inside transformers' own generate: a hook on the top
  module times each forward. 'forwards' the decode forwards' seconds (the first, the
  prefill, left out), 'gaps' the host work between two (generate's loop: logits
  processors, argmax, stopping criteria, cache and input bookkeeping), 'parts'
  {part: seconds per decode forward}; 'prefill' the first forward's seconds,
  'prefill_parts' its {part: seconds}.
  hooked=True adds hooks on every part's module."""
  import torch

  def run(hooked: bool):
    totals: dict[str, float] = {}
    spans, prefill_parts = [], {}
    handles = hf_hooks(hf_model, totals) if hooked else []

    def pre(module, args, kwargs):
      spans.append([time.perf_counter(), None])

    def post(module, args, kwargs, output):
      spans[-1][1] = time.perf_counter()
      if len(spans) == 1:  # the prefill
        prefill_parts.update(totals)
        totals.clear()

    handles += [
      hf_model.register_forward_pre_hook(pre, with_kwargs=True),
      hf_model.register_forward_hook(post, with_kwargs=True),
    ]
    try:
      with torch.no_grad():
        ids = torch.as_tensor(prompts)
        hf_model.generate(
          ids,
          do_sample=False,
          max_new_tokens=new_tokens,
          min_new_tokens=new_tokens,
          attention_mask=torch.ones_like(ids),
          pad_token_id=0,
        )
    finally:
      for handle in handles:
        handle.remove()
    forwards = [end - begin for begin, end in spans[1:]]
    return {
      "forwards": forwards,
      "gaps": [b[0] - a[1] for a, b in zip(spans, spans[1:])],
      "parts": {k: v / max(len(forwards), 1) for k, v in totals.items()},
      "prefill": spans[0][1] - spans[0][0],
      "prefill_parts": prefill_parts,
    }

  return run


def hf_parts(parts: dict, forward: float) -> dict:
  """Hooked inclusive times -> PARTS (a MoE block's own time is its dispatch glue;
  what no hooked module holds is other_in_step)."""
  by_part = dict.fromkeys(PARTS, 0.0)
  for name, seconds in parts.items():
    if name != "mlp_moe":
      by_part[name] += seconds
  inner = sum(parts.get(k, 0.0) for k in ("moe_router", "moe_experts"))
  by_part["moe_dispatch"] = max(parts.get("mlp_moe", 0.0) - inner, 0.0)
  by_part["other_in_step"] = max(forward - sum(by_part.values()), 0.0)
  return by_part
