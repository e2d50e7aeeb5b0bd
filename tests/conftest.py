"""Shared test settings: CPU only, hypothesis without deadlines (jit compiles)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

settings.register_profile("moejax", deadline=None, print_blob=True)
settings.load_profile("moejax")


# Files that take the longest (scripts/test.sh prints --durations; this order is
# from a JUnit report of the whole suite), run first so that the two workers
# (--dist loadfile --no-loadscope-reorder) finish together instead of one idling
# while the other runs the 8-device sessions at the end.
SLOW_FIRST = ("tests/sharding/test_on_8_devices.py", "tests/train/test_grad_accumulation.py",
              "tests/train/test_training.py", "tests/inference/test_kv_cache.py",
              "tests/sharding/test_multi_process.py", "tests/dispatch/test_memeff.py",
              "tests/layers/test_moe_layer.py", "tests/experts/test_omnimoe.py",
              "tests/kernels/test_gmm_grad.py", "tests/dispatch/test_dispatch.py",
              "tests/models/test_scale_skeleton.py", "tests/layers/test_lookup.py",
              "tests/train/test_finetune_hf.py")


def pytest_collection_modifyitems(items):
  rank = {path: i for i, path in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(SLOW_FIRST)))
