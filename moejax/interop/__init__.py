"""HF safetensors import/export for the decoder families (moejax/models/decoder.py).

  import_hf(hf_dir) -> Loaded(config, params, rest, hf_config)
  export_hf(config, params, rest, out_dir, family=..., dtype=...)
  save_workdir / load_workdir: a converted model in a moejax workdir
See docs/interop.md.
"""

from moejax.interop.convert import Loaded, export_hf, import_hf, load_workdir, save_workdir
from moejax.interop.hf_config import from_hf_config, supported_architectures, to_hf_config

__all__ = [
  "Loaded",
  "export_hf",
  "from_hf_config",
  "import_hf",
  "load_workdir",
  "save_workdir",
  "supported_architectures",
  "to_hf_config",
]
