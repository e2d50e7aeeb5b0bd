"""A synthetic checkpoint of any size, and the bit checks of its conversions.

A Qwen3-MoE checkpoint (Qwen3MoeForCausalLM's config.json and tensor names,
per-expert tensors, bf16) of Qwen3-30B-A3B's shape scaled down, every tensor
drawn from its own seeded generator and written at its offset in its shard, so
the whole model is never in memory (the benchmark
experiments/benchmarks/large_checkpoint.py converts one larger than its memory);
and the comparisons of a conversion's output with it, bf16 bit by bit.
"""

import json
import math
import os
import time

import ml_dtypes
import numpy as np

from moejax.interop.convert import read_config_json
from moejax.interop.hf_config import from_hf_config
from moejax.interop.names import tensor_maps
from moejax.interop.safetensors_io import PlannedWriter, SafetensorsReader

BF16 = np.dtype(ml_dtypes.bfloat16)
VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, EXPERT_FF = 32768, 1024, 16, 4, 128, 64, 8, 512


# ---------------------------------------------------------------- the checkpoint


def qwen3_config(num_layers: int) -> dict:
  return {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": VOCAB,
    "hidden_size": D,
    "num_hidden_layers": num_layers,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": 4 * D,
    "moe_intermediate_size": EXPERT_FF,
    "num_experts": EXPERTS,
    "num_experts_per_tok": TOP_K,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "attention_bias": False,
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
  }


def layer_tensors(i: int) -> list[tuple[str, tuple]]:
  """One decoder layer's (name, shape), as Qwen3MoeForCausalLM names them."""
  p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
  out = [
    (f"{p}.input_layernorm.weight", (D,)),
    (f"{a}.q_proj.weight", (HEADS * HEAD_DIM, D)),
    (f"{a}.k_proj.weight", (KV_HEADS * HEAD_DIM, D)),
    (f"{a}.v_proj.weight", (KV_HEADS * HEAD_DIM, D)),
    (f"{a}.o_proj.weight", (D, HEADS * HEAD_DIM)),
    (f"{a}.q_norm.weight", (HEAD_DIM,)),
    (f"{a}.k_norm.weight", (HEAD_DIM,)),
    (f"{p}.post_attention_layernorm.weight", (D,)),
    (f"{p}.mlp.gate.weight", (EXPERTS, D)),
  ]
  for e in range(EXPERTS):
    x = f"{p}.mlp.experts.{e}"
    out += [
      (f"{x}.gate_proj.weight", (EXPERT_FF, D)),
      (f"{x}.up_proj.weight", (EXPERT_FF, D)),
      (f"{x}.down_proj.weight", (D, EXPERT_FF)),
    ]
  return out


def checkpoint_tensors(num_layers: int) -> list[tuple[str, tuple]]:
  out = [("model.embed_tokens.weight", (VOCAB, D))]
  for i in range(num_layers):
    out += layer_tensors(i)
  return out + [("model.norm.weight", (D,)), ("lm_head.weight", (VOCAB, D))]


def nbytes(tensors) -> int:
  return sum(math.prod(shape) for _, shape in tensors) * BF16.itemsize


def layers_for(gb: float) -> int:
  fixed, per_layer = nbytes(checkpoint_tensors(0)), nbytes(layer_tensors(0))
  return max(1, round((gb * 1e9 - fixed) / per_layer))


def draw(name: str, shape: tuple, seed: int, index: int) -> np.ndarray:
  """Tensor `index`: norms ~1 + 0.2 N(0, 1), routers N(0, 1), the rest N(0, 1/fan_in), bf16."""
  rng = np.random.default_rng([seed, index])
  x = rng.standard_normal(shape, np.float32)
  if name.endswith("norm.weight"):
    x = 1.0 + 0.2 * x
  elif not name.endswith("mlp.gate.weight"):
    x *= shape[-1] ** -0.5
  return x.astype(BF16)


def make_checkpoint(directory: str, gb: float, seed: int, shard_bytes: int) -> dict:
  """The checkpoint of about `gb` GB (by its layer count) in `directory`, in shards of
  at most shard_bytes: its layers, tensors, bytes, files and the seconds it took."""
  num_layers = layers_for(gb)
  tensors = checkpoint_tensors(num_layers)
  start = time.perf_counter()
  writer = PlannedWriter(directory, [(n, s, BF16) for n, s in tensors], shard_bytes)
  for index, (name, shape) in enumerate(tensors):
    writer.write(name, draw(name, shape, seed, index))
  writer.close()
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(qwen3_config(num_layers), f, indent=2)
  return {
    "num_layers": num_layers,
    "num_tensors": len(tensors),
    "bytes": nbytes(tensors),
    "files": len(checkpoint_files(directory)),
    "seconds": time.perf_counter() - start,
  }


def checkpoint_files(directory: str) -> list[str]:
  return sorted(os.path.join(directory, f) for f in os.listdir(directory))


# ---------------------------------------------------------------- bits


def bits(array: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(array).view(np.uint16)


def compare_exports(src: str, out: str) -> dict:
  """Every tensor of `out` against `src`: same names, shapes and bf16 bits."""
  a, b = SafetensorsReader(src), SafetensorsReader(out)
  differ = [
    n
    for n in a.names()
    if n not in b
    or a.shape(n) != b.shape(n)
    or b.dtype(n) != BF16
    or not np.array_equal(bits(a.read(n, a.shape(n), BF16)), bits(b.read(n, b.shape(n), BF16)))
  ]
  extra = sorted(set(b.names()) - set(a.names()))
  return {
    "tensors": len(a.names()),
    "identical": not differ and not extra,
    "differing": differ[:10],
    "extra": extra[:10],
  }


def sampled(src: str, count: int, seed: int):
  """(model config, source reader, [(tensor map, [(expert, HF name)])]): `count`
  source tensors drawn by `seed` (half of them experts), by the tensor map that
  places them."""
  m, hf = from_hf_config(read_config_json(src)), SafetensorsReader(src)
  rng = np.random.default_rng(seed)
  experts = sorted(n for n in hf.names() if ".experts." in n)
  others = sorted(n for n in hf.names() if ".experts." not in n)
  picked = set(rng.choice(experts, count // 2, replace=False)) | set(
    rng.choice(others, count - count // 2, replace=False)
  )
  groups = [
    (tm, [(e, n) for e, n in enumerate(tm.hf_names) if n in picked]) for tm in tensor_maps(m)
  ]
  return m, hf, [(tm, names) for tm, names in groups if names]


def compared(hf, name: str, tm, stored: np.ndarray, where: dict) -> dict:
  """One sampled tensor: its place `where`, and whether the stored array (as its
  tensor map transposes it) has the source's shape and bf16 bits."""
  stored = stored.T if tm.transpose else stored
  source = hf.read(name, hf.shape(name), BF16)
  return {
    "name": name,
    **where,
    "shape": list(source.shape),
    "identical": bool(stored.shape == source.shape and np.array_equal(bits(stored), bits(source))),
  }


def summary(rows: list) -> dict:
  return {"sampled": len(rows), "identical": all(r["identical"] for r in rows), "tensors": rows}


def compare_sample(src: str, workdir: str, count: int, seed: int) -> dict:
  """`count` source tensors (half experts) against their place in the converted workdir."""
  _, hf, groups = sampled(src, count, seed)
  ours = SafetensorsReader(os.path.join(workdir, "model"), index_file="params.index.json")
  rows = []
  for tm, names in groups:
    key = f"{tm.collection}/{'.'.join(map(str, tm.path))}"
    for e, name in names:
      stored = (
        ours.read_part(key, e, ours.shape(key), BF16)
        if tm.stacked
        else ours.read(key, ours.shape(key), BF16)
      )
      rows.append(
        compared(hf, name, tm, stored, {"workdir": key + (f"[{e}]" if tm.stacked else "")})
      )
  return summary(rows)


def compare_orbax_sample(src: str, directory: str, count: int, seed: int) -> dict:
  """`count` source tensors (half experts, drawn by seed + 1) against the orbax
  checkpoint, each leaf holding one restored alone (the others orbax's
  PLACEHOLDER), on one device."""
  import jax
  import orbax.checkpoint.experimental.v1 as ocp
  from moejax.interop.streaming import ORBAX_STATE, _orbax_keys, orbax_target

  m, hf, groups = sampled(src, count, seed + 1)
  target = {
    k: v for k, v in _orbax_keys(orbax_target(m, None, "bfloat16")).items() if jax.tree.leaves(v)
  }  # orbax stores no empty subtree
  rows = []
  for tm, names in groups:
    path = (tm.collection, *map(str, tm.path))

    def only(tree, at=()):
      if isinstance(tree, dict):
        return {k: only(v, at + (k,)) for k, v in tree.items()}
      return tree if at == path else ocp.PLACEHOLDER

    leaf = ocp.load(os.path.join(os.path.abspath(directory), ORBAX_STATE), only(target))
    for key in path:
      leaf = leaf[key]
    leaf = np.asarray(leaf)
    for e, name in names:
      rows.append(
        compared(
          hf,
          name,
          tm,
          leaf[e] if tm.stacked else leaf,
          {"orbax": "/".join(path) + (f"[{e}]" if tm.stacked else "")},
        )
      )
  return summary(rows)
