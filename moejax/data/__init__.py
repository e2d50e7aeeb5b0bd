"""Data pipeline: Shakespeare, mix (or any TFDS text dataset) -> packed LM batches.

``build_lm_data`` is the entry point; see ``moejax.data.pipeline``.
"""

from moejax.data.mix import DOMAINS as MIX_DOMAINS, prepare_mix
from moejax.data.builders import BUILTIN_DATASETS
from moejax.data.pipeline import LMData, build_lm_data
from moejax.data.shakespeare import VALIDATION_PLAYS, prepare_shakespeare, shakespeare_sources
from moejax.data.tokenizers import TOKENIZERS, ByteTokenizer, SentencePieceTokenizer, get_tokenizer

__all__ = [
  'MIX_DOMAINS',
  'prepare_mix',
  'BUILTIN_DATASETS',
  'LMData',
  'build_lm_data',
  'VALIDATION_PLAYS',
  'prepare_shakespeare',
  'shakespeare_sources',
  'TOKENIZERS',
  'ByteTokenizer',
  'SentencePieceTokenizer',
  'get_tokenizer',
]
