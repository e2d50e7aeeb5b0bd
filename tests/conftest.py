"""Shared test settings (CPU only, hypothesis without deadlines: jit compiles) and
the fixtures every area builds on: `data_dir` (one TFDS directory per session),
`tiny_config(arg="", model=None, **train)` (the tiny MoE LM's config), `tiny_model` (it built
and initialised) and `tiny_workdir` (it trained for a few steps)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache directory per xdist worker (scripts/test.sh makes the run's):
# jax writes cache entries without a lock unless eviction is on, and a worker that
# read another's half-written entry crashed deserialising it.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
    os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"]
  )

import pytest  # noqa: E402  (after JAX_PLATFORMS is set)
from hypothesis import settings  # noqa: E402  (after JAX_PLATFORMS is set)

from tests.helpers import (  # noqa: E402  (after JAX_PLATFORMS is set)
  TINY_WORKDIR_STEPS,
  in_share,
  integration_share,
  set_key,
)

settings.register_profile("moejax", deadline=None, print_blob=True)
settings.load_profile("moejax")

MAX_MEMORY_MAPS = 10_000


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """Drops every compiled program after a test file once the worker holds more than
  MAX_MEMORY_MAPS memory maps. XLA:CPU maps each executable into its own pages and
  keeps it while jax's caches hold it: a worker that keeps them all passes Linux's
  vm.max_map_count partway through the suite and segfaults in the next compile
  (docs/results/test_suite_cpu.md). Not after every file: each clear recompiles the
  eager ops that build a model."""
  yield
  try:
    with open("/proc/self/maps", "rb") as maps:
      count = sum(1 for _ in maps)
  except OSError:  # not Linux: no such limit
    return
  if count > MAX_MEMORY_MAPS:
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """The session's TFDS data directory (the corpus is prepared into it once)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="session")
def tiny_config(data_dir):
  """tiny_config(arg="", model=None, **train): configs/lm_shakespeare_moe.py at
  size=tiny plus the config args `arg` (e.g. "router=sigmoid_bias"), data in
  `data_dir`, no progress bar, the model.* keys of `model` set ({dotted key under
  model: value}, e.g. {"attention.qkv_bias": True}) and these train.* keys set.
  A new ConfigDict each call."""
  from moejax.configs import lm_shakespeare_moe

  def make(arg="", model=None, **train):
    c = lm_shakespeare_moe.get_config(",".join(filter(None, ["size=tiny", arg])))
    c.data.data_dir = data_dir
    c.train.progress_bar = False
    # Per-row 'gather' (no sort, no layout): the tiny model's train step compiles in
    # half the time of the CPU default ('fused'); tests/dispatch and tests/contract
    # check every grouped matmul against the reference; a test that needs another
    # sets it on the config it gets.
    c.model.moe.grouped_matmul = "gather"
    for key, value in (model or {}).items():
      set_key(c.model, key, value)
    for key, value in train.items():
      c.train[key] = value
    return c

  return make


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
  """(config, graphdef, TrainState) of the tiny MoE LM at initialisation. Shared by
  the session: read it, copy before changing (its arrays are immutable jax arrays;
  tests/helpers.py `host` gives numpy views in new containers)."""
  from moejax.train.build import init_state

  config = tiny_config()
  graphdef, state, _ = init_state(config)
  return config, graphdef, state


@pytest.fixture(scope="session")
def tiny_workdir(tiny_config, tmp_path_factory):
  """(config, workdir) of the tiny MoE LM after TINY_WORKDIR_STEPS steps, checkpointed."""
  from moejax.train.loop import train_and_evaluate

  config = tiny_config(
    steps=TINY_WORKDIR_STEPS, checkpoint_every=TINY_WORKDIR_STEPS, eval_batches=1
  )
  workdir = str(tmp_path_factory.mktemp("tiny_workdir"))
  train_and_evaluate(config, workdir, write_metrics=False)
  return config, workdir


# Files marked `multidevice` (child processes with several devices) and then
# `slow` (over ~25 s in a JUnit report of the whole suite) run first, in collection
# order, so that the two workers (--dist loadfile --no-loadscope-reorder) finish
# together on short files instead of one idling while the other runs a long one.
FIRST = ("multidevice", "slow")


def pytest_addoption(parser):
  parser.addoption(
    "--integration-share",
    default="all",
    metavar="K/N|all|none",
    help="of the tests marked `integration`, run the K-th of N shares (each test's "
    "share is a hash of its id), all of them (the default) or none",
  )


def pytest_report_header(config):
  return f"integration tests: share {config.getoption('integration_share')}"


def pytest_collection_modifyitems(config, items):
  share = integration_share(config.getoption("integration_share"))
  dropped = [
    item
    for item in items
    if item.get_closest_marker("integration") and not in_share(item.nodeid, share)
  ]
  if dropped:
    config.hook.pytest_deselected(items=dropped)
    dropped_ids = {id(item) for item in dropped}
    items[:] = [item for item in items if id(item) not in dropped_ids]

  def rank(item):
    return next(
      (i for i, marker in enumerate(FIRST) if item.get_closest_marker(marker)), len(FIRST)
    )

  items.sort(key=rank)  # stable: collection order within each rank
