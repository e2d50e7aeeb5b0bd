r"""Converting a checkpoint larger than the memory it may use.

  python -m experiments.benchmarks.large_checkpoint --out_dir=runs/large_ckpt --gb=4 \
      --json=docs/results/large_checkpoint_cpu.json --markdown=docs/results/large_checkpoint_cpu.md

1. Writes a synthetic Qwen3-MoE checkpoint (moejax/interop/synthetic.py:
   Qwen3MoeForCausalLM's config.json and tensor names, per-expert tensors, bf16)
   of about --gb GB (1e9 bytes):
   Qwen3-30B-A3B's shape scaled down (hidden 1024, 16 query / 4 KV heads of
   128, 64 experts of width 512, top-8, vocab 32768) with as many layers as the
   size gives. Every tensor is drawn from its own seeded generator and written
   at its offset in shards of --shard_mb (header first: safetensors_io.PlannedWriter),
   so the whole model is never in memory; no tokenizer.
2. Times a plain copy of the same files (shutil.copyfile: in-kernel copy_file_range).
3. Runs each conversion in a child process under /usr/bin/time -v and takes
   its "Maximum resident set size" (the kernel's ru_maxrss), plus the peaks of
   its anonymous and file-backed parts polled from /proc/<pid>/status every 20 ms:
     import    HF -> converted workdir, streaming (moejax/interop/streaming.py)
     export    workdir -> HF bf16, streaming
     orbax     HF -> orbax checkpoint, each array sharded on --orbax_mesh of 8 simulated
               CPU devices, a partial save per 128 MB of arrays (streaming.import_to_orbax)
     baseline  the in-memory path experiments.convert runs (import_hf + save_workdir)
     floor     the child's interpreter with the same modules imported, converting nothing
   GB/s = checkpoint bytes / seconds, of the child's whole life (wall) and of the
   conversion call alone (conv, timed in the child).
   Before each timed step the page cache is flushed (sync) and the input
   files' cached pages dropped (posix_fadvise DONTNEED): the reads come from disk
   ("cold"); --warm repeats copy/import/export with the inputs read into the
   cache first.
4. Checks bf16 bits: every tensor of the export against the source, and
   --sample tensors (seeded, half of them experts) of the source against their
   place in the converted workdir (transposed, in their expert's row).
--keep leaves the files (several times --gb) under --out_dir; by default they
are deleted at the end.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import psutil
from absl import app, flags

from moejax import cli, cli_files
from moejax.interop.synthetic import (
  checkpoint_files,
  compare_exports,
  compare_orbax_sample,
  compare_sample,
  layers_for,
  make_checkpoint,
  qwen3_config,
)
from moejax.profiling.conversion import conversion_report, drop_cache, gbps, tree_bytes, warm_cache
from moejax.profiling.timing import machine

_OUT_DIR = flags.DEFINE_string("out_dir", "runs/large_ckpt", "Where the checkpoints are written.")
_GB = flags.DEFINE_float("gb", 4.0, "Checkpoint size in GB (1e9 bytes), by its layer count.")
_SHARD_MB = flags.DEFINE_integer("shard_mb", 1000, "Largest shard (MB, 1e6 bytes).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and of the sample.")
_SAMPLE = flags.DEFINE_integer("sample", 20, "Tensors checked against the converted workdir.")
_BASELINE = flags.DEFINE_bool("baseline", True, "Also measure the in-memory conversion.")
_WARM = flags.DEFINE_bool("warm", True, "Repeat copy/import/export with warm caches.")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the checkpoints (default: delete them).")
_ORBAX_MESH = flags.DEFINE_string(
  "orbax_mesh",
  "fsdp=2,expert=4",
  "Mesh of the sharded orbax import, over 8 simulated CPU devices ('' to skip it).",
)
_CHILD = flags.DEFINE_enum(
  "child",
  None,
  ["import", "export", "baseline", "floor", "orbax"],
  "Internal: run one conversion (this process is the measured child).",
)
_SRC = flags.DEFINE_string("src", None, "Internal: the child's input.")
_DST = flags.DEFINE_string("dst", None, "Internal: the child's output.")
OUTPUTS = cli_files.study_outputs()

# ---------------------------------------------------------------- measuring


def plain_copy(src: str, dst: str) -> float:
  os.makedirs(dst)
  start = time.perf_counter()
  for path in checkpoint_files(src):
    shutil.copyfile(path, os.path.join(dst, os.path.basename(path)))
  return time.perf_counter() - start


def _status_kb(pid: int) -> dict:
  out = {}
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith(("VmRSS", "RssAnon", "RssFile")):
          key, value = line.split(":")
          out[key] = int(value.split()[0])
  except (FileNotFoundError, ProcessLookupError):
    pass
  return out


TIME = "/usr/bin/time"


def measured_child(kind: str, src: str, dst: str) -> dict:
  """Run `--child=kind` under /usr/bin/time -v; its wall time, its own conversion time
  and its peak memory (MB, 1e6 bytes). The peak RSS is time's "Maximum resident set
  size" (the kernel's ru_maxrss of the child; taken through `time`, a small process,
  since a child forked from this one starts with this one's resident set in it)."""
  cmd = [
    sys.executable,
    "-m",
    "experiments.benchmarks.large_checkpoint",
    f"--child={kind}",
    f"--src={src}",
    f"--dst={dst}",
    f"--orbax_mesh={_ORBAX_MESH.value}",
  ]
  use_time = os.access(TIME, os.X_OK)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if kind == "orbax":
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  start = time.perf_counter()
  proc = subprocess.Popen(
    ([TIME, "-v"] if use_time else []) + cmd,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  peaks, done = {}, threading.Event()

  def poll():
    target = None
    while not done.is_set():
      if target is None:
        kids = psutil.Process(proc.pid).children() if use_time else [proc]
        target = kids[0].pid if kids else None
      for key, value in (_status_kb(target) if target else {}).items():
        peaks[key] = max(peaks.get(key, 0), value)
      time.sleep(0.02)

  poller = threading.Thread(target=poll, daemon=True)
  poller.start()
  output = proc.stdout.read().decode()
  _, status, usage = os.wait4(proc.pid, 0)
  seconds = time.perf_counter() - start
  done.set()
  poller.join()
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"child {kind} failed:\n{output[-3000:]}")
  maxrss_kb = usage.ru_maxrss
  if use_time:
    maxrss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", output).group(1))
  inner = re.search(r"^converted in ([0-9.]+) s", output, re.M)
  return {
    "seconds": seconds,
    "convert_seconds": float(inner.group(1)) if inner else None,
    "peak_rss_mb": maxrss_kb * 1024 / 1e6,
    "peak_rss_source": ("/usr/bin/time -v" if use_time else "os.wait4 ru_maxrss"),
    "peak_rss_mb_polled": peaks.get("VmRSS", 0) * 1024 / 1e6,
    "peak_anon_mb_polled": peaks.get("RssAnon", 0) * 1024 / 1e6,
    "peak_file_mb_polled": peaks.get("RssFile", 0) * 1024 / 1e6,
  }


def run_child(kind: str, src: str, dst: str) -> None:
  from moejax.interop import convert, streaming  # noqa: F401 - the floor imports them too

  start = time.perf_counter()
  if kind == "import":
    streaming.import_to_workdir(src, dst, "bfloat16")
  elif kind == "export":
    streaming.export_workdir(src, dst, dtype="bfloat16", max_shard_bytes=_SHARD_MB.value * 10**6)
  elif kind == "orbax":
    streaming.import_to_orbax(src, dst, streaming.mesh_layout(orbax_mesh()), "bfloat16")
  elif kind == "baseline":  # what experiments.convert's import runs
    convert.save_workdir(dst, convert.import_hf(src, "bfloat16"))
  print(f"converted in {time.perf_counter() - start:.3f} s")


def orbax_mesh() -> dict:
  return {k: int(v) for k, v in (item.split("=") for item in _ORBAX_MESH.value.split(","))}


# ---------------------------------------------------------------- the run


def bench(out_dir: str, gb: float, seed: int, shard_bytes: int) -> dict:
  if os.path.exists(out_dir) and os.listdir(out_dir):
    raise app.UsageError(f"--out_dir={out_dir} exists and is not empty")
  hf_dir, copy_dir = os.path.join(out_dir, "hf"), os.path.join(out_dir, "copy")
  work, export = os.path.join(out_dir, "workdir"), os.path.join(out_dir, "export")
  record = {
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "machine": machine(),
    "command": " ".join(["python -m experiments.benchmarks.large_checkpoint"] + sys.argv[1:]),
    "model": {
      k: v
      for k, v in qwen3_config(layers_for(gb)).items()
      if k
      in (
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
      )
    },
  }
  made = make_checkpoint(hf_dir, gb, seed, shard_bytes)
  size = made["bytes"]
  record["checkpoint"] = {
    **made,
    "bytes_on_disk": tree_bytes(hf_dir),
    "write_gbps": gbps(tree_bytes(hf_dir), made["seconds"]),
  }
  print(
    f"checkpoint: {made['num_layers']} layers, {made['num_tensors']} tensors, "
    f"{size / 1e9:.2f} GB in {made['files']} files, {made['seconds']:.0f} s"
  )
  runs = []

  def step(kind, cache, fn, src, dst_dir):
    (drop_cache if cache == "cold" else warm_cache)(src)
    drop_cache(out_dir) if cache == "cold" else os.sync()
    if kind == "copy":
      result = {"seconds": fn(src, dst_dir)}
    else:
      result = measured_child(kind, src, dst_dir)
    result.update(kind=kind, cache=cache, bytes_read=size if kind != "floor" else 0)
    if kind != "floor":
      result["gbps"] = gbps(size, result["seconds"])
      if result.get("convert_seconds"):
        result["convert_gbps"] = gbps(size, result["convert_seconds"])
    result["load_average"] = os.getloadavg()[0]
    runs.append(result)
    print(
      json.dumps(
        {
          k: (round(v, 3) if isinstance(v, float) else v)
          for k, v in result.items()
          if k != "output"
        }
      )
    )
    return result

  step("floor", "cold", None, hf_dir, None)
  for cache in ("cold", "warm") if _WARM.value else ("cold",):
    for d in (copy_dir, work, export):
      shutil.rmtree(d, ignore_errors=True)
    step("copy", cache, plain_copy, hf_dir, copy_dir)
    step("import", cache, None, hf_dir, work)
    step("export", cache, None, work, export)
  record["workdir_bytes"], record["export_bytes"] = tree_bytes(work), tree_bytes(export)
  record["round_trip"] = compare_exports(hf_dir, export)
  record["workdir_sample"] = compare_sample(hf_dir, work, _SAMPLE.value, seed)
  if _ORBAX_MESH.value:
    orbax_dir = os.path.join(out_dir, "orbax")
    for d in (copy_dir, export):
      shutil.rmtree(d)
    step("orbax", "cold", None, hf_dir, orbax_dir)
    record["orbax_mesh"] = orbax_mesh()
    record["orbax_bytes"] = tree_bytes(orbax_dir)
    record["orbax_sample"] = compare_orbax_sample(hf_dir, orbax_dir, _SAMPLE.value, seed)
    shutil.rmtree(orbax_dir)
  if _BASELINE.value:
    baseline_dir = os.path.join(out_dir, "baseline")
    shutil.rmtree(work)
    step("baseline", "cold", None, hf_dir, baseline_dir)
    shutil.rmtree(baseline_dir)
  record["runs"] = runs
  if not _KEEP.value:
    shutil.rmtree(out_dir)
  return record


def main(argv):
  del argv
  if _CHILD.value:
    run_child(_CHILD.value, _SRC.value, _DST.value)
    return
  record = bench(_OUT_DIR.value, _GB.value, _SEED.value, _SHARD_MB.value * 10**6)
  text = conversion_report(record)
  print(text)
  OUTPUTS.write(record, text)


if __name__ == "__main__":
  cli.run(main)
