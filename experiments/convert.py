r"""Convert between HF checkpoint directories and moejax workdirs.

HF -> moejax (config.json + sharded safetensors, read and written tensor by tensor,
moejax/interop/streaming.py: resident memory bounded by the largest tensor):
  python -m experiments.convert --hf_dir=/ckpt/Qwen3-30B-A3B --workdir=runs/qwen3
moejax -> HF (per-expert tensors, loadable by transformers):
  python -m experiments.convert --workdir=runs/qwen3 --out_hf_dir=/out/qwen3-pruned \
      [--dtype=bfloat16] [--max_shard_mb=2048]
A training workdir (experiments.train) exports as Mixtral when its flags fit:
  python -m experiments.convert --workdir=runs/moe --out_hf_dir=/out/moe --family=mixtral
Supported: MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
OlmoeForCausalLM, DeepseekV3ForCausalLM (see docs/interop.md).
--check_logits loads the export in transformers (a test requirement) and
compares its float32 logits with moejax's on a fixed padded batch, failing
above --check_atol (moejax/interop/parity.py).
Compressed experts ('quantized', 'codebook', 'factorised': transformers has no
such type) are written as the dense float weights they compute with; the export
prints a line saying so and records it in OUT/moejax_export.json
(moejax/interop/dense_experts.py). --check_logits then compares the compressed
model's logits with transformers' on the dense export. Importing the export
gives a float ('swiglu') model.

Import refuses a workdir that holds a training run (--allow_mixed overrides);
export refuses an --out_hf_dir that exists and is not empty.
"""

import os

from absl import flags

from moejax import cli, cli_files
from moejax.errors import ConfigError
from moejax.interop import dense_experts, parity, streaming
from moejax.interop.convert import WORKDIR_MODEL, export_hf
from moejax.interop.hf_config import FAMILIES
from moejax.train.load import load_model

_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory to import.")
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "moejax workdir (written on import, read on export)."
)
_OUT_HF_DIR = flags.DEFINE_string("out_hf_dir", None, "HF directory to write (export).")
_FAMILY = cli.checked(
  flags.DEFINE_string(
    "family",
    None,
    "Export as this HF model_type (default: the model's own; 'mixtral' for training workdirs).",
  ),
  cli.one_of(*FAMILIES),
)
_DTYPE = flags.DEFINE_enum(
  "dtype", None, ["float32", "bfloat16", "float16"], "Export dtype (default: the parameters' own)."
)
_PARAM_DTYPE = flags.DEFINE_enum(
  "param_dtype", "float32", ["float32", "bfloat16"], "Dtype of the imported parameters."
)
_MAX_SHARD_MB = cli.checked(
  flags.DEFINE_integer("max_shard_mb", 2048, "Largest safetensors shard written (export)."),
  cli.at_least(1),
)
_CHECK_LOGITS = flags.DEFINE_bool(
  "check_logits", False, "After export, load it in transformers and compare logits with moejax's."
)
_CHECK_ATOL = cli.checked(
  flags.DEFINE_float("check_atol", 1e-4, "Largest logit difference --check_logits accepts."),
  cli.in_range(0, 1e3, low_open=True),
)
_ALLOW_MIXED = flags.DEFINE_bool(
  "allow_mixed",
  False,
  "Import into a workdir that already holds a training run (experiments.train).",
)

EXPORT_ONLY = (_FAMILY, _DTYPE, _MAX_SHARD_MB, _CHECK_LOGITS, _CHECK_ATOL)
IMPORT_ONLY = (_PARAM_DTYPE, _ALLOW_MIXED)


def refuse_flags_of_the_other_direction(holders, direction: str) -> None:
  for holder in holders:
    if flags.FLAGS[holder.name].present:
      raise cli.flag_error(holder, f"this flag is for {direction} only")


def import_main() -> None:
  refuse_flags_of_the_other_direction(EXPORT_ONLY, "export (--out_hf_dir)")
  cli_files.writable_workdir("workdir", _WORKDIR.value, "converted", allow_mixed=_ALLOW_MIXED.value)
  cli_files.output_dir("workdir", _WORKDIR.value, not_inside=[("--hf_dir", _HF_DIR.value)])
  if not os.path.isdir(_HF_DIR.value):
    raise cli.flag_error(_HF_DIR, "expected an existing HF checkpoint directory")
  # tensor by tensor (moejax/interop/streaming.py): every tensor's presence, shape and
  # dtype checked before the first write, memory bounded by the largest tensor
  m, unused = streaming.import_to_workdir(
    _HF_DIR.value, _WORKDIR.value, _PARAM_DTYPE.value, extra_files_from=_HF_DIR.value
  )
  directory = os.path.join(_WORKDIR.value, WORKDIR_MODEL)
  print(
    f"imported {m.family} ({m.num_layers} layers, {m.moe.num_experts} experts) into "
    f"{directory}"
    + (f"; {len(unused)} checkpoint tensors unused, e.g. {unused[0]}" if unused else "")
  )


def export_main() -> None:
  refuse_flags_of_the_other_direction(IMPORT_ONLY, "import (--hf_dir)")
  cli_files.existing_workdir("workdir", _WORKDIR.value)
  out = _OUT_HF_DIR.value
  cli_files.output_dir("out_hf_dir", out, empty=True, not_inside=[("--workdir", _WORKDIR.value)])
  if _CHECK_LOGITS.value:
    if _DTYPE.value not in (None, "float32"):
      raise cli.flag_error(_CHECK_LOGITS, f"compares float32 exports, not --dtype={_DTYPE.value}")
    parity.require_transformers()
  loaded, _, _ = load_model(workdir=_WORKDIR.value)
  family = _FAMILY.value or ("mixtral" if loaded.config.family == "moejax" else None)
  extra = os.path.join(_WORKDIR.value, "model")
  hf = export_hf(
    loaded.config,
    loaded.params,
    loaded.rest,
    out,
    family=family,
    dtype=_DTYPE.value,
    base_hf_config=loaded.hf_config,
    max_shard_bytes=_MAX_SHARD_MB.value << 20,
    extra_files_from=extra if os.path.isdir(extra) else None,
  )
  print(f"exported {hf['architectures'][0]} to {out}")
  record = dense_experts.read_record(out)
  if record is not None:
    print(record["note"])
  if _CHECK_LOGITS.value:
    diff, scale = parity.export_logit_difference(loaded, out)
    verdict = "matches" if diff <= _CHECK_ATOL.value else "DIFFERS"
    print(
      f"transformers {verdict}: max |logit difference| {diff:.2e} "
      f"(--check_atol={_CHECK_ATOL.value:g}; largest |logit| {scale:.2f})"
    )
    if diff > _CHECK_ATOL.value:
      raise SystemExit(1)


def main(argv):
  del argv
  given = tuple(h.value is not None for h in (_HF_DIR, _WORKDIR, _OUT_HF_DIR))
  if given == (True, True, False):
    import_main()
  elif given == (False, True, True):
    export_main()
  else:
    raise ConfigError(
      "give --hf_dir and --workdir (import) or --workdir and --out_hf_dir "
      f"(export) (--hf_dir={_HF_DIR.value}, --workdir={_WORKDIR.value}, "
      f"--out_hf_dir={_OUT_HF_DIR.value})"
    )


if __name__ == "__main__":
  cli.run(main)
