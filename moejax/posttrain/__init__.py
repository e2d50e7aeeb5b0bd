"""Post-training tools on a trained MoE (issue 14): which experts to keep
(expert_subset), and, as they land, calibration capture and model surgery."""
