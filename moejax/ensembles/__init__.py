"""Ensembles of models drawn around one checkpoint: RandOpt (neural thickets)."""
