"""Post-training tools on a trained MoE: the model they start from (source),
calibration draws and their statistics (calibration), one request check (request),
expert pruning (prune, prune_workdir), compression (compress_pipeline,
compress_workdir) and what a study measures of the results (measure)."""
