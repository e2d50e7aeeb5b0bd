"""Token-centric dropless experts for a handful of rows (decode steps):
grouped matmul 'gather' (moejax/dispatch/grouped_matmul.py), which 'auto'
picks whenever a call has no more (token, slot) assignments than experts.

No sort and no layout: assignment (t, s), flattened slot-major, is row
s * T + t, holding x[t]; each row's matmul gathers its own expert's slice,

    matmul(rows [R, a], w [E, a, b])[r] = rows[r] @ w[expert(r)]   (einsum over w[expert])

and y[t] = sum_s combine_weight[t, s] * out[s * T + t], in at least float32.
Invalid slots read expert 0 and carry weight 0. An expert type with its own
gathered form (ExpertType.gathered: compressed experts, reading only the rows'
experts' codes, moejax/experts/gathered.py) runs that instead of the matmul.
The matmul copies one weight slice per assignment (R x a x b per matmul), so
it pays off only when R is small: a decode step of batch B sends B * k rows,
where the block loop of the
dropless layout pays a loop iteration, a weight-slice copy and the sort per
expert hit (docs/results/generate_cpu.md, "Where the time goes"). Plain
autodiff: the weight gradient is a scatter-add over the gathered slices.
"""

import jax.numpy as jnp

from moejax.experts.base import experts_of


def assignment_experts(routing) -> jnp.ndarray:
  """Expert of each assignment, slot-major [S*T] (0 for invalid slots)."""
  expert = jnp.where(routing.valid, routing.expert_index, 0)
  return expert.T.reshape(-1).astype(jnp.int32)


def gather_matmul(row_expert):
  """matmul(rows, w) -> rows[r] @ w[row_expert[r]] for every row r."""
  return lambda rows, w: jnp.einsum("ra,rab->rb", rows, w[row_expert])


def token_gather_dispatch(x, routing, expert_fn):
  """sum_s w[t, s] * expert_{e[t, s]}(x[t]), every assignment its own row: (y, metrics)."""
  num_tokens, num_slots = routing.expert_index.shape
  rows = jnp.tile(x, (num_slots, 1))  # row s * T + t holds x[t]
  row_expert = assignment_experts(routing)
  bound = experts_of(expert_fn)
  if bound is not None and bound.has_gathered:
    out = bound.gathered(rows, row_expert)
  else:
    out = expert_fn(rows, gather_matmul(row_expert))
  acc_dtype = jnp.promote_types(jnp.float32, out.dtype)
  weight = routing.masked_weight().T.reshape(-1, 1).astype(acc_dtype)
  y = jnp.sum((out.astype(acc_dtype) * weight).reshape(num_slots, num_tokens, -1), axis=0)
  zero = jnp.zeros((), jnp.float32)
  return y.astype(x.dtype), {"dropped_fraction": zero, "padding_waste": zero}
