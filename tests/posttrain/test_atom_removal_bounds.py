"""HEAPr's atom removal (moejax/posttrain/atoms.py remove_atoms) at its bounds:
keeping a single atom is a model (width rounded up to 8), keeping none is refused,
and the width steps from 8 to 16 between 8 and 9 kept atoms, capped at d_ff."""

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import atoms

from tests.helpers import host


def masks(kept_in_expert_3_of_block_1):
  keep = {block: np.zeros((8, 32), bool) for block in (0, 1)}
  keep[1][3, kept_in_expert_3_of_block_1] = True
  return keep


def test_one_kept_atom_is_a_model_of_width_eight(tiny_model):
  m, params = tiny_model[0].model, host(tiny_model[2].params)  # 2 MoE layers, 8 x 32 atoms
  new_m, cut = atoms.remove_atoms(m, params, masks([21]))
  assert new_m.moe.expert_d_ff == 8
  experts = params["blocks"][1]["ffn"]["experts"]
  got = cut["blocks"][1]["ffn"]["experts"]
  np.testing.assert_array_equal(got["w_gate"][3][:, 0], experts["w_gate"][3][:, 21])
  np.testing.assert_array_equal(got["w_down"][3][0], experts["w_down"][3][21])
  assert not got["w_gate"][3][:, 1:].any() and not got["w_up"][2].any()


def test_no_kept_atom_is_refused(tiny_model):
  m, params = tiny_model[0].model, host(tiny_model[2].params)  # 2 MoE layers, 8 x 32 atoms
  with pytest.raises(ConfigError, match="every atom would be removed"):
    atoms.remove_atoms(m, params, masks([]))


@pytest.mark.parametrize("count, width", [(8, 8), (9, 16), (17, 24), (25, 32), (32, 32)])
def test_width_is_the_most_kept_atoms_rounded_up_to_eight(tiny_model, count, width):
  m, params = tiny_model[0].model, host(tiny_model[2].params)  # 2 MoE layers, 8 x 32 atoms
  new_m, _ = atoms.remove_atoms(m, params, masks(list(range(count))))
  assert new_m.moe.expert_d_ff == width


def test_the_atom_pruning_report_counts_experts_and_their_kept_atoms(tiny_model):
  """prune_atoms' per-layer report on 2 MoE layers of 8 experts x 32 atoms, keeping
  half of all atoms by a random score: 'experts' is 8 (not the 32 atoms), one kept
  count per expert, and the counts add up to 256 of the 512."""
  import types
  from moejax.posttrain import prune

  m, params = tiny_model[0].model, host(tiny_model[2].params)  # 2 MoE layers, 8 x 32 atoms
  sums = {block: {"predicted": 1.0, "h2": np.zeros((8, 32))} for block in (0, 1)}
  calibration = types.SimpleNamespace(atom_sums=sums)
  _, _, _, layers = prune.prune_atoms(
    m, params, {}, calibration, keep="0.5", method="atom_random", seed=3
  )
  assert [layer["block"] for layer in layers] == [0, 1]
  assert all(layer["experts"] == 8 and len(layer["kept_atoms"]) == 8 for layer in layers)
  assert sum(sum(layer["kept_atoms"]) for layer in layers) == 256
