"""Turn a GGUF causal language model (SmolLM2-135M-Instruct) into a plain Hugging Face directory.

transformers can read GGUF files (with the ``gguf`` package), dequantizing every tensor, but that takes tens of
seconds and ``save_pretrained`` refuses a model loaded that way. So the weights are read from the GGUF once, copied
into a model built from the same config without its ``quantization_config``, and saved as float32 safetensors with
the tokenizer (chat template included). The directory then reloads offline in about a second.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from speechstream.errors import SpeechstreamError

GGUF_ONLY_CONFIG_KEYS = ("quantization_config", "_model_name_or_path")  # attributes that describe the GGUF source
LOAD_TIME_TOKENIZER_KEYS = ("is_local", "local_files_only")  # loading options save_pretrained copies into the config
UNREADABLE_GGUF_ERRORS = (ValueError, OSError, KeyError, IndexError, struct.error)  # struct.error: a cut header


def _plain_config(config):
    """A copy of a GGUF-loaded model config without the attributes that tie it to the GGUF file."""
    plain = config.__class__.from_dict(config.to_dict())
    for key in GGUF_ONLY_CONFIG_KEYS:
        if hasattr(plain, key):
            delattr(plain, key)
    return plain


def load_gguf_model(gguf_path: str | Path):
    """The causal LM in a GGUF file, dequantized to float32 (slow: tens of seconds for 135M parameters)."""
    import torch  # noqa: PLC0415 - heavy imports only when converting
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    path = Path(gguf_path)
    try:
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except UNREADABLE_GGUF_ERRORS as error:
        raise SpeechstreamError(f"{path.name}: cannot read this GGUF model: {error}") from error


def load_gguf_tokenizer(gguf_path: str | Path):
    """The tokenizer stored in a GGUF file's metadata (vocabulary, merges, special tokens, chat template)."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    path = Path(gguf_path)
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except UNREADABLE_GGUF_ERRORS as error:
        raise SpeechstreamError(f"{path.name}: cannot read the tokenizer of this GGUF model: {error}") from error


def plain_copy(gguf_model):
    """The same network as a model built ``from_config``, which ``save_pretrained`` accepts."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_config(_plain_config(gguf_model.config), dtype=torch.float32)
    result = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = [key for key in result.missing_keys if key not in tied]
    if missing or result.unexpected_keys:
        raise SpeechstreamError(
            f"GGUF weights do not fit the model built from their config: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    model.generation_config = gguf_model.generation_config
    return model.eval()


def write_llm_directory(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert a GGUF causal LM into ``out_dir`` (config, generation config, safetensors, tokenizer).

    ``AutoModelForCausalLM.from_pretrained(out_dir)`` and ``AutoTokenizer.from_pretrained(out_dir)`` load the result.
    """
    out = Path(out_dir)
    tokenizer = load_gguf_tokenizer(gguf_path)
    gguf_model = load_gguf_model(gguf_path)
    model = plain_copy(gguf_model)
    del gguf_model
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out)
    _drop_load_time_keys(out / "tokenizer_config.json")
    return out


def _drop_load_time_keys(tokenizer_config: Path) -> None:
    """Remove the loading options transformers writes into tokenizer_config.json along with the tokenizer."""
    settings = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    for key in LOAD_TIME_TOKENIZER_KEYS:
        settings.pop(key, None)
    tokenizer_config.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
