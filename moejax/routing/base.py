"""The router registry and what routers share.

A router returns a RouterOutput (moejax/assignment/routing.py, below routers,
losses and dispatch): its Routing, the contract every dispatch path consumes,
the float32 probabilities over all E experts that its losses use (`probs`), its
float32 logits, metrics and updated state. A router whose point is never to
form [T, E] (product keys over N = n^2 experts) returns probs = logits = None and
declares gives_probs=False: no loss applies to it, and config validation
refuses loss weights with it.

Router configuration (RouterConfig)
-----------------------------------
A router never reads the model.moe ConfigDict. `router_config(spec, moe)`, the
one function that reads model.moe for routers, builds a frozen, hashable
RouterConfig once, where the MoE layer is built (and where config validation
checks a config): the layer's shape (top_k, num_experts), the routing keys more
than one router reads, from the section model.moe.routing (ROUTING: renormalize,
routed_scaling_factor, bias_update_rate, num_groups, topk_groups),
capacity_factor from model.moe.capacity.factor, loss_weights, and `settings`,
the router's own parsed section model.moe.<name> (registry.Settings).
Every callback of a RouterSpec receives that object as `cfg`: route,
update_state, validate, validate_settings, accumulation_check and the
projection's init and apply; `spec.route` refuses anything else. Tests and
benchmarks call a router by name on a ConfigDict with `call_router`.

Router inputs (RouterSpec.projection)
-------------------------------------
By default the MoE layer owns the router kernel W [d, E] and `route` receives
the float32 logits x W. A router may own its projection instead (a
`RouterProjection`: its parameters, their logical axes, and the map from the
float32 token features x [T, d] to whatever `route` takes in place of the
logits, e.g. the two [T, n] halves of a product-key router). The layer then
holds no kernel; the projection's parameters are trained like the kernel
(float32, under model.moe's router settings) and sharded by their axes.

Router state across micro-batches (the state-update protocol)
-------------------------------------------------------------
Non-trained router state that follows the training batch (the aux-loss-free
bias, a co-occurrence EMA) must move once per optimizer step, from the load of
the whole step's batch. A router does that by splitting its update in two:
  * `RouterOutput.stats`: accumulable statistics of the call, *sums* over its
    tokens (per-expert assignment counts, co-occurrence sums, the token count),
    so the sum over micro-batches is the statistic of the whole batch;
  * `RouterSpec.update_state(state, stats, cfg) -> new state`: pure (cfg: the
    layer's RouterConfig).
In training `route` itself returns update_state(state, stats, cfg), so one call
is one update. With train.micro_batches = M > 1 the train step
(moejax/train/step.py) runs every micro-batch from the state at the start of
the step, discards the per-call states, sums the stats of each layer over the
micro-batches and calls update_state once: the state after the step equals the
one-batch state. MoE layers hand their stats to the step by sowing them
(nnx sow, `RouterStats` in moejax/layers/moe.py) under the step's nnx.capture. A router with
init_state but no update_state refuses M > 1 (`check_micro_batches`); so does
one whose `accumulation_check` gives a reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Protocol

import jax
import jax.numpy as jnp

from moejax.assignment.routing import (  # noqa: F401  (re-exported)
  RouterOutput,
  Routing,
  routing_entropy,
)
from moejax.errors import ConfigError
from moejax.registry import PartSettings, Registry, Settings, check_number


def validate_routing(moe) -> None:
  """ConfigError naming model.moe.routing.<key> and the value, whatever the router
  (a router in use checks the rest: group_limited the groups against num_experts)."""
  s = ROUTING.parse(moe)
  if not isinstance(s["renormalize"], bool):
    raise ConfigError(f"model.moe.routing.renormalize={s['renormalize']!r} must be True or False")
  check_number("model.moe.routing.routed_scaling_factor", s["routed_scaling_factor"])
  check_number("model.moe.routing.bias_update_rate", s["bias_update_rate"], strict=False)
  for key in ("num_groups", "topk_groups"):
    check_number(f"model.moe.routing.{key}", s[key], integer=True, low=1, strict=False)
  jitter = s["jitter"]
  if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter < 1:
    raise ConfigError(f"model.moe.routing.jitter={jitter!r} must be in [0, 1)")
  check_number("model.moe.routing.init_scale", s["init_scale"])


# model.moe.routing: the routing keys no one router owns, key -> (default, what it
# does). Routers read the first five from their RouterConfig (router_config), the
# MoE layer reads jitter and init_scale (moejax/layers/moe.py), and HF families
# name four of them (moejax/interop/hf_config.py).
ROUTING_KEYS = {
  "renormalize": (True, "the kept top-k weights divided by their sum (HF norm_topk_prob)"),
  "routed_scaling_factor": (
    1.0,
    "the routed experts' weights times this (DeepSeek-V3; sigmoid_bias, group_limited; "
    "HF routed_scaling_factor)",
  ),
  "bias_update_rate": (
    1e-3,
    "aux-loss-free bias step (DeepSeek-V3; sigmoid_bias, group_limited); 0: a loaded "
    "bias stays fixed",
  ),
  "num_groups": (1, "expert groups of group-limited routing (HF n_group)"),
  "topk_groups": (1, "the groups each token may use (HF topk_group)"),
  "jitter": (
    0.0,
    "training noise U(1 - jitter, 1 + jitter) times the router input, any router "
    "(Switch Transformer, Fedus et al. 2022, sec. 2.4)",
  ),
  "init_scale": (
    0.1,
    "variance scale of the router kernel's truncated-normal fan-in init; small keeps "
    "early routing near uniform (ST-MoE, Zoph et al. 2022, sec. 3.2)",
  ),
}
ROUTING = PartSettings(
  "routing",
  "the routing section",
  tuple((key, default) for key, (default, _) in ROUTING_KEYS.items()),
  legacy_keys=(
    ("renormalize", "renormalize"),
    ("routed_scaling_factor", "routed_scaling_factor"),
    ("bias_update_rate", "bias_update_rate"),
    ("num_groups", "num_groups"),
    ("topk_groups", "topk_groups"),
    ("router_jitter", "jitter"),
    ("router_init_scale", "init_scale"),
  ),
  validate=validate_routing,
)


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  """What a router reads (the module doc): the layer's shape, the shared routing
  keys (model.moe.routing) and its own settings. Frozen and hashable: a static
  attribute of the MoE layer and a constant under jit. Built by `router_config` only."""

  num_experts: int
  top_k: int
  renormalize: bool
  routed_scaling_factor: float
  bias_update_rate: float
  capacity_factor: float
  num_groups: int  # expert groups of group-limited routing
  topk_groups: int  # ... and the groups each token may use
  loss_weights: Settings  # model.moe.loss_weights (accumulation checks)
  settings: Settings  # the router's own section, model.moe.<name>


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (static in nnx graphs)
class RouterProjection:
  """A router's own projection of the token features (see the module doc).

  init(key, d_model, num_experts, cfg) -> {name: float32 array}: the trained
    parameters, created once per MoE layer;
  logical_axes: {name: logical axes} of each parameter (sharding);
  apply(params, x_f32 [T, d], cfg) -> the float32 array `route` receives in
    place of the logits.
  cfg: the layer's RouterConfig.
  """

  init: Callable[..., dict[str, jax.Array]]
  logical_axes: Mapping[str, tuple]
  apply: Callable[..., jax.Array]


class Route(Protocol):
  """A router's routing function: RouterSpec.fn (see there)."""

  def __call__(
    self,
    logits: jax.Array,
    /,
    *,
    cfg: RouterConfig,
    state: Mapping[str, jax.Array],
    rng: jax.Array | None,
    train: bool,
  ) -> RouterOutput: ...


@dataclasses.dataclass(frozen=True)
class RouterSpec:
  """A registered router. `cfg` below is always the layer's RouterConfig (the
  module doc), built once by `router_config`; no callback reads model.moe.

  fn: pure function (logits_f32 [T, E], *, cfg, state, rng, train)
    -> RouterOutput, the router itself; call it through `route`, which refuses a
    cfg that is not a RouterConfig. With a `projection`, its first argument is
    what the projection returns.
  init_state: num_experts -> dict of float32 arrays kept as non-trained
    router state (e.g. the aux-loss-free bias), or None.
  init_params: num_experts -> dict of float32 arrays the router trains
    besides its kernel (e.g. SmoothSMoE's band eta), or None. The MoE layer
    holds them as nnx.Params and passes them to `route` inside `state`
    (with gradient); only init_state keys are written back.
  causal: False when a token's routing depends on later tokens
    (expert choice); such a router must not be used for autoregressive
    generation without care.
  validate: cfg -> None, raising ConfigError for a config this router, in use,
    cannot run (e.g. top_k > num_experts).
  update_state: (state, summed stats, cfg) -> new state, pure: the state-update
    protocol of the module doc. None: the state (if any) is whatever `route`
    returns, and micro-batching is refused when there is one.
  accumulation_check: cfg -> None, or the reason why this router's training
    step is not the same with micro-batches (e.g. a loss scaled by the tokens
    of the call); check_micro_batches turns it into a ConfigError.
  promises: properties beyond the Routing contract that the contract tests
    (tests/contract/) then check, from PROMISES.
  settings: ((key, default), ...) the router's own settings, held in the config
    section model.moe.<name> (config.base_config builds it from this registry);
    they reach the router parsed, as cfg.settings. legacy_keys: ((flat model.moe
    key of older configs, setting), ...), moved into the section when a stored
    config is loaded (moejax/migrate.with_defaults). validate_settings: cfg ->
    None, ConfigError naming model.moe.<name>.<key> and the value, checked
    whatever the router in use. See registry.PartSettings.
  projection: the router's own RouterProjection, or None for the layer's
    kernel x W [d, E] (the module doc).
  gives_probs: False when the RouterOutput has no logits / probs over all E
    experts (then no loss applies; the module doc).
  """

  name: str
  fn: Route
  init_state: Callable[[int], dict[str, jax.Array]] | None = None
  causal: bool = True
  validate: Callable[[RouterConfig], None] | None = None
  init_params: Callable[[int], dict[str, jax.Array]] | None = None
  update_state: Callable[[dict, dict, RouterConfig], dict] | None = None
  accumulation_check: Callable[[RouterConfig], str | None] | None = None
  promises: frozenset[str] = frozenset()
  settings: tuple[tuple[str, Any], ...] = ()
  legacy_keys: tuple[tuple[str, str], ...] = ()
  validate_settings: Callable[[RouterConfig], None] | None = None
  projection: RouterProjection | None = None
  gives_probs: bool = True

  def route(
    self,
    logits: jax.Array,
    *,
    cfg: RouterConfig,
    state: Mapping[str, jax.Array],
    rng: jax.Array | None,
    train: bool,
  ) -> RouterOutput:
    """`fn` on the layer's RouterConfig (TypeError for anything else, e.g. the
    model.moe ConfigDict: routers receive their parsed config, built once)."""
    if not isinstance(cfg, RouterConfig):
      raise TypeError(
        f"router {self.name!r} takes a RouterConfig (routing.router_config), not "
        f"{type(cfg).__name__}"
      )
    return self.fn(logits, cfg=cfg, state=state, rng=rng, train=train)

  @property
  def config_section(self) -> PartSettings:
    """Its settings section, model.moe.<name>; its check runs validate_settings on
    the RouterConfig of the model.moe it checks."""
    check = None if self.validate_settings is None else self._check_settings
    return PartSettings(self.name, f"router {self.name!r}", self.settings, self.legacy_keys, check)

  def _check_settings(self, moe) -> None:
    if self.validate_settings is not None:
      self.validate_settings(router_config(self, moe))

  def __post_init__(self):
    unknown = set(self.promises) - set(PROMISES)
    if unknown:
      raise ValueError(
        f"router {self.name!r}: unknown promises {sorted(unknown)}; known: {sorted(PROMISES)}"
      )

  def initial_state(self, num_experts: int) -> dict[str, jax.Array]:
    """The full `state` dict `route` expects at initialisation (state and params)."""
    return {
      **(self.init_state(num_experts) if self.init_state else {}),
      **(self.init_params(num_experts) if self.init_params else {}),
    }


# What a router may promise about its RouterOutput (RouterSpec.promises).
PROMISES = {
  # Per token, the valid slots' weights are c_t * probs[t, e] with one c_t > 0
  # (raw softmax weights, renormalised top-k, a routed scaling factor).
  "weights_proportional_to_probs",
}


ROUTERS: Registry[RouterSpec] = Registry("model.moe.router")


def register_router(
  name: str,
  *,
  init_state: Callable[[int], dict[str, jax.Array]] | None = None,
  causal: bool = True,
  validate: Callable[[RouterConfig], None] | None = None,
  init_params: Callable[[int], dict[str, jax.Array]] | None = None,
  update_state: Callable[[dict, dict, RouterConfig], dict] | None = None,
  accumulation_check: Callable[[RouterConfig], str | None] | None = None,
  promises: Iterable[str] = (),
  settings: Mapping[str, Any] | None = None,
  legacy_keys: Mapping[str, str] | None = None,
  validate_settings: Callable[[RouterConfig], None] | None = None,
  projection: RouterProjection | None = None,
  gives_probs: bool = True,
) -> Callable[[Route], Route]:
  """Decorator: register a pure routing function under `name` (see RouterSpec)."""

  def wrap(fn: Route) -> Route:
    ROUTERS.add(
      name,
      RouterSpec(
        name,
        fn,
        init_state,
        causal,
        validate,
        init_params,
        update_state,
        accumulation_check,
        frozenset(promises),
        tuple((settings or {}).items()),
        tuple((legacy_keys or {}).items()),
        validate_settings,
        projection,
        gives_probs,
      ),
    )
    return fn

  return wrap


get_router = ROUTERS.get


def router_config(spec: RouterSpec | str, moe) -> RouterConfig:
  """The RouterConfig of router `spec` (or its name) from `moe`, a model.moe
  ConfigDict: the one place that maps model.moe's routing keys to what routers
  read (ConfigError for a flat key of older configs in model.moe.routing or in
  its section; defaults where a hand-built `moe` lacks model.moe.routing)."""
  spec = get_router(spec) if isinstance(spec, str) else spec
  shared = ROUTING.parse(moe)
  return RouterConfig(
    num_experts=moe.num_experts,
    top_k=moe.top_k,
    renormalize=shared["renormalize"],
    routed_scaling_factor=shared["routed_scaling_factor"],
    bias_update_rate=shared["bias_update_rate"],
    capacity_factor=moe.capacity.factor,
    num_groups=shared["num_groups"],
    topk_groups=shared["topk_groups"],
    loss_weights=Settings(moe.loss_weights),
    settings=spec.config_section.parse(moe),
  )


def call_router(
  name: str,
  logits: jax.Array,
  moe,
  *,
  state: Mapping[str, jax.Array] | None = None,
  rng: jax.Array | None = None,
  train: bool = False,
) -> RouterOutput:
  """Router `name` on `logits` with its RouterConfig from `moe` (a model.moe
  ConfigDict); state: its initial state (RouterSpec.initial_state) where None.
  For tests and benchmarks: the MoE layer builds its RouterConfig once."""
  spec = get_router(name)
  state = spec.initial_state(moe.num_experts) if state is None else state
  return spec.route(logits, cfg=router_config(spec, moe), state=state, rng=rng, train=train)


def check_micro_batches(spec: RouterSpec, cfg: RouterConfig, micro_batches: int) -> None:
  """ConfigError unless `micro_batches` micro-batches give this router the
  one-batch training step (see the module doc); cfg: its RouterConfig."""
  if micro_batches == 1:
    return
  reason = spec.accumulation_check(cfg) if spec.accumulation_check is not None else None
  if not reason and spec.init_state is not None and spec.update_state is None:
    reason = (
      "its state is updated by every call and it has no update_state "
      "(moejax/routing/base.py), so micro-batches would update it once each"
    )
  if reason:
    raise ConfigError(
      f"train.micro_batches={micro_batches} is not supported with "
      f"model.moe.router={spec.name!r}: {reason}"
    )


def top_k_slots(scores: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """Top-k expert indices and their scores per token; ties go to the lower index."""
  values, index = jax.lax.top_k(scores, k)
  return values, index.astype(jnp.int32)
