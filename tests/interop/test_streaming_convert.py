"""Streaming conversion (moejax/interop/streaming.py) gives what the in-memory path
gives, holds one tensor at a time (a memory bound measured in a child process),
and writes a sharded orbax checkpoint that restores onto another mesh."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from moejax.migrate import flatten_config
from moejax.interop.convert import export_hf, import_hf, load_workdir, save_workdir
from moejax.interop.safetensors_io import PlannedWriter, SafetensorsReader
from moejax.interop.streaming import export_workdir, import_to_workdir

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tensors(directory, index_file="model.safetensors.index.json"):
  reader = SafetensorsReader(directory, index_file=index_file)
  out = {n: reader.read(n, reader.shape(n), reader.dtype(n)) for n in reader.names()}
  return out, reader.file_of


def test_streaming_import_and_export_match_the_in_memory_path(hf_checkpoints, family, tmp_path):
  _, hf_dir = hf_checkpoints(family)
  memory, stream = str(tmp_path / "memory"), str(tmp_path / "stream")
  loaded = import_hf(hf_dir)
  save_workdir(memory, loaded, extra_files_from=hf_dir)
  import_to_workdir(hf_dir, stream, extra_files_from=hf_dir)
  assert sorted(os.listdir(os.path.join(memory, "model"))) == sorted(
    os.listdir(os.path.join(stream, "model"))
  )
  a, b = load_workdir(memory), load_workdir(stream)
  assert flatten_config(a.config.to_dict()) == flatten_config(b.config.to_dict())
  assert a.hf_config == b.hf_config
  assert jax.tree.structure((a.params, a.rest)) == jax.tree.structure((b.params, b.rest))
  for x, y in zip(jax.tree.leaves((a.params, a.rest)), jax.tree.leaves((b.params, b.rest))):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for dtype in (None, "bfloat16"):
    out_memory, out_stream = str(tmp_path / f"em{dtype}"), str(tmp_path / f"es{dtype}")
    want = export_hf(
      a.config,
      a.params,
      a.rest,
      out_memory,
      dtype=dtype,
      base_hf_config=a.hf_config,
      max_shard_bytes=30_000,
    )
    got = export_workdir(stream, out_stream, dtype=dtype, max_shard_bytes=30_000)
    assert got == want
    (x, x_files), (y, y_files) = tensors(out_memory), tensors(out_stream)
    assert x_files == y_files  # same shards, same tensors in each
    for name in x:
      assert x[name].dtype == y[name].dtype, name
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_bfloat16_import_round_trips_bit_exactly(hf_checkpoints, tmp_path):
  _, hf_dir = hf_checkpoints("qwen3_moe")
  import_to_workdir(hf_dir, str(tmp_path / "w"), "bfloat16")
  export_workdir(str(tmp_path / "w"), str(tmp_path / "out"), dtype="bfloat16")
  (source, _), (back, _) = tensors(hf_dir), tensors(str(tmp_path / "out"))
  assert sorted(source) == sorted(back)
  bf16 = np.dtype(ml_dtypes.bfloat16)
  for name, value in source.items():
    assert back[name].dtype == bf16
    np.testing.assert_array_equal(
      back[name].view(np.uint16), value.astype(bf16).view(np.uint16), err_msg=name
    )


def test_planned_writer_any_order_and_parts(tmp_path):
  rng = np.random.default_rng(0)
  a = rng.standard_normal((3, 5, 4)).astype(ml_dtypes.bfloat16)
  b = rng.standard_normal((7, 6)).astype(np.float32)
  c = rng.standard_normal((6,)).astype(np.float16)
  specs = [("a", a.shape, a.dtype), ("b", (6, 7), b.dtype), ("c", c.shape, c.dtype)]
  writer = PlannedWriter(str(tmp_path), specs, max_shard_bytes=200)
  writer.write("c", c)
  writer.write("b", b.T)  # a transposed view, written in pieces
  for e in (2, 0, 1):
    writer.write_part("a", e, a[e])
  writer.close()
  index = json.load(open(tmp_path / "model.safetensors.index.json"))
  assert len(set(index["weight_map"].values())) == 2  # a (120 B) | b + c: a new shard at 200
  for name, want in (("a", a), ("b", b.T), ("c", c)):
    with safe_open(
      str(tmp_path / index["weight_map"][name]), "numpy"
    ) as f:  # an independent reader
      got = f.get_tensor(name)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
  incomplete = PlannedWriter(str(tmp_path / "x"), specs)
  incomplete.write_part("a", 0, a[0])
  with pytest.raises(ValueError, match="not \\(fully\\) written"):
    incomplete.close()


MEMORY_CHILD = textwrap.dedent("""
    import json, os, re, sys
    import numpy as np
    from moejax.interop.convert import import_hf, save_workdir
    from moejax.interop.hf_config import from_hf_config
    from moejax.interop.names import tensor_maps
    from moejax.interop.safetensors_io import PlannedWriter
    from moejax.interop.streaming import export_workdir, import_to_workdir
    from moejax.models.decoder import abstract_model

    def status(key):
      return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10

    tmp, kind = sys.argv[1], sys.argv[2]
    hf = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=2048,
              hidden_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, intermediate_size=512, moe_intermediate_size=256, num_experts=32,
              num_experts_per_tok=4, norm_topk_prob=True)
    hf_dir = os.path.join(tmp, "hf")
    if not os.path.exists(hf_dir):  # one HF tensor per expert, float32, ~80 MB
      m = from_hf_config(hf)
      _, params, _ = abstract_model(m)
      specs = []
      for tm in tensor_maps(m):
        leaf = params
        for key in tm.path:
          leaf = leaf[key]
        specs += [(n, tm.hf_shape(leaf.shape), np.float32) for n in tm.hf_names]
      writer = PlannedWriter(hf_dir, specs, 16 << 20)
      for i, (name, shape, dtype) in enumerate(specs):
        writer.write(name, np.full(shape, i % 7 - 3, dtype))
      writer.close()
      json.dump(hf, open(os.path.join(hf_dir, "config.json"), "w"))
    size = sum(os.path.getsize(os.path.join(hf_dir, f)) for f in os.listdir(hf_dir))
    open("/proc/self/clear_refs", "w").write("5")  # the peak RSS starts again from here
    base = status("VmRSS")
    work = os.path.join(tmp, kind)
    if kind == "stream":
      import_to_workdir(hf_dir, work)
      export_workdir(work, os.path.join(tmp, "out"))
    else:
      save_workdir(work, import_hf(hf_dir))
    print(json.dumps({"bytes": size, "growth": status("VmHWM") - base}))
""")


def peak_growth(tmp_path, kind):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  out = subprocess.run(
    [sys.executable, "-c", MEMORY_CHILD, str(tmp_path), kind],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.integration
@pytest.mark.skipif(
  not os.path.exists("/proc/self/clear_refs"),
  reason="resets the peak RSS (VmHWM) through Linux's /proc/self/clear_refs; "
  "CI and the development machines are Linux, where it runs",
)
def test_streaming_conversion_holds_one_tensor_not_the_checkpoint(tmp_path):
  """Peak RSS growth over the conversion (import then export) stays under a fifth of
  the checkpoint (largest tensor: the 2 MB embedding); the in-memory path fails it."""
  stream = peak_growth(tmp_path, "stream")
  assert stream["bytes"] > 70e6
  assert stream["growth"] < 0.2 * stream["bytes"], stream
  memory = peak_growth(tmp_path, "memory")  # the bound can fail: the in-memory path fails it
  assert memory["growth"] > 0.9 * memory["bytes"], memory


ORBAX_CHILD = textwrap.dedent("""
    import os, sys
    import jax, numpy as np
    from moejax.interop.convert import import_hf
    from moejax.interop.streaming import import_to_orbax, load_orbax, mesh_layout
    hf_dir, out = sys.argv[1], sys.argv[2]
    calls = []
    import moejax.interop.safetensors_io as io
    read = io.SafetensorsReader.read
    io.SafetensorsReader.read = lambda self, name, *a: (calls.append(name), read(self, name, *a))[1]
    import_to_orbax(hf_dir, out, mesh_layout({"fsdp": 2, "expert": 4}))
    assert len(calls) == len(set(calls)), "an HF tensor read twice"
    want = import_hf(hf_dir)
    for layout in (mesh_layout({"expert": 8}), None):
      m, params, rest = load_orbax(out, layout)
      assert jax.tree.structure((params, rest)) == jax.tree.structure((want.params, want.rest))
      for a, b in zip(jax.tree.leaves((params, rest)), jax.tree.leaves((want.params, want.rest))):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    blocks = load_orbax(out, mesh_layout({"expert": 8}))[1]["blocks"]
    w_gate = blocks[max(blocks)]["ffn"]["experts"]["w_gate"]  # the last layer is MoE
    assert w_gate.sharding.spec[0] == "expert", w_gate.sharding
    assert len(w_gate.addressable_shards) == 8 and w_gate.addressable_shards[0].data.shape[0] == 1
    print("ok")
""")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3"])
def test_orbax_checkpoint_written_sharded_restores_on_another_mesh(hf_checkpoints, name, tmp_path):
  _, hf_dir = hf_checkpoints(name)
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": ROOT,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
  }
  out = subprocess.run(
    [sys.executable, "-c", ORBAX_CHILD, hf_dir, str(tmp_path / "orbax")],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
