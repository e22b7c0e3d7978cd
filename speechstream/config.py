"""Frozen configuration dataclasses, loaded from YAML with unknown keys rejected (and in model configs, keys given
twice).

Model configs live in ``models/<name>/config.yaml``; decoding options map one-to-one
onto command-line flags.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from speechstream.errors import InputError


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """A Whisper-architecture speech encoder run block-causally."""

    d_model: int = 384  # width of the encoder
    layers: int = 4  # transformer layers
    heads: int = 6  # attention heads
    ffn_dim: int = 1536  # feed-forward width
    num_mel_bins: int = 80  # input features per frame
    max_source_positions: int = 1500  # rows of the sinusoidal position table (30 s)
    left_frames: int | None = 500  # encoder frames of left context each block sees (None: unbounded)
    # encoder frames (20 ms each) past a block's end that the block also sees; the block is emitted that much later
    # (0: no right context beyond the stem's own look-ahead)
    lookahead_frames: int = 0
    weights: str | None = None  # Whisper checkpoint (asset name, HF directory or hub id); None: random init
    # the last N transformer layers (and the final layer norm) are trained with the projector, and their weights
    # ship in the model's checkpoint; the layers below stay Whisper's (0: the whole encoder frozen)
    tuned_layers: int = 0


@dataclasses.dataclass(frozen=True)
class ProjectorConfig:
    """Frame stacking plus a two-layer MLP into the LLM's embedding space."""

    stack: int = 4  # encoder frames per source token (4 x 20 ms = 80 ms)
    # the MLP's output times this is what the LLM reads; the CTC head scores the MLP's output itself, so a
    # scale < 1 brings CTC-sharpened speech vectors (norm ~30) down to the LLM's embedding norm (~3)
    output_scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class LLMConfig:
    """The decoder-only LLM and its group position encoding."""

    architecture: str = "llama"  # llama | qwen2 | gemma2 | phi3 (used when no base is given)
    base: str | None = None  # pretrained LLM (asset name, HF directory or hub id); None: build from the fields below
    hidden_size: int = 64  # tiny models only
    layers: int = 2  # tiny models only
    heads: int = 4  # tiny models only
    kv_heads: int = 2  # tiny models only
    intermediate_size: int = 128  # tiny models only
    phi: int = 0  # first position id of the target group
    lora_rank: int = 0  # LoRA rank of the adapters on the attention projections (0: none)
    lora_alpha: int = 32  # LoRA scaling numerator (scale = alpha / rank)
    lora_targets: str = "attention"  # "attention": q/k/v/o projections; "all": the MLP projections too


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """How source and target token sequences are framed around the speech."""

    source_prefix: str = "<|im_start|>user\nTranscribe the audio.\n"  # text before the speech (source group)
    source_suffix: str = "<|im_end|>\n"  # end-of-source marker, read at finish
    target_prefix: str = "<|im_start|>assistant\n"  # assistant header (target group)
    eoc_token: str = "<|eoc|>"  # end of chunk: the writer asks for the next chunk
    eos_token: str = "<|im_end|>"  # end of the transcript


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a speech LLM."""

    name: str = "tiny-random"  # display name (load_model_config: where the file gives none, its folder's name)
    tokenizer: str = "bytes"  # "bytes" (built-in byte-level tokenizer) or a tokenizer directory / hub id
    seed: int = 0  # initialisation seed of randomly initialised parts
    encoder: EncoderConfig = EncoderConfig()
    projector: ProjectorConfig = ProjectorConfig()
    llm: LLMConfig = LLMConfig()
    prompt: PromptConfig = PromptConfig()
    # safetensors with trained projector/adapter weights, relative to the config's folder ("~/..." in the home folder)
    checkpoint: str | None = None
    ctc_weight: float = 0.0  # the joint CTC decoding weight used when decoding does not set one (needs a CTC head)
    # whether the CTC head's labels are the output text (ASR). A translation model's head transcribes the source
    # language, so joint CTC decoding would push source-language words into the output: it is refused.
    ctc_is_output: bool = True
    # frames between the windows of the fine CTC head that joint decoding scores (speechstream/ctc_head.py): 0, none
    # (the CTC head on the speech tokens, one per projector stack); 1..stack, a head of its own every that many frames
    ctc_hop: int = 0
    # the languages the model was trained for: of its speech (e.g. "en") and of the text it writes; None: not
    # declared (a test model): any --source-lang / --target-lang is taken as given
    source_lang: str | None = None
    target_lang: str | None = None
    # the chunk size (ms) the model was trained on; None: not declared. Shorter chunks at decoding time give the
    # encoder and the writer much less than they learned from (chunk_note)
    train_chunk_ms: int | None = None


# The largest count any option takes (a C int): --k, --max-repeats, --threads and the other whole numbers.
MAX_COUNT = 2**31 - 1
# --threads (and a recipe's threads) at most: 10,000 OpenMP threads took minutes to start, 100,000 failed to map a
# library
MAX_THREADS = 1024
MAX_BEAM = 16  # --beam: each hypothesis is a branch of the stream's cache (``decoder.Branches``) fed at every beam step
BEAM_NEEDS_CTC = "--beam above 1 searches with joint CTC decoding: it needs --ctc-weight above 0"

# Precisions of the LLM's weights (``DecodingConfig.dtype``, ``--dtype``): float32 keeps the streaming = batch forward
# contract to float precision; bfloat16 halves the weights each step reads (faster where the CPU computes in it
# natively, AVX-512 BF16 or AMX, and on GPUs) and decodes within its own precision
DTYPES = ("float32", "bfloat16")

# Decoding-time GPE ablations (``DecodingConfig.ablation``, ``--ablation``); speechstream.gpe implements them.
ABLATIONS = ("none", "interleaved", "source-sees-target", "reencode")


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """Streaming decoding options (each has a command-line flag of the same name, except ``max_tail_tokens`` and
    ``context_tokens``, which only the Python API sets)."""

    chunk_ms: int = 640  # audio per chunk (source segment)
    policy: str = "wait-k"  # read/write policy name
    k: int = 2  # chunks read before the first write
    max_tokens_per_chunk: int = 24  # cap on text tokens written between two reads (header, markers not counted)
    max_tail_tokens: int = 200  # cap on tokens written after the end of the audio
    max_repeats: int = 4  # repetition guard: a block repeated this often ends the chunk's writing (0: off; not 1)
    # torch device, the CPU speed mode (int8 dynamic quantization of the LLM: approximate, model.quantize_int8) and
    # the LLM's precision (DTYPES): the commands load the model so (model.load_decoding_model); a session runs its
    # model as loaded and refuses these when they name another device (the default "cpu" takes any), int8 for a
    # float model or bfloat16 for a float32 one (the default "float32" takes any)
    device: str = "cpu"
    int8: bool = False
    dtype: str = "float32"
    ablation: str = "none"  # decoding-time GPE ablation (speechstream.gpe.ABLATIONS); "none" is GPE itself
    vad: bool = False  # long sessions: Silero VAD pauses end a segment; the front end and LLM cache then restart
    vad_min_silence_ms: int = 600  # with vad: the pause (ms) that ends a segment (refused without vad)
    context_tokens: int = 0  # at a segment cut (VAD or position limit): last committed tokens fed after its header
    # joint CTC decoding (speechstream.ctc): weight of the CTC head's prefix scores; 0: off, None: the model's own
    ctc_weight: float | None = None
    ctc_candidates: int = 32  # joint CTC decoding: the LLM's best text tokens re-ranked at each step
    beam: int = 1  # joint CTC decoding: hypotheses of the beam search over each chunk's writing (1: greedy)

    def __post_init__(self) -> None:
        """Values no stream could decode with are input errors, named by their command-line flags."""
        from speechstream.chunker import chunk_samples

        def integer(name: str, low: int, high: int = MAX_COUNT) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InputError(f"--{name.replace('_', '-')} must be a whole number, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers too, stored as int
            if value < low:
                raise InputError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
            if value > high:  # (counts past a C int overflowed deep in the decoder, e.g. the repetition window)
                raise InputError(f"--{name.replace('_', '-')} must be at most {high}, got {value}")

        chunk_samples(self.chunk_ms)
        object.__setattr__(self, "chunk_ms", int(self.chunk_ms))  # 640.0 or numpy's 640 as the int 640 (config.json)
        for name, low in (("k", 1), ("max_tokens_per_chunk", 1), ("max_tail_tokens", 1), ("max_repeats", 0),
                          ("vad_min_silence_ms", 32), ("context_tokens", 0), ("ctc_candidates", 1)):
            integer(name, low)
        integer("beam", 1, MAX_BEAM)
        if self.beam > 1 and self.ablation != "none":
            raise InputError(f"--beam above 1 decodes with GPE only, not --ablation {self.ablation}")
        if self.max_repeats == 1:
            raise InputError("--max-repeats must be 0 (off) or at least 2: every block of one token repeats once, so "
                             "1 would stop all writing")
        if self.ablation not in ABLATIONS:
            raise InputError(f"unknown ablation {self.ablation!r} (known: {', '.join(ABLATIONS)})")
        for name in ("int8", "vad"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))  # numpy's bools too, stored as bool
        if not self.vad and self.vad_min_silence_ms != DecodingConfig.vad_min_silence_ms:  # it would do nothing
            raise InputError("--vad-min-silence-ms is the pause that ends a VAD segment: it needs --vad")
        weight = self.ctc_weight
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, numbers.Real)
                                   or not 0.0 <= weight < 1.0):
            raise InputError(f"--ctc-weight must be at least 0 and below 1, got {weight!r}")
        if weight is not None:
            object.__setattr__(self, "ctc_weight", float(weight))  # numpy floats too, stored as float
        if self.beam > 1 and weight == 0:
            raise InputError(BEAM_NEEDS_CTC)
        if not isinstance(self.policy, str) or not isinstance(self.device, str):
            raise InputError("policy and device must be names (strings)")
        from speechstream.policy import POLICIES

        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r} (known: {', '.join(POLICIES)})")
        check_device(self.device)
        if self.int8 and self.device != "cpu":  # refused here, before a model loads onto the device
            raise InputError(f"--int8 is a CPU speed mode (int8 weights on the CPU): not with --device {self.device}")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.int8 and self.dtype != "float32":
            raise InputError(f"--int8 quantizes float32 weights: not with --dtype {self.dtype}")


def check_device(device: str) -> None:
    """A torch device this machine has (cpu; cuda or mps where present), or a one-line input error."""
    if not isinstance(device, str):  # (torch's TypeError for None spans lines; an int it takes as a CUDA index)
        raise InputError(f"--device must be a name (cpu, cuda, cuda:1, mps), got {device!r}")
    if device == "cpu":
        return
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA GPU is available here (use cpu)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device}: MPS is not available here (use cpu)")
    if kind == "cpu":  # (cpu:0: the one CPU device by an index, which the commands compare as "cpu")
        raise InputError(f"--device {device}: the CPU takes no index (give --device cpu)")
    if kind not in ("cuda", "mps"):
        raise InputError(f"--device {device}: unsupported (cpu, cuda or mps)")
    index = torch.device(device).index  # (torch's "invalid device ordinal" came once the model was built)
    count = torch.cuda.device_count() if kind == "cuda" else 1
    if index is not None and index >= count:
        present = f"{kind}:0" if count == 1 else f"{kind}:0 .. {kind}:{count - 1}"
        raise InputError(f"--device {device}: no such device here (this machine has {present})")


def with_model_defaults(decoding: DecodingConfig, model: ModelConfig) -> DecodingConfig:
    """``decoding`` with the options it leaves to the model (None) taken from the model's config."""
    if decoding.ctc_weight is None:
        if decoding.beam > 1 and model.ctc_weight == 0:  # (an explicit 0 DecodingConfig refuses itself)
            if not model.ctc_is_output:
                raise InputError(f"--beam above 1 searches with joint CTC decoding, which model {model.name} cannot "
                                 "use: its CTC head transcribes the source language, not the output text")
            raise InputError(f"{BEAM_NEEDS_CTC} (model {model.name} decodes greedily by default)")
        return dataclasses.replace(decoding, ctc_weight=model.ctc_weight)
    if decoding.ctc_weight > 0 and not model.ctc_is_output:
        raise InputError(f"model {model.name}: its CTC head transcribes the source language, not the output text, "
                         "so joint CTC decoding cannot be used (--ctc-weight 0)")
    return decoding


def chunk_note(decoding: DecodingConfig, model: ModelConfig) -> str | None:
    """A note for the user when the chunks are shorter than those the model was trained on, else None."""
    if model.train_chunk_ms is None or decoding.chunk_ms >= model.train_chunk_ms:
        return None
    return (f"speechstream: note: {model.name} was trained on {model.train_chunk_ms} ms chunks; at "
            f"{decoding.chunk_ms} ms it reads far less speech per step than it learned from and transcribes much "
            f"worse (recipes/RESULTS.md)")


def one_line(error: BaseException) -> str:
    """An exception's message on one line (YAML parser messages span several, with a caret under the column)."""
    return " ".join(str(error).split())


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1) with YAML 1.2's floats: 1e-4 and 2E5 are numbers, not the strings 1.1 makes
    of them without a dot (``lr_lora: 1e-4`` was refused as "the wrong type")."""


class UniqueKeyYamlLoader(YamlLoader):
    """``YamlLoader`` for model configs and training recipes: a key given twice in one mapping is an error, as YAML
    has it (PyYAML kept the last value: a second ``encoder:`` section dropped the first whole). Keys a merge (``<<``)
    brings in may be given again."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:  # (an unhashable key: the constructor's own error names it)
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(None, None, f"found duplicate key {key!r}",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


YAML_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")
YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_EXPONENT_FLOAT, list("-+0123456789"))


def load_yaml(text: str, loader: type[YamlLoader] = YamlLoader) -> Any:
    """``yaml.safe_load`` with YAML 1.2's floats (`YamlLoader`, or ``loader``). Nesting deeper than the parser
    recurses (``[[[...`` thousands deep) is a ``yaml.YAMLError``, as other malformed YAML is, not the parser's
    RecursionError."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


def read_yaml(path: Path | str, what: str, loader: type[YamlLoader] = YamlLoader) -> Any:
    """A YAML file's contents (read by ``loader``); unreadable, undecodable or malformed files are one-line input
    errors."""
    try:
        return load_yaml(Path(path).read_text(encoding="utf-8"), loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise InputError(f"{path}: cannot read {what} ({one_line(error)})") from None


def from_dict(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses; unknown keys and missing required
    keys are errors."""
    if data is not None and not isinstance(data, dict):
        raise InputError(f"a config{' key ' + where.rstrip('.') if where else ''} must be a mapping of keys to values")
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - set(fields)))  # (YAML keys need not be strings: ``1: 2``)
    if unknown:
        raise InputError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(where + k for k in unknown)}")
    missing = [name for name, f in fields.items() if name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise InputError(f"missing config key{'s' if len(missing) > 1 else ''} {', '.join(where + k for k in missing)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise InputError(f"config key {where}{name} must be a mapping")
            value = from_dict(hint, value, f"{where}{name}.")
        else:
            value = _check_type(value, hint, where + name)
        values[name] = value
    return cls(**values)


def _check_type(value: Any, hint: Any, name: str) -> Any:
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > sys.float_info.max:  # (float() raised OverflowError)
                raise InputError(f"config key {name} is too large for a number (a whole number of "
                                 f"{len(str(abs(value)))} digits)")
            return float(value)
        bool_as_int = kind is int and isinstance(value, bool)
        if kind in (int, str, bool, float) and isinstance(value, kind) and not bool_as_int:
            return value
    if isinstance(value, bool) and str in allowed:  # (``source_lang: no``, Norwegian, reads as false)
        raise InputError(f"config key {name} has the wrong type: {value!r} (YAML reads an unquoted no, yes, off or on "
                         "as false or true: put text in quotes)")
    raise InputError(f"config key {name} has the wrong type: {value!r}")


def load_model_config(path: Path) -> ModelConfig:
    """Read ``models/<name>/config.yaml``."""
    data = read_yaml(path, "model config", UniqueKeyYamlLoader)
    if not isinstance(data, dict):
        raise InputError(f"{path}: a model config must be a mapping")
    try:
        config = from_dict(ModelConfig, data)
    except InputError as error:
        raise InputError(f"{path}: {error}") from None
    check_sizes(config, str(path))
    if not 0.0 <= config.ctc_weight < 1.0:
        raise InputError(f"{path}: ctc_weight must be at least 0 and below 1")
    if config.ctc_weight > 0 and not config.ctc_is_output:
        raise InputError(f"{path}: ctc_weight must be 0 when ctc_is_output is false")
    check_ctc_hop(config, str(path))
    if "name" not in data:  # (the default, tiny-random's, named the shipped test model in this model's messages)
        config = dataclasses.replace(config, name=default_model_name(path))
    return dataclasses.replace(config, **{key: language_code(getattr(config, key), f"{path}: {key}")
                                          for key in ("source_lang", "target_lang")})


def default_model_name(path: Path) -> str:
    """The name of a model whose config gives none: its folder's for a ``config.yaml``, else the YAML file's own."""
    path = Path(path).absolute()
    return path.parent.name if path.name == "config.yaml" else path.stem


def language_code(value: str | None, name: str) -> str | None:
    """A model's declared language as the commands compare it (``--source-lang ES`` is taken as ``es``): stripped
    and lower case; None stays None (not declared). An empty one is an InputError naming it as ``name``: a model
    declaring "ES" or " en" refused every --source-lang / --target-lang given, even its own."""
    if value is None:
        return None
    if not value.strip():
        raise InputError(f"{name} must be a language code such as en, or left out, not {value!r}")
    return value.strip().lower()


def check_sizes(config: ModelConfig, where: str) -> None:
    """The architecture's sizes are positive and the attention widths divide into their heads; the seed and
    the projector's scale are numbers torch can take."""
    enc, llm = config.encoder, config.llm
    sizes = {"encoder.d_model": enc.d_model, "encoder.layers": enc.layers, "encoder.heads": enc.heads,
             "encoder.ffn_dim": enc.ffn_dim, "encoder.num_mel_bins": enc.num_mel_bins,
             "encoder.max_source_positions": enc.max_source_positions, "projector.stack": config.projector.stack,
             "llm.hidden_size": llm.hidden_size, "llm.layers": llm.layers, "llm.heads": llm.heads,
             "llm.kv_heads": llm.kv_heads, "llm.intermediate_size": llm.intermediate_size}
    for name, value in sizes.items():
        if value < 1:
            raise InputError(f"{where}: {name} must be at least 1, not {value}")
    counts = {"encoder.left_frames": enc.left_frames or 0, "encoder.lookahead_frames": enc.lookahead_frames,
              "encoder.tuned_layers": enc.tuned_layers, "llm.phi": llm.phi, "llm.lora_rank": llm.lora_rank}
    for name, value in counts.items():
        if value < 0:
            raise InputError(f"{where}: {name} must not be negative, not {value}")
    for name, value in (sizes | counts).items():  # (past a C int, torch's tensor sizes overflowed deep in the build)
        if value > MAX_COUNT:
            raise InputError(f"{where}: {name} must be at most {MAX_COUNT}, not {value}")
    if enc.tuned_layers > enc.layers:
        raise InputError(f"{where}: encoder.tuned_layers ({enc.tuned_layers}) must not exceed encoder.layers "
                         f"({enc.layers})")
    from speechstream.audio import N_MELS

    if enc.num_mel_bins != N_MELS:
        raise InputError(f"{where}: encoder.num_mel_bins must be {N_MELS} (the log-mel features computed)")
    if enc.d_model % enc.heads:
        raise InputError(f"{where}: encoder.d_model ({enc.d_model}) must be a multiple of encoder.heads ({enc.heads})")
    if llm.base is None and (llm.hidden_size % llm.heads or llm.heads % llm.kv_heads):
        raise InputError(f"{where}: llm.hidden_size ({llm.hidden_size}) must be a multiple of llm.heads ({llm.heads}), "
                         f"and llm.heads of llm.kv_heads ({llm.kv_heads})")
    if enc.d_model % 2 or enc.d_model < 4:  # (Whisper's sinusoids: a sine and a cosine half, each of 2 or more)
        raise InputError(f"{where}: encoder.d_model must be even and at least 4 (its sinusoidal positions), not "
                         f"{enc.d_model}")
    if llm.base is None and llm.hidden_size // llm.heads % 2:  # (RoPE rotates pairs of channels)
        raise InputError(f"{where}: llm.hidden_size / llm.heads ({llm.hidden_size // llm.heads}) must be even "
                         "(RoPE rotates pairs of channels)")
    if not 0 <= config.seed < 2**63:  # (torch.manual_seed overflowed past 64 bits; as a training recipe's seed)
        raise InputError(f"{where}: seed must be a whole number from 0 to 2**63 - 1, not {config.seed}")
    if not 0 < config.projector.output_scale < math.inf:  # (NaN too: the LLM read NaN speech tokens, wrote blanks)
        raise InputError(f"{where}: projector.output_scale must be a positive number, not "
                         f"{config.projector.output_scale}")
    if llm.lora_targets not in ("attention", "all"):
        raise InputError(f"{where}: llm.lora_targets must be attention or all, not {llm.lora_targets!r}")


def check_ctc_hop(config: ModelConfig, where: str) -> None:
    """``ctc_hop`` is 0 (no fine CTC head) or 1 .. the projector's stack (its windows are ``stack`` frames)."""
    if not 0 <= config.ctc_hop <= config.projector.stack:
        raise InputError(f"{where}: ctc_hop must be 0 or 1..{config.projector.stack} (the projector's stack), "
                         f"not {config.ctc_hop}")
