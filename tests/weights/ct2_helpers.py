"""Test helpers: a small CTranslate2 model.bin writer, a tiny seeded Whisper, and a reference forward pass.

The reference computes Whisper straight from the CTranslate2 arrays (fused projections and all), so comparing it
with transformers' model checks every name and split the converter makes.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speechstream.text import bytes_to_unicode

DTYPE_IDS = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
             np.dtype("float16"): 4}
BFLOAT16_ID = 5


@dataclass(frozen=True)
class Bfloat16:
    """Marks float32 values to be written as bfloat16 (their top 16 bits)."""

    values: np.ndarray  # float32 values, exactly representable in bfloat16


def _string(text: str) -> bytes:
    raw = text.encode("utf-8") + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _variable(name: str, value: np.ndarray | Bfloat16, version: int = 6) -> bytes:
    if version < 4:  # before binary version 4: the item size and the number of values, not a dtype id and bytes
        array = np.asarray(value)
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header = _string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        return header + struct.pack("<BI", array.dtype.itemsize, array.size) + raw
    if isinstance(value, Bfloat16):
        array = np.asarray(value.values, dtype=np.float32)
        raw = (array.view(np.uint32) >> 16).astype("<u2").tobytes()
        dtype_id = BFLOAT16_ID
    else:
        array = np.asarray(value)  # (not ascontiguousarray: it turns scalars into shape (1,))
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        dtype_id = DTYPE_IDS[array.dtype]
    header = _string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
    return header + struct.pack("<BI", dtype_id, len(raw)) + raw


def write_ct2(variables: dict[str, np.ndarray | Bfloat16], aliases: dict[str, str] | None = None,
              version: int = 6, spec_name: str = "WhisperSpec", revision: int = 3) -> bytes:
    """The bytes of a CTranslate2 model.bin holding ``variables`` and ``aliases``, in the layout of ``version``."""
    out = io.BytesIO()
    out.write(struct.pack("<I", version))
    if version >= 2:
        out.write(_string(spec_name) + struct.pack("<I", revision))
    out.write(struct.pack("<I", len(variables)))
    for name, value in variables.items():
        out.write(_variable(name, value, version))
    if version >= 3:
        aliases = aliases or {}
        out.write(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            out.write(_string(alias) + _string(target))
    return out.getvalue()


# --- a tiny Whisper ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TinyWhisper:
    """Sizes of the synthetic Whisper used in tests."""

    n_mels: int = 80  # mel bins, as in the real models
    d_model: int = 64  # hidden width
    heads: int = 4  # attention heads in both stacks
    ffn: int = 128  # feed-forward width
    encoder_layers: int = 2  # encoder blocks
    decoder_layers: int = 2  # decoder blocks
    source_positions: int = 16  # encoder positions: the model takes 32 mel frames
    target_positions: int = 16  # decoder positions
    languages: tuple[str, ...] = ("en", "de")  # language tokens of the tiny vocabulary


def special_tokens(size: TinyWhisper) -> list[str]:
    """Whisper's special tokens in id order, right after the 256 byte tokens."""
    return (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in size.languages]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
               "<|notimestamps|>"])


def tiny_vocab_size(size: TinyWhisper) -> int:
    """256 byte tokens, the special tokens, then 1501 timestamps."""
    return 256 + len(special_tokens(size)) + 1501


def tiny_tokenizer_json(size: TinyWhisper) -> dict:
    """A Whisper-style tokenizer.json over bytes only (no merges), without timestamp tokens, like CTranslate2's."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    added = [{"id": 256 + index, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for index, token in enumerate(special_tokens(size))]
    vocab |= {token["content"]: token["id"] for token in added}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tiny_ct2_config(size: TinyWhisper) -> dict:
    """The CTranslate2 config.json of the tiny model (suppression lists as the real ones have)."""
    end_of_text = 256
    return {"alignment_heads": [[1, 0], [1, 2]], "lang_ids": [258, 259],
            "suppress_ids": [1, 2, 7, end_of_text + 1], "suppress_ids_begin": [220, end_of_text]}


def _linear(rng: np.random.Generator, rows: int, cols: int, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}/weight": rng.normal(0, cols ** -0.5, (rows, cols)),
            f"{prefix}/bias": rng.normal(0, 0.1, rows)}


def _norm(rng: np.random.Generator, width: int, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}/gamma": 1 + rng.normal(0, 0.1, width), f"{prefix}/beta": rng.normal(0, 0.1, width)}


def _block(rng: np.random.Generator, size: TinyWhisper, prefix: str, cross: bool) -> dict[str, np.ndarray]:
    d = size.d_model
    tensors = _linear(rng, 3 * d, d, f"{prefix}/self_attention/linear_0")  # q, k, v fused (k bias nonzero on purpose)
    tensors |= _linear(rng, d, d, f"{prefix}/self_attention/linear_1")
    tensors |= _norm(rng, d, f"{prefix}/self_attention/layer_norm")
    if cross:
        tensors |= _linear(rng, d, d, f"{prefix}/attention/linear_0")  # q
        tensors |= _linear(rng, 2 * d, d, f"{prefix}/attention/linear_1")  # k, v fused
        tensors |= _linear(rng, d, d, f"{prefix}/attention/linear_2") | _norm(rng, d, f"{prefix}/attention/layer_norm")
    tensors |= _linear(rng, size.ffn, d, f"{prefix}/ffn/linear_0") | _linear(rng, d, size.ffn, f"{prefix}/ffn/linear_1")
    return tensors | _norm(rng, d, f"{prefix}/ffn/layer_norm")


def tiny_whisper_variables(size: TinyWhisper, seed: int = 0, dtype: str = "float16") -> dict[str, np.ndarray]:
    """Seeded random Whisper weights under CTranslate2 names, plus the scalars a real WhisperSpec carries."""
    rng = np.random.default_rng(seed)
    d = size.d_model
    tensors = {"encoder/conv1/weight": rng.normal(0, (3 * size.n_mels) ** -0.5, (d, size.n_mels, 3)),
               "encoder/conv1/bias": rng.normal(0, 0.1, d),
               "encoder/conv2/weight": rng.normal(0, (3 * d) ** -0.5, (d, d, 3)),
               "encoder/conv2/bias": rng.normal(0, 0.1, d),
               "encoder/position_encodings/encodings": rng.normal(0, 0.5, (size.source_positions, d))}
    for index in range(size.encoder_layers):
        tensors |= _block(rng, size, f"encoder/layer_{index}", cross=False)
    tensors |= _norm(rng, d, "encoder/layer_norm")
    tensors["decoder/embeddings/weight"] = rng.normal(0, 0.5, (tiny_vocab_size(size), d))
    tensors["decoder/position_encodings/encodings"] = rng.normal(0, 0.1, (size.target_positions, d))
    for index in range(size.decoder_layers):
        tensors |= _block(rng, size, f"decoder/layer_{index}", cross=True)
    tensors |= _norm(rng, d, "decoder/layer_norm")
    variables = {name: value.astype(dtype) for name, value in tensors.items()}
    return variables | {
        "encoder/num_heads": np.array(size.heads, dtype=np.int16),
        "decoder/num_heads": np.array(size.heads, dtype=np.int16),
        "decoder/activation": np.array(3, dtype=np.int8),
        "decoder/pre_norm": np.array(1, dtype=np.int8),
        "decoder/alibi": np.array(0, dtype=np.int8),
        "decoder/scale_embeddings": np.array(0, dtype=np.int8),
        "decoder/start_from_zero_embedding": np.array(0, dtype=np.int8),
        "decoder/alignment_heads": np.array(1, dtype=np.int16),
        "decoder/alignment_layer": np.array(-1, dtype=np.int16),
    }


WHISPER_ALIASES = {"decoder/projection/weight": "decoder/embeddings/weight"}  # as real files tie the output layer


def tiny_whisper_bin(size: TinyWhisper, seed: int = 0) -> bytes:
    """A complete synthetic WhisperSpec model.bin."""
    return write_ct2(tiny_whisper_variables(size, seed), WHISPER_ALIASES)


# --- reference forward pass from CTranslate2 arrays ------------------------------------------------------------------

def _t(variables: dict[str, np.ndarray], name: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(variables[name], dtype=np.float32))


def _layer_norm(v: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], _t(v, f"{prefix}/gamma"), _t(v, f"{prefix}/beta"), eps=1e-5)


def _dense(v: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    return x @ _t(v, f"{prefix}/weight").T + _t(v, f"{prefix}/bias")


def _attend(q: torch.Tensor, k: torch.Tensor, val: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    # q: (T, D), k/val: (S, D) -> (T, D)
    split = lambda x: x.reshape(x.shape[0], heads, -1).transpose(0, 1)  # noqa: E731  (H, T, Dh)
    qh, kh, vh = split(q), split(k), split(val)
    scores = qh @ kh.transpose(1, 2) / qh.shape[-1] ** 0.5  # (H, T, S)
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ vh).transpose(0, 1).reshape(q.shape)


def _self_attention(v: dict, prefix: str, x: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    h = _layer_norm(v, f"{prefix}/self_attention/layer_norm", x)
    q, k, val = _dense(v, f"{prefix}/self_attention/linear_0", h).chunk(3, dim=-1)  # k keeps its bias here
    return _dense(v, f"{prefix}/self_attention/linear_1", _attend(q, k, val, heads, causal))


def _cross_attention(v: dict, prefix: str, x: torch.Tensor, memory: torch.Tensor, heads: int) -> torch.Tensor:
    h = _layer_norm(v, f"{prefix}/attention/layer_norm", x)
    q = _dense(v, f"{prefix}/attention/linear_0", h)
    k, val = _dense(v, f"{prefix}/attention/linear_1", memory).chunk(2, dim=-1)
    return _dense(v, f"{prefix}/attention/linear_2", _attend(q, k, val, heads, causal=False))


def _feed_forward(v: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    h = _layer_norm(v, f"{prefix}/ffn/layer_norm", x)
    return _dense(v, f"{prefix}/ffn/linear_1", F.gelu(_dense(v, f"{prefix}/ffn/linear_0", h)))


def reference_encoder(v: dict, mel: torch.Tensor, size: TinyWhisper) -> torch.Tensor:
    """Whisper's encoder from CTranslate2 arrays: mel (n_mels, frames) -> (frames // 2, d_model)."""
    x = F.gelu(F.conv1d(mel[None], _t(v, "encoder/conv1/weight"), _t(v, "encoder/conv1/bias"), padding=1))
    x = F.gelu(F.conv1d(x, _t(v, "encoder/conv2/weight"), _t(v, "encoder/conv2/bias"), stride=2, padding=1))
    x = x[0].T + _t(v, "encoder/position_encodings/encodings")[: x.shape[-1]]  # (T, D)
    for index in range(size.encoder_layers):
        x = x + _self_attention(v, f"encoder/layer_{index}", x, size.heads, causal=False)
        x = x + _feed_forward(v, f"encoder/layer_{index}", x)
    return _layer_norm(v, "encoder/layer_norm", x)


def reference_logits(v: dict, memory: torch.Tensor, tokens: list[int], size: TinyWhisper) -> torch.Tensor:
    """Whisper's decoder from CTranslate2 arrays: tokens (L,) over encoder output -> logits (L, vocab)."""
    embeddings = _t(v, "decoder/embeddings/weight")
    x = embeddings[tokens] + _t(v, "decoder/position_encodings/encodings")[: len(tokens)]
    for index in range(size.decoder_layers):
        prefix = f"decoder/layer_{index}"
        x = x + _self_attention(v, prefix, x, size.heads, causal=True)
        x = x + _cross_attention(v, prefix, x, memory, size.heads)
        x = x + _feed_forward(v, prefix, x)
    return _layer_norm(v, "decoder/layer_norm", x) @ embeddings.T


# --- wheels -----------------------------------------------------------------------------------------------------------

def write_wheel(path: Path, members: dict[str, bytes]) -> Path:
    """A zip with the given members, standing in for a downloaded wheel."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path
