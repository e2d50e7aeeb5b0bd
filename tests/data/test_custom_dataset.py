"""Any TFDS dataset prepared on disk works by name, with its own keys and splits."""

import numpy as np

from moejax.data import build_lm_data

from .helpers import take, tiny_texts_config
from .tiny_texts import SPLIT_TEXTS


def test_unregistered_dataset_on_disk_is_read_by_name(tiny_dir):
  data = build_lm_data(tiny_texts_config(tiny_dir), seed=0)
  batch = next(data.train_iter)
  assert batch['inputs'].shape == (4, 15)

  rows = [np.concatenate([b['inputs'], b['targets'][:, -1:]], 1) for b in data.eval_batches()]
  eval_text = data.tokenizer.decode(np.concatenate(rows).reshape(-1))
  heldout = '\0'.join(SPLIT_TEXTS['heldout']) + '\0'
  assert len(eval_text) > 50 and heldout.startswith(eval_text)


def test_train_rows_come_from_the_named_train_split(tiny_dir):
  data = build_lm_data(tiny_texts_config(tiny_dir), seed=0)
  fit = '\0'.join(SPLIT_TEXTS['fit']).encode()
  for batch in take(data.train_iter, 3):
    for row in batch['inputs']:
      assert row.astype(np.uint8).tobytes() in fit + b'\0'
