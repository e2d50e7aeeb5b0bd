"""Registered study scorers: one file per scorer, each registering itself in
moejax.studies.scoring.SCORERS (a file is imported when a scorer is looked up)."""
