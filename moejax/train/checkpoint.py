"""Orbax checkpoints holding the train state, the data iterator state and
the config that made them, with a compatibility check before any restore.

Layout: WORKDIR/checkpoints/<step>/{state, data, meta}. Orbax writes each
step to a temporary directory and renames it when complete, so a crash during
a save leaves the previous checkpoint intact; a refused restore never writes.

Before a restore, the expert variables the checkpoint holds (read from its
tree metadata: every array below an 'experts' key, e.g. w_gate_codes of
'quantized', w_gate/core of 'factorised') are compared with those of the
target state; a checkpoint of another expert type is refused with a one-line
ConfigError naming both types and some of their variables, before orbax reads
any array (`_check_expert_variables`).
"""

import contextlib
import json
import logging as std_logging
import os

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from moejax.migrate import flatten_config, with_defaults
from moejax.errors import ConfigError
from moejax.train.layouts import placed_like, stored_layout

# Config sections whose change makes a checkpoint unusable for a run.
COMPATIBILITY_SECTIONS = ("model", "data")


def config_mismatch(saved: dict, current: dict) -> list[str]:
  """Keys (dotted) whose values differ between two config dicts."""
  saved_flat, current_flat = flatten_config(saved), flatten_config(current)
  keys = sorted(set(saved_flat) | set(current_flat))
  return [
    f"{k}: checkpoint={saved_flat.get(k, '<absent>')!r} config={current_flat.get(k, '<absent>')!r}"
    for k in keys
    if saved_flat.get(k, "<absent>") != current_flat.get(k, "<absent>")
  ]


class Checkpointer:
  def __init__(self, workdir: str, max_to_keep: int = 1, *, read_only: bool = False):
    """read_only: for restoring; creates nothing (the directory must exist)."""
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    if read_only and not os.path.isdir(self.directory):
      raise ConfigError(f"no checkpoints/ directory in the workdir ({self.directory})")
    # Read-only, orbax warns about its options at every open and logs an unreadable
    # file at ERROR before raising; the ConfigError of _naming_errors says it once.
    self._quiet = _quiet_orbax if read_only else contextlib.nullcontext
    with self._quiet():
      self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, create=not read_only, read_only=read_only
        ),
        item_names=("state", "data", "meta"),
      )

  def latest_step(self):
    with self._quiet():
      return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    with self._quiet():
      return sorted(self.manager.all_steps())

  def save(self, step: int, state, data_state, meta: dict) -> None:
    self.manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta),
      ),
    )

  def read_meta(self, step: int) -> dict:
    """The run's metadata; its config upgraded with keys added since (with_defaults)."""
    meta = self._stored_meta(step)
    return {**meta, "config": with_defaults(meta["config"])} if "config" in meta else meta

  def _stored_meta(self, step: int) -> dict:
    with self._naming_errors(step):
      return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
        "meta"
      ]

  def check_compatible(self, step: int, meta: dict) -> None:
    """Refuse (ConfigError) a checkpoint made by a different model or data config."""
    saved = self.read_meta(step)
    diffs = []
    for section in COMPATIBILITY_SECTIONS:
      diffs += [
        f"{section}.{d}"
        for d in config_mismatch(saved["config"].get(section, {}), meta["config"][section])
      ]
    if diffs:
      raise ConfigError(
        f"workdir checkpoint {self.directory}/{step} was made by an incompatible "
        f"config ({len(diffs)} difference(s)): "
        + "; ".join(diffs[:8])
        + ". Use a fresh --workdir or the checkpoint's config; nothing was changed."
      )

  def restore(self, step: int, abstract_state):
    """(state, data state) of `step`, in the layout of `abstract_state`; a
    checkpoint of an older variable layout (moejax/train/layouts.py) is read
    in its own layout and mapped to today's."""
    stored = self.stored_tree(step)
    layout = stored_layout(self._stored_meta(step).get("config", {}), stored)
    target = abstract_state if layout is None else layout.to_old(abstract_state)
    self._check_expert_variables(step, target, stored)
    with self._naming_errors(step):
      restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()
        ),
      )
    state = restored["state"]
    if layout is not None:
      state = placed_like(layout.to_new(state), abstract_state)
    return state, restored["data"]

  def stored_tree(self, step: int):
    """The tree of the state saved at `step`, array metadata as leaves (None
    when it cannot be read: the restore itself then names the problem)."""
    handler = ocp.StandardCheckpointHandler()
    try:
      with self._quiet():
        return handler.metadata(epath.Path(self.directory) / str(step) / "state").tree
    except Exception:  # noqa: BLE001 - orbax raises many types; restore reports it
      return None
    finally:
      handler.close()

  def _check_expert_variables(self, step: int, target, stored) -> None:
    """ConfigError (one line, naming both expert types) when the checkpoint's
    expert variables (`stored`: its stored_tree) are not those of `target`."""
    if stored is None:
      return
    have, want = expert_variable_names(stored), expert_variable_names(target)
    if have == want or not have or not want:  # MoE vs dense: orbax names the mismatch
      return
    model = self.read_meta(step).get("config", {}).get("model")
    saved_type = expert_type_with(have, model) or (model or {}).get("moe", {}).get("experts")
    advice = (
      f"restore it with the expert type it was saved with (model.moe.experts={saved_type!r})"
      if saved_type
      else "restore it with the config it was saved with"
    )
    raise ConfigError(
      f"cannot read checkpoint {self.directory}/{step}: it holds "
      f"{_described(saved_type, have - want or have)}; the config asks for "
      f"{_described(expert_type_with(want, model), want - have or want)}. {advice[0].upper()}"
      f"{advice[1:]}; nothing was changed."
    )

  @contextlib.contextmanager
  def _naming_errors(self, step: int):
    """A checkpoint orbax cannot read (corrupt, truncated, other shapes) as a ConfigError
    naming it; the orbax error stays chained (--verbose)."""
    try:
      with self._quiet():
        yield
    except ConfigError:
      raise
    except Exception as e:  # noqa: BLE001 - orbax raises many types
      first = (str(e).strip().splitlines() or [""])[0][:200]
      raise ConfigError(
        f"cannot read checkpoint {self.directory}/{step}: {type(e).__name__}: {first}"
      ) from e

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def _key_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def expert_variable_names(tree) -> frozenset:
  """The expert variables of a state tree: each array's path below its 'experts'
  key ('w_gate', 'w_gate_codes', 'w_gate/core'), over all layers and collections."""
  names = set()
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [_key_name(k) for k in path]
    if "experts" in keys:
      names.add("/".join(keys[keys.index("experts") + 1 :]))
  return frozenset(names)


def expert_type_with(names: frozenset, model: dict | None) -> str | None:
  """The registered expert type whose layers hold exactly `names` in `model` (a
  stored model config; each type tried in its place), None if none does."""
  if not names or not isinstance(model, dict):
    return None
  from moejax.experts.base import EXPERT_TYPES  # the error path only: models are heavy
  from moejax.models.decoder import abstract_model

  for name, _ in EXPERT_TYPES.items():
    m = ml_collections.ConfigDict(model)
    try:
      m.moe.experts = name
      _, params, rest = abstract_model(m)
    except Exception:  # noqa: BLE001 - a type these dims cannot build is not the one
      continue
    if expert_variable_names({"params": params, "rest": rest}) == names:
      return name
  return None


def _described(expert_type: str | None, names) -> str:
  """ "'quantized' experts (bits, w_down_codes, w_down_scales and 7 more)"."""
  names = sorted(names)
  shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
  return f"{expert_type!r} experts ({shown})" if expert_type else f"experts ({shown})"


@contextlib.contextmanager
def _quiet_orbax():
  """Orbax's log records (through absl's logger) below CRITICAL are dropped."""
  logger = std_logging.getLogger("absl")
  level = logger.level
  logger.setLevel(std_logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def jsonable(tree):
  """A config dict made JSON-safe (tuples to lists), for meta and comparisons."""
  return json.loads(json.dumps(tree, default=str))


def latest_config(workdir: str) -> tuple[ml_collections.ConfigDict, int]:
  """(config, step) of a training workdir's latest checkpoint: metadata only."""
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise ConfigError(f"no checkpoint in {ckpt.directory}")
    return ml_collections.ConfigDict(ckpt.read_meta(steps[-1])["config"]), steps[-1]
  finally:
    ckpt.close()
