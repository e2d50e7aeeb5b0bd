"""Routing diagnostics from the experts of scored tokens (aux["moe"] of the Decoder).

Input per MoE layer: int32 [N, S], the expert of each slot of N tokens, -1
where the slot is invalid (evaluation/model.py). A token's assignments are
its valid slots; every assignment counts once (a top-2 token counts twice).

  domain_expert_counts  [D, E] assignments of each domain's tokens to each expert
  usage                 each domain's share of assignments per expert (rows sum to 1)
  mutual_information    I(domain; expert) in BITS, of the joint distribution of
                        one assignment drawn uniformly: (domain of its token, expert)
  max_over_mean_load    busiest expert's assignments / mean over experts
  topk_set_changed      fraction of tokens whose set of experts differs from a
                        reference model's on the same tokens
"""

import numpy as np

from moejax.errors import ConfigError


def domain_expert_counts(
  experts: np.ndarray, token_domain: np.ndarray, num_domains: int, num_experts: int
) -> np.ndarray:
  """float64 [D, E]: valid assignments by domain of the token and expert."""
  experts = np.asarray(experts)
  domain = np.broadcast_to(np.asarray(token_domain)[:, None], experts.shape)
  valid = experts >= 0
  if np.any(experts >= num_experts):
    raise ConfigError(f"expert index {experts.max()} >= num_experts={num_experts}")
  counts = np.zeros((num_domains, num_experts), np.float64)
  np.add.at(counts, (domain[valid], experts[valid]), 1.0)
  return counts


def usage(counts: np.ndarray) -> np.ndarray:
  """[D, E]: each row divided by its sum (a domain without tokens stays 0)."""
  total = counts.sum(1, keepdims=True)
  return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def entropy_bits(p: np.ndarray) -> float:
  """Shannon entropy in bits of a distribution (zeros ignored)."""
  p = np.asarray(p, np.float64).ravel()
  p = p[p > 0]
  return float(0.0 - (p * np.log2(p)).sum())  # 0.0, not -0.0, for one outcome


def mutual_information(counts: np.ndarray) -> float:
  """I(domain; expert) in bits from joint counts [D, E]: H(D) + H(E) - H(D, E)."""
  total = counts.sum()
  if total <= 0:
    raise ConfigError("mutual information of no assignments")
  joint = counts / total
  mi = entropy_bits(joint.sum(1)) + entropy_bits(joint.sum(0)) - entropy_bits(joint)
  return max(mi, 0.0)  # rounding can leave -1e-16 for independent counts


def max_over_mean_load(counts: np.ndarray) -> float:
  """Busiest expert's assignments / the mean over experts (1 = balanced)."""
  load = counts.sum(0) if counts.ndim == 2 else counts
  return float(load.max() / load.mean())


def expert_sets(experts: np.ndarray, num_experts: int) -> np.ndarray:
  """bool [N, E]: which experts each token's valid slots name."""
  experts = np.asarray(experts)
  member = np.zeros((experts.shape[0], num_experts + 1), bool)
  np.put_along_axis(member, np.where(experts >= 0, experts, num_experts), True, axis=1)
  return member[:, :num_experts]


def topk_set_changed(experts: np.ndarray, reference: np.ndarray, num_experts: int) -> float:
  """Fraction of tokens whose expert set differs between two models' routings."""
  if np.shape(experts)[0] != np.shape(reference)[0]:
    raise ConfigError(
      f"top-k set change needs the same tokens: {np.shape(experts)[0]} "
      f"against {np.shape(reference)[0]} in the reference"
    )
  changed = np.any(expert_sets(experts, num_experts) != expert_sets(reference, num_experts), 1)
  return float(changed.mean())


def routing_report(
  routing: list, token_domain: np.ndarray, domains: list[str], num_experts: list[int]
) -> list[dict]:
  """Per MoE layer: usage per domain, MI (bits), H(domain), max/mean load overall and
  per domain."""
  report = []
  for experts, e in zip(routing, num_experts):
    counts = domain_expert_counts(experts, token_domain, len(domains), e)
    report.append(
      {
        "mutual_information_bits": mutual_information(counts),
        "domain_entropy_bits": entropy_bits(counts.sum(1) / counts.sum()),
        "max_over_mean_load": max_over_mean_load(counts),
        "usage": {d: usage(counts)[i].tolist() for i, d in enumerate(domains)},
        "max_over_mean_load_by_domain": {
          d: max_over_mean_load(counts[i]) for i, d in enumerate(domains) if counts[i].sum()
        },
      }
    )
  return report
