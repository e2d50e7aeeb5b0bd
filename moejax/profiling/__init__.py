"""Where time goes: compiled moejax programs by part (XLA thunks attributed by named
scope and source frame), transformers models by module hooks, and their tables."""
