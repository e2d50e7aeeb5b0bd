"""The method catalogue that scripts/method_pages.py writes docs/methods/ from: per
kind of registered part and per study, the paper, a one-line mechanism, what is a
guess, the tests, the command and the related studies. A registered part without an
entry here gets no page, and tests/docs/test_doc_coverage.py fails until it has one."""

import dataclasses

KINDS = (
  "router",
  "expert type",
  "dispatcher",
  "loss",
  "grouped matmul",
  "post-training method",
  "merge method",
  "merged experts",
  "prompt adapter",
  "attention adapter",
  "distillation method",
  "attack",
  "study",
)

# Papers as the project's paper lists (shared/specs/PAPERS.md) and the classics name them.
ICML, ICLR = "ICML 2026", "ICLR 2026"
PAPERS = {
  "shazeer": (
    "Outrageously Large Neural Networks: The Sparsely-Gated MoE Layer",
    "ICLR 2017",
    "1701.06538",
  ),
  "gshard": ("GShard", "ICLR 2021", "2006.16668"),
  "switch": ("Switch Transformers", "JMLR 2022", "2101.03961"),
  "st_moe": ("ST-MoE", "arXiv 2022", "2202.08906"),
  "expert_choice": ("Mixture-of-Experts with Expert Choice Routing", "NeurIPS 2022", "2202.09368"),
  "deepseek_v3": ("DeepSeek-V3 Technical Report", "arXiv 2024", "2412.19437"),
  "glu": ("GLU Variants Improve Transformer", "arXiv 2020", "2002.05202"),
  "megablocks": ("MegaBlocks", "MLSys 2023", "2211.15841"),
  "sonicmoe": ("SonicMoE", ICLR, "2512.14080"),
  "capacity_aware": ("Capacity-Aware Token Drop / Expanded Drop", ICLR, "2503.05066"),
  "super_experts": ("Super Experts", ICLR, "2507.23279"),
  "routing_contributions": (
    "Cross-layer contributions to MoE routing (OpenReview BqyPLOkxFY)",
    ICLR,
    "",
  ),
  "heapr": ("HEAPr", ICLR, "2509.22299"),
  "td_moe": ("TD-MoE", ICLR, None),
  "fedgem": ("FedGEM", ICLR, "2601.21160"),
  "molr_mog": ("MoLR-MoG", ICLR, "2601.01475"),
  "codequant": ("CodeQuant", ICLR, "2604.10496"),
  "sere": ("SERE", ICLR, "2602.07616"),
  "tmow": ("TMoW (Test-time Mixture of World Models)", ICLR, "2601.22647"),
  "moe_edit": ("MoEEdit: knowledge editing through the experts", ICLR, "2602.10965"),
  "schur_astar": ("SCHUR-A*", ICML, None),
  "dpsl": ("DPSL", ICML, "2510.01185"),
  "smooth_smoe": ("SmoothSMoE", ICML, "2606.19036"),
  "l3": ("L3 Large Lookup Layer", ICML, "2601.21461"),
  "as_coot": ("TiME / As-COOT", ICML, None),
  "probmoe": ("ProbMoE", ICML, "2606.01509"),
  "mgfa": ("MGFA (mixtures of geodesic factor analysers)", ICML, None),
  "mp_moe": ("MP-MoE: Breaking the Echo Chamber", ICML, None),
  "omnimoe": ("OmniMoE", ICML, "2602.05711"),
  "gemq": ("GEMQ", ICML, "2605.23078"),
  "ace": ("ACE", ICML, None),
  "step": ("Step: Less Token, More Signal", ICML, None),
  "hartigan": ("Lloyd vs Hartigan k-means", ICML, "2602.09936"),
  "gptq": ("GPTQ", "ICLR 2023", "2210.17323"),
  "repetition_curse": ("RepetitionCurse", ICML, "2512.23995"),
  "task_arithmetic": ("Editing Models with Task Arithmetic", "ICLR 2023", "2212.04089"),
  "ties": (
    "TIES-Merging: Resolving Interference When Merging Models",
    "NeurIPS 2023",
    "2306.01708",
  ),
  "model_soups": (
    "Model soups: averaging weights of multiple fine-tuned models",
    "ICML 2022",
    "2203.05482",
  ),
  "thickets": ("Neural Thickets (RandOpt)", ICML, "2603.12228"),
  "mergemix": (
    "MergeMix: Optimizing Mid-Training Data Mixtures via Learnable Model Merging",
    ICML,
    "2601.17858",
  ),
  "overtrained_experts": (
    "From Memorization to Parameter Interference: How Overtraining Experts Harms Model Merging",
    ICML,
    "2506.14126",
  ),
  "namex": ("NAMEx: Nash Merging of Experts", ICLR, "2510.16138"),
  "smear": ("Soft Merging of Experts with Adaptive Routing (SMEAR)", "TMLR 2024", "2306.03745"),
  "camex": ("CAMEx: Curvature-aware Merging of Experts", "ICLR 2025", "2502.18821"),
  "prism_moe": ("Prism-MoE: dense-to-MoE conversion", ICML, None),
  "vpt": ("Visual Prompt Tuning", "ECCV 2022", "2203.12119"),
  "lora_mixer": ("LoRA-Mixer", ICLR, "2507.00029"),
  "residual_kd": ("Knowledge distillation through residual learning", ICLR, None),
  "hinton_kd": ("Distilling the Knowledge in a Neural Network", "arXiv 2015", "1503.02531"),
  "fitnets": ("FitNets: Hints for Thin Deep Nets", "ICLR 2015", "1412.6550"),
  "vapt": (
    "Adaptive Prompt: Unlocking the Power of Visual Prompt Tuning (VAPT)",
    ICLR,
    "2501.18936",
  ),
  "smope": ("SMoPE: Sparse Mixture of Prompt Experts", ICLR, "2509.24483"),
  "flyprompt": (
    "FlyPrompt: Brain-Inspired Random-Expanded Routing with Temporal-Ensemble Experts",
    ICLR,
    "2602.01976",
  ),
  "bayesian_moe_vqa": ("Calibrated Bayesian mixture-of-experts for continual VQA", ICML, None),
  "tlga": (
    "Temporal Lipschitz-guided attacks and adversarial training of video MoE "
    "classifiers (TLGA, J-TLGA, J-TLAT)",
    ICLR,
    "2602.01369",
  ),
}


@dataclasses.dataclass(frozen=True)
class Entry:
  title: str
  summary: str
  paper: str | None = None  # a PAPERS key; None: a baseline or an engineering part
  guess: str = (
    "Nothing reconstructed: the implementation follows the paper's text or its "
    "official code (or is a standard part); differences, if any, are in the source "
    "above."
  )
  tests: tuple[str, ...] = ()
  studies: tuple[str, ...] = ()  # configs/studies/<name>.py whose outputs show it
  results: tuple[str, ...] = ()  # further result files under docs/results/
  command: str | None = None  # None: the kind's default
  page: str | None = None  # None: the name


E = Entry
ROUTER_TESTS = ("tests/contract/test_router_contract.py",)
ENTRIES = {
  "router": {
    "topk": E(
      "Top-k softmax router",
      "Softmax over the expert logits, the k largest kept, renormalised (optional jitter).",
      "shazeer",
      tests=("tests/routing/test_routers.py",),
      studies=("routers", "routers_seeds"),
    ),
    "capacity_aware": E(
      "Capacity-aware token drop and expanded drop",
      "At inference, each expert keeps its "
      "top-C tokens by score (gamma sets C); "
      "expanded drop re-routes the dropped "
      "tokens to r extra experts.",
      "capacity_aware",
      tests=("tests/routing/test_capacity_aware.py",),
      studies=("router_inference_capacity",),
    ),
    "expert_choice": E(
      "Expert choice",
      "Each expert picks its top-C tokens (non-causal: flagged unusable for generation).",
      "expert_choice",
      tests=("tests/routing/test_routers.py",),
      studies=("routers",),
    ),
    "sigmoid_bias": E(
      "Sigmoid gates with the aux-loss-free bias",
      "Sigmoid scores; a non-trained "
      "per-expert bias, moved against the "
      "load after each step, decides the "
      "top-k but not the weights.",
      "deepseek_v3",
      tests=("tests/routing/test_routers.py",),
      studies=("routers", "routers_seeds"),
    ),
    "group_limited": E(
      "Group-limited top-k",
      "Experts in groups; each token picks its best groups first, then its top-k inside them.",
      "deepseek_v3",
      tests=("tests/routing/test_group_limited.py",),
    ),
    "mahalanobis": E(
      "MP-MoE Mahalanobis routing",
      "An EMA covariance of expert "
      "co-activation; each token greedily "
      "chooses the k experts that maximise "
      "g_S^T Sigma_S^-1 g_S.",
      "mp_moe",
      guess="The objective's form and plain top-k at inference "
      "are guesses (the spec had no paper text).",
      tests=("tests/routing/test_mahalanobis.py",),
      studies=("routers", "routers_seeds"),
    ),
    "as_coot": E(
      "As-COOT semi-relaxed optimal-transport routing",
      "A Sinkhorn plan per slot with the "
      "expert marginal held uniform and the "
      "token side relaxed by tau KL; tokens "
      "go to their top entries of the plan.",
      "as_coot",
      guess="The whole mechanism is reconstructed from the abstract "
      "and COOT (Redko et al. 2020): the paper's text was not "
      "read.",
      tests=("tests/routing/test_optimal_transport.py",),
      studies=("router_inference_as_coot",),
    ),
    "probmoe": E(
      "ProbMoE conditional-Bernoulli routing",
      "Exact-k (or dynamic-k) sampling of a "
      "conditional Bernoulli by a log-space "
      "DP; marginals by autograd; "
      "straight-through weights.",
      "probmoe",
      guess="The official code has two variants (log q detached or "
      "kept); both are settings (probmoe.detach_log_q).",
      tests=("tests/routing/test_probmoe.py",),
      studies=("routers", "routers_seeds"),
    ),
    "product_key": E(
      "OmniMoE product-key router",
      "Two maps to sqrt(N) logits each, "
      "BatchNorm, log-softmax; the score of "
      "atomic expert (i, j) is their sum; "
      "exact top-k over the grid.",
      "omnimoe",
      tests=("tests/experts/test_omnimoe.py",),
    ),
    "prototype": E(
      "TMoW prototype router",
      "Top-k of softmax(cos(x, prototype_e) / tau): "
      "each expert has a prototype refined at test "
      "time.",
      "tmow",
      tests=("tests/routing/test_prototype_router.py", "tests/online/test_tmow.py"),
      studies=("tmow",),
    ),
    "sere": E(
      "SERE similarity-based expert re-routing",
      "At decode, a token's secondary "
      "experts are re-routed to similar "
      "experts already in use by the batch "
      "(similarity by linear CKA), so fewer "
      "distinct experts run.",
      "sere",
      tests=("tests/routing/test_sere.py", "tests/analysis/test_router_inference.py"),
      studies=("router_inference_sere",),
    ),
    "smooth_topk": E(
      "SmoothSMoE smooth top-k",
      "A trained band eta around the k-th logit: "
      "weights fall continuously to zero across "
      "it, so routing is continuous where top-k "
      "jumps.",
      "smooth_smoe",
      guess="The official dispatch keeps k slots where k+1 "
      "are needed; moejax keeps k+1 (not copied).",
      tests=("tests/routing/test_smooth_topk.py",),
      studies=("routers", "routers_seeds"),
    ),
    "topk_rounded": E(
      "Token rounding (SonicMoE)",
      "Top-k, then each expert's token count "
      "rounded to a multiple of the tile by "
      "dropping its weakest or adding its "
      "strongest non-top-k tokens; no padding "
      "waste.",
      "sonicmoe",
      guess="Training with rounding and evaluating with plain top-k is a guess.",
      tests=("tests/routing/test_token_rounding.py",),
      studies=("token_rounding_seeds",),
    ),
  },
  "expert type": {
    "swiglu": E(
      "SwiGLU experts",
      "down(silu(gate(x)) * up(x)) per expert, each a slice of three [E, a, b] weights.",
      "glu",
      tests=("tests/contract/test_expert_contract.py",),
      studies=("expert_types",),
    ),
    "atomic": E(
      "OmniMoE atomic experts",
      "An expert is one pair (u_i, d_i): act(x u_i) "
      "d_i, thousands of them, chosen by the "
      "product-key router.",
      "omnimoe",
      tests=("tests/experts/test_omnimoe.py", "tests/contract/test_expert_contract.py"),
      studies=("expert_types",),
    ),
    "codebook": E(
      "Codebook experts (CodeQuant)",
      "Per-group (or per-output-column) k-means indices and "
      "centroids, bits per expert, an optional "
      "Hadamard rotation; decoded inside the "
      "expert; optional activation fake-quantization (act_bits).",
      "codequant",
      tests=("tests/experts/test_codebook_experts.py", "tests/experts/test_activation_quant.py"),
      studies=("codequant",),
    ),
    "codebook_rotated": E(
      "Codebook experts with learned rotations (CodeQuant)",
      "Codebook experts whose every input is rotated by a stored, learned "
      "orthogonal matrix (Hadamard start) before it is quantized: CodeQuant's "
      "W4A4 / W4A8 form.",
      "codequant",
      tests=("tests/experts/test_activation_quant.py", "tests/posttrain/test_codebook.py"),
      studies=("codequant",),
    ),
    "factorised": E(
      "Factorised experts (TD-MoE)",
      "Shared Tucker input and output "
      "factors, a per-expert factor and core; "
      "full rank equals SwiGLU.",
      "td_moe",
      tests=("tests/experts/test_factorised.py",),
      studies=("td_moe",),
    ),
    "quantized": E(
      "Quantized experts",
      "Per-group integer codes, scales and zero points, "
      "bits per expert; dequantized inside the expert "
      "(codes are not trained); optional activation fake-quantization (act_bits).",
      "gemq",
      tests=("tests/experts/test_quantized.py", "tests/experts/test_activation_quant.py"),
      studies=("gemq",),
    ),
  },
  "dispatcher": {
    "capacity": E(
      "Capacity dispatch (GShard)",
      "Each expert takes at most C = "
      "capacity.factor x T k / E tokens in "
      "GShard's priority order; the rest are "
      "dropped and counted.",
      "gshard",
      tests=("tests/dispatch/test_dispatch.py",),
    ),
    "dropless": E(
      "Dropless dispatch",
      "Assignments sorted by expert into tile-padded row "
      "groups; the experts run through the configured "
      "grouped matmul; nothing dropped.",
      "megablocks",
      tests=("tests/dispatch/test_dispatch.py", "tests/contract/test_expert_contract.py"),
    ),
    "dropless_memeff": E(
      "Memory-efficient dropless (SonicMoE backward)",
      "The expert type's fused path: a "
      "custom VJP that keeps no [T k, d] "
      "residual and recomputes what the "
      "backward needs.",
      "sonicmoe",
      tests=("tests/dispatch/test_memeff.py",),
    ),
  },
  "loss": {
    "load_balance": E(
      "Load-balance loss",
      "E * sum_e f_e P_e: the fraction of slots "
      "routed to e times its mean router probability "
      "(Switch eq. 4).",
      "switch",
      tests=("tests/losses/test_balance.py",),
    ),
    "z_loss": E(
      "Router z-loss",
      "The mean over tokens of logsumexp(logits)^2 (ST-MoE eq. 5).",
      "st_moe",
      tests=("tests/losses/test_balance.py",),
    ),
    "dpsl": E(
      "DPSL (Dirichlet prior shaping loss)",
      "Each expert's sorted column of router "
      "probabilities is pulled to the "
      "quantiles of its Beta marginal under "
      "a Dirichlet(alpha) prior.",
      "dpsl",
      guess="The distance (a Cramer-von-Mises-like form) is a guess.",
      tests=("tests/losses/test_dpsl.py",),
      studies=("routers", "routers_seeds"),
    ),
    "smooth_boundary": E(
      "SmoothSMoE boundary loss",
      "alpha * eta * (mean number of active experts - (k + 0.5)): keeps the smooth band narrow.",
      "smooth_smoe",
      tests=("tests/routing/test_smooth_topk.py",),
      studies=("routers_seeds",),
    ),
    "rsl": E(
      "RSL (LoRA-Mixer's routing specialization loss)",
      "w_b E sum_i f_i Pbar_i + w_s mean_t H(p_t) - w_m H(Pbar): balanced load, decisive "
      "tokens, a used marginal; minimal at one-hot tokens with a uniform marginal.",
      "lora_mixer",
      guess="The form and the fixed weights (1, 1, 1) are guesses: the paper's code is not "
      "released and its weights adapt during training.",
      tests=("tests/losses/test_rsl.py",),
      studies=("lora_mixer",),
    ),
  },
  "grouped matmul": {
    "loop": E(
      "Loop grouped matmul",
      "A fori_loop over row blocks, each one plain matmul "
      "against its expert's weight slice read in place.",
      tests=("tests/dispatch/test_memeff.py", "tests/contract/test_expert_contract.py"),
      results=("moe_layer_2026-12-02_cpu.md",),
    ),
    "tiled": E(
      "Tiled grouped matmul",
      "One batched einsum over all tiles, each tile times "
      "its expert's weight slice gathered per tile.",
      tests=("tests/contract/test_expert_contract.py", "tests/train/test_layouts.py"),
      results=("moe_layer_2026-11-30_cpu.md",),
    ),
    "ragged_dot": E(
      "ragged_dot grouped matmul",
      "jax.lax.ragged_dot on the padded groups (portable; on CPU a masked dense dot).",
      tests=("tests/contract/test_expert_contract.py",),
      results=("gpu_h200_2026-11-30.md",),
    ),
    "gmm": E(
      "Pallas grouped matmul (gmm/tgmm)",
      "The Pallas kernel: Mosaic on TPU, Triton "
      "on GPU, with a custom VJP (tgmm for the "
      "weight gradient); on CPU its jnp "
      "reference or interpret mode.",
      "megablocks",
      tests=(
        "tests/kernels/test_gmm_kernels.py",
        "tests/kernels/test_gmm_grad.py",
        "tests/kernels/test_gpu_tiling.py",
      ),
      results=("gpu_h200_2026-11-30.md",),
    ),
    "fused": E(
      "Fused expert path",
      "The expert type's own whole-layer path (SwiGLU: SonicMoE's memory-efficient block loop).",
      "sonicmoe",
      tests=("tests/dispatch/test_memeff.py",),
      results=("moe_layer_2026-12-02_cpu.md",),
    ),
    "gather": E(
      "Token-gather grouped matmul",
      "No sort: each (token, slot) row times its "
      "own expert's weight slice, gathered; for "
      "decode-sized calls.",
      tests=("tests/dispatch/test_token_gather.py",),
      results=("generate_cpu.md",),
    ),
    "auto": E(
      "Automatic grouped matmul",
      "gather for decode-sized calls; else gmm on "
      "TPU/GPU, and on CPU fused (if the expert type "
      "has it) or loop.",
      tests=("tests/dispatch/test_token_gather.py", "tests/contract/test_expert_contract.py"),
    ),
  },
  "post-training method": {
    "schur_astar": E(
      "SCHUR-A* expert pruning",
      "A* over include/exclude decisions on the "
      "Gram of routed expert contributions, with "
      "an admissible Schur-complement bound; "
      "optimal kept set per layer.",
      "schur_astar",
      guess="All of it (abstract only): the objective, the "
      "bound and the knee budget are reconstructed.",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning", "pruning_knee"),
      page="schur_astar",
    ),
    "greedy": E(
      "Greedy expert selection",
      "Forward selection on the same objective as SCHUR-A*.",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning",),
    ),
    "step": E(
      "Step expert pruning (with merge)",
      "Token-selective Taylor scores on the "
      "highest-loss calibration tokens; the "
      "pruned experts merged into the most "
      "similar kept ones.",
      "step",
      guess="All of it (abstract only): token selection, the score and the merge rule.",
      tests=("tests/posttrain/test_taylor.py", "tests/posttrain/test_expert_subset.py"),
      studies=("pruning",),
    ),
    "step_no_merge": E(
      "Step expert pruning (scores only)",
      "Step's token-selective Taylor scores without the merge.",
      "step",
      guess="As for step.",
      tests=("tests/posttrain/test_taylor.py",),
      studies=("pruning",),
    ),
    "frequency": E(
      "Frequency pruning (baseline)",
      "Keep the experts routed to most often on the calibration tokens.",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning",),
    ),
    "router_mass": E(
      "Router-mass pruning (baseline)",
      "Keep the experts with the largest summed router weight.",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning",),
    ),
    "output_norm": E(
      "Output-norm pruning (baseline)",
      "Keep the experts whose routed outputs have the largest norm.",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning",),
    ),
    "random": E(
      "Random pruning (baseline)",
      "Keep m experts per layer uniformly at random (seeded).",
      tests=("tests/posttrain/test_expert_subset.py",),
      studies=("pruning",),
    ),
    "heapr": E(
      "HEAPr atom pruning",
      "Per-atom (expert hidden unit) second-order OBS "
      "scores from one backward pass per batch, ranked over "
      "all layers; atoms removed.",
      "heapr",
      tests=("tests/posttrain/test_atoms.py", "tests/posttrain/test_prune_workdir.py"),
      studies=("pruning",),
    ),
    "heapr_first_order": E(
      "HEAPr, first-order atom scores",
      "HEAPr's ranking with a first-order "
      "score (ours; it tracks the "
      "brute-force loss change better here).",
      "heapr",
      guess="This variant is ours, not the paper's.",
      tests=("tests/posttrain/test_atoms.py",),
      studies=("pruning",),
    ),
    "atom_magnitude": E(
      "Atom magnitude pruning (baseline)",
      "Rank atoms by weight magnitude.",
      tests=("tests/posttrain/test_atoms.py",),
      studies=("pruning",),
    ),
    "atom_random": E(
      "Random atom pruning (baseline)",
      "Rank atoms at random (seeded).",
      tests=("tests/posttrain/test_atoms.py",),
      studies=("pruning",),
    ),
    "rtn": E(
      "Round-to-nearest quantizer (--quantizer=rtn)",
      "Symmetric per-group integer grid; each weight rounded to its nearest level. "
      "The quantizer every bit allocation (uniform, per_layer, gemq) can use.",
      tests=("tests/posttrain/test_quantize.py", "tests/contract/test_posttrain_parts_contract.py"),
      studies=("gemq",),
    ),
    "gptq": E(
      "GPTQ quantizer (--quantizer=gptq)",
      "Columns quantized one at a time, each rounding error spread over the "
      "remaining columns through the inverse Hessian of the expert's routed inputs.",
      "gptq",
      tests=("tests/posttrain/test_quantize.py", "tests/contract/test_posttrain_parts_contract.py"),
      studies=("gemq",),
    ),
    "uniform": E(
      "Uniform quantization (baseline)",
      "Every expert at the same integer bit width (RTN or GPTQ).",
      "gptq",
      tests=("tests/posttrain/test_quantize.py", "tests/posttrain/test_compress_workdir.py"),
      studies=("gemq",),
    ),
    "per_layer": E(
      "Per-layer bit allocation",
      "GEMQ's costs with each layer allocated alone at the same average bits.",
      "gemq",
      tests=("tests/posttrain/test_bit_allocation.py",),
      studies=("gemq",),
    ),
    "gemq": E(
      "GEMQ mixed-precision expert quantization",
      "Fisher-weighted per-expert costs at "
      "each bit width, one global "
      "multiple-choice knapsack, GPTQ, "
      "router fine-tuning, progressive "
      "rounds.",
      "gemq",
      tests=(
        "tests/posttrain/test_gemq.py",
        "tests/posttrain/test_bit_allocation.py",
        "tests/posttrain/test_compress_workdir.py",
      ),
      studies=("gemq",),
      results=("posttrain/gemq_control_zoo_s.md",),
    ),
    "kmeans": E(
      "Codebook quantization by k-means (baseline)",
      "Lloyd's k-means per weight group, no "
      "rotation: CodeQuant without its "
      "rotation and fine-tuning.",
      tests=("tests/posttrain/test_codebook.py",),
      studies=("codequant",),
      page="codebook_kmeans",
    ),
    "codequant": E(
      "CodeQuant codebook quantization",
      "Hadamard or learned rotation, k-means "
      "codebooks per group or per output column, centroids fine-tuned on "
      "each expert's routed inputs, then re-clustered; weights and "
      "activations (W4A4 / W4A8) in the study.",
      "codequant",
      tests=("tests/posttrain/test_codebook.py", "tests/experts/test_codebook_experts.py"),
      studies=("codequant",),
    ),
    "td_moe": E(
      "TD-MoE whitened joint Tucker",
      "One layer's experts stacked and "
      "factorised jointly (whitened Tucker), "
      "ranks allocated over the modes and layers "
      "under one budget.",
      "td_moe",
      guess="Built from a paper note and a third-party reimplementation, not the official code.",
      tests=("tests/posttrain/test_tucker.py", "tests/experts/test_factorised.py"),
      studies=("td_moe",),
    ),
    "tucker": E(
      "Joint Tucker without whitening",
      "TD-MoE's factorisation on the raw weights.",
      "td_moe",
      tests=("tests/posttrain/test_tucker.py",),
      studies=("td_moe",),
    ),
    "svd": E(
      "Per-expert truncated SVD (baseline)",
      "Each expert's weights cut to the rank that matches the parameter budget.",
      tests=("tests/posttrain/test_tucker.py",),
      studies=("td_moe",),
    ),
    "whitened_svd": E(
      "Whitened per-expert SVD (baseline)",
      "Per-expert SVD of the input-whitened weights (SVD-LLM style).",
      tests=("tests/posttrain/test_tucker.py",),
      studies=("td_moe",),
    ),
  },
}
MERGE_TESTS = ("tests/merging/test_merging.py", "tests/merging/test_merge_cli.py")
ENTRIES["merge method"] = {
  "task_arithmetic": E(
    "Task arithmetic",
    "base + scale * sum_i w_i (theta_i - base): a "
    "weighted, scaled sum of task vectors; one-hot "
    "weights return that model exactly.",
    "task_arithmetic",
    tests=MERGE_TESTS,
  ),
  "ties": E(
    "TIES-merging",
    "Trim each task vector to its largest-magnitude entries, elect "
    "each entry's sign by summed mass, average the entries that "
    "agree (disjoint mean).",
    "ties",
    guess="Weighted steps 2 and 3 are ours (the paper has no weights); the "
    "trim is global over the model, as the paper's code does.",
    tests=MERGE_TESTS,
  ),
  "nash": E(
    "Nash-bargaining merge (NAMEx)",
    "Task vectors bargain for one update direction "
    "d = G alpha with (G^T G) alpha = 1/alpha "
    "(NAMEx eqs. 7-9): every model gains, d^T tau_j "
    "= 1/alpha_j > 0; theta = base + scale * d.",
    "namex",
    guess="The scale of the bargained direction (NAMEx's gamma) when "
    "merging whole models is ours; non-uniform weights as bargaining "
    "powers are our extension. NAMEx's training-time layer is the "
    "merged experts 'namex' (model.moe.merge).",
    tests=MERGE_TESTS + ("tests/merging/test_nash.py",),
  ),
  "mergemix": E(
    "MergeMix: merging weights as a data-mixture proxy",
    "theta(alpha) = base + sum_k alpha_k (theta_k - base), alpha on the simplex: the "
    "merge of K domain experts scored in place of training on the mixture alpha; a "
    "one-hot alpha returns that expert exactly.",
    "mergemix",
    guess="The paper optimises alpha against downstream benchmarks; here an exhaustive "
    "simplex grid over a held-out loss.",
    tests=MERGE_TESTS + ("tests/merging/test_mergemix.py", "tests/merging/test_mergemix_hf.py"),
    studies=("mergemix",),
  ),
  "average": E(
    "Weight averaging",
    "sum_i w_i theta_i with weights on the simplex; Step's "
    "expert merge applies it to one layer's experts, weighted "
    "by routing mass.",
    "model_soups",
    tests=MERGE_TESTS + ("tests/posttrain/test_surgery.py",),
  ),
}
PROMPT_TESTS = ("tests/vision/test_prompts.py",)
PROMPT_COMMAND = (
  "python -m experiments.train --config=configs/vit_digits_moe.py "
  "--workdir=runs/x \\\n    --config.model.scan_layers=False "
  "--config.model.vit.prompt.adapter={name} --config.train.trainable=prompt"
)
ENTRIES["prompt adapter"] = {
  "vpt_shallow": E(
    "VPT-shallow: prompt tokens at the first block",
    "N learned tokens inserted after the CLS token at the first block's "
    "input; the same for every image.",
    "vpt",
    tests=PROMPT_TESTS,
    command=PROMPT_COMMAND.format(name="vpt_shallow"),
  ),
  "vpt_deep": E(
    "VPT-deep: prompt tokens at every block",
    "N learned tokens per block, replacing the prompt slots at every block's "
    "input (L N d parameters); the same for every image.",
    "vpt",
    tests=PROMPT_TESTS,
    command=PROMPT_COMMAND.format(name="vpt_deep"),
  ),
  "vapt": E(
    "VAPT: adaptive prompt experts",
    "Each block's prompts generated from its input patch tokens: LayerNorm, one "
    "k x k kernel shared by all channels over the patch grid, a zero-initialised "
    "token-wise projection to N tokens, plus a shared bottleneck MLP with a "
    "residual (prompts exactly 0 at initialisation).",
    "vapt",
    guess="Prompts generated at every block, the first included (the official code "
    "gives the first block a learned VPT prompt); its dropouts left out; "
    "LayerNorm eps, ReLU and the kernel's N(0, 1) draw as its defaults.",
    tests=PROMPT_TESTS,
    studies=("vapt",),
    command=PROMPT_COMMAND.format(name="vapt"),
  ),
  "smope": E(
    "SMoPE: a sparse mixture of prompt experts",
    "One shared prefix of N key/value prompt experts in the attention of the first "
    "blocks; each image and head attends to the K experts with the highest proxy "
    "score, the mean query's logit (= the mean of the per-query logits), and the "
    "selected experts' logits are that score for every query. Usage after each task "
    "penalises experts earlier tasks used often (training) and excludes unused ones "
    "(evaluation). The official router losses join the training loss: a margin "
    "cross-entropy on the selected scores and an old-key prototype loss (weights 1e-5).",
    "smope",
    guess="The usage penalties and both router losses follow the official code "
    "(deterministic offsets, not noise; the losses are not in the paper's text); a head "
    "with no frequent expert adds 0 to the prototype loss (NaN there); the dense "
    "first-task warm-up is the continual-learning loop's, with no router loss.",
    tests=(
      "tests/vision/test_smope.py",
      "tests/vision/test_smope_router_losses.py",
      "tests/vision/test_class_stream.py",
    ),
    studies=("smope",),
    command=PROMPT_COMMAND.format(name="smope"),
  ),
}
ENTRIES["attention adapter"] = {
  "lora_mixer": E(
    "LoRA-Mixer: token-routed LoRA experts on the attention projections",
    "Each adapted projection (q, k, v, o; or the dense FFN's gate, up, down, the MoE-LoRA "
    "baseline's place) becomes W x + sum over the top-k of g_i B_i A_i x, "
    "g from a per-projection token router softmax(W_r x); B starts at 0 (the base exactly). "
    "Hard-soft routing: g = hard + p - stop_gradient(p), the hard top-k forward and the "
    "softmax's gradient. Trained on a frozen base (train.trainable='adapter'), or routers "
    "only over frozen LoRAs ('adapter_router'); router losses by name (RSL, load balance).",
    "lora_mixer",
    guess="The paper's code is not released: the straight-through form of its hard-soft "
    "routing (hard = 1/k on the chosen experts), no alpha / r scaling, the router init, "
    "and RSL's form and fixed weights are guesses; grouped-query attention only.",
    tests=("tests/adapters/test_lora_mixer.py", "tests/losses/test_rsl.py"),
    studies=("lora_mixer",),
    command="python -m experiments.train --config=configs/lora_mixer.py \\\n"
    "    --config.init.hf_dir=runs/base/converted --workdir=runs/lora_mixer",
  ),
}
ATTACK_TESTS = (
  "tests/contract/test_attack_contract.py",
  "tests/attacks/test_attacks.py",
  "tests/attacks/test_adversarial_training.py",
)
ATTACK_COMMAND = "python -m experiments.study --config=configs/studies/video_attacks.py"
ATTACK_GUESS = (
  "The paper's router and expert losses, their weights (lambda_router = lambda_expert = "
  "0.1 here) and its per-frame step rule are reconstructed from its description: the "
  "router term is the mean log-probability of the k experts the router trusts least on "
  "the clean input, the expert term the relative squared change of each MoE layer's "
  "output, and a frame's step is alpha times T times its share of the frames' gradient "
  "norms. J-TLAT's stage schedule (one step each of router, expert, joint) is a guess."
)
ENTRIES["attack"] = {
  "pgd": E(
    "PGD: projected gradient descent on the cross-entropy (l-infinity)",
    "Sign steps of size alpha on the cross-entropy, each projected back into the "
    "epsilon ball around the input and the pixel range; the baseline the router "
    "attacks are measured against, and what PGD adversarial training trains on.",
    None,
    tests=ATTACK_TESTS,
    studies=("video_attacks",),
    command=ATTACK_COMMAND,
  ),
  "tlga_r": E(
    "TLGA-R: the routers steered to their least-trusted experts",
    "Maximises the mean over MoE layers and tokens of the summed log router probability "
    "of the k experts with the lowest clean probability, with per-frame steps scaled by "
    "each frame's gradient norm (a local Lipschitz estimate); reads no label.",
    "tlga",
    guess=ATTACK_GUESS,
    tests=ATTACK_TESTS,
    studies=("video_attacks",),
    command=ATTACK_COMMAND,
  ),
  "j_tlga": E(
    "J-TLGA: the joint attack (cross-entropy, router and expert terms)",
    "Maximises CE + lambda_R L_router + lambda_E L_expert with TLGA's per-frame steps; "
    "J-TLAT trains against it (and its router and expert stages) in turn.",
    "tlga",
    guess=ATTACK_GUESS,
    tests=ATTACK_TESTS,
    studies=("video_attacks",),
    command=ATTACK_COMMAND,
  ),
}
STUDY = {  # configs/studies/<name>.py: (title, paper key, tests)
  "video_attacks": (
    "TLGA-R and J-TLGA against PGD, J-TLAT against PGD-AT: a video ViT-MoE on moving "
    "digits, 3 seeds",
    "tlga",
    ATTACK_TESTS + ("tests/attacks/test_video_attacks_study.py", "tests/vision/test_video_vit.py"),
  ),
  "lora_mixer": (
    "LoRA-Mixer: RSL against the load-balance loss, a single LoRA and LoRA experts in the "
    "FFN, on polyglot tasks and (:tasks=mix) four domains of mix, 3 seeds each",
    "lora_mixer",
    (
      "tests/adapters/test_lora_mixer.py",
      "tests/losses/test_rsl.py",
      "tests/analysis/test_adapter_tasks.py",
    ),
  ),
  "vapt": (
    "VAPT against VPT-deep, VPT-shallow and a linear probe: few-shot transfer from a "
    "frozen ViT (VTAB-1k style), 3 seeds",
    "vapt",
    ("tests/studies/test_vapt_study.py", "tests/vision/test_prompts.py"),
  ),
  "smope": (
    "SMoPE against a shared prompt and task prompts: class-incremental digits, 3 seeds",
    "smope",
    ("tests/vision/test_smope.py", "tests/vision/test_class_stream.py"),
  ),
  "flyprompt": (
    "FlyPrompt's analytic router against key matching and ridge without expansion: "
    "blurry class-incremental digits, 3 seeds",
    "flyprompt",
    (
      "tests/vision/test_rear.py",
      "tests/vision/test_flyprompt.py",
      "tests/studies/test_prompt_studies.py",
    ),
  ),
  "bayesian_moe": (
    "Calibrated Bayesian MoE (utility routing with entropy, BMA) against hard task-id "
    "routing: continual Sort-of-CLEVR style VQA, 3 seeds",
    "bayesian_moe_vqa",
    (
      "tests/continual/test_bayesian_moe.py",
      "tests/continual/test_bayesian_vqa.py",
      "tests/data/test_sort_of_clevr.py",
      "tests/studies/test_bayesian_moe_study.py",
    ),
  ),
  "namex": (
    "NAMEx against SMEAR and EP-CAMEx: Brown genre fine-tuning",
    "namex",
    ("tests/layers/test_namex.py", "tests/data/test_brown_genres.py"),
  ),
  "moe_edit": (
    "MoEEdit: knowledge editing through the experts, zoo-s, 3 seeds",
    "moe_edit",
    ("tests/editing/test_bcd.py", "tests/editing/test_edit_model.py"),
  ),
  "ace": (
    "ACE: online selection among arriving experts",
    "ace",
    ("tests/online/test_ace.py", "tests/studies/test_online_studies.py"),
  ),
  "codequant": (
    "CodeQuant against k-means, RTN and GPTQ (weight-only, W4A4, W4A8)",
    "codequant",
    ("tests/studies/test_posttrain_studies.py",),
  ),
  "expert_types": (
    "Expert types at equal active FLOPs",
    "omnimoe",
    ("tests/studies/test_training_studies.py",),
  ),
  "fedgem": (
    "FedGEM: federated EM that discovers K",
    "fedgem",
    ("tests/mixtures/test_fedgem.py", "tests/studies/test_mixture_studies.py"),
  ),
  "gemq": (
    "GEMQ: global bit allocation and router fine-tuning",
    "gemq",
    ("tests/studies/test_posttrain_studies.py",),
  ),
  "interval_coverage": (
    "Interval coverage (the statistics' own check)",
    None,
    ("tests/studies/test_interval_coverage.py",),
  ),
  "kmeans": (
    "Lloyd against Hartigan k-means in high dimension",
    "hartigan",
    ("tests/mixtures/test_kmeans_hartigan.py", "tests/studies/test_mixture_studies.py"),
  ),
  "l3_sentencepiece": (
    "L3 lookup layers over a sentencepiece vocabulary",
    "l3",
    ("tests/layers/test_lookup.py", "tests/studies/test_training_studies.py"),
  ),
  "mgfa": (
    "MGFA: geodesic factor analysers on spheres",
    "mgfa",
    ("tests/mixtures/test_sphere_mgfa.py", "tests/studies/test_mixture_studies.py"),
  ),
  "molr_mog": (
    "MoLR-MoG score networks",
    "molr_mog",
    ("tests/mixtures/test_score_mixture.py", "tests/studies/test_mixture_studies.py"),
  ),
  "routing_attribution": (
    "Routing attribution: removing the most influential components against the least",
    "routing_contributions",
    (
      "tests/analysis/test_routing_attribution.py",
      "tests/analysis/test_routing_paths.py",
      "tests/studies/test_routing_attribution_study.py",
    ),
  ),
  "phenomena": (
    "Super-expert ablation",
    "super_experts",
    ("tests/analysis/test_super_experts.py", "tests/analysis/test_super_expert_ablation.py"),
  ),
  "prism_moe": (
    "Prism-MoE: dense-to-MoE conversion against random and MoEfication partitions",
    "prism_moe",
    (
      "tests/conversion/test_partition.py",
      "tests/conversion/test_convert.py",
      "tests/conversion/test_prism_study.py",
    ),
  ),
  "pruning": (
    "Expert and atom pruning on zoo-s",
    "schur_astar",
    ("tests/studies/test_posttrain_studies.py",),
  ),
  "pruning_knee": (
    "Knee layer budgets for SCHUR-A*",
    "schur_astar",
    ("tests/posttrain/test_expert_subset.py",),
  ),
  "mergemix": (
    "MergeMix: merged domain experts against trained data mixtures, zoo-xs",
    "mergemix",
    ("tests/merging/test_mergemix.py", "tests/studies/test_domain_studies.py"),
  ),
  "overtrained_experts": (
    "Overtrained experts merge worse, zoo-xs, 2 seeds",
    "overtrained_experts",
    ("tests/merging/test_overtraining.py", "tests/studies/test_domain_studies.py"),
  ),
  "randopt": (
    "RandOpt: neural thickets through pretraining",
    "thickets",
    ("tests/ensembles/test_randopt.py",),
  ),
  "router_inference_as_coot": (
    "As-COOT routing at inference",
    "as_coot",
    ("tests/analysis/test_router_inference.py",),
  ),
  "router_inference_capacity": (
    "Capacity-aware token drop at inference",
    "capacity_aware",
    ("tests/analysis/test_router_inference.py",),
  ),
  "router_inference_sere": (
    "SERE re-routing at decode",
    "sere",
    ("tests/analysis/test_router_inference.py",),
  ),
  "repetition_curse": (
    "RepetitionCurse: one repeated token sends every position to the same experts",
    "repetition_curse",
    ("tests/analysis/test_repetition.py",),
  ),
  "routers": ("Router sweep (one seed)", None, ("tests/studies/test_training_studies.py",)),
  "routers_seeds": (
    "Router claims on several seeds",
    None,
    ("tests/studies/test_training_studies.py",),
  ),
  "td_moe": (
    "TD-MoE against per-expert SVD",
    "td_moe",
    ("tests/studies/test_posttrain_studies.py",),
  ),
  "residual_kd": (
    "Residual KD against KL-KD under a normal and a misleading MoE teacher, zoo-s, 3 seeds",
    "residual_kd",
    (
      "tests/distill/test_distill_objectives.py",
      "tests/distill/test_distill_modules.py",
      "tests/train/test_distill_task.py",
    ),
  ),
  "tmow": (
    "TMoW: test-time prototype routing",
    "tmow",
    ("tests/online/test_tmow.py", "tests/studies/test_online_studies.py"),
  ),
  "token_rounding_seeds": (
    "Token rounding on zoo-xs, 3 seeds",
    "sonicmoe",
    ("tests/routing/test_token_rounding.py", "tests/studies/test_training_studies.py"),
  ),
}
# Result files a study wrote outside docs/results/studies/<name>/ (its --out).
STUDY_RESULTS = {
  "codequant": ("posttrain/codequant_zoo_s.md",),
  "expert_types": ("ablations/expert_types.md",),
  "gemq": ("posttrain/gemq_zoo_s.md",),
  "l3_sentencepiece": ("ablations/l3_sentencepiece_zoo_xs.md",),
  "lora_mixer": ("studies/lora_mixer_mix/results.md",),
  "overtrained_experts": ("studies/overtrained_experts/pool_120/results.md",),
  "phenomena": ("posttrain/super_experts_ablation_zoo_s.md",),
  "pruning": ("posttrain/pruning_zoo_s.md",),
  "pruning_knee": ("posttrain/pruning_knee_zoo_s.md",),
  "routers": ("ablations/routers.md",),
  "routers_seeds": ("ablations/routers_zoo_xs.md",),
  "td_moe": ("posttrain/td_moe_zoo_s.md",),
  "token_rounding_seeds": ("ablations/token_rounding_zoo_xs.md",),
}
CONFIG_KEY = {
  "router": "model.moe.router",
  "expert type": "model.moe.experts",
  "dispatcher": "model.moe.dispatch",
  "loss": "model.moe.loss_weights",
  "merged experts": "model.moe.merge",
  "grouped matmul": "model.moe.grouped_matmul",
  "prompt adapter": "model.vit.prompt.adapter",
  "attention adapter": "model.attention.adapter",
  "distillation method": "distill.method",
}
CONTRACT_KINDS = ("router", "expert type", "dispatcher", "loss", "grouped matmul")
MERGE_COMMAND = (
  "python -m experiments.merge --base=DIR --experts=A,B,C --method={name} [--weights=...] --out=OUT"
)

DISTILL_TESTS = (
  "tests/distill/test_distill_objectives.py",
  "tests/train/test_distill_task.py",
)
DISTILL_COMMAND = (
  "python -m experiments.train --config=configs/distill.py:method={name} --workdir=runs/x \\\n"
  "    --config.distill.teacher.workdir=runs/zoo/s"
)
ENTRIES["distillation method"] = {
  "kl": E(
    "KL knowledge distillation (the KD baseline)",
    "Cross-entropy plus distill.weight * T^2 KL(softmax(z_t / T) || softmax(z_s / T)) "
    "against a frozen teacher's logits (task='distill').",
    "hinton_kd",
    tests=DISTILL_TESTS,
    studies=("residual_kd",),
    command=DISTILL_COMMAND.format(name="kl"),
    page="distill_kl",
  ),
  "residual": E(
    "Residual KD: the student predicts from h_s - Proj(h_t) where the teacher is wrong",
    "Stage 1: a projector from the teacher's features (an MoE teacher's last-layer "
    "expert outputs fused by self-attention over experts) to the student's width, "
    "trained as an autoencoder. Stage 2: cross-entropy plus the cross-entropy of "
    "head(h_s - Proj(h_t)) at positions where the teacher's argmax is wrong.",
    "residual_kd",
    guess="Code 'TBD' and no equations found: the code width (the student's d_model), "
    "the RMS-normalised code, the features (fused routed expert outputs of the last MoE "
    "layer), the expert attention (no value projection, mean-pooled, trained with the "
    "autoencoder), the relative reconstruction loss, no term at teacher-right positions, "
    "the normalisation by all tokens and the argmax as the teacher's prediction are ours. "
    "Two tokenizers: CrossModelAttention exists and is tested, but the trainer aligns "
    "positions one to one (one tokenizer; a vocabulary map for different vocabularies).",
    tests=DISTILL_TESTS + ("tests/distill/test_distill_modules.py",),
    studies=("residual_kd",),
    command=DISTILL_COMMAND.format(name="residual"),
    page="distill_residual",
  ),
  "hidden": E(
    "Hidden-state KD (FitNets' hint loss on the final hidden state)",
    "Cross-entropy plus distill.weight * the mean squared difference of the student's "
    "final hidden state (the final norm's output) and Proj(h_t), the teacher's stage-1 "
    "code that residual KD subtracts; reads no teacher logits.",
    "fitnets",
    guess="FitNets trains a regressor on the student's side and hints an intermediate "
    "layer; here the map between the widths is residual KD's stage-1 projector, fixed, "
    "and the hint is the final hidden state, so it is the white-box baseline closest to "
    "residual KD.",
    tests=DISTILL_TESTS,
    studies=("residual_kd",),
    command=DISTILL_COMMAND.format(name="hidden"),
    page="distill_hidden",
  ),
}

MERGED_TESTS = ("tests/layers/test_merged_experts.py",)
MERGED_STUDIES = ("namex",)
MERGED_GUESS = (
  "The first segment's gates are uniform (CAMEx's code reuses that segment's own "
  "gates, which is not causal); gates are the plain softmax of the router kernel "
  "on the segment mean, without CAMEx's noisy top-k."
)
ENTRIES["merged experts"] = {
  "smear": E(
    "SMEAR: merged experts per segment",
    "Per segment of model.moe.merged.segment_len "
    "tokens, one expert sum_i g_i E_i under the "
    "previous segment's gates.",
    "smear",
    guess=MERGED_GUESS,
    tests=MERGED_TESTS,
    studies=MERGED_STUDIES,
  ),
  "ep_camex": E(
    "EP-CAMEx: base expert plus gated task vectors",
    "Per segment, one expert E_b + eta sum_i g_i (E_i - E_b) with a separate base expert E_b.",
    "camex",
    guess=MERGED_GUESS + " The curvature matrices are the identity (not learned).",
    tests=MERGED_TESTS,
    studies=MERGED_STUDIES,
  ),
  "namex": E(
    "NAMEx: the base expert carried across layers by Nash weights",
    "EP-CAMEx whose base expert, owned by the first MoE layer, moves to the next "
    "layer by E_b + Re(gamma mu), mu <- beta mu + sum_i alpha_i tau_i, alpha the "
    "Nash-bargaining weights of the task vectors and beta the complex momentum "
    "(model.moe.merged.momentum_real, momentum_imag; 0: no momentum).",
    "namex",
    guess=MERGED_GUESS + " The curvature matrices are the identity; gamma is real; "
    "alpha is not differentiated (the paper does not say); a task vector that is "
    "exactly 0 takes no part in the bargaining. Not in scanned models "
    "(model.scan_layers) or KV-cache decoding.",
    tests=MERGED_TESTS + ("tests/layers/test_namex.py",),
    studies=MERGED_STUDIES,
    command="python -m experiments.train --config=configs/lm_shakespeare_moe.py "
    "--workdir=runs/x \\\n    --config.model.moe.merge=namex "
    "--config.model.moe.merged.eta=0.5 --config.model.moe.merged.momentum_real=0.7",
  ),
}
