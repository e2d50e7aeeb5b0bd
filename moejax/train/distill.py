"""The 'distill' training task (config task='distill'): the student is the config's
model, trained on next-token cross-entropy plus `distill.weight` times a
distillation term from a frozen teacher (moejax/distill/objectives.py).

  distill.method        'kl' (KD baseline) or 'residual' (residual KD,
                        OpenReview Dh6KxUxG20): DISTILL_METHODS
  distill.teacher.workdir / distill.teacher.hf_dir   exactly one: a training or
                        converted workdir, or an HF checkpoint directory
  distill.vocab_map     'none': teacher and student vocabularies must be equal;
                        'shared_prefix': ids below min(V_t, V_s) are the same
                        tokens (teacher logits cut or padded to the student's V)
  distill.projector_steps, projector_learning_rate   residual KD's stage 1
  distill.corrupt_domains, corrupt_seed   a misleading teacher: on training rows of
                        these mix domains (comma-separated) its logits are permuted
                        over the vocabulary by a fixed permutation (a study's control)

`prepare(config, layout)` loads and checks the teacher before any data is read or
anything is written, and returns `attach(data)`: the train iterator then yields
each batch with the teacher's outputs added (teacher_logits [B, L, V_s], and
teacher_code [B, L, d_s] for residual KD), so the train step never runs the
teacher and no gradient reaches it; the iterator's state is the inner one's, so
resume is exact. Residual KD first fits the stage-1 projector
(moejax/distill/modules.py) on the teacher's features of the first
`projector_steps` training batches (the iterator is rewound after). An MoE
teacher's features are its last MoE layer's routed expert outputs, fused by
expert attention; a dense teacher's its final hidden state.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.data.mix import DOMAINS
from moejax.distill.modules import Projector
from moejax.distill.modules import fit_projector
from moejax.distill.objectives import DISTILL_METHODS
from moejax.errors import ConfigError, choice_error
from moejax.models.capture import captured_forward, expert_outputs_on_tokens
from moejax.models.decoder import abstract_model
from moejax.models.structure import moe_layer_indices
from moejax.train.load import load_model

VOCAB_MAPS = ("none", "shared_prefix")
FEATURE_KEYS = ("hidden", "experts", "valid")  # what the stage-1 projector reads


def teacher_source(config) -> dict:
  """{'workdir': path} or {'hf_dir': path}: the one teacher source, which exists."""
  given = {k: v for k, v in config.distill.teacher.items() if v}
  if len(given) != 1:
    raise ConfigError(
      "task='distill' needs exactly one of distill.teacher.workdir and "
      f"distill.teacher.hf_dir; given: {given or 'none'}"
    )
  ((key, path),) = given.items()
  if not os.path.isdir(path):
    raise ConfigError(f"distill.teacher.{key}={path} does not exist")
  return given


def corrupt_domain_ids(config) -> tuple[int, ...]:
  """Indices into mix.DOMAINS of distill.corrupt_domains ('' for none)."""
  names = [d for d in config.distill.corrupt_domains.split(",") if d]
  if names and config.data.name != "mix":
    raise ConfigError(
      f"distill.corrupt_domains={config.distill.corrupt_domains!r} needs "
      f"data.name='mix' (its rows carry a domain), not {config.data.name!r}"
    )
  for name in names:
    if name not in DOMAINS:
      raise choice_error("distill.corrupt_domains", name, DOMAINS)
  return tuple(DOMAINS.index(name) for name in names)


def check_vocab(teacher_vocab: int, student_vocab: int, vocab_map: str, source: str) -> None:
  """Different vocabularies need distill.vocab_map; ConfigError names both sizes."""
  if vocab_map not in VOCAB_MAPS:
    raise choice_error("distill.vocab_map", vocab_map, VOCAB_MAPS)
  if teacher_vocab != student_vocab and vocab_map == "none":
    raise ConfigError(
      f"distill.vocab_map='none': the teacher's vocab_size={teacher_vocab} ({source}) "
      f"differs from the student's model.vocab_size={student_vocab}; set "
      "distill.vocab_map='shared_prefix' if the ids they share are the same tokens"
    )


def map_vocab(logits_BxLxV, student_vocab: int):
  """The teacher's logits over the student's ids (shared_prefix): cut, or padded with
  a large negative logit for ids the teacher lacks."""
  teacher_vocab = logits_BxLxV.shape[-1]
  if teacher_vocab >= student_vocab:
    return logits_BxLxV[..., :student_vocab]
  pad = [(0, 0)] * (logits_BxLxV.ndim - 1) + [(0, student_vocab - teacher_vocab)]
  return jnp.pad(logits_BxLxV, pad, constant_values=-1e9)


def corrupt_logits(logits_BxLxV, domain_B, domain_ids, permutation_V):
  """Rows whose domain is in domain_ids get logits[..., permutation]; others unchanged."""
  hit = jnp.isin(domain_B, jnp.asarray(domain_ids, jnp.int32))[:, None, None]
  return jnp.where(hit, logits_BxLxV[..., permutation_V], logits_BxLxV)


def last_moe_block(model) -> int | None:
  moe = [i for i, block in enumerate(model.blocks) if block.is_moe]
  return moe[-1] if moe else None


@functools.partial(jax.jit, static_argnums=(0, 1))
def teacher_forward(graphdef, with_experts: bool, params, rest, tokens_BxL) -> dict:
  """The teacher on tokens [B, L], stop-gradient: logits [B, L, V], final hidden
  state [B*L, d], and with_experts (an MoE teacher) its last MoE layer's routed
  expert outputs [B*L, K, d] (unweighted) with their valid [B*L, K]."""
  model = nnx.merge(graphdef, params, rest)
  logits, aux, outputs = captured_forward(model, tokens_BxL)
  d = model.cfg.d_model
  out = {"logits": logits, "hidden": outputs[("final_norm", "__call__")].reshape(-1, d)}
  block = last_moe_block(model)
  if with_experts and block is not None:
    layer, layer_aux = model.blocks[block].ffn, aux["moe"][-1]
    x = outputs[("blocks", block, "ffn_norm", "__call__")].reshape(-1, d).astype(jnp.float32)
    bound = layer.expert_type.bind(layer.experts.weights(jnp.float32), layer.cfg)
    every = expert_outputs_on_tokens(bound, x, layer.cfg.num_experts)  # [E, T, d]
    index = jnp.minimum(layer_aux["expert_index"], layer.cfg.num_experts - 1)
    out["experts"] = every[index, jnp.arange(x.shape[0])[:, None]]
    out["valid"] = layer_aux["valid"]
  return jax.lax.stop_gradient(out)


@dataclasses.dataclass
class Teacher:
  """A loaded, checked teacher and what the task does with it (module doc)."""

  graphdef: object
  params: dict
  rest: dict
  d_model: int
  is_moe: bool
  student_vocab: int
  corrupt_ids: tuple[int, ...]
  permutation: np.ndarray

  def outputs(self, batch, with_experts: bool = False) -> dict:
    """The teacher's outputs on the batch (teacher_forward), its logits in the
    student's vocabulary and corrupted on the misleading domains."""
    inputs = jnp.asarray(batch["inputs"])
    out = teacher_forward(self.graphdef, with_experts, self.params, self.rest, inputs)
    logits = map_vocab(out["logits"], self.student_vocab)
    if self.corrupt_ids:
      logits = corrupt_logits(logits, batch["domain"], self.corrupt_ids, self.permutation)
    return {**out, "logits": logits}


class TeacherBatches:
  """The train iterator with the teacher's outputs added to every batch; its state
  is the inner iterator's."""

  def __init__(self, inner, add):
    self.inner, self.add = inner, add

  def __iter__(self):
    return self

  def __next__(self):
    batch = next(self.inner)
    return {**batch, **self.add(batch)}

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def load_teacher(config) -> Teacher:
  """The teacher of config.distill, checked against the student (module doc)."""
  source = teacher_source(config)
  loaded, _, _ = load_model(**source)
  ((key, path),) = source.items()
  check_vocab(
    loaded.config.vocab_size,
    config.model.vocab_size,
    config.distill.vocab_map,
    f"distill.teacher.{key}={path}",
  )
  graphdef, _, _ = abstract_model(loaded.config)
  rng = np.random.default_rng(config.distill.corrupt_seed)
  return Teacher(
    graphdef,
    loaded.params,
    loaded.rest,
    loaded.config.d_model,
    bool(moe_layer_indices(loaded.config)),
    config.model.vocab_size,
    corrupt_domain_ids(config),
    rng.permutation(config.model.vocab_size).astype(np.int32),
  )


def make_objective(method, settings: dict):
  """objective(student model, logits, batch, hidden) -> (weighted term, metrics) of the
  step; its `student_hidden` asks the step for the student's final hidden state."""

  def objective(model, logits, batch, hidden=None):
    teacher = {"logits": batch["teacher_logits"]}
    if reads_code(method):
      code = jax.lax.stop_gradient(batch["teacher_code"])
      if "code" in method.teacher_keys:
        teacher["code"] = code
      if "code_logits" in method.teacher_keys:
        teacher["code_logits"] = model.output_projection(code)
    if method.student_hidden:
      teacher["student_hidden"] = hidden
    loss, metrics = method.loss(logits, teacher, batch["targets"], settings)
    return settings["weight"] * loss, {"distill_loss": loss, **metrics}

  objective.student_hidden = method.student_hidden  # type: ignore[attr-defined]  # a function's attribute, read by step.make_loss_fn
  return objective


def reads_code(method) -> bool:
  """Whether the method reads the teacher's stage-1 code (then stage 1 is fitted)."""
  return bool({"code", "code_logits"} & set(method.teacher_keys))


def check_settings(d) -> None:
  """distill.weight >= 0, temperature > 0, projector_steps >= 1, learning rate > 0."""
  for key, low, strict in (
    ("weight", 0.0, False),
    ("temperature", 0.0, True),
    ("projector_steps", 1, False),
    ("projector_learning_rate", 0.0, True),
  ):
    value = d[key]
    if not value >= low or (strict and value == low):
      raise ConfigError(f"distill.{key}={value!r} must be {'>' if strict else '>='} {low}")


def prepare(config, layout):
  """Checks and loads the teacher (nothing written); returns attach(data) -> (data
  with teacher outputs on every train batch, the train step's objective)."""
  method = DISTILL_METHODS.get(config.distill.method)
  check_settings(config.distill)
  if layout is not None:
    raise ConfigError("task='distill' runs on one device: set a mesh of one device")
  teacher = load_teacher(config)
  settings = {"weight": config.distill.weight, "temperature": config.distill.temperature}

  def attach(data):
    add = functools.partial(teacher_outputs, teacher, None)
    if reads_code(method):
      add = functools.partial(teacher_outputs, teacher, fit_stage1(config, teacher, data))
    train_iter = TeacherBatches(data.train_iter, add)
    return dataclasses.replace(data, train_iter=train_iter), make_objective(method, settings)

  return attach


def fit_stage1(config, teacher: Teacher, data) -> Projector:
  """The projector fitted on the first distill.projector_steps train batches (the
  iterator is rewound to where it was)."""
  projector = Projector(
    teacher.d_model,
    config.model.d_model,
    fuse_experts=teacher.is_moe,
    rngs=nnx.Rngs(config.seed),
  )
  start = data.train_iter.get_state()
  batches = []
  for _ in range(config.distill.projector_steps):
    out = teacher.outputs(next(data.train_iter), with_experts=teacher.is_moe)
    batches.append({k: out[k] for k in FEATURE_KEYS if k in out})
  data.train_iter.set_state(start)
  fit_projector(projector, batches, config.distill.projector_learning_rate)
  return projector


@nnx.jit
def projector_code(projector: Projector, teacher: dict):
  return projector.encode(projector.features(teacher))


def teacher_outputs(teacher: Teacher, projector: Projector | None, batch) -> dict:
  """What the train batch carries of the teacher: teacher_logits, and teacher_code
  [B, L, d_s] when a projector is given."""
  out = teacher.outputs(batch, with_experts=projector is not None and teacher.is_moe)
  added = {"teacher_logits": np.asarray(out["logits"])}
  if projector is not None:
    code = projector_code(projector, out)
    added["teacher_code"] = np.asarray(code).reshape(*batch["inputs"].shape, -1)
  return added
