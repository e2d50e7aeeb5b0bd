"""Data pipeline: Shakespeare (or any TFDS text dataset) -> packed LM batches.

``build_lm_data`` is the entry point; see ``moejax.data.pipeline``.
"""

from moejax.data.pipeline import BUILTIN_DATASETS, LMData, build_lm_data
from moejax.data.shakespeare import VALIDATION_PLAYS, prepare_shakespeare, shakespeare_sources
from moejax.data.tokenizers import (TOKENIZERS, ByteTokenizer, SentencePieceTokenizer,
                                    get_tokenizer)

__all__ = [
    'BUILTIN_DATASETS', 'LMData', 'build_lm_data', 'VALIDATION_PLAYS', 'prepare_shakespeare',
    'shakespeare_sources', 'TOKENIZERS', 'ByteTokenizer', 'SentencePieceTokenizer',
    'get_tokenizer',
]
