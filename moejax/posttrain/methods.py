"""Every post-training method by name, without importing jax (for early flag
checks): three registries of `parts.Method`s (moejax/posttrain/parts.py: declared
settings bound once, the function imported on first use).

PRUNERS (`--method` of experiments.prune, prune.prune_model):
  kind 'expert'  select(stats, m, **settings) -> the m experts one MoE layer keeps:
                 distinct, sorted, in [0, E). stats: contributions.LayerStatistics
                 (gram, frequency, mass, block; `needs` names any other statistic it
                 reads, 'step_score'). `merge`: the method's own merge of the pruned
                 experts into the kept (prune.MERGES). A 'seed' is combined with
                 stats.block, so each layer draws its own.
                 SCHUR-A* (ICML 2026) and greedy forward selection minimise err(S) of
                 the `objective` (expert_subset.py); Step (ICML 2026) keeps the top m
                 by token-selective Taylor scores (taylor.py); the rankings by routing
                 frequency, router mass, output energy diag(G) or a random score.
  kind 'atom'    scores(sums, params=params, **settings) -> {block: [E, F]}: the value
                 of each SwiGLU hidden unit, from atoms.atom_sums; the top fraction
                 over every layer is kept (atoms.global_keep). HEAPr (ICLR 2026, arXiv
                 2509.22299): the factorised OBS cost (heapr_first_order: plus the
                 first-order term D1); the baselines ||w_gate_k|| ||w_up_k||
                 ||w_down_k|| and a random score.

QUANTIZERS (`--quantizer` of experiments.compress, compress.quantized_from_float):
  quantize(W [E, d_in, d_out], bits, group_size, hessians, **settings) -> per expert
  an object whose dequantize() is W_hat [d_in, d_out] float32 (quantize.py: x @ W,
  rows are input dims). kind 'integer': codes with a scale (and zero point) per
  group of group_size rows and one output column, stored by expert type
  'quantized': round to nearest, and GPTQ (Frantar et al. 2022, arXiv 2210.17323,
  Alg. 1), which `needs` hessians [E, d_in, d_in] (X_e^T X_e). kind 'codebook':
  2^bits k-means centroids per group of group_size rows (all columns), stored by
  'codebook' (CodeQuant, ICLR 2026, arXiv 2604.10496; codebook.py).

DECOMPOSITIONS (the factorised `--method`s of experiments.compress):
  decompose(W [E, d_in, d_out], budget, inputs=X, outputs=Y, **settings) -> an
  object with reconstruct() [E, d_in, d_out], `parameters` (what it stores: at most
  min(budget, E d_in d_out)) and `ranks`. kind 'joint': one Tucker model of the
  expert stack, stored by expert type 'factorised' (TD-MoE, ICLR 2026: whitened by
  the inputs X [n, d_in] and outputs Y [n, d_out]; `tucker` unwhitened); kind
  'per_expert': each expert's truncated SVD, plain or of S^T W_e (SVD-LLM style),
  a baseline no expert type stores. `needs`: 'inputs', 'outputs' read.

Besides: the compression pipeline's methods by family (`family`): bit allocations
over an integer quantizer, codebooks, and the decompositions.
"""

from moejax.errors import choice_error
from moejax.posttrain.parts import Method, Names, add, lookup, names
from moejax.registry import Registry

OBJECTIVES = ("rescaled", "no_rescale")  # expert_subset.py: err(S) with or without rescaling
# HEAPr's per-expert normalisation (atoms.py): divide by n_e, by n_e^2, or not at all
NORMALISATIONS = ("routed", "mean", "sum")
INITS = ("kmeans++", "quantile")  # codebook.py: k-means starts

PRUNERS: Registry[Method] = Registry("--method")
QUANTIZERS: Registry[Method] = Registry("--quantizer")
DECOMPOSITIONS: Registry[Method] = Registry("--method")

SUBSET = "moejax.posttrain.expert_subset"
ATOMS = "moejax.posttrain.atoms:atom_scores"


def _expert(name, function, settings=(), **extra) -> Method:
  choices = (("objective", OBJECTIVES),) if "objective" in dict(settings) else ()
  return add(PRUNERS, Method(name, "expert", f"{SUBSET}:{function}", settings, choices, **extra))


def _atom(name, score, settings=()) -> Method:
  choices = (("normalisation", NORMALISATIONS),) if "normalisation" in dict(settings) else ()
  return add(PRUNERS, Method(name, "atom", ATOMS, settings, choices, (("score", score),)))


OBJECTIVE = (("objective", "rescaled"),)
SEED = (("seed", 0),)
_expert("schur_astar", "select_astar", OBJECTIVE)
_expert("greedy", "select_greedy", OBJECTIVE)
_expert("step", "select_step", needs=("step_score",), merge="average")
_expert("step_no_merge", "select_step", needs=("step_score",))
_expert("frequency", "select_frequency")
_expert("router_mass", "select_mass")
_expert("output_norm", "select_output_norm")
_expert("random", "select_random", SEED)
_atom("heapr", "heapr", (("normalisation", "routed"),))
_atom("heapr_first_order", "heapr_first_order", (("normalisation", "routed"),))
_atom("atom_magnitude", "magnitude")
_atom("atom_random", "random", SEED)

add(
  QUANTIZERS,
  Method("rtn", "integer", "moejax.posttrain.quantize:rtn_experts", (("symmetric", False),)),
)
add(
  QUANTIZERS,
  Method(
    "gptq",
    "integer",
    "moejax.posttrain.quantize:gptq_experts",
    (("symmetric", False), ("damp", 0.01)),
    needs=("hessians",),
  ),
)
add(
  QUANTIZERS,
  Method(
    "kmeans",
    "codebook",
    "moejax.posttrain.codebook:kmeans_experts",
    (("iterations", 100), ("init", "kmeans++"), ("seed", 0)),
    (("init", INITS),),
  ),
)

DECOMPOSE = "moejax.posttrain.factorise"
DAMPING = ("damping", 1e-6)  # whitening: C = X^T X / n + damping * mean(diag) I (tucker.py)
HOOI = ("iterations", 5)  # HOOI sweeps after the HOSVD start
add(
  DECOMPOSITIONS,
  Method(
    "td_moe",
    "joint",
    f"{DECOMPOSE}:td_moe_experts",
    (DAMPING, HOOI),
    needs=("inputs", "outputs"),
  ),
)
add(DECOMPOSITIONS, Method("tucker", "joint", f"{DECOMPOSE}:tucker_experts", (HOOI,)))
add(DECOMPOSITIONS, Method("svd", "per_expert", f"{DECOMPOSE}:svd_experts"))
add(
  DECOMPOSITIONS,
  Method(
    "whitened_svd",
    "per_expert",
    f"{DECOMPOSE}:whitened_svd_experts",
    (DAMPING,),
    needs=("inputs",),
  ),
)

# Names as the tuples these registries replace had them (live views).
METHODS = Names(lambda: names(PRUNERS))
EXPERT_METHODS = Names(lambda: names(PRUNERS, "expert"))
ATOM_METHODS = Names(lambda: names(PRUNERS, "atom"))
INTEGER_QUANTIZERS = Names(lambda: names(QUANTIZERS, "integer"))

# The compression pipeline's methods (compress_pipeline.py), by family.
QUANTIZED = ("uniform", "per_layer", "gemq")  # bit allocations over an integer quantizer
CODEBOOK = ("kmeans", "codequant")  # codebooks: plain k-means, CodeQuant
COMPRESSION = Names(lambda: QUANTIZED + CODEBOOK + names(DECOMPOSITIONS))


def family(method: str, key: str = "--method") -> str:
  """'quantized', 'codebook' or 'factorised' (a decomposition); ConfigError naming
  `key` for a name that is none of them."""
  if method in QUANTIZED:
    return "quantized"
  if method in CODEBOOK:
    return "codebook"
  if method in DECOMPOSITIONS:
    return "factorised"
  raise choice_error(key, method, COMPRESSION)


def pruner(name: str, key: str | None = None) -> Method:
  return lookup(PRUNERS, name, key)


def integer_quantizer(name: str, key: str = "--quantizer") -> Method:
  """A quantizer whose codes the 'quantized' expert type stores."""
  return lookup(QUANTIZERS, name, key, kind="integer")


def decomposition(name: str, key: str | None = None) -> Method:
  return lookup(DECOMPOSITIONS, name, key)
