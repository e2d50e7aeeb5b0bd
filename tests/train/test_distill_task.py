"""The 'distill' training task (moejax/train/distill.py): the logged term equals an
independent computation from the teacher and the initial student, no gradient of
the step reaches the teacher, bad teachers are refused before anything is written,
imported HF checkpoints work as teacher and as student, the misleading teacher
permutes only its domains' rows, and mix rows carry their domain."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import config as config_lib
from moejax.configs import finetune_hf
from moejax.data import mix
from moejax.data.pipeline import build_lm_data
from moejax.distill.modules import Projector
from moejax.distill.objectives import DISTILL_METHODS, kl_divergence
from moejax.models.capture import captured_forward
from moejax.errors import ConfigError
from moejax.train import distill
from moejax.train import step as step_lib
from moejax.train import tasks
from moejax.train.build import init_state
from moejax.train.load import load_model
from moejax.train.loop import train_and_evaluate
from tests.interop.hf_tiny import make_model, save_model

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """{vocab size: a tiny qwen3_moe HF checkpoint with that vocabulary}."""
  return {
    v: save_model(make_model("qwen3_moe", vocab_size=v), str(tmp_path_factory.mktemp(f"hf{v}")))
    for v in (96, 256)
  }


def student_config(tiny_config, teacher_workdir=None, method="kl", steps=2):
  c = tiny_config("dense=true", steps=steps, log_every=1, checkpoint_every=steps, eval_batches=1)
  c.task, c.distill.method = "distill", method
  c.distill.teacher.workdir, c.distill.projector_steps = teacher_workdir, 3
  return c


@pytest.mark.integration
def test_the_logged_kl_term_is_the_teacher_student_kl_on_the_first_batch(
  tiny_config, tiny_workdir, tmp_path
):
  config = student_config(tiny_config, tiny_workdir[1], "kl")
  run = train_and_evaluate(config, str(tmp_path / "run"), write_metrics=False)
  first = run.history[0]
  assert first["loss"] == pytest.approx(first["ce_loss"] + first["distill_loss"], rel=1e-5)
  # Independently: the first batch, the teacher's and the initial student's logits.
  batch = next(build_lm_data(config.data, seed=config.seed).train_iter)
  teacher, _, _ = load_model(tiny_workdir[1])
  teacher_logits = teacher.model()(jnp.asarray(batch["inputs"]))[0]
  graphdef, state, _ = init_state(config)
  student_logits = nnx.merge(graphdef, state.params, state.rest)(jnp.asarray(batch["inputs"]))[0]
  expected = float(kl_divergence(teacher_logits, student_logits, 1.0))
  assert first["distill_loss"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.integration
def test_no_gradient_of_the_residual_step_reaches_the_teacher(tiny_config, tiny_model):
  _, teacher_graphdef, teacher_state = tiny_model
  config = student_config(tiny_config, method="residual")
  graphdef, state, _ = init_state(config)
  batch = next(build_lm_data(config.data, seed=0).train_iter)
  projector = Projector(
    config.model.d_model, config.model.d_model, fuse_experts=True, rngs=nnx.Rngs(0)
  )
  objective = distill.make_objective(DISTILL_METHODS.get("residual"), {"weight": 1.0})
  loss_fn = step_lib.make_loss_fn(graphdef, objective)

  def loss(student_params, teacher_params):
    out = distill.teacher_forward(
      teacher_graphdef, True, teacher_params, teacher_state.rest, batch["inputs"]
    )
    code = projector.encode(projector.features(out)).reshape(*batch["inputs"].shape, -1)
    full = {**batch, "teacher_logits": out["logits"], "teacher_code": code}
    return loss_fn(student_params, state.rest, full, jax.random.key(0))[0]

  to_student, to_teacher = jax.grad(loss, argnums=(0, 1))(state.params, teacher_state.params)
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(to_teacher))
  assert any(np.any(np.asarray(g)) for g in jax.tree.leaves(to_student))


@pytest.mark.integration
def test_the_hidden_term_of_the_step_is_the_mse_of_the_students_final_norm_output(tiny_config):
  """The step hands hidden-state KD the student's final hidden state: the logged term
  equals the mean squared difference of the final norm's output (read by nnx.capture,
  not the with_hidden path) and the batch's code; the code gets no gradient."""
  config = student_config(tiny_config, method="hidden")
  graphdef, state, _ = init_state(config)
  batch = next(build_lm_data(config.data, seed=0).train_iter)
  rng = np.random.default_rng(0)
  code = jnp.asarray(rng.normal(size=(*batch["inputs"].shape, config.model.d_model)), jnp.float32)
  full = {**batch, "teacher_logits": np.zeros((1,), np.float32), "teacher_code": code}
  objective = distill.make_objective(DISTILL_METHODS.get("hidden"), {"weight": 1.0})
  loss_fn = step_lib.make_loss_fn(graphdef, objective)
  aux = loss_fn(state.params, state.rest, full, jax.random.key(0))[1][1]
  model = nnx.merge(graphdef, state.params, state.rest)
  _, _, outputs = captured_forward(model, jnp.asarray(batch["inputs"]))
  hidden = np.asarray(outputs[("final_norm", "__call__")], np.float64)
  want = np.mean((hidden - np.asarray(code, np.float64)) ** 2)
  assert float(aux["task"]["distill_loss"]) == pytest.approx(want, rel=1e-5)

  def term(c):
    return loss_fn(state.params, state.rest, {**full, "teacher_code": c}, jax.random.key(0))[0]

  assert not np.any(np.asarray(jax.grad(term)(code)))


def test_different_vocabularies_without_a_map_are_refused_in_one_line(
  tiny_config, hf_dirs, tmp_path
):
  config = student_config(tiny_config)
  config.distill.teacher.workdir, config.distill.teacher.hf_dir = None, hf_dirs[96]
  with pytest.raises(ConfigError) as error:
    train_and_evaluate(config, str(tmp_path / "run"))
  message = str(error.value)
  assert "\n" not in message and "vocab_size=96" in message and "vocab_size=256" in message
  assert "distill.vocab_map" in message
  assert not os.path.exists(tmp_path / "run")


def test_a_missing_teacher_workdir_is_named_before_anything_is_written(tiny_config, tmp_path):
  missing = str(tmp_path / "no_teacher")
  with pytest.raises(ConfigError, match=rf"distill\.teacher\.workdir={missing} does not exist"):
    train_and_evaluate(student_config(tiny_config, missing), str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.integration
@pytest.mark.parametrize("method", ["residual", "hidden"])
def test_an_hf_student_learns_from_an_hf_teacher_through_a_vocab_map(
  hf_dirs, tiny_workdir, tmp_path, method
):
  c = finetune_hf.get_config("family=qwen3_moe,steps=2,seq_len=32,batch_size=8")
  c.init.hf_dir, c.data.data_dir = hf_dirs[256], tiny_workdir[0].data.data_dir
  c.train.log_every, c.train.eval_batches, c.train.progress_bar = 1, 1, False
  c.task, c.distill.method, c.distill.projector_steps = "distill", method, 3
  c.distill.teacher.hf_dir, c.distill.vocab_map = hf_dirs[96], "shared_prefix"
  run = train_and_evaluate(c, str(tmp_path / "run"), write_metrics=False)
  first = run.history[0]
  assert len(run.history) == 2 and np.isfinite(first["distill_loss"]) and first["distill_loss"] > 0
  assert first["loss"] == pytest.approx(
    first["ce_loss"] + first["aux_loss"] + first["distill_loss"], rel=1e-5
  )
  if method == "residual":  # the 96-id teacher cannot predict a byte >= 96 (most letters)
    assert 0.5 < first["teacher_wrong_fraction"] <= 1.0


def test_the_misleading_teacher_permutes_only_rows_of_its_domains():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, 5)))
  permutation = np.array([4, 0, 1, 2, 3])
  out = np.asarray(distill.corrupt_logits(logits, jnp.array([0, 3, 5]), (3, 5), permutation))
  np.testing.assert_array_equal(out[0], np.asarray(logits)[0])
  np.testing.assert_array_equal(out[1:], np.asarray(logits)[1:][..., permutation])
  np.testing.assert_array_equal(
    np.asarray(distill.map_vocab(logits, 3)), np.asarray(logits)[..., :3]
  )
  assert np.asarray(distill.map_vocab(logits, 7))[..., 5:].max() == -1e9


def test_corrupt_domains_need_the_mix_corpus(tiny_config, tiny_workdir, tmp_path):
  config = student_config(tiny_config, tiny_workdir[1])
  config.distill.corrupt_domains = "code"
  with pytest.raises(ConfigError, match=r"distill\.corrupt_domains='code' needs data\.name='mix'"):
    train_and_evaluate(config, str(tmp_path / "run"))


def test_labelled_mix_windows_carry_the_domain_their_tokens_come_from():
  domains = [d for d in mix.DOMAINS for _ in range(2)]
  texts = [chr(ord("A") + mix.DOMAINS.index(d)) * 40 for d in domains]  # one letter per domain
  weights = mix.check_weights({d: 1.0 for d in mix.DOMAINS})

  def encode(text):
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)

  windows = mix.mixed_train_windows(texts, domains, weights, encode, 0, 15, 0, label_domains=True)
  plain = mix.mixed_train_windows(texts, domains, weights, encode, 0, 15, 0)
  for i in range(60):
    assert windows[i]["domain"] == windows[i]["inputs"].max() - ord("A")
    np.testing.assert_array_equal(windows[i]["inputs"], plain[i]["inputs"])


def test_the_config_schema_names_every_registered_task():
  assert set(config_lib.TASKS) == set(tasks.TASKS)
