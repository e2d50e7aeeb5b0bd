# %% [markdown]
# # Kernels and sharding: the Pallas grouped matmul, and expert parallelism
#
# Dropless MoE dispatch sorts the token-to-expert assignments by expert, so expert
# e's rows are one contiguous group and all experts run as one **grouped matmul**:
# `out[rows of e] = lhs[rows of e] @ rhs[e]` (`kernels/`, also importable as
# `moejax.kernels`). The Pallas kernels (Mosaic on TPU, Triton on GPU) are checked
# here against the pure-jnp reference; on a CPU the TPU-design kernel runs in
# Pallas' interpret mode (slow, but the same program logic).
#
# Then a device mesh with **expert parallelism** (`moejax/sharding.py`,
# `moejax/dispatch/expert_parallel.py`): experts split over the `expert` mesh
# axis, tokens exchanged by all-to-all inside each MoE layer. Without an
# accelerator the set-up cell asks XLA for 8 simulated CPU devices (the flag must
# be set before jax is imported), so the same mesh code runs anywhere.

# %% [setup]
# 8 host (CPU) devices when there is no accelerator; a TPU or GPU keeps its own devices.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

# %% [markdown]
# ## The grouped matmul against its reference
#
# 8 experts with uneven group sizes (empty ones too, and rows past the last group,
# which must come out zero). `backend="auto"` picks the platform's kernel on a TPU
# or GPU; on a CPU we ask for the TPU-design Pallas kernel in interpret mode.

# %%
import time

import jax.numpy as jnp
import numpy as np
from moejax.kernels import gmm, gmm_reference, tgmm, tgmm_reference

if ACCELERATOR:
  kernel = dict(backend="auto")
  m, k, n = 4096, 512, 1024
else:
  kernel = dict(backend="pallas", interpret=True)
  m, k, n = 256, 64, 128
E = 8
# Relative error allowed (max |kernel - reference| / max |reference|): float32 on a
# CPU; on TPU/GPU, XLA's reference and the kernel may multiply float32 in reduced
# precision passes (bf16 / TF32) in different orders.
TOLERANCE = 2e-2 if ACCELERATOR else 1e-5


def check(name, got, want):
  error = float(jnp.abs(got - want).max() / jnp.abs(want).max())
  print(f"{name}: max |kernel - reference| / max |reference| = {error:.1e}")
  assert error <= TOLERANCE, (name, error)


rng = np.random.default_rng(0)
sizes = rng.multinomial(m - 24, rng.dirichlet(np.ones(E)))  # 24 padding rows at the end
sizes[3] = 0
sizes[4] += m - 24 - sizes.sum()
group_sizes = jnp.asarray(sizes, jnp.int32)
lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
rhs = jnp.asarray(rng.standard_normal((E, k, n)) / np.sqrt(k), jnp.float32)
grad = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
print("group sizes", sizes.tolist(), "rows", m, "->", int(sizes.sum()), "in groups")

out = gmm(lhs, rhs, group_sizes, **kernel)
check("gmm ", out, gmm_reference(lhs, rhs, group_sizes))
print("rows past the groups are zero:", bool(jnp.all(out[int(sizes.sum()):] == 0)))
w_grad = tgmm(lhs, grad, group_sizes, **kernel)
check("tgmm", w_grad, tgmm_reference(lhs, grad, group_sizes))
print("empty groups have zero weight gradients:", bool(jnp.all(w_grad[sizes == 0] == 0)))

# %% [markdown]
# The kernel is differentiable (a `custom_vjp`: `d lhs = gmm(grad, rhs^T)`,
# `d rhs = tgmm(lhs, grad)`), so its gradients must equal the reference's.

# %%
def loss(f):
  """The scalar <f(a, b), grad> whose gradient is the VJP of f against grad."""
  return lambda a, b: jnp.sum(f(a, b, group_sizes) * grad)


g_kernel = jax.grad(loss(lambda a, b, g: gmm(a, b, g, **kernel)), argnums=(0, 1))(lhs, rhs)
g_ref = jax.grad(loss(gmm_reference), argnums=(0, 1))(lhs, rhs)
for name, a, b in zip(("d lhs", "d rhs"), g_kernel, g_ref):
  check(name, a, b)

if ACCELERATOR:  # compiled kernels: time them against the jnp reference
  for name, f in (("pallas", jax.jit(lambda a, b, g: gmm(a, b, g, **kernel))),
                  ("reference", jax.jit(gmm_reference))):
    f(lhs, rhs, group_sizes).block_until_ready()
    start = time.perf_counter()
    for _ in range(20):
      f(lhs, rhs, group_sizes).block_until_ready()
    print(f"{name:9s} {(time.perf_counter() - start) / 20 * 1e3:.3f} ms per call")

# %% [markdown]
# ## A mesh with expert parallelism
#
# The config's `mesh` section names the axis sizes (`data`, `fsdp`, `expert`,
# `tensor`; -1 = the devices left over). With 8 devices: 2-way data parallelism x
# 4-way expert parallelism, 2 of the 8 experts per device. The tiny LM trains a few
# steps on the mesh and on one device: the losses agree (float32, to ~1e-5),
# because every layout computes the same model.

# %%
from moejax import sharding
from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import train_and_evaluate

devices = jax.devices()
count = len(devices)
mesh = dict(data=2, expert=4) if count >= 8 else dict(data=1, expert=count)
print(f"{count} {BACKEND} devices -> mesh {mesh}")


def tiny_config(mesh_sizes):
  c = lm_shakespeare_moe.get_config("size=tiny")
  c.train.steps, c.train.log_every, c.train.eval_batches, c.train.progress_bar = 6, 1, 1, False
  c.data.batch_size = 16  # rows for every data and expert shard
  for axis, size in mesh_sizes.items():
    c.mesh[axis] = size
  return c


one = train_and_evaluate(tiny_config(dict(data=1)), os.path.join(WORK, "one_device"),
                         devices=devices[:1], write_metrics=False)
if count > 1:
  many = train_and_evaluate(tiny_config(mesh), os.path.join(WORK, "mesh"),
                            write_metrics=False)
  a = np.array([r["loss"] for r in one.history])
  b = np.array([r["loss"] for r in many.history])
  print("losses, one device:", a.round(5))
  print("losses, on the mesh:", b.round(5))
  print(f"max relative difference {np.max(np.abs(a - b) / np.abs(a)):.1e}")
  np.testing.assert_allclose(b, a, rtol=1e-4)
else:
  print("one device: no mesh to compare (the plain single-device program ran)")

# %% [markdown]
# Where the expert weights live: each device holds a slice of the expert axis
# (and a copy for each data shard).

# %%
if count > 1:
  layout = sharding.make_layout(tiny_config(mesh))
  print("mesh", dict(layout.mesh.shape), "| rule for the expert axis:",
        layout.rules["expert"])
  paths = jax.tree_util.tree_flatten_with_path(many.state.params)[0]
  for path, leaf in paths:
    name = jax.tree_util.keystr(path)
    if "expert" in name.lower() and leaf.ndim == 3:
      shards = sorted({(s.device.id, tuple(s.data.shape)) for s in leaf.addressable_shards})
      print(f"{name}: global {leaf.shape}, {leaf.sharding.spec}")
      print("   per device:", shards[:8])
      break
