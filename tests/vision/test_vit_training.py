"""Training the ViT on the digits (task 'classification', moejax/train/tasks.py): a short
run of a tiny ViT-MoE beats chance by far on the held-out test split, its checkpoint
restores through the one reader (moejax/train/restore.py) to the same accuracy, and
bad settings are refused in one line naming the key."""

import jax
import numpy as np
import pytest

from moejax.config import base_config
from moejax.configs import vit_digits_moe
from moejax.data.vision import build_image_data
from moejax.errors import ConfigError
from moejax.train import step as step_lib
from moejax.train.loop import train_and_evaluate
from moejax.train.restore import restore
from moejax.train.tasks import evaluate_classification, task_of
from tests.cli.harness import run_entry
from tests.helpers import set_key

STEPS = 60


def tiny_vit_config(data_dir, arg=""):
  """configs/vit_digits_moe.py, 2 blocks of width 32 (block 1 MoE), STEPS steps."""
  c = vit_digits_moe.get_config(",".join(filter(None, [f"steps={STEPS}", arg])))
  m = c.model
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 32, 2, 2, 2, 16
  c.data.data_dir = data_dir
  t = c.train
  t.progress_bar, t.learning_rate, t.warmup_steps = False, 1e-2, 5
  t.log_every = t.eval_every = t.checkpoint_every = STEPS
  return c


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  config = tiny_vit_config(str(tmp_path_factory.mktemp("tfds")))
  workdir = str(tmp_path_factory.mktemp("vit"))
  return config, workdir, train_and_evaluate(config, workdir)


@pytest.mark.integration
def test_a_short_run_is_far_above_chance_on_the_test_split(trained):
  _, _, run = trained
  assert run.eval["val_accuracy"] > 0.5  # chance: 0.1
  record = run.history[-1]
  assert record["loss"] > record["ce_loss"]  # the router losses are added
  assert {"moe/layer1/load_balance", "val_accuracy"} <= set(record)


@pytest.mark.integration
def test_the_checkpoint_restores_to_the_same_test_accuracy(trained):
  config, workdir, run = trained
  r = restore(workdir)
  assert r.step == STEPS and r.config.model_name == "vit" and r.config.task == "classification"
  data = build_image_data(config.data, seed=config.seed)
  eval_step = task_of(r.config).make_eval_step(r.graphdef)
  state = step_lib.TrainState(np.int32(r.step), jax.tree.map(np.asarray, r.params), r.rest, None)
  scores = evaluate_classification(eval_step, state, data, None)
  assert scores["val_accuracy"] == pytest.approx(run.eval["val_accuracy"], abs=1e-6)
  assert scores["val_loss"] == pytest.approx(run.eval["val_loss"], rel=1e-5)


def test_the_dense_arm_trains_with_the_same_loop(tmp_path):
  config = tiny_vit_config(str(tmp_path / "tfds"), "moe=0")
  config.train.steps = config.train.log_every = config.train.eval_every = 3
  run = train_and_evaluate(config, str(tmp_path / "dense"), write_metrics=False)
  assert config.model.ffn_type == "dense" and run.history[-1]["aux_loss"] == 0.0
  assert 0.0 <= run.eval["val_accuracy"] <= 1.0


@pytest.mark.parametrize(
  "key, value, names",
  [
    ("model.vit.patch_size", 3, ["model.vit.patch_size=3", "model.vit.image_size=8"]),
    ("model.vit.pooling", "max", ["model.vit.pooling='max'", "cls", "mean"]),
    ("model.vit.num_classes", 0, ["model.vit.num_classes=0"]),
    ("model.vit.frames", 0, ["model.vit.frames=0", ">= 1"]),
    ("model.vit.frames", 8, ["model.vit.frames=8", "data.name='digits'", "images"]),
    ("model.vit.num_classes", 7, ["model.vit", "10 classes"]),
    ("model.vit.image_size", 16, ["model.vit", "(8, 8, 1)"]),
    ("model.attention.windows", [2, 2, 2, 2], ["model.attention.windows"]),
    ("task", "lm", ["task='lm'", "model_name='vit'"]),
    ("task", "regression", ["task='regression'", "classification"]),
    ("model_name", "decoder", ["model_name='decoder'", "classification"]),
    ("data.name", "shakespeare", ["data.name='shakespeare'", "image dataset"]),
  ],
)
def test_bad_vit_settings_are_refused_naming_the_key(key, value, names):
  from moejax.validation import validate_config

  c = vit_digits_moe.get_config()
  set_key(c, key, value)
  with pytest.raises(ConfigError) as error:
    validate_config(c)
  assert "\n" not in str(error.value)
  for text in names:
    assert text in str(error.value)


def test_an_lm_config_on_an_image_dataset_is_refused():
  from moejax.validation import validate_config

  c = base_config()
  c.data.name = "digits"
  with pytest.raises(ConfigError, match="data.name='digits' is an image dataset"):
    validate_config(c)


@pytest.mark.parametrize(
  "override, line",
  [
    ("--config.model.vit.no_such_key=1", "error: unknown config key model.vit.no_such_key"),
    ("--config.model.vit.pooling=max", "error: model.vit.pooling='max' is not known"),
  ],
)
def test_the_train_command_refuses_a_bad_vit_key_in_one_line(tmp_path, override, line):
  result = run_entry(
    "experiments.train",
    "--config=configs/vit_digits_moe.py",
    f"--workdir={tmp_path / 'run'}",
    override,
  )
  assert result.code == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(line)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dataset", ["digits", "mnist", "glyphs", "textures"])
def test_every_kit_dataset_gives_a_config_the_validation_accepts(dataset):
  from moejax.data.vision import VISION_DATASETS
  from moejax.validation import validate_config

  c = vit_digits_moe.get_config(f"dataset={dataset}")
  validate_config(c)  # raises unless image shape and classes match the dataset
  assert c.data.name == dataset
  assert c.model.vit.num_classes == VISION_DATASETS[dataset].num_classes


def test_an_unknown_kit_dataset_is_refused_naming_the_arg():
  with pytest.raises(ConfigError, match=r"^dataset='cifar'.*textures"):
    vit_digits_moe.get_config("dataset=cifar")


@pytest.mark.integration
def test_a_short_run_on_the_textures_beats_chance(tmp_path):
  config = tiny_vit_config(str(tmp_path / "tfds"), "dataset=textures")
  run = train_and_evaluate(config, str(tmp_path / "textures"), write_metrics=False)
  assert run.eval["val_accuracy"] > 2 / 5  # 5 textures, balanced: chance is 1/5
