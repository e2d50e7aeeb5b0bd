"""Per-task figures of an adapter run (moejax/analysis/adapter_tasks.py): mix domains
cut into windows (checked by hand), the per-task means and the task-expert mutual information
against closed forms, and the LoRA-Mixer scorer's refusals of bad task settings."""

import numpy as np
import pytest

from moejax.analysis.adapter_tasks import task_figures, task_windows
from moejax.config import base_config
from moejax.errors import ConfigError


class Bytes:
  eos_id = 0

  def encode(self, text):
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


def test_each_domain_is_one_stream_of_its_documents_cut_into_whole_windows():
  documents = [("code", "abc"), ("facts", "xyz12"), ("code", "de"), ("drama", "zz")]
  windows, task = task_windows(Bytes(), documents, ["facts", "code"], seq_len=2)
  # code: EOS a b c EOS d e -> 2 windows of 3 (tail dropped); facts: EOS x y z 1 2 -> 2
  want = [[0, 97, 98], [99, 0, 100], [0, 120, 121], [122, 49, 50]]
  assert windows.tolist() == want and task.tolist() == [1, 1, 0, 0]
  with pytest.raises(ConfigError, match="'drama' documents hold no window of 4 tokens"):
    task_windows(Bytes(), documents, ["drama"], seq_len=3)


def test_task_means_and_mutual_information_against_closed_forms():
  c = base_config()
  c.model.attention.adapter = "lora_mixer"
  c.model.attention.lora_mixer.num_experts = 4
  nll = np.array([[1.0, 3.0], [2.0, 2.0], [5.0, 7.0]])
  correct = np.array([[1, 0], [1, 1], [0, 0]], bool)
  token_task = np.array([0, 0, 1, 1, 2, 2])  # one window per task
  aligned = {(0, "q"): np.array([0, 0, 1, 1, 2, 2])}  # expert = task: I = log2(3)
  out = task_figures(c, {}, nll, correct, aligned, token_task, ["a", "b", "c"])
  assert (out["loss/a"], out["loss/b"], out["loss/c"]) == (2.0, 2.0, 6.0)
  assert (out["accuracy/a"], out["accuracy/b"], out["accuracy/c"]) == (0.5, 1.0, 0.0)
  assert out["task_loss"] == pytest.approx(10 / 3) and out["task_accuracy"] == pytest.approx(0.5)
  assert out["mi_bits"] == pytest.approx(np.log2(3))
  constant = {(0, "q"): np.zeros(6, int)}  # one expert for everything: I = 0
  assert task_figures(c, {}, nll, correct, constant, token_task, ["a", "b", "c"])["mi_bits"] == 0


def study_config(**settings):
  import importlib.util

  spec = importlib.util.spec_from_file_location("study", "configs/studies/lora_mixer.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("tasks=mix")
  c.settings.update(settings)
  return c


@pytest.mark.parametrize(
  "settings, message",
  [
    (dict(tasks=["code", "poetry"]), r"study\.settings\.tasks=\['code', 'poetry'\] must be"),
    (dict(tasks=["code", "code"]), r"distinct mix domains"),
    (dict(heldout_bytes_per_domain=0), r"heldout_bytes_per_domain must be > 0"),
    (dict(common=["data.seq_len=64"]), r"arm 'rsl' trains on data\.name='polyglot_synth'"),
  ],
)
def test_bad_task_settings_are_refused_before_any_run(settings, message):
  from moejax.studies.runner import prepare

  with pytest.raises(ConfigError, match=message):
    prepare(study_config(**settings))
