r"""Edit facts of a trained MoE through its experts (MoEEdit and baselines), save it.

  python -m experiments.edit --workdir=runs/zoo/s --facts=10 --method=moe_edit \
      --out=runs/edited/s_moe_edit [--report=edit.json]

--workdir: a training workdir (its latest checkpoint) or a converted one; or
--hf_dir, an HF checkpoint, whose preserved keys come from --calibration (.npy
token ids or .jsonl {"text": ...} lines). --facts: a JSON-lines file of
{"subject", "attribute", "target"} (subjects: people of the mix corpus's facts
domain), or a count of edits drawn from that domain with --facts_seed.
--method: moe_edit (MoEEdit: block coordinate descent over the routed experts,
updates in the null space of the preserved keys; --noproject drops the
projection), lstsq (per-expert least squares, no projection) or finetune (Adam
on the down projections) (moejax/editing/methods.py). --lam, --tol and --layers
override the method's settings. Preserved keys: --num_windows windows of the
training split (or --calibration) drawn with --seed. --out: the edited model (a
training workdir, or a converted one for an imported model), new or empty.
--report: the edit's report and its measures (efficacy, paraphrase, unedited
facts, routing shift) as JSON. The study over methods and seeds:
configs/studies/moe_edit.py.
"""

import json

from absl import flags

from moejax import cli, cli_files
from moejax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A training or converted workdir.")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "An HF checkpoint directory.")
_CALIBRATION = flags.DEFINE_string(
  "calibration",
  None,
  "For --hf_dir or a converted workdir: preserved tokens, .npy ids or .jsonl texts file.",
)
_FACTS = flags.DEFINE_string(
  "facts", "10", "A JSON-lines file of facts to edit, or a count drawn from the facts domain."
)
_FACTS_SEED = cli.checked(
  flags.DEFINE_integer("facts_seed", 0, "Draw of the facts (a count)."), cli.in_range(0, 2**32 - 1)
)
_METHOD = flags.DEFINE_string("method", "moe_edit", "The edit method.")
_PROJECT = flags.DEFINE_bool("project", True, "moe_edit: project into the null space.")
_LAM = flags.DEFINE_float("lam", None, "Ridge weight lambda (0 = none).")
_TOL = flags.DEFINE_float(
  "tol", None, "moe_edit: relative eigenvalue tolerance of the null space, in [0, 1) (0 = exact)."
)
_LAYERS = flags.DEFINE_list(
  "layers",
  None,
  "MoE block indices to edit (default: the "
  "method's (1, 2); on a model without those MoE blocks, its "
  "early-middle ones).",
)
_NUM_WINDOWS = cli.checked(
  flags.DEFINE_integer("num_windows", 16, "Preserved windows."), cli.at_least(1)
)
_SEED = cli.checked(
  flags.DEFINE_integer("seed", 0, "Draw of the preserved windows."), cli.in_range(0, 2**32 - 1)
)
_OUT = flags.DEFINE_string("out", None, "Write the edited model's workdir here (new or empty).")
_REPORT = flags.DEFINE_string("report", None, "Write the report here as JSON.")


def bound_method():
  """The method with the flags' overrides, checked (ConfigError naming the setting)."""
  from moejax.editing import methods

  method = methods.get(_METHOD.value)
  overrides = {}
  if _LAM.value is not None:
    overrides["lam"] = _LAM.value
  if _TOL.value is not None:
    overrides["tol"] = _TOL.value
  if _LAYERS.value is not None:
    overrides["layers"] = _LAYERS.value
  if method.name == "moe_edit":
    overrides["project"] = _PROJECT.value
  return method.bind(overrides)


def read_edits():
  from moejax.editing import facts

  value = _FACTS.value
  if value.isdigit():
    if int(value) < 1:
      raise ConfigError(f"at least one fact to edit (--facts={value})")
    return facts.draw_facts(int(value), _FACTS_SEED.value)
  return facts.read_facts(value)


def main(argv):
  del argv
  bound = bound_method()
  edits = read_edits()
  kind = cli_files.one_source(_WORKDIR, _HF_DIR)
  if _CALIBRATION.value is not None:
    cli_files.input_file("calibration", _CALIBRATION.value)
  imported = kind not in ("training", "mixed")
  if imported and _CALIBRATION.value is None:
    raise ConfigError(
      "an imported model has no training split: give --calibration (.npy "
      f"token ids or .jsonl texts) (--{'hf_dir' if _HF_DIR.value else 'workdir'})"
    )
  inputs = [
    ("--workdir", _WORKDIR.value),
    ("--hf_dir", _HF_DIR.value),
    ("--calibration", _CALIBRATION.value),
  ]
  cli_files.output_dir("out", _OUT.value, empty=True, not_inside=inputs)
  cli_files.output_file("report", _REPORT.value, not_inside=inputs)
  from moejax.editing import methods
  from moejax.posttrain import source as source_lib

  if not imported:
    model = source_lib.training_config(_WORKDIR.value)[0].model
    bound = methods.with_model_layers(bound, model, given=_LAYERS.value is not None)
    methods.check_model(bound, model)
  report = run(bound, edits, imported)
  print(
    f"{report['method']}: {report['edits']} edits; efficacy {report['measures']['efficacy']:.3f}, "
    f"paraphrase {report['measures']['paraphrase']:.3f}, unedited accuracy "
    f"{report['measures']['unedited_accuracy']:.3f}, routing KL "
    f"{report['measures']['routing_kl']:.2e}, top-k change "
    f"{report['measures']['topk_change']:.4f}"
  )
  if _REPORT.value:
    with open(_REPORT.value, "w") as f:
      json.dump(report, f, indent=1)


def run(bound, edits, imported: bool) -> dict:
  import os

  from moejax.editing import edit, facts, measure, methods
  from moejax.models.decoder import abstract_model, unstack_layers
  from moejax.posttrain import calibration, source as source_lib

  source = source_lib.load(_WORKDIR.value, _HF_DIR.value)
  if source.tokenizer is None:
    raise ConfigError(
      "the model has no tokenizer (tokenizer.json) to encode the fact prompts "
      f"with (--{'hf_dir' if _HF_DIR.value else 'workdir'})"
    )
  m, params, rest = unstack_layers(source.model, source.params, source.rest)
  bound = methods.with_model_layers(bound, m, given=_LAYERS.value is not None)
  methods.check_model(bound, m)
  if imported:
    stream = calibration.calibration_stream(
      _CALIBRATION.value, source.tokenizer, source.eos_id, m.vocab_size
    )
    where, context = f"--calibration={_CALIBRATION.value}", min(m.max_seq_len, 256)
  else:
    from moejax.data.pipeline import train_token_stream

    stream, where = train_token_stream(source.config.data), "the training split"
    context = source.config.data.seq_len

  def windows(n, seed):
    return calibration.calibration_windows(stream, n, context, seed, where)

  preserved = windows(_NUM_WINDOWS.value, _SEED.value)
  prefix = source.eos_id if source.eos_id is not None else 0
  new, report = edit.edit_model(m, params, rest, source.tokenizer, prefix, edits, bound, preserved)
  graphdef = abstract_model(m)[0]
  unedited = facts.draw_facts(20, 1000 + _FACTS_SEED.value, exclude=[e.subject for e in edits])
  report["measures"] = {
    **measure.fact_metrics(graphdef, params, new, rest, source.tokenizer, prefix, edits, unedited),
    **measure.routing_shift(
      graphdef, params, new, rest, windows(4, _SEED.value + 1), min(bound.options["layers"])
    ),
  }
  if _OUT.value:
    if source.kind == "training":
      source_lib.save_training_workdir(
        _OUT.value,
        source_lib.with_model(source.config, m),
        new,
        rest,
        source.step,
        source.data_state,
      )
    else:
      from moejax.interop.convert import Loaded, save_workdir

      files = _HF_DIR.value or os.path.join(_WORKDIR.value, "model")
      save_workdir(_OUT.value, Loaded(m, new, rest, source.hf_config), files)
  return report


if __name__ == "__main__":
  cli.run(main)
