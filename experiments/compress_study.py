r"""Every arm of a compression table at each level on several calibration draws,
scored on the same held-out bytes (moejax/posttrain/compress_study.py).

  python -m experiments.compress_study --workdir=runs/zoo/s --table=gemq \
      --levels=2.5,3,4 --draws=5 --json=docs/results/posttrain/gemq_zoo_s.json \
      --markdown=docs/results/posttrain/gemq_zoo_s.md

--table: gemq (uniform, per-layer, GEMQ, + router fine-tuning, + the progressive
loop; GPTQ), codequant (per-group RTN, k-means, CodeQuant at the same bit
allocation), td_moe (per-expert SVD, whitened SVD, joint Tucker, TD-MoE).
--levels: average bits, or (td_moe) fractions of expert parameters removed.
"""
from absl import flags

from moejax import cli
from moejax.evaluation.probe_data import PROBES

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (float experts).")
_TABLE = flags.DEFINE_enum("table", "gemq", ["gemq", "codequant", "td_moe"], "Which table.")
_LEVELS = cli.checked(flags.DEFINE_list("levels", None, "Average bits, or fractions removed."),
                      cli.at_least(0.0, float))
_ARMS = flags.DEFINE_list("arms", None, "Only these arms of the table (default all).")
_DRAWS = cli.checked(flags.DEFINE_integer("draws", 5, "Calibration draws (seeds 0..N-1)."),
                     cli.at_least(1))
_NUM_WINDOWS = cli.checked(flags.DEFINE_integer("num_windows", 32, "Calibration windows "
                                                "per draw."), cli.at_least(1))
_GROUP = cli.checked(flags.DEFINE_integer("group_size", 32, "Quantization / codebook group."),
                     cli.at_least(0))
_FT_STEPS = cli.checked(flags.DEFINE_integer("finetune_steps", 32, "Router fine-tuning steps "
                                             "of the fine-tuned GEMQ arms."), cli.at_least(1))
_BYTES = cli.checked(flags.DEFINE_integer("bytes_per_domain", 8192, "Held-out bytes per "
                                          "domain (0 = all)."), cli.at_least(0))
_PROBE_COUNT = cli.checked(flags.DEFINE_integer("probe_count", 16, "Examples per probe group."),
                           cli.at_least(1))
_RESUME = flags.DEFINE_bool("resume", False, "Keep the runs already in --json (same table "
                            "and settings) and run only the missing ones.")
_CONTROL = flags.DEFINE_bool("finetuned_control", False, "Also fine-tune the fp32 model's "
                              "routers by the same recipe and report each arm's re-routing "
                              "against the fp32 model with the same router training.")
_OUTPUTS = cli.study_outputs()
flags.mark_flags_as_required(["workdir", "levels"])


SETTINGS = ("num_windows", "group_size", "finetune_steps", "bytes_per_domain", "probe_count",
            "finetuned_control")


def resumable(path, table: str, levels) -> dict | None:
  """The earlier result in --json to resume, checked to be of this table and settings."""
  import json
  import os
  if not path:
    raise cli.flag_error(_RESUME, "resumes the study in --json; give --json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    previous = json.load(f)
  now = {"num_windows": _NUM_WINDOWS.value, "group_size": _GROUP.value,
         "finetune_steps": _FT_STEPS.value, "bytes_per_domain": _BYTES.value,
         "probe_count": _PROBE_COUNT.value, "finetuned_control": _CONTROL.value}
  different = [k for k in SETTINGS  # studies saved before the control existed had none
               if previous.get(k, False if k == "finetuned_control" else None) != now[k]]
  if previous.get("table") != table or different:
    raise cli.flag_error(_RESUME, f"{path} holds another study (table "
                         f"{previous.get('table')!r}, differing {different})")
  return previous


def main(argv):
  del argv
  cli.existing_workdir("workdir", _WORKDIR.value, kinds=("training",))
  _OUTPUTS.check()
  from moejax.posttrain import compress_study, prune
  names = {a.name for a in compress_study.TABLES[_TABLE.value]}
  for arm in _ARMS.value or ():
    if arm not in names:
      raise cli.flag_error(_ARMS, f"expected arms of the {_TABLE.value} table among "
                           f"{', '.join(sorted(names))}")
  config, _ = prune.source_config(_WORKDIR.value)
  probes = list(PROBES) if config.data.name == "mix" else []
  levels = [float(v) for v in _LEVELS.value]
  previous = None
  if _RESUME.value:
    previous = resumable(_OUTPUTS.json.value, _TABLE.value, levels)

  def save(result):
    _OUTPUTS.write(result, compress_study.tables(result) if result["runs"] else "")

  result = compress_study.run_study(
      _WORKDIR.value, _TABLE.value, levels=levels, draws=_DRAWS.value,
      num_windows=_NUM_WINDOWS.value, bytes_per_domain=_BYTES.value, probes=probes,
      probe_count=_PROBE_COUNT.value, group_size=_GROUP.value, finetune_steps=_FT_STEPS.value,
      arms=_ARMS.value, on_run=save, previous=previous, finetuned_control=_CONTROL.value)
  text = compress_study.tables(result)
  print(text)
  save(result)


if __name__ == "__main__":
  cli.run(main)
