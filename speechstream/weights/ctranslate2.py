"""Read CTranslate2 ``model.bin`` files and turn Whisper ones into Hugging Face directories.

The reader is written from the format description alone (see docs/weights.md); it needs only numpy and
never imports the ctranslate2 package. The file is little-endian:

    u32 binary_version
    [version >= 2] string spec_name, u32 spec_revision
    u32 variable_count
    variable_count x (string name, u8 rank, rank x u32 shape, u8 dtype_id, u32 byte_count, byte_count raw bytes)
        [version < 4: u8 item_size (4 float32, 2 int16, 1 int8) and u32 value_count instead of dtype_id, byte_count]
    [version >= 3] u32 alias_count, alias_count x (string alias, string target)

A string is a u16 length that counts a trailing NUL byte, then that many bytes.

The converter maps the WhisperSpec variable names onto transformers' ``WhisperForConditionalGeneration``.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechstream.errors import SpeechstreamError

MAX_BINARY_VERSION = 6  # newest layout this reader understands (CTranslate2 3.x/4.x write 6)
BFLOAT16_ID = 5  # numpy has no bfloat16: such variables are widened to float32 (exactly)
DTYPES_BY_ID = {  # CTranslate2 dtype id -> numpy dtype as stored on disk (little-endian)
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    BFLOAT16_ID: np.dtype("<u2"),
}
SCALE_SUFFIX = "_scale"  # an int8/int16 weight's quantization scale is the variable "<name>_scale"
FIRST_DTYPE_ID_VERSION = 4  # older files give each variable's item size and value count instead of dtype id and bytes
DTYPES_BY_ITEM_SIZE = {4: np.dtype("<f4"), 2: np.dtype("<i2"), 1: np.dtype("i1")}  # the only dtypes before version 4


class CT2FormatError(SpeechstreamError):
    """A model.bin that is truncated, corrupted or of a layout this reader does not know."""


@dataclass(frozen=True)
class CT2Model:
    """The content of one model.bin."""

    binary_version: int  # layout version written in the file's first 4 bytes
    spec_name: str  # model family, e.g. "WhisperSpec" ("" before binary version 2)
    spec_revision: int  # revision of that family's variable set (1 before binary version 2)
    variables: dict[str, np.ndarray]  # name -> array, aliases included (an alias shares its target's array and scale)
    aliases: dict[str, str]  # alias name -> target name


class _Cursor:
    """Sequential little-endian reads over a byte buffer that fail loudly at its end."""

    def __init__(self, data: bytes | memoryview, source: str):
        self.data = memoryview(data)
        self.offset = 0
        self.source = source

    def take(self, count: int, what: str) -> memoryview:
        end = self.offset + count
        if end > len(self.data):
            raise CT2FormatError(
                f"{self.source}: truncated CTranslate2 model file: needed {count} bytes for {what} "
                f"at offset {self.offset}, but the file has {len(self.data)} bytes"
            )
        chunk = self.data[self.offset : end]
        self.offset = end
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))

    def u8(self, what: str) -> int:
        return self.unpack("<B", what)[0]

    def u16(self, what: str) -> int:
        return self.unpack("<H", what)[0]

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def string(self, what: str) -> str:
        length = self.u16(f"the length of {what}")
        raw = bytes(self.take(length, what))
        if length == 0 or raw[-1] != 0:
            raise CT2FormatError(f"{self.source}: corrupted CTranslate2 model file: {what} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as error:
            raise CT2FormatError(f"{self.source}: corrupted CTranslate2 model file: {what} is not UTF-8") from error

    def remaining(self) -> int:
        return len(self.data) - self.offset


def read_model_bin(source: bytes | bytearray | memoryview | str | Path, name: str | None = None) -> CT2Model:
    """Parse a CTranslate2 model.bin (a path or its bytes) into arrays; raises CT2FormatError when malformed.

    Arrays read from bytes are read-only views on those bytes; bfloat16 arrays are widened to float32.
    """
    if isinstance(source, (str, Path)):
        label = name or str(source)
        data: bytes | bytearray | memoryview = Path(source).read_bytes()
    else:
        label = name or "model.bin"
        data = source
    cursor = _Cursor(data, label)
    version = cursor.u32("the binary version")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise CT2FormatError(
            f"{label}: not a CTranslate2 model file this reader understands "
            f"(binary version {version}, expected 1 to {MAX_BINARY_VERSION})"
        )
    spec_name, revision = ("", 1)
    if version >= 2:
        spec_name = cursor.string("the spec name")
        revision = cursor.u32("the spec revision")
    variables = _read_variables(cursor, version)
    aliases = _read_aliases(cursor, variables) if version >= 3 else {}
    if cursor.remaining():
        raise CT2FormatError(
            f"{label}: corrupted CTranslate2 model file: {cursor.remaining()} unexpected trailing bytes"
        )
    for alias, target in aliases.items():
        variables[alias] = variables[target]
    for alias, target in aliases.items():  # as CTranslate2 loads them: quantization happens after aliasing
        if f"{target}{SCALE_SUFFIX}" in variables:
            variables.setdefault(f"{alias}{SCALE_SUFFIX}", variables[f"{target}{SCALE_SUFFIX}"])
    return CT2Model(version, spec_name, revision, variables, aliases)


def read_variables(source: bytes | bytearray | memoryview | str | Path) -> dict[str, np.ndarray]:
    """Name -> array for every variable and alias in a model.bin."""
    return read_model_bin(source).variables


def _read_variables(cursor: _Cursor, version: int) -> dict[str, np.ndarray]:
    count = cursor.u32("the variable count")
    variables: dict[str, np.ndarray] = {}
    for index in range(count):
        name = cursor.string(f"the name of variable {index}")
        variables[name] = _read_array(cursor, name, version)
    return variables


def _read_dtype(cursor: _Cursor, name: str, version: int) -> tuple[int | None, np.dtype, int]:
    """(dtype id or None, on-disk dtype, byte count) of a variable, in the layout of binary ``version``."""
    if version < FIRST_DTYPE_ID_VERSION:
        item_size = cursor.u8(f"the item size of {name}")
        if item_size not in DTYPES_BY_ITEM_SIZE:
            raise CT2FormatError(
                f"{cursor.source}: corrupted CTranslate2 model file: {name} has unknown item size {item_size}"
            )
        return None, DTYPES_BY_ITEM_SIZE[item_size], cursor.u32(f"the value count of {name}") * item_size
    dtype_id = cursor.u8(f"the dtype of {name}")
    if dtype_id not in DTYPES_BY_ID:
        raise CT2FormatError(
            f"{cursor.source}: corrupted CTranslate2 model file: {name} has unknown dtype id {dtype_id}"
        )
    return dtype_id, DTYPES_BY_ID[dtype_id], cursor.u32(f"the byte count of {name}")


def _read_array(cursor: _Cursor, name: str, version: int) -> np.ndarray:
    rank = cursor.u8(f"the rank of {name}")
    shape = cursor.unpack(f"<{rank}I", f"the shape of {name}") if rank else ()
    dtype_id, dtype, byte_count = _read_dtype(cursor, name, version)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if byte_count != expected:
        raise CT2FormatError(
            f"{cursor.source}: corrupted CTranslate2 model file: {name} of shape {list(shape)} and dtype "
            f"{dtype} should take {expected} bytes, the file says {byte_count}"
        )
    raw = cursor.take(byte_count, f"the values of {name}")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if dtype_id == BFLOAT16_ID:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _read_aliases(cursor: _Cursor, variables: dict[str, np.ndarray]) -> dict[str, str]:
    count = cursor.u32("the alias count")
    aliases: dict[str, str] = {}
    for index in range(count):
        alias = cursor.string(f"alias {index}")
        target = cursor.string(f"the target of alias {alias}")
        if target not in variables:
            raise CT2FormatError(
                f"{cursor.source}: corrupted CTranslate2 model file: alias {alias} points to unknown variable {target}"
            )
        aliases[alias] = target
    return aliases


# --------------------------------------------------------------------------------------------------------------------
# Whisper: CTranslate2 WhisperSpec -> transformers WhisperForConditionalGeneration
# --------------------------------------------------------------------------------------------------------------------

SAMPLING_RATE = 16_000  # Hz, the rate every Whisper model was trained on
TIMESTAMP_COUNT = 1501  # <|0.00|> ... <|30.00|> in 0.02 s steps, the last ids of every Whisper vocabulary
TIMESTAMP_STEP_S = 0.02  # seconds between two timestamp tokens
MULTILINGUAL_MIN_VOCAB = 51865  # vocabulary size from which a Whisper model is multilingual
NO_SPEECH_TOKENS = ("<|nocaptions|>", "<|nospeech|>")  # the "no speech" token's name before and from large-v3 on
GELU_ACTIVATION_ID = 3  # CTranslate2's id for exact (erf) GELU, Whisper's activation
WHISPER_FLAGS = {  # CTranslate2 scalar -> the value an OpenAI Whisper model must have (anything else is refused)
    "decoder/activation": GELU_ACTIVATION_ID,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
INFORMATIONAL_SCALARS = (  # scalars that describe the model but carry no weights
    "encoder/num_heads",
    "decoder/num_heads",
    "decoder/alignment_heads",
    "decoder/alignment_layer",
)


@dataclass(frozen=True)
class WhisperDims:
    """Sizes of a Whisper model, read off its tensors."""

    n_mels: int  # mel bins the convolution stem expects
    d_model: int  # width of every hidden state
    encoder_layers: int  # transformer blocks in the encoder
    decoder_layers: int  # transformer blocks in the decoder
    encoder_heads: int  # attention heads per encoder block
    decoder_heads: int  # attention heads per decoder block
    encoder_ffn_dim: int  # hidden width of the encoder's feed-forward blocks
    decoder_ffn_dim: int  # hidden width of the decoder's feed-forward blocks
    max_source_positions: int  # encoder positions (1500 = 30 s after the stride-2 stem)
    max_target_positions: int  # decoder positions (448 tokens)
    vocab_size: int  # rows of the token embedding (51864 English-only, 51865 multilingual)


@dataclass(frozen=True)
class WhisperTokens:
    """The special token ids of a Whisper vocabulary."""

    end_of_text: int  # <|endoftext|>: end of sequence and padding
    start_of_transcript: int  # <|startoftranscript|>: the decoder's first token
    translate: int  # <|translate|> task token
    transcribe: int  # <|transcribe|> task token
    start_of_prev: int  # <|startofprev|>: opens a text prompt
    no_captions: int  # <|nocaptions|> (<|nospeech|> in the large-v3 family): the "no speech" token
    no_timestamps: int  # <|notimestamps|>; the timestamp tokens follow it
    languages: dict[str, int]  # "<|en|>" -> id for each language token (English-only models still list them)


def count_layers(variables: dict[str, np.ndarray], stack: str) -> int:
    """Number of ``{stack}/layer_{i}/`` blocks, checking they are numbered 0..n-1."""
    pattern = re.compile(rf"^{stack}/layer_(\d+)/")
    indices = {int(match.group(1)) for name in variables if (match := pattern.match(name))}
    if indices != set(range(len(indices))):
        raise CT2FormatError(f"{stack} layers are not numbered 0..n-1: {sorted(indices)}")
    return len(indices)


def _require(variables: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in variables:
        raise CT2FormatError(f"not a CTranslate2 Whisper model: variable {name} is missing")
    return variables[name]


def whisper_dims(variables: dict[str, np.ndarray]) -> WhisperDims:
    """Read a Whisper model's sizes off its CTranslate2 variables."""
    conv1 = _require(variables, "encoder/conv1/weight")  # (d_model, n_mels, 3)
    encoder_heads = int(_require(variables, "encoder/num_heads"))
    return WhisperDims(
        n_mels=conv1.shape[1],
        d_model=conv1.shape[0],
        encoder_layers=count_layers(variables, "encoder"),
        decoder_layers=count_layers(variables, "decoder"),
        encoder_heads=encoder_heads,
        decoder_heads=int(variables.get("decoder/num_heads", encoder_heads)),
        encoder_ffn_dim=_require(variables, "encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn_dim=_require(variables, "decoder/layer_0/ffn/linear_0/weight").shape[0],
        max_source_positions=_require(variables, "encoder/position_encodings/encodings").shape[0],
        max_target_positions=_require(variables, "decoder/position_encodings/encodings").shape[0],
        vocab_size=_require(variables, "decoder/embeddings/weight").shape[0],
    )


def check_whisper_flags(variables: dict[str, np.ndarray]) -> None:
    """Refuse CTranslate2 models whose layout flags differ from OpenAI Whisper's (they would convert silently wrong)."""
    for name, expected in WHISPER_FLAGS.items():
        if name in variables and int(variables[name]) != expected:
            raise CT2FormatError(f"not an OpenAI Whisper layout: {name} is {int(variables[name])}, expected {expected}")


class _WeightTaker:
    """Hands out CTranslate2 variables as float32 arrays and remembers which ones were used."""

    def __init__(self, variables: dict[str, np.ndarray]):
        self.variables = variables
        self.used: set[str] = set()

    def take(self, name: str) -> np.ndarray:
        array = _require(self.variables, name)
        self.used.add(name)
        scale_name = f"{name}{SCALE_SUFFIX}"
        if array.dtype.kind in "iu":  # int8/int16 weights with per-row scales
            if scale_name not in self.variables:
                raise CT2FormatError(f"{name} is quantized to {array.dtype}, but its scale {scale_name} is missing")
            self.used.add(scale_name)
            scale = self.variables[scale_name].astype(np.float32)
            return array.astype(np.float32) / scale.reshape(-1, *([1] * (array.ndim - 1)))
        return array.astype(np.float32)

    def unused(self) -> list[str]:
        projection = "decoder/projection/weight"  # tied to the embedding, as is its scale
        ignorable = set(WHISPER_FLAGS) | set(INFORMATIONAL_SCALARS) | {projection, f"{projection}{SCALE_SUFFIX}"}
        return sorted(set(self.variables) - self.used - ignorable)


def _linear(taker: _WeightTaker, source: str, target: str, bias: bool = True) -> dict[str, np.ndarray]:
    tensors = {f"{target}.weight": taker.take(f"{source}/weight")}
    if bias:
        tensors[f"{target}.bias"] = taker.take(f"{source}/bias")
    return tensors


def _layer_norm(taker: _WeightTaker, source: str, target: str) -> dict[str, np.ndarray]:
    return {f"{target}.weight": taker.take(f"{source}/gamma"), f"{target}.bias": taker.take(f"{source}/beta")}


def _split_rows(weight: np.ndarray, parts: int) -> list[np.ndarray]:
    if weight.shape[0] % parts:
        raise CT2FormatError(f"a fused projection with {weight.shape[0]} rows cannot be split into {parts}")
    return np.split(weight, parts, axis=0)


def _fused_projections(taker: _WeightTaker, source: str, target: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Split a projection fused along dim 0 (q,k,v or k,v) into separate ones; k keeps no bias.

    Dropping k's bias is exact: it adds the same q.b to every score of a query, which softmax ignores.
    """
    weights = _split_rows(taker.take(f"{source}/weight"), len(names))
    biases = _split_rows(taker.take(f"{source}/bias"), len(names))
    tensors = {}
    for name, weight, bias in zip(names, weights, biases):
        tensors[f"{target}.{name}_proj.weight"] = weight
        if name != "k":
            tensors[f"{target}.{name}_proj.bias"] = bias
    return tensors


def _self_attention(taker: _WeightTaker, source: str, target: str) -> dict[str, np.ndarray]:
    tensors = _fused_projections(taker, f"{source}/self_attention/linear_0", f"{target}.self_attn", ("q", "k", "v"))
    tensors |= _linear(taker, f"{source}/self_attention/linear_1", f"{target}.self_attn.out_proj")
    tensors |= _layer_norm(taker, f"{source}/self_attention/layer_norm", f"{target}.self_attn_layer_norm")
    return tensors


def _cross_attention(taker: _WeightTaker, source: str, target: str) -> dict[str, np.ndarray]:
    tensors = _linear(taker, f"{source}/attention/linear_0", f"{target}.encoder_attn.q_proj")
    tensors |= _fused_projections(taker, f"{source}/attention/linear_1", f"{target}.encoder_attn", ("k", "v"))
    tensors |= _linear(taker, f"{source}/attention/linear_2", f"{target}.encoder_attn.out_proj")
    tensors |= _layer_norm(taker, f"{source}/attention/layer_norm", f"{target}.encoder_attn_layer_norm")
    return tensors


def _feed_forward(taker: _WeightTaker, source: str, target: str) -> dict[str, np.ndarray]:
    tensors = _linear(taker, f"{source}/ffn/linear_0", f"{target}.fc1")
    tensors |= _linear(taker, f"{source}/ffn/linear_1", f"{target}.fc2")
    tensors |= _layer_norm(taker, f"{source}/ffn/layer_norm", f"{target}.final_layer_norm")
    return tensors


def whisper_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' WhisperForConditionalGeneration state dict (float32 numpy) from CTranslate2 variables.

    ``proj_out.weight`` is left out: it is tied to the token embedding, as in Hugging Face's own checkpoints.
    """
    check_whisper_flags(variables)
    dims = whisper_dims(variables)
    taker = _WeightTaker(variables)
    tensors: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        tensors |= _linear(taker, f"encoder/{conv}", f"model.encoder.{conv}")
    tensors["model.encoder.embed_positions.weight"] = taker.take("encoder/position_encodings/encodings")
    for index in range(dims.encoder_layers):
        source, target = f"encoder/layer_{index}", f"model.encoder.layers.{index}"
        tensors |= _self_attention(taker, source, target) | _feed_forward(taker, source, target)
    tensors |= _layer_norm(taker, "encoder/layer_norm", "model.encoder.layer_norm")
    tensors["model.decoder.embed_tokens.weight"] = taker.take("decoder/embeddings/weight")
    tensors["model.decoder.embed_positions.weight"] = taker.take("decoder/position_encodings/encodings")
    for index in range(dims.decoder_layers):
        source, target = f"decoder/layer_{index}", f"model.decoder.layers.{index}"
        tensors |= _self_attention(taker, source, target) | _cross_attention(taker, source, target)
        tensors |= _feed_forward(taker, source, target)
    tensors |= _layer_norm(taker, "decoder/layer_norm", "model.decoder.layer_norm")
    _check_projection_is_tied(variables)
    if taker.unused():
        raise CT2FormatError(f"not a Whisper layout this converter knows: unused variables {taker.unused()[:5]}")
    return tensors


def _check_projection_is_tied(variables: dict[str, np.ndarray]) -> None:
    projection = variables.get("decoder/projection/weight")
    embeddings = variables["decoder/embeddings/weight"]
    if projection is not None and projection is not embeddings and not np.array_equal(projection, embeddings):
        raise CT2FormatError("decoder/projection/weight differs from the token embedding; Whisper ties them")


# --- tokens, configs and the output directory -----------------------------------------------------------------------

def timestamp_tokens() -> list[str]:
    """``<|0.00|>`` ... ``<|30.00|>``, the 1501 timestamp tokens in id order."""
    return [f"<|{index * TIMESTAMP_STEP_S:.2f}|>" for index in range(TIMESTAMP_COUNT)]


def whisper_tokens(tokenizer_json: dict) -> WhisperTokens:
    """Special token ids from a Whisper tokenizer.json's added tokens."""
    ids = {token["content"]: token["id"] for token in tokenizer_json.get("added_tokens", [])}
    no_speech = next((token for token in NO_SPEECH_TOKENS if token in ids), NO_SPEECH_TOKENS[0])
    names = {
        "end_of_text": "<|endoftext|>",
        "start_of_transcript": "<|startoftranscript|>",
        "translate": "<|translate|>",
        "transcribe": "<|transcribe|>",
        "start_of_prev": "<|startofprev|>",
        "no_captions": no_speech,
        "no_timestamps": "<|notimestamps|>",
    }
    missing = [token for token in names.values() if token not in ids]
    if missing:
        raise CT2FormatError(f"not a Whisper tokenizer.json: special tokens {missing} are missing")
    fields = {field: ids[token] for field, token in names.items()}
    languages = {
        token: token_id
        for token, token_id in sorted(ids.items(), key=lambda item: item[1])
        if fields["start_of_transcript"] < token_id < fields["translate"]
    }
    return WhisperTokens(**fields, languages=languages)


def with_timestamp_tokens(tokenizer_json: dict, tokens: WhisperTokens, vocab_size: int) -> dict:
    """A copy of tokenizer.json whose added tokens include the timestamps, checked against the model's vocabulary."""
    present = {token["content"] for token in tokenizer_json["added_tokens"]}
    added = [dict(token) for token in tokenizer_json["added_tokens"]]
    for index, content in enumerate(timestamp_tokens()):
        if content not in present:
            added.append({"id": tokens.no_timestamps + 1 + index, "content": content, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    if tokens.no_timestamps + 1 + TIMESTAMP_COUNT != vocab_size:
        raise CT2FormatError(
            f"tokenizer and model disagree: <|notimestamps|> is {tokens.no_timestamps}, so the vocabulary should "
            f"have {tokens.no_timestamps + 1 + TIMESTAMP_COUNT} tokens, but the embedding has {vocab_size} rows"
        )
    return {**tokenizer_json, "added_tokens": sorted(added, key=lambda token: token["id"])}


def is_multilingual(dims: WhisperDims) -> bool:
    """OpenAI's rule: the English-only vocabulary has 51864 tokens, every multilingual one at least 51865."""
    return dims.vocab_size >= MULTILINGUAL_MIN_VOCAB


def whisper_config_dict(dims: WhisperDims, tokens: WhisperTokens, ct2_config: dict) -> dict:
    """Keyword arguments for transformers' WhisperConfig."""
    return {
        "vocab_size": dims.vocab_size,
        "num_mel_bins": dims.n_mels,
        "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers,
        "decoder_layers": dims.decoder_layers,
        "encoder_attention_heads": dims.encoder_heads,
        "decoder_attention_heads": dims.decoder_heads,
        "encoder_ffn_dim": dims.encoder_ffn_dim,
        "decoder_ffn_dim": dims.decoder_ffn_dim,
        "max_source_positions": dims.max_source_positions,
        "max_target_positions": dims.max_target_positions,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "pad_token_id": tokens.end_of_text,
        "bos_token_id": tokens.end_of_text,
        "eos_token_id": tokens.end_of_text,
        "decoder_start_token_id": tokens.start_of_transcript,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [])),
    }


def whisper_generation_dict(dims: WhisperDims, tokens: WhisperTokens, ct2_config: dict) -> dict:
    """Keyword arguments for a GenerationConfig that makes plain ``generate()`` transcribe without timestamps.

    English-only models start with <|startoftranscript|><|notimestamps|>. Multilingual ones detect the language,
    then <|transcribe|><|notimestamps|> (pass ``language="en"`` to skip detection).
    """
    config = {
        "decoder_start_token_id": tokens.start_of_transcript,
        "bos_token_id": tokens.end_of_text,
        "eos_token_id": tokens.end_of_text,
        "pad_token_id": tokens.end_of_text,
        "max_length": dims.max_target_positions,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [])),
        "no_timestamps_token_id": tokens.no_timestamps,
        "prev_sot_token_id": tokens.start_of_prev,
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
        "is_multilingual": is_multilingual(dims),
    }
    if ct2_config.get("alignment_heads"):
        config["alignment_heads"] = [list(pair) for pair in ct2_config["alignment_heads"]]
    if config["is_multilingual"]:
        config["lang_to_id"] = dict(tokens.languages)
        config["task_to_id"] = {"translate": tokens.translate, "transcribe": tokens.transcribe}
        config["task"] = "transcribe"
    return config


def tokenizer_config_dict(dims: WhisperDims) -> dict:
    """tokenizer_config.json for transformers' WhisperTokenizer (tokenizer.json carries the vocabulary)."""
    special = "<|endoftext|>"
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": special,
        "eos_token": special,
        "unk_token": special,
        "pad_token": special,
        "add_prefix_space": False,
        "model_max_length": dims.max_target_positions,
    }


def write_whisper_directory(
    model_bin: CT2Model | dict[str, np.ndarray], ct2_config: dict, tokenizer_json: dict, out_dir: str | Path
) -> Path:
    """Write a Hugging Face Whisper directory (config, generation config, safetensors, tokenizer, preprocessor).

    ``out_dir`` must not exist yet or be empty; ``WhisperForConditionalGeneration.from_pretrained(out_dir)`` and
    ``WhisperProcessor.from_pretrained(out_dir)`` load the result offline.
    """
    from safetensors.numpy import save_file  # noqa: PLC0415 - keep the reader importable without safetensors
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor  # noqa: PLC0415

    variables = model_bin.variables if isinstance(model_bin, CT2Model) else model_bin
    dims = whisper_dims(variables)
    tokens = whisper_tokens(tokenizer_json)
    full_tokenizer = with_timestamp_tokens(tokenizer_json, tokens, dims.vocab_size)
    tensors = whisper_state_dict(variables)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    WhisperConfig(**whisper_config_dict(dims, tokens, ct2_config)).save_pretrained(out)
    GenerationConfig(**whisper_generation_dict(dims, tokens, ct2_config)).save_pretrained(out)
    WhisperFeatureExtractor(feature_size=dims.n_mels, sampling_rate=SAMPLING_RATE).save_pretrained(out)
    (out / "tokenizer.json").write_text(json.dumps(full_tokenizer, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config_dict(dims), indent=2), encoding="utf-8")
    return out
