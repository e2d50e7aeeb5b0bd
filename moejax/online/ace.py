"""ACE, the Awakening Crowd of Experts (ICML 2026; abstract only): online choice
among experts that arrive one per round and never leave.

Known from the abstract: a sleeping-experts problem (Kleinberg et al. 2010) with
K = T experts, a new one awake at every round; stochastic ACE has regret
O~(T^{2/3}) through pessimism, optimism fails. Everything else is a GUESS:

  * rounds t = 0..T-1; expert t arrives at the start of round t, so experts
    0..t are available then; the learner picks I_t from what it saw before t;
  * full information (GUESS, from "experts": under bandit feedback a
    pessimistic rule never tries a newcomer): after the pick every available
    expert's reward X_t(i) ~ Bernoulli(mu_i) (or N(mu_i, sigma^2)) is shown, so
    at round t expert i holds n_i = t - i rewards with sum S_i;
  * regret (GUESS: the "optimal strategy" is the best-ordering benchmark of
    sleeping experts, which under stochastic rewards plays the best awake
    expert) is the pseudo-regret against the best expert arrived so far,
        R_T = sum_{t<T} (max_{i<=t} mu_i - mu_{I_t});
    the optimum's "stability" is how often that argmax changes.

Index policies (`index`), b(n) = sqrt(c log T / n) (Hoeffding at confidence
~1/T^2 for c = 1 and rewards in [0, 1]); I_t = argmax, ties to the oldest:
  ucb    S/n + b(n), +inf at n = 0: optimism plays every newcomer (linear);
  greedy S/n, -inf at n = 0: follows the empirical leader, lucky newcomers too;
  lcb    S/n - b(n), -inf at n = 0: the paper's pessimism (spec: argmax
         LCB_i = mu_i - sqrt(c log T / n_i); the constant c is a GUESS);
  oracle mu_i: knows the means; its regret is exactly 0.
Means: `stochastic_means` (iid uniform, on [0, 1] or on an interior range) or
`adversarial_means`, an oblivious
adversary's arrivals (GUESS: the staircase behind a T^{2/3} lower bound). The
paper's adversarial ACE (adversarial rewards, alpha-regret, a log log T
competitive ratio) is not modelled.

`simulate_dense` is the plain O(T^2)-per-seed model (lax.scan over rounds,
vmap over seeds). `simulate` (numpy, Bernoulli) makes the same choices on the
same rewards, and has the same law when it samples them, while it skips the
experts that provably cannot be picked for a while (`bounds`). In both, row r
of a batch draws its rewards from its own stream (`rows`: numpy
default_rng([seed, T, r]), jax fold_in(key, r)), so a row's regret does not
depend on the other rows of the batch.

`instance` builds a study's means: draw d of `stochastic_means` (row d; on [0, 1] or
an interior range) or the adversary's staircase (the same for every draw).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, choice_error

POLICIES = ("ucb", "greedy", "lcb", "oracle")
REWARDS = ("bernoulli", "gaussian")
_SIGN = {"ucb": 1.0, "greedy": 0.0, "lcb": -1.0}
_AT_ZERO = {"ucb": math.inf, "greedy": -math.inf, "lcb": -math.inf, "oracle": -math.inf}


def check(*, horizon=1, policy="lcb", c=1.0, rewards="bernoulli", sigma=1.0, seeds=1, block=1):
  """ConfigError (one line naming the value) for settings no simulation can use."""
  if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
    raise ConfigError(f"the horizon must be an integer >= 1 (T={horizon!r})")
  if policy not in POLICIES:
    raise choice_error("policy", policy, POLICIES)
  if not (isinstance(c, (int, float)) and 0 <= c < math.inf):
    raise ConfigError(f"the confidence scale must be a finite number >= 0 (c={c!r})")
  if rewards not in REWARDS:
    raise choice_error("rewards", rewards, REWARDS)
  if not (isinstance(sigma, (int, float)) and 0 < sigma < math.inf):
    raise ConfigError(f"the reward noise must be a finite number > 0 (sigma={sigma!r})")
  for name, value in (("seeds", seeds), ("block", block)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ConfigError(f"{name} must be an integer >= 1 ({name}={value!r})")


def _checked_means(means, rewards="bernoulli"):
  means = np.asarray(means, np.float64)
  if means.ndim != 2 or means.shape[1] < 1:
    raise ConfigError(f"means must be (seeds, T) with T >= 1 (shape={means.shape})")
  if not np.all(np.isfinite(means)):
    raise ConfigError("means must be finite (a mean is nan or inf)")
  if rewards == "bernoulli" and (means.min() < 0 or means.max() > 1):
    raise ConfigError(f"Bernoulli means must lie in [0, 1] (range=[{means.min()}, {means.max()}])")
  return means


def stochastic_means(horizon, seeds=1, *, seed=0, low=0.0, high=1.0):
  """(seeds, T) means drawn iid uniform on [low, high], seeded; row r is the same
  whatever `seeds` (> r) is."""
  check(horizon=horizon, seeds=seeds)
  if not 0 <= low <= high <= 1:
    raise ConfigError(f"need 0 <= low <= high <= 1 (low={low}, high={high})")
  return np.random.default_rng([seed, horizon]).uniform(low, high, (seeds, horizon))


def adversarial_means(horizon, seeds=1, *, low=0.25, high=0.75, decoy=0.0):
  """(seeds, T) means an oblivious adversary picks knowing T (GUESS: lower-bound shape).

  K = ceil(T^{1/3}) steps, one every L = ceil(T / K) rounds: expert k L has mean
  low + k eps, eps = (high - low) / K, so the best expert changes K times and
  eps^2 L stays constant (telling two steps apart takes ~c log T / eps^2 rounds,
  longer than a step lasts); every other expert is a decoy of mean `decoy`. A
  mean-0 decoy is a newcomer only optimism tries, and `simulate` rules it out
  for good; decoy > 0 also lures greedy (a lucky first reward), but slows it."""
  check(horizon=horizon, seeds=seeds)
  if not (0 <= decoy <= 1 and 0 <= low < high <= 1):
    raise ConfigError(
      f"need 0 <= low < high <= 1 and decoy in [0, 1] (low={low}, high={high}, decoy={decoy})"
    )
  steps = math.ceil(round(horizon ** (1 / 3), 9))
  spacing = math.ceil(horizon / steps)
  means = np.full(horizon, float(decoy))
  means[::spacing] = low + np.arange(len(means[::spacing])) * (high - low) / steps
  return np.tile(means, (seeds, 1))


VARIANTS = ("stochastic", "adversarial", "interior")


def instance(variant, horizon, draws, *, seed=0, decoy=0.0, interior=(0.25, 0.75)):
  """(len(draws), T) means of the given draws: row d of stochastic_means(seed=seed) on
  [0, 1] ('stochastic') or on [interior[0], interior[1]] ('interior': no expert is near
  1, so a newcomer whose first rewards are all 1 looks better than every leader, the
  few-lucky-samples trap that pessimism avoids), or the adversary's staircase with
  decoys of mean `decoy` (the same for every draw)."""
  if variant not in VARIANTS:
    raise choice_error("variant", variant, VARIANTS)
  draws = np.asarray(draws, np.int64)
  if draws.ndim != 1 or draws.size == 0 or draws.min() < 0:
    raise ConfigError(f"draws must be a non-empty list of integers >= 0 (draws={draws.tolist()!r})")
  if variant == "adversarial":
    return adversarial_means(horizon, len(draws), decoy=decoy)
  low, high = interior if variant == "interior" else (0.0, 1.0)
  return stochastic_means(horizon, int(draws.max()) + 1, seed=seed, low=low, high=high)[draws]


def _rows(rows, seeds):
  """The batch rows' stream ids: 0..seeds-1 by default; ConfigError if not [seeds] ints >= 0."""
  if rows is None:
    return np.arange(seeds)
  rows = np.asarray(rows)
  if (
    rows.shape != (seeds,)
    or not np.issubdtype(rows.dtype, np.integer)
    or (rows.size and rows.min() < 0)
  ):
    raise ConfigError(
      f"rows must be {seeds} integers >= 0, one per row of the means (rows={rows.tolist()!r})"
    )
  return rows


def _row_keys(key, rows):
  return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.asarray(rows, jnp.uint32))


def index(policy, total, count, mean, horizon, c=1.0, xp=np):
  """The policy's index of experts holding `count` rewards summing to `total`.

  ucb S/n + sqrt(c log T / n), greedy S/n, lcb S/n - sqrt(c log T / n), oracle mu;
  at n = 0: ucb +inf, greedy and lcb -inf. `bounds` relies on this exact order
  of float operations (each one monotone)."""
  if policy == "oracle":
    return xp.broadcast_to(mean, xp.shape(total))
  safe = xp.maximum(count, 1)
  value = total / safe + _SIGN[policy] * xp.sqrt(c * math.log(horizon) / safe)
  return xp.where(count > 0, value, _AT_ZERO[policy])


def regret(means, choices):
  """(seeds,) R_T = sum_t (max_{i<=t} mu_i - mu_{I_t}); refuses an unavailable pick."""
  means = np.asarray(means, np.float64)
  choices = np.asarray(choices)
  late = choices > np.arange(means.shape[1])
  if np.any(late) or np.any(choices < 0):
    raise ConfigError(f"a pick is not available at its round (choices={choices[late][:3]})")
  picked = np.take_along_axis(means, choices.astype(np.int64), axis=1)
  return (np.maximum.accumulate(means, axis=1) - picked).sum(axis=1)


def _draw(key, mean, rewards, sigma):
  if rewards == "bernoulli":
    return jax.random.bernoulli(key, mean).astype(mean.dtype)
  return mean + sigma * jax.random.normal(key, mean.shape, mean.dtype)


def reward_matrix(key, means, *, rewards="bernoulli", sigma=1.0, rows=None):
  """(seeds, T, T) rewards X[r, t, i] of expert i at round t (0 before it arrives):
  the ones `simulate_dense(key, ..., rows=rows)` draws."""
  check(rewards=rewards, sigma=sigma)
  means = jnp.asarray(_checked_means(means, rewards), jnp.result_type(float))
  keys = _row_keys(key, _rows(rows, means.shape[0]))
  rounds = jnp.arange(means.shape[1])

  def one(key, mean):
    rows = jax.vmap(lambda t: _draw(jax.random.fold_in(key, t), mean, rewards, sigma))(rounds)
    return jnp.where(rounds[None, :] <= rounds[:, None], rows, 0)

  return jax.vmap(one)(keys, means)


def simulate_dense(key, means, policy, *, c=1.0, rewards="bernoulli", sigma=1.0, rows=None):
  """Every expert's sum updated every round: lax.scan over T rounds, vmap over seeds.

  means: (seeds, T); row r draws with fold_in(key, rows[r]). Returns (choices
  (seeds, T) int, regret (seeds,) float64)."""
  check(policy=policy, c=c, rewards=rewards, sigma=sigma)
  means_np = _checked_means(means, rewards)
  keys = _row_keys(key, _rows(rows, means_np.shape[0]))
  run = _dense(policy, means_np.shape[1], float(c), rewards, float(sigma))
  means = jnp.asarray(means_np, jnp.result_type(float))
  choices = np.asarray(run(keys, means))
  return choices, regret(means_np, choices)


@functools.lru_cache(maxsize=32)
def _dense(policy, horizon, c, rewards, sigma):
  experts = jnp.arange(horizon)

  def one(key, mean):
    def step(carry, t):  # count = t - i is carried: under vmap XLA rewrites x / broadcast(y)
      total, count = carry  # as x * (1 / y), which breaks ties such as 39/39 == 49/49
      value = index(policy, total, count, mean, horizon, c, xp=jnp)
      choice = jnp.argmax(jnp.where(count >= 0, value, -jnp.inf))
      reward = _draw(jax.random.fold_in(key, t), mean, rewards, sigma)
      return (total + jnp.where(count >= 0, reward, 0), count + 1), choice

    start = (jnp.zeros_like(mean), -experts.astype(mean.dtype) + 0 * mean)
    return jax.lax.scan(step, start, experts)[1]

  return jax.jit(jax.vmap(one))


def bounds(policy, total, seen, experts, start, stop, mean, horizon, c=1.0):
  """(lower, upper) of each expert's index over rounds start..stop-1 (Bernoulli).

  `total` sums the expert's rewards of rounds [experts, seen), seen <= start; each
  later round adds 0 or 1 (only 0 when mean = 0), so S/n lies in [total / n_hi,
  (total + stop-1 - seen) / n_hi] (the upper end increases with the round since
  total <= seen - experts). Each float operation is that of `index`, so monotone."""
  if policy == "oracle":
    return mean, mean
  n_lo, n_hi = start - experts, stop - 1 - experts
  safe_lo, safe_hi = np.maximum(n_lo, 1), np.maximum(n_hi, 1)
  scale, sign, zero = c * math.log(horizon), _SIGN[policy], _AT_ZERO[policy]
  upper = np.where(mean > 0, (total + (stop - 1 - seen)) / safe_hi, 0.0)
  lower = total / safe_hi
  if sign:
    upper = upper + sign * np.sqrt(scale / (safe_lo if sign > 0 else safe_hi))
    lower = lower + sign * np.sqrt(scale / (safe_hi if sign > 0 else safe_lo))
  # n = 0 at the first rounds (index `zero`, +inf or -inf), or at all of them
  upper = np.where(n_hi < 1, zero, np.where(n_lo < 1, np.maximum(upper, zero), upper))
  lower = np.where(n_hi < 1, zero, np.where(n_lo < 1, np.minimum(lower, zero), lower))
  return lower, upper


def _binomials(rngs, r, i, n, p):
  """Binomial(n, p) for each (row r, expert i), each row's draws from its own stream
  in expert order, so they do not depend on the other rows."""
  out = np.empty(len(r), np.int64)
  order = np.lexsort((i, r))
  rows, starts = np.unique(r[order], return_index=True)
  for row, part in zip(rows, np.split(order, starts[1:])):
    out[part] = rngs[row].binomial(n[part], p[part])
  return out


def simulate(means, policy, *, seed=0, c=1.0, block=32, table=None, rows=None):
  """Bernoulli ACE, exact, touching only experts that may be picked.

  In blocks of B rounds. The floor is the best lower bound (`bounds`) of last
  block's candidates over windows of B 2^k rounds (or the newcomer's index: +inf
  for ucb). Each tracked expert (last block's candidates, experts due back, the
  block's arrivals) sleeps through the longest window where its upper bound stays
  below the floor: it cannot be picked there, and catches up with one Binomial
  draw when due. The rest are the block's candidates, sampled every round. Row r
  samples from default_rng([seed, T, rows[r]]) (rows: 0..seeds-1 by default). A
  (seeds, T, T) 0/1 `table` (reward_matrix) replaces the sampling. Returns
  (choices (seeds, T), regret (seeds,))."""
  means = _checked_means(means)
  seeds, horizon = means.shape
  check(horizon=horizon, policy=policy, c=c, seeds=seeds, block=block)
  if policy == "ucb":  # every newcomer has index +inf and is picked (simulate_dense agrees)
    choices = np.tile(np.arange(horizon), (seeds, 1))
    return choices, regret(means, choices)
  rngs = [np.random.default_rng([seed, horizon, int(r)]) for r in _rows(rows, seeds)]
  if table is not None:
    fixed = np.asarray(table).astype(np.int64)
    if fixed.shape != (seeds, horizon, horizon) or not np.isin(fixed, (0, 1)).all():
      raise ConfigError(f"the table must be 0/1 of shape (seeds, T, T) (shape={fixed.shape})")
    cum = np.concatenate([np.zeros_like(fixed[:, :1]), np.cumsum(fixed, axis=1)], axis=1)
  total = np.zeros((seeds, horizon), np.int64)
  seen = np.tile(np.arange(horizon), (seeds, 1))  # total sums the rounds [i, seen)
  choices = np.empty((seeds, horizon), np.int64)
  spans = block * 2 ** np.arange(max(1, math.ceil(math.log2(horizon / block)) + 1))
  due = {}  # block start -> [(seed ids, expert ids)] to bound again
  keep = (np.zeros(0, np.int64),) * 2  # last block's candidates
  cand = cand_total = cand_mean = np.zeros((seeds, 0), np.int64)
  seed_ids = np.arange(seeds)
  for start in range(0, horizon, block):
    stop = min(start + block, horizon)
    ends = np.minimum(start + spans, horizon)
    floor = np.full((seeds, len(ends)), _AT_ZERO[policy])  # the newcomer's index
    if start:  # and last block's candidates' (their sums are up to date)
      lower = bounds(
        policy,
        cand_total[..., None],
        start,
        cand[..., None],
        start,
        ends,
        cand_mean[..., None],
        horizon,
        c,
      )[0]
      lower = np.where((cand < horizon)[..., None], lower, -np.inf)
      floor = np.maximum(floor, lower.max(axis=1))
    new = np.divmod(np.arange(seeds * (stop - start)), stop - start)
    parts = [keep, *due.pop(start, []), (new[0], new[1] + start)]
    r, i = (np.concatenate(p) for p in zip(*parts))
    late = seen[r, i] < start
    if late.any():  # catch up to `start`
      lr, li = r[late], i[late]
      total[lr, li] += (
        cum[lr, start, li] - cum[lr, seen[lr, li], li]
        if table is not None
        else _binomials(rngs, lr, li, start - seen[lr, li], means[lr, li])
      )
      seen[lr, li] = start
    upper = bounds(
      policy,
      total[r, i][:, None],
      seen[r, i][:, None],
      i[:, None],
      start,
      ends,
      means[r, i][:, None],
      horizon,
      c,
    )[1]
    # upper grows and the floor shrinks with the window: sleeps through a prefix
    asleep = np.logical_and.accumulate(upper < floor[r], axis=1).sum(axis=1)
    for k in np.unique(asleep[asleep > 0]):
      if ends[k - 1] < horizon:
        due.setdefault(int(ends[k - 1]), []).append((r[asleep == k], i[asleep == k]))
    r, i = r[asleep == 0], i[asleep == 0]
    order = np.lexsort((i, r))
    r, i = r[order], i[order]
    counts = np.bincount(r, minlength=seeds)
    slot = np.arange(len(r)) - np.repeat(np.cumsum(counts) - counts, counts)
    cand = np.full((seeds, counts.max()), horizon)  # padding: never arrives
    cand[r, slot] = i
    safe = np.minimum(cand, horizon - 1)
    cand_total = np.take_along_axis(total, safe, axis=1)
    cand_mean = np.take_along_axis(means, safe, axis=1)
    if table is not None:
      draws = np.take_along_axis(fixed[:, start:stop], safe[:, None, :], axis=2)
    else:
      draws = np.zeros((seeds, stop - start, cand.shape[1]), bool)
      for row, count in enumerate(counts):  # row's own stream, its own candidates only
        draws[row, :, :count] = rngs[row].random((stop - start, count)) < cand_mean[row, :count]
    for t in range(start, stop):
      count = t - cand
      value = np.where(count >= 0, index(policy, cand_total, count, cand_mean, horizon, c), -np.inf)
      choices[:, t] = cand[seed_ids, value.argmax(axis=1)]
      cand_total += draws[:, t - start] & (count >= 0)
    total[r, i] = cand_total[r, slot]
    seen[r, i] = stop
    keep = (r, i)
  return choices, regret(means, choices)
