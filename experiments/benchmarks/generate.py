r"""Generation speed against transformers on the same model.

  python -m experiments.benchmarks.generate [--families=qwen3_moe,deepseek_v3]
      [--batches=1,8,32] [--prompt_len=32] [--new_tokens=32] [--reps=3]
      [--json=FILE] [--markdown=FILE]
  python -m experiments.benchmarks.generate --profile --families=qwen3_moe --batches=1,8
      [--profile_phase=decode|prefill] [--reps=7] [--profile_calls=30]
      [--profile_torch_threads=1] [--json=FILE]
  python -m experiments.benchmarks.generate --experts=quantized_4bit,codebook_4bit[@xla]
      [--families=qwen3_moe] [--workdirs=runs/zoo/s] [--group_size=32] [--batches=1,8]

For each family, transformers builds a small random model (hidden 256, 4
layers, 16 routed experts of width 256, top-4, vocab 4096: tens of millions of
FLOPs per token), saves it, and moejax imports the same weights. Both generate
greedily from the same prompts (batch B, all of length --prompt_len, no
padding), float32 (--dtype=bfloat16: both sides' weights rounded to bfloat16 and
computed in it), eager attention for transformers. Per family and batch:

  prefill tok/s   B * prompt_len / time to first token (one generated token)
  decode tok/s    B * (N - 1) / (time for N tokens - time for 1)
  identical       fraction of generated tokens equal to transformers' tokens; where
                  below 1, the first divergence with both models' logits for both
                  tokens (a near-tie in both is rounding, not a bug)

and the ratios moejax / transformers. Each measurement is the median of
--reps runs, interleaved (moejax, transformers, moejax, ...) on this shared
machine; moejax is compiled by an untimed call first (generation compiles once
per prompt bucket and cache bucket: moejax/inference/generate.py).

--profile (where the time goes) replaces the speed table by a
decode step's time split into parts, per family and batch, in ms per step:

  moejax        (a) the compiled one-token decode step (DecodePrograms.step): in a
                jax.profiler trace, from its first XLA:CPU thunk's start to its last one's
                end (median of --profile_calls calls); (b) host: generate's
                per-token time - (a) (the jit call, fold_in, the Python loop:
                what async dispatch does not hide); (c) inside (a): its thunks,
                each attributed by its HLO op_name (module calls are wrapped in
                jax.named_scope while the step is compiled again: the same ops,
                named) and source frame to attention, MoE router / dispatch /
                experts, norms, embedding, LM head, sampling; the MoE expert
                loops also by their bodies' thunks (matmuls, expert weight
                slices, row gather/scatter, loop runtime); the remainder of (a)
                is XLA's runtime between thunks.
  transformers  (a) its model's forward inside its own generate (hooks on the
                top module, prefill left out); (b) generate's work between two
                forwards; (c) forward hooks on each part's module (shares scaled
                to the unhooked forward).

plus the parameter bytes one step reads and the time one core takes to read
them. --profile_phase=prefill splits time to first token the same way: moejax's
prefill program (DecodePrograms.prefill) by part, the host around it (time to
first token - the program); transformers' first forward by part, generate's
work around it; with the useful matmul FLOP/s each reaches against one plain
matmul of the prompt's rows. --profile_torch_threads=1 on a busy shared machine
(see the flag). The measurements are moejax/profiling/generation.py's, the tables
moejax/profiling/report.py's.

--experts (compressed experts against float32 experts, moejax only) replaces the
table by one row per model, batch and arm: float32 ('swiglu') and each listed
variant of moejax/profiling/compressed_experts.py, converted from the same float
model (RTN codes; k-means codebooks; group --group_size), '@xla' or '@ffi' naming
its decode_kernel (moejax/experts/gathered.py; default 'auto'). Per arm: prefill
and decode tok/s and their ratios to float32 (medians of --reps rounds, every arm
once per round), decode also timed as the steps alone (one compiled call after the
prefill: a check on t(N) - t(1), which a slow prefill's jitter distorts), the weight
bytes a decode step reads (every parameter but the expert stacks and embedding, the
experts each MoE layer activated as stored: uint8 codes), the tok/s one core's read
rate (numpy sum of 256 MiB) bounds that at, and the fraction of tokens equal to
float32's. Models: --families' benchmark
models (transformers only supplies their weights; the default list only when no
--workdirs) and the training workdirs --workdirs (e.g. runs/zoo/s).
"""

import datetime
import os
import platform

from absl import flags

from moejax import cli, cli_files
from moejax.experts.gathered import DECODE_KERNELS
from moejax.profiling import compressed_generation, generation, generation_profile, report
from moejax.profiling.compressed_experts import REFERENCE, VARIANTS

_FAMILIES = cli.checked(
  flags.DEFINE_list("families", list(generation.FAMILIES), "HF families."),
  cli.one_of(*generation.FAMILIES),
)
_BATCHES = cli.checked(
  flags.DEFINE_list("batches", ["1", "8", "32"], "Batch sizes."), cli.at_least(1)
)
_PROMPT = cli.checked(flags.DEFINE_integer("prompt_len", 32, "Prompt tokens."), cli.at_least(1))
_NEW = cli.checked(flags.DEFINE_integer("new_tokens", 32, "Generated tokens."), cli.at_least(2))
_REPS = cli.checked(flags.DEFINE_integer("reps", 3, "Timed repetitions."), cli.at_least(1))
OUTPUTS = cli_files.study_outputs(plot=False)
_DTYPE = flags.DEFINE_enum(
  "dtype",
  "float32",
  ["float32", "bfloat16"],
  "Both sides' weights and compute (the speed and --profile tables; the float32 weights "
  "rounded on each side; moejax's router math stays float32).",
)
_PROFILE = flags.DEFINE_bool(
  "profile",
  False,
  "Instead of the speed table: where a decode step's time goes, per "
  "family and batch (moejax: the compiled step's device time split by part from the XLA "
  "profiler, its dispatch, the host loop; transformers: the forward split by module hooks, "
  "generate's loop). --json/--markdown get these figures.",
)
_PHASE = flags.DEFINE_enum(
  "profile_phase",
  "decode",
  ["decode", "prefill"],
  "--profile: a decode step, or the "
  "prefill (time to first token: moejax's prefill program by part and the host around it; "
  "transformers' first forward by part and generate's set-up).",
)
_CALLS = cli.checked(
  flags.DEFINE_integer(
    "profile_calls", 30, "--profile: timed calls of the moejax step per round (median)."
  ),
  cli.at_least(1),
)
_TORCH_THREADS = cli.checked(
  flags.DEFINE_integer(
    "profile_torch_threads",
    0,
    "--profile: torch.set_num_threads (0: torch's default). On a "
    "shared, busy machine torch's two threads wait on each other (5x slower decode here "
    "under a load of 6); one thread measures its work instead.",
  ),
  cli.at_least(0),
)


_EXPERTS = flags.DEFINE_list(
  "experts",
  [],
  "Compressed-expert arms against float32 experts (moejax only): variants of "
  "moejax/profiling/compressed_experts.py, each optionally '@auto|ffi|xla' (its decode_kernel).",
)
_WORKDIRS = flags.DEFINE_list(
  "workdirs", [], "--experts: training workdirs whose model is measured too (e.g. runs/zoo/s)."
)
_GROUP = cli.checked(
  flags.DEFINE_integer("group_size", 32, "--experts: quantization / codebook group size."),
  cli.at_least(1),
)
ARM_VARIANTS = tuple(v for v in VARIANTS if v != REFERENCE and not v.startswith("factorised"))


def check_arms(names) -> None:
  """A flag error naming --experts for an unknown variant or decode kernel."""
  for name in names:
    variant, kernel = compressed_generation.split_arm(name)
    if variant not in ARM_VARIANTS or kernel not in DECODE_KERNELS:
      raise cli.flag_error(
        _EXPERTS,
        f"{name!r}: want <variant>[@<kernel>], variant one of {ARM_VARIANTS}, "
        f"kernel one of {DECODE_KERNELS}",
      )


def compressed_main(meta: dict) -> None:
  """--experts: the compressed-expert arms' table (compressed_generation.py)."""
  from moejax.train.load import from_training_workdir

  check_arms(_EXPERTS.value)
  OUTPUTS.check()
  # --families at its default is left out when --workdirs names the models
  given = flags.FLAGS["families"].present or not _WORKDIRS.value
  models = [(f, lambda f=f: generation.model_pair(f)[1]) for f in _FAMILIES.value if given]
  models += [(w, lambda w=w: from_training_workdir(w)[0]) for w in _WORKDIRS.value]
  rows = []
  for name, load in models:
    rows += compressed_generation.variant_rows(
      load(),
      name,
      _EXPERTS.value,
      [int(b) for b in _BATCHES.value],
      _PROMPT.value,
      _NEW.value,
      _REPS.value,
      _GROUP.value,
    )
  text = compressed_generation.variant_table(rows)
  print(text)
  meta.update(experts=_EXPERTS.value, group_size=_GROUP.value, loadavg_end=os.getloadavg())
  OUTPUTS.write({"meta": meta, "rows": rows}, f"{meta}\n\n{text}\n")


def main(argv):
  del argv
  if _EXPERTS.value:
    if _DTYPE.value != "float32":
      raise cli.flag_error(_DTYPE, "--experts compares compressed experts with float32 ones")
    now = datetime.datetime.now(datetime.timezone.utc)
    return compressed_main(
      {
        "date": now.isoformat(timespec="minutes"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "prompt_len": _PROMPT.value,
        "new_tokens": _NEW.value,
        "reps": _REPS.value,
        "loadavg": os.getloadavg(),
      }
    )
  if _PHASE.value != "decode" and not _PROFILE.value:
    raise cli.flag_error(_PHASE, "chooses what --profile measures; give --profile too")
  OUTPUTS.check()
  if not _PROFILE.value:
    measure, table, extra = generation.speed_rows, report.speed_table, ()
  elif _PHASE.value == "prefill":
    measure, table = generation_profile.profile_prefill, report.prefill_table
    extra = (_CALLS.value, _TORCH_THREADS.value)
  else:
    measure, table = generation_profile.profile_decode, report.profile_table
    extra = (_CALLS.value, _TORCH_THREADS.value)
  rows = []
  for family in _FAMILIES.value:
    rows += measure(
      generation.model_pair(family, _DTYPE.value),
      family,
      [int(b) for b in _BATCHES.value],
      _PROMPT.value,
      _NEW.value,
      _REPS.value,
      *extra,
    )
  text = table(rows)
  print(text)
  meta = {
    "date": datetime.date.today().isoformat(),
    "machine": platform.machine(),
    "cpus": os.cpu_count(),
    "prompt_len": _PROMPT.value,
    "new_tokens": _NEW.value,
    "reps": _REPS.value,
    "dtype": _DTYPE.value,
    "loadavg": os.getloadavg(),
  }
  if _PROFILE.value:
    import jax
    import torch

    meta.update(
      profile_calls=_CALLS.value,
      jax=jax.__version__,
      backend=jax.default_backend(),
      torch=torch.__version__,
      torch_threads=torch.get_num_threads(),
    )
  OUTPUTS.write({"meta": meta, "rows": rows}, f"{meta}\n\n{text}\n")


if __name__ == "__main__":
  cli.run(main)
