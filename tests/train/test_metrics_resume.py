"""After a kill and a resume, metrics.jsonl holds one record per step and the
expert-load plot draws what an uninterrupted run draws (issue 11).

The kill is simulated from an uninterrupted 10-step run (checkpoints every 4
steps, a record every step): a copy of its workdir, cut back to what a job
killed after logging step 7 leaves behind (checkpoints 8 and 10 deleted, so the
last is step 4; metrics.jsonl up to step 7), is resumed; it replays 5-7."""

import json
import os
import shutil

import numpy as np
import pytest

from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import train_and_evaluate
from moejax.train.metrics import MetricWriter, expert_load_series, purge_jsonl, read_jsonl

STEPS, EVERY, KILLED_AT = 10, 4, 7


@pytest.mark.integration
def test_resume_after_kill_leaves_one_record_per_step(tiny_config, tmp_path):
  config = tiny_config(
    steps=STEPS, checkpoint_every=EVERY, log_every=1, eval_every=100, eval_batches=1, max_to_keep=5
  )
  straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
  train_and_evaluate(config, straight)
  shutil.copytree(straight, killed)
  ckpt = Checkpointer(killed, 5)
  assert ckpt.all_steps() == [4, 8, 10]
  ckpt.close()
  for step in (8, 10):
    shutil.rmtree(os.path.join(killed, "checkpoints", str(step)))
  path = os.path.join(killed, "metrics.jsonl")
  with open(path) as f:
    lines = f.read().splitlines()
  with open(path, "w") as f:
    f.write("".join(line + "\n" for line in lines[:KILLED_AT]))
  assert [r["step"] for r in read_jsonl(path)] == list(range(1, KILLED_AT + 1))

  resumed = train_and_evaluate(config, killed)
  assert resumed.start_step == EVERY
  steps = [r["step"] for r in read_jsonl(os.path.join(killed, "metrics.jsonl"))]
  assert steps == list(range(1, STEPS + 1)), steps  # before the fix: 1..7, 5..10

  want_steps, want = expert_load_series(read_jsonl(os.path.join(straight, "metrics.jsonl")))
  got_steps, got = expert_load_series(read_jsonl(os.path.join(killed, "metrics.jsonl")))
  assert got_steps == want_steps == list(range(1, STEPS + 1))
  assert got.keys() == want.keys() and len(want) == 2
  for layer in want:
    assert got[layer].keys() == want[layer].keys() and len(want[layer]) == 8
    for expert in want[layer]:  # resume is bit exact, so are the logged loads
      np.testing.assert_array_equal(
        got[layer][expert], want[layer][expert], err_msg=f"{layer} {expert}"
      )
  assert os.path.exists(os.path.join(killed, "expert_load.png"))


def test_purge_drops_later_steps_and_a_cut_line_atomically(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 8)]
  with open(path, "w") as f:
    f.write("\n".join(lines) + '\n{"step": 8, "lo')  # a write cut short by the kill
  assert purge_jsonl(path, 4) == 4
  assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4]
  with open(path) as f:
    assert f.read() == "\n".join(lines[:4]) + "\n"
  assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]  # no temporary file left
  before = os.stat(path).st_mtime_ns
  assert purge_jsonl(path, 4) == 0 and os.stat(path).st_mtime_ns == before  # untouched
  assert purge_jsonl(str(tmp_path / "missing.jsonl"), 0) == 0


def tensorboard_scalars(logdir: str, tag: str):
  """(START step markers, [(step, value)]) of `tag` as TensorBoard shows them: its
  EventAccumulator, on a SessionLog START at step s, drops what it holds at steps
  >= s (the `tensorboard` package is not installed; the TFRecord frames and
  Event protos are read here directly)."""
  import struct

  from tensorboardX.proto import event_pb2

  starts, shown = [], []
  for name in sorted(os.listdir(logdir)):  # event files sort by creation time
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == 1:  # START
        starts.append(event.step)
        shown = [(s, v) for s, v in shown if s < event.step]
      for value in event.summary.value:
        if value.tag == tag:
          shown.append((event.step, value.simple_value))
  return starts, shown


def test_writer_purges_on_start_and_hides_later_tensorboard_events(tmp_path):
  workdir = str(tmp_path)
  writer = MetricWriter(workdir, start_step=0)
  for step in range(1, 8):
    writer.write(step, {"loss": float(step)})
  writer.close()
  writer = MetricWriter(workdir, start_step=4)
  for step in range(5, 11):
    writer.write(step, {"loss": 10.0 * step})
  writer.close()
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == list(
    range(1, 11)
  )
  starts, shown = tensorboard_scalars(os.path.join(workdir, "tensorboard"), "loss")
  assert starts == [5]  # purge_step on the resumed writer only
  assert shown == [(s, float(s)) for s in range(1, 5)] + [(s, 10.0 * s) for s in range(5, 11)]
