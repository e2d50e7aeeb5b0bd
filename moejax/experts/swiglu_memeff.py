"""Memory-efficient dropless SwiGLU MoE (SonicMoE, arXiv 2512.14080): the fused
path the 'swiglu' expert type declares (swiglu.py), which dispatch
'dropless_memeff' (moejax/dispatch/memeff.py) and grouped_matmul 'fused' run.

Same routing, layout and forward as 'dropless' (tile-padded rows,
moejax/assignment/layout.py), but the whole expert pass is one `jax.custom_vjp`
fused into the block loop of moejax/assignment/blocks.py, and its residuals are only
    x [T, d] (ungathered), H = [x W_gate | x W_up] [rows, 2f] (pre-activations),
    the per-row gates S [rows], the row -> token indices and the block schedule
(plus the weights, which are parameters anyway). Never saved: the gathered
rows X_g [T*k, d], the activations A, the expert outputs Y [T*k, d].

Forward, per block of rows of expert e (paper sec. 3, Fig. 2):
    X_g = x[token(rows)]        gathered inside the loop, never stored whole
    H = X_g [W_gate_e | W_up_e],  A = silu(H_gate) * H_up,  Y = A W_down_e
    O[token] += S * Y           (scatter-add into [T, d])
Backward (paper's dS / dH split), per block, with A recomputed from H:
    dA' = dO[token] W_down_e^T
    dS  = <dA', A> per row       (= <dO_t, Y_te>: the gate's cotangent)
    dH  = phi'(H) (S dA')        (phi(g, u) = silu(g) u)
    dW_down_e += (S A)^T dO[token],  dW_gate|up_e += X_g^T dH   (one [d, 2f] matmul,
                                     not two)
    dx[token] += dH [W_gate_e | W_up_e]^T   (scatter-add over the k slots)
The router's gradient flows from dS through the per-row gates back to the
Routing's combine weights (a gather, transposed by autodiff) and the router.
Gate and up weights stay two matrices (two matmuls per block, the same
FLOPs as one fused [d, 2f] matmul, without concatenating the weights on
every call).
"""

import jax
import jax.numpy as jnp
from jax import lax

from moejax.assignment.blocks import for_each_block, schedule_of
from moejax.assignment.layout import dropless_metrics, tile_layout


def _rows(a, start, size):
  return lax.dynamic_slice_in_dim(a, start, size)


def _forward(x, row_gate, w_gate, w_up, w_down, row_token, schedule, save_h):
  acc_dtype = jnp.promote_types(jnp.float32, x.dtype)
  ffn = w_gate.shape[2]

  def body(size, start, expert, carry):
    y, h = carry
    token = _rows(row_token, start, size)
    x_g = x[token]
    gate, up = x_g @ w_gate[expert], x_g @ w_up[expert]
    out = (jax.nn.silu(gate) * up) @ w_down[expert]
    s = _rows(row_gate, start, size).astype(acc_dtype)[:, None]
    y = y.at[token].add(s * out.astype(acc_dtype))
    if save_h:
      h = lax.dynamic_update_slice_in_dim(h, jnp.concatenate([gate, up], 1), start, 0)
    return y, h

  h = jnp.zeros((row_token.shape[0] if save_h else 0, 2 * ffn), x.dtype)
  y, h = for_each_block(schedule, body, (jnp.zeros(x.shape, acc_dtype), h))
  return y.astype(x.dtype), h


@jax.custom_vjp
def swiglu_moe_memeff(x, row_gate, w_gate, w_up, w_down, row_token, schedule):
  """O[t] = sum over rows r of t of row_gate[r] * SwiGLU_{expert(r)}(x[t]), O [T, d]."""
  return _forward(x, row_gate, w_gate, w_up, w_down, row_token, schedule, False)[0]


def _memeff_fwd(x, row_gate, w_gate, w_up, w_down, row_token, schedule):
  y, h = _forward(x, row_gate, w_gate, w_up, w_down, row_token, schedule, True)
  return y, (x, h, row_gate, w_gate, w_up, w_down, row_token, schedule)


def _memeff_bwd(res, d_out):
  x, h, row_gate, w_gate, w_up, w_down, row_token, schedule = res
  acc_dtype = jnp.promote_types(jnp.float32, x.dtype)
  ffn = w_gate.shape[2]
  d_out = d_out.astype(x.dtype)

  def body(size, start, expert, carry):
    dx, d_gate_rows, dw_gate, dw_up, dw_down = carry
    token = _rows(row_token, start, size)
    s = _rows(row_gate, start, size).astype(x.dtype)[:, None]
    h_b = _rows(h, start, size)
    gate, up = h_b[:, :ffn], h_b[:, ffn:]
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    act = silu * up  # A, recomputed from H
    x_g, do_g = x[token], d_out[token]
    da_prime = do_g @ w_down[expert].T
    d_s = jnp.sum((da_prime * act).astype(acc_dtype), axis=1)
    d_gate_rows = lax.dynamic_update_slice_in_dim(d_gate_rows, d_s, start, 0)
    da = s * da_prime
    d_gate_pre = da * up * sig * (1 + gate * (1 - sig))  # silu'(g) = sig (1 + g (1 - sig))
    d_up_pre = da * silu
    dw_down = dw_down.at[expert].add(((s * act).T @ do_g).astype(acc_dtype))
    dw_gate_up = x_g.T @ jnp.concatenate([d_gate_pre, d_up_pre], 1)  # one [d, 2f] matmul
    dw_gate = dw_gate.at[expert].add(dw_gate_up[:, :ffn].astype(acc_dtype))
    dw_up = dw_up.at[expert].add(dw_gate_up[:, ffn:].astype(acc_dtype))
    dx_g = d_gate_pre @ w_gate[expert].T + d_up_pre @ w_up[expert].T
    dx = dx.at[token].add(dx_g.astype(acc_dtype))
    return dx, d_gate_rows, dw_gate, dw_up, dw_down

  init = (
    jnp.zeros(x.shape, acc_dtype),
    jnp.zeros(row_gate.shape, acc_dtype),
    jnp.zeros(w_gate.shape, acc_dtype),
    jnp.zeros(w_up.shape, acc_dtype),
    jnp.zeros(w_down.shape, acc_dtype),
  )
  dx, d_gate_rows, dw_gate, dw_up, dw_down = for_each_block(schedule, body, init)
  return (
    dx.astype(x.dtype),
    d_gate_rows.astype(row_gate.dtype),
    dw_gate.astype(w_gate.dtype),
    dw_up.astype(w_up.dtype),
    dw_down.astype(w_down.dtype),
    None,
    None,
  )


swiglu_moe_memeff.defvjp(_memeff_fwd, _memeff_bwd)


def swiglu_memeff_dispatch(weights: dict, x, routing, cfg):
  """SwiGLU experts {w_gate, w_up, w_down} fused over the dropless layout: (y, metrics)."""
  x = jnp.asarray(x)
  layout = tile_layout(routing, cfg.num_experts, cfg.dropless.tile)
  row_gate = layout.row_values(routing.masked_weight().T.reshape(-1))
  weights = jax.tree.map(jnp.asarray, weights)
  y = swiglu_moe_memeff(
    x,
    row_gate,
    weights["w_gate"],
    weights["w_up"],
    weights["w_down"],
    layout.row_token,
    schedule_of(layout, cfg.dropless),
  )
  return y, dropless_metrics(layout)
