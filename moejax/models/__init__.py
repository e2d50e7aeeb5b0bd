from moejax.models.transformer import TransformerLM, moe_layer_indices
