"""Language-model batches from a TFDS text dataset, with grain and no TensorFlow.

``build_lm_data(cfg, seed=..., shard_index=..., shard_count=...)`` reads the
``data`` config block (see ``moejax.config.base_config``):

  name         'shakespeare' (built in, modern spelling), 'shakespeare_folio'
               (built in, modern + First Folio), 'mix' (built in, multi-domain,
               ``moejax.data.mix``), 'files' (your own .txt/.jsonl files,
               streamed: ``moejax.data.files``), a generated dataset of
               ``GENERATED_DATASETS`` ('polyglot_synth': moejax.data.polyglot,
               settings in ``data.polyglot``, nothing written to disk), or any
               TFDS dataset already prepared as array_record in ``data_dir``.
  files.train, files.eval   for 'files': globs; eval unset holds out every
               10th train file whole.
  mix.weights  for 'mix': {domain: weight}; training interleaves the domains in
               these proportions (``mix.mixed_train_windows``).
  text_key     feature holding the text (default 'text').
  train_split, eval_split   split names (default 'train', 'validation').
  tokenizer    'byte' (default) or 'sentencepiece'; ``vocab_size`` for the latter,
               trained on the train split (for 'mix': ``mix.tokenizer_sample``,
               at most 1 MB per domain) and cached in ``data_dir``.
  seq_len      tokens per example; ``batch_size`` rows per global batch.
  data_dir     where datasets and tokenizer models live (default
               $TFDS_DATA_DIR or ~/tensorflow_datasets).

Each split is tokenized and packed (``moejax.data.packing``) in memory, which
suits corpora up to a few hundred million tokens; 'files' gives the same
windows read lazily from disk, for corpora larger than memory. Documents are separated by
the tokenizer's ``eos_id``: byte 0 (NUL) for 'byte', ``</s>`` (id 2) for
'sentencepiece'.

Train order: windows are shuffled with ``seed`` (a fresh permutation every
epoch) and repeated forever. Global batch t holds the windows at positions
[t*B, (t+1)*B) of that order. With ``shard_count`` processes, process s gets
rows [s*B/S, (s+1)*B/S) of every global batch, so concatenating the shards in
process order gives the global batch exactly. All processes must pass the
same ``seed``. ``train_iter`` is a grain ``DatasetIterator``: ``get_state()``
is a small JSON-serialisable dict and ``set_state`` on a freshly built
iterator resumes exactly.

Eval: the validation windows in stream order, cut into the same sharded
global batches; only full global batches are used.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from moejax.data import builders, files, mix, polyglot
from moejax.data.packing import PackedWindows, pack_documents
from moejax.data.storage import resolve_data_dir
from moejax.data.tokenizers import ByteTokenizer, Tokenizer, check_tokenizer_settings, get_tokenizer
from moejax.errors import ConfigError

Batch = dict[str, np.ndarray]

# Generated dataset name -> fn(data config) -> (dataset id, {split: texts}).
GENERATED_DATASETS = {polyglot.NAME: polyglot.split_texts}
OPTIONAL_DEFAULTS: dict[str, Any] = {
  'name': 'shakespeare',
  'text_key': 'text',
  'train_split': 'train',
  'eval_split': 'validation',
  'tokenizer': 'byte',
  'vocab_size': None,
  'data_dir': None,
  'mix': {},
  'files': {},
}
# Windows are cheap numpy slices; a little read-ahead keeps the host ahead of
# the accelerator without holding many batches in memory.
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


@dataclasses.dataclass(frozen=True)
class LMData:
  """Everything a training loop needs from the data pipeline.

  train_iter: infinite iterator of {'inputs', 'targets'}: int32 [B/S, seq_len]
    numpy batches (this process's rows), with get_state/set_state.
  eval_batches: ``eval_batches(num_batches=None)`` -> iterator over the first
    ``num_batches`` (None: all ``num_eval_batches``) validation batches, the
    same ones on every call.
  tokenizer, vocab_size: the tokenizer and its vocabulary size.
  bytes_per_token: UTF-8 bytes per token on the validation split (each
    document separator counts as one byte), so that
    bits_per_byte = loss_nats_per_token / ln(2) / bytes_per_token.
    Exactly 1.0 for the byte tokenizer.
  """

  train_iter: grain.DatasetIterator
  eval_batches: Callable[[int | None], Iterator[Batch]]
  tokenizer: Tokenizer
  vocab_size: int
  bytes_per_token: float
  num_eval_batches: int


def build_lm_data(
  cfg, *, seed: int, shard_index: int = 0, shard_count: int = 1, label_domains: bool = False
) -> LMData:
  """Builds train and eval data for this process (see module doc).

  label_domains: for 'mix', every train row also carries 'domain' (int32, its
  index in mix.DOMAINS); the batches are otherwise the same. Other data: no effect.

  Raises ConfigError (a ValueError) naming the key and value for bad settings;
  all checks but the corpus-size one run before any text is read.
  """
  settings = {key: cfg.get(key, default) for key, default in OPTIONAL_DEFAULTS.items()}
  settings.update(seq_len=_require(cfg, 'seq_len'), batch_size=_require(cfg, 'batch_size'))
  _check_settings(settings, seed, shard_index, shard_count)
  mix_weights = (
    mix.check_weights(settings['mix'].get('weights')) if settings['name'] == 'mix' else None
  )
  data_dir = resolve_data_dir(settings['data_dir'])
  windows: Mapping[str, files.StreamedWindows | PackedWindows]
  if settings['name'] == 'files':
    tokenizer, streamed = files.streamed_splits(
      settings['files'],
      functools.partial(_files_tokenizer, settings, data_dir),
      settings['seq_len'],
      settings['text_key'],
    )
    eval_bytes, eval_tokens = (
      streamed['eval_split'].num_text_bytes,
      streamed['eval_split'].num_tokens,
    )
    windows = streamed
  else:
    tokenizer, texts, train_domains = _texts_and_tokenizer(cfg, settings, data_dir)
    streams = {
      key: pack_documents(map(tokenizer.encode, split_texts), tokenizer.eos_id)
      for key, split_texts in texts.items()
    }
    windows = {key: PackedWindows(stream, settings['seq_len']) for key, stream in streams.items()}
    eval_texts = texts['eval_split']
    eval_bytes = sum(len(text.encode('utf-8')) for text in eval_texts) + len(eval_texts)
    eval_tokens = len(streams['eval_split'])
  for key, split_windows in windows.items():
    _check_fits_one_batch(settings, key, len(split_windows))

  rows = settings['batch_size'] // shard_count
  if mix_weights is None:
    train_windows = grain.MapDataset.source(windows['train_split']).shuffle(seed=seed).repeat()
  else:
    train_windows = mix.mixed_train_windows(
      texts['train_split'],
      train_domains,
      mix_weights,
      tokenizer.encode,
      tokenizer.eos_id,
      settings['seq_len'],
      seed,
      label_domains=label_domains,
    )
  train = _batched(train_windows, rows, shard_index, shard_count)
  num_eval_batches = len(windows['eval_split']) // settings['batch_size']
  eval_ds = _batched(
    grain.MapDataset.source(windows['eval_split'])[: num_eval_batches * settings['batch_size']],
    rows,
    shard_index,
    shard_count,
  )
  return LMData(
    train_iter=iter(train.to_iter_dataset(READ_OPTIONS)),
    eval_batches=functools.partial(_eval_batches, eval_ds, num_eval_batches),
    tokenizer=tokenizer,
    vocab_size=tokenizer.vocab_size,
    bytes_per_token=eval_bytes / eval_tokens,
    num_eval_batches=num_eval_batches,
  )


def _texts_and_tokenizer(cfg, settings: dict, data_dir: str):
  """(tokenizer, {split key: texts}, the train documents' domains or None) of an
  in-memory dataset (built in, generated or prepared TFDS; not 'files')."""
  if settings['name'] in GENERATED_DATASETS:
    dataset_id, texts = _generated_texts(cfg, settings)
  else:
    builder = builders.open_builder(settings['name'], data_dir)
    dataset_id = builder.info.full_name.replace('/', '-')
    sources = {
      key: builders.open_split(builder, settings, key) for key in ('train_split', 'eval_split')
    }
    texts = {key: _read_texts(source, settings['text_key']) for key, source in sources.items()}
  train_domains = (
    _read_texts(sources['train_split'], 'domain') if settings['name'] == 'mix' else None
  )
  tokenizer = get_tokenizer(
    settings['tokenizer'],
    vocab_size=settings['vocab_size'],
    model_path=_tokenizer_path(dataset_id, settings, data_dir),
    train_texts=lambda: (
      texts['train_split']
      if train_domains is None
      else mix.tokenizer_sample(texts['train_split'], train_domains)
    ),
  )
  return tokenizer, texts, train_domains


def train_token_stream(cfg) -> np.ndarray:
  """The training split of the ``data`` config ``cfg`` as one token stream through
  its tokenizer (documents in split order, each followed by ``eos_id``): what L3
  allocates its rows from (moejax/layers/lookup.py, ``model.l3.corpus='train_split'``)."""
  settings = {key: cfg.get(key, default) for key, default in OPTIONAL_DEFAULTS.items()}
  check_tokenizer_settings(settings['tokenizer'], settings['vocab_size'])
  data_dir = resolve_data_dir(settings['data_dir'])
  if settings['name'] == 'files':
    tokenizer, windows = files.streamed_splits(
      settings['files'],
      functools.partial(_files_tokenizer, settings, data_dir),
      1,
      settings['text_key'],
    )
    texts = windows['train_split'].texts()
  else:
    tokenizer, split_texts, _ = _texts_and_tokenizer(cfg, settings, data_dir)
    texts = split_texts['train_split']
  return pack_documents(map(tokenizer.encode, texts), tokenizer.eos_id)


def _batched(
  windows: grain.MapDataset, rows: int, shard_index: int, shard_count: int
) -> grain.MapDataset:
  """This process's batches: rows [s*rows, (s+1)*rows) of each global batch."""
  local = windows.batch(rows, drop_remainder=True, batch_fn=stack_rows)
  return local[shard_index::shard_count]


def _eval_batches(
  eval_ds: grain.MapDataset, num_available: int, num_batches: int | None = None
) -> Iterator[Batch]:
  """The first ``num_batches`` (None: all) eval batches, in a fixed order."""
  count = num_available if num_batches is None else num_batches
  if not (_is_int(count) and 1 <= count <= num_available):
    raise ConfigError(
      f'eval_batches={num_batches!r} must be in [1, {num_available}] '
      f'(the full validation batches available) or None for all'
    )
  return (eval_ds[i] for i in range(count))


def stack_rows(rows: Sequence[Batch]) -> Batch:
  """Stacks examples into a batch (always a fresh copy, never a view)."""
  return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def _require(cfg, key: str) -> Any:
  if key not in cfg:
    raise ConfigError(f'data.{key} is missing')
  return cfg[key]


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_settings(settings: dict, seed, shard_index, shard_count) -> None:
  """Checks needing no data: tokenizer, sizes, sharding, seed."""
  check_tokenizer_settings(settings['tokenizer'], settings['vocab_size'])
  for key in ('seq_len', 'batch_size'):
    if not (_is_int(settings[key]) and settings[key] >= 1):
      raise ConfigError(f'data.{key}={settings[key]!r} must be an int >= 1')
  if not (_is_int(shard_count) and shard_count >= 1):
    raise ConfigError(f'shard_count={shard_count!r} must be an int >= 1')
  if not (_is_int(shard_index) and 0 <= shard_index < shard_count):
    raise ConfigError(f'shard_index={shard_index!r} must be in [0, shard_count={shard_count})')
  if settings['batch_size'] % shard_count:
    raise ConfigError(
      f"data.batch_size={settings['batch_size']} must be divisible by "
      f'shard_count={shard_count} (each process takes an equal slice)'
    )
  if not (_is_int(seed) and 0 <= seed < 2**32):
    raise ConfigError(f'seed={seed!r} must be an int in [0, 2**32)')


def _read_texts(source: Sequence[dict], text_key: str) -> list[str]:
  texts = (source[i][text_key] for i in range(len(source)))
  return [text.decode('utf-8') if isinstance(text, bytes) else str(text) for text in texts]


def _generated_texts(cfg, settings: dict) -> tuple[str, dict[str, list[str]]]:
  """(dataset id, {'train_split': texts, 'eval_split': texts}) of a generated dataset."""
  dataset_id, splits = GENERATED_DATASETS[settings['name']](cfg)
  for key in ('train_split', 'eval_split'):
    if settings[key] not in splits:
      raise ConfigError(
        f'data.{key}={settings[key]!r} is not a split of data.name='
        f"{settings['name']!r}; splits: {', '.join(splits)}"
      )
  return dataset_id, {key: splits[settings[key]] for key in ('train_split', 'eval_split')}


def _tokenizer_path(dataset_id: str, settings: dict, data_dir: str) -> str:
  """Cache file of a learned tokenizer: keyed by dataset, split, key and vocab (and,
  for mix, the per-domain bytes of ``mix.tokenizer_sample``)."""
  sample = f'-sample{mix.TOKENIZER_SAMPLE_BYTES}' if settings['name'] == 'mix' else ''
  return os.path.join(
    data_dir,
    'moejax_tokenizers',
    f"{dataset_id}-{settings['train_split']}-{settings['text_key']}"
    f"-{settings['tokenizer']}{settings['vocab_size']}{sample}.model",
  )


def _files_tokenizer(settings: dict, data_dir: str, train_texts) -> Tokenizer:
  """The tokenizer of data.name=files; a learned one is cached per set of train files."""
  paths = files.resolve_files(settings['files'])['train']
  key = hashlib.sha256(
    json.dumps([(p, os.path.getsize(p), os.path.getmtime(p)) for p in paths]).encode()
  ).hexdigest()[:16]
  model_path = os.path.join(
    data_dir,
    'moejax_tokenizers',
    f"files-{key}-{settings['text_key']}-{settings['tokenizer']}{settings['vocab_size']}.model",
  )
  return get_tokenizer(
    settings['tokenizer'],
    vocab_size=settings['vocab_size'],
    model_path=model_path,
    train_texts=train_texts,
  )


def _check_fits_one_batch(settings: dict, key: str, num_windows: int) -> None:
  if num_windows < settings['batch_size']:
    split = (
      f"data.files.{key.split('_')[0]}={settings['files'].get(key.split('_')[0])!r}"
      if settings['name'] == 'files'
      else f"data.{key}={settings[key]!r} of data.name={settings['name']!r}"
    )
    raise ConfigError(
      f"{split} is too small: "
      f"{num_windows} windows of data.seq_len+1={settings['seq_len'] + 1} tokens, "
      f"fewer than one batch of data.batch_size={settings['batch_size']}"
    )


def split_documents(cfg, split_key: str = 'eval_split') -> list[tuple[str, str]]:
  """(domain, text) of every document of the split ``cfg[split_key]`` (default the
  eval split), in order: the document's ``domain`` feature when the dataset has
  one, else ``cfg.name``. For the evaluation harness (moejax/evaluation)."""
  settings = {key: cfg.get(key, default) for key, default in OPTIONAL_DEFAULTS.items()}
  check_tokenizer_settings(settings['tokenizer'], settings['vocab_size'])
  if settings['name'] == 'files':
    paths = files.resolve_files(settings['files'])[split_key.split('_')[0]]
    return [
      ('files', text)
      for text in files.StreamedWindows(paths, ByteTokenizer(), 1, settings['text_key']).texts()
    ]
  builder = builders.open_builder(settings['name'], resolve_data_dir(settings['data_dir']))
  source = builders.open_split(builder, settings, split_key)
  texts = _read_texts(source, settings['text_key'])
  if 'domain' not in builder.info.features:
    return [(settings['name'], text) for text in texts]
  domains = (source[i]['domain'] for i in range(len(source)))
  return [
    (d.decode('utf-8') if isinstance(d, bytes) else str(d), text) for d, text in zip(domains, texts)
  ]
