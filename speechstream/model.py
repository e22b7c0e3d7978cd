"""The speech LLM: streaming encoder -> projector -> GPE decoder, plus its prompt and tokenizer.

``load_model`` finds a model config (a name under ``models/`` or a directory holding
``config.yaml``) and builds it. ``source_batch`` and ``target_sequence`` are the
training-side views of what a streaming session feeds: the same encoder, projector,
segments and prompt tokens.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from huggingface_hub.errors import EntryNotFoundError, StrictDataclassError
from torch import nn

from speechstream import features, gpe, schedule, shipped_dir
from speechstream.chunker import chunk_samples
from speechstream.config import DTYPES, EncoderConfig, LLMConfig, ModelConfig, check_device, load_model_config
from speechstream.ctc_head import CTCHead
from speechstream.decoder import GPEDecoder
from speechstream.encoder import StreamingWhisperEncoder
from speechstream.errors import InputError, SpeechstreamError
from speechstream.projector import Projector
from speechstream.text import byte_tokenizer

MODELS_DIR = shipped_dir(Path(__file__).resolve().parent, "models")  # model configs and checkpoints shipped
TRANSLATION_MODEL = "smollm2-whisper-base-es-en"  # Spanish speech -> English text (recipes/st/)
ASR_MODEL = "smollm2-whisper-base"  # English speech -> English text (recipes/asr/)


def checkpoint_path(checkpoint: str, base_dir: Path | None = None) -> Path:
    """The file a model config's ``checkpoint`` names: a leading "~" that names a home folder is that folder (as
    for encoder.weights, llm.base and tokenizer); a relative path is read from ``base_dir`` (the config's folder; None:
    the current one)."""
    return (base_dir or Path.cwd()) / os.path.expanduser(checkpoint)


def _trained(name: str) -> bool:
    """Whether the shipped model ``name`` names a checkpoint that exists (a trained model, not a config alone), read
    where loading reads it (``checkpoint_path``: "~" is the home folder). A config that cannot say (not a mapping, a
    checkpoint that is no path) is untrained here; loading it names what is wrong."""
    import yaml

    path = MODELS_DIR / name / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    checkpoint = config.get("checkpoint") if isinstance(config, dict) else None
    return isinstance(checkpoint, str) and bool(checkpoint) and checkpoint_path(checkpoint, path.parent).is_file()


# Used when no --model is given: the task's shipped model once its recipe has exported a trained checkpoint
# into it; until then the untrained tiny-random test model.
DEFAULT_MODELS = {
    "asr": ASR_MODEL if _trained(ASR_MODEL) else "tiny-random",
    "translate": TRANSLATION_MODEL if _trained(TRANSLATION_MODEL) else "tiny-random",
}
ARCHITECTURES = ("llama", "qwen2", "gemma2", "phi3")  # LLM families the GPE decoder is verified on
# what transformers raises on a pretrained folder whose files are missing, broken or do not fit one another: beside
# OSError and ValueError, a config.json whose sizes are not its weights' (RuntimeError), one whose values have the wrong
# type (configs are strict dataclasses: StrictDataclassError, TypeError), a tokenizer_config.json that is no object or
# names its class with a number (AttributeError, where transformers reads it)
PRETRAINED_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, EntryNotFoundError,
                          StrictDataclassError)


def out_of_memory(error: BaseException) -> bool:
    """Whether a RuntimeError torch raised is the machine's memory running out (an accelerator's, or the CPU
    allocator's), not the files': it is not blamed on the files (``load_pretrained`` lets it through)."""
    import torch

    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


@dataclass(frozen=True)
class EncodedBatch:
    """Encoder output of a batch, with each item's read schedule."""

    frames: torch.Tensor  # (B, U, d) encoder frames, zero past each item's end
    frame_ends: list[list[int]]  # per item, cumulative encoder frames at the end of each segment


@dataclass(frozen=True)
class SourceBatch:
    """Source token embeddings of a batch, as the training forward sees them."""

    embeds: torch.Tensor  # (B, S, H) prefix + speech + suffix, padded
    lengths: torch.Tensor  # (B,) valid source tokens per item
    unit_ends: list[list[int]]  # per item, cumulative source tokens at the end of each read unit
    speech: torch.Tensor  # (B, N, H) the projected speech tokens alone (for the CTC loss)
    speech_lengths: torch.Tensor  # (B,) valid speech tokens per item


def tiny_llm_config(llm: LLMConfig, vocab_size: int, pad_id: int):
    """A transformers config of ``llm.architecture`` with the tiny sizes of ``llm``."""
    from transformers import Gemma2Config, LlamaConfig, Phi3Config, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=llm.hidden_size,
        num_hidden_layers=llm.layers,
        num_attention_heads=llm.heads,
        num_key_value_heads=llm.kv_heads,
        intermediate_size=llm.intermediate_size,
        max_position_embeddings=8192,
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=True,
    )
    if llm.architecture == "llama":
        return LlamaConfig(**common)
    if llm.architecture == "qwen2":
        return Qwen2Config(**common)
    if llm.architecture == "gemma2":
        return Gemma2Config(**common, head_dim=llm.hidden_size // llm.heads, sliding_window=8192)
    if llm.architecture == "phi3":
        return Phi3Config(**common, sliding_window=None)
    raise InputError(f"unknown LLM architecture {llm.architecture!r} (known: {', '.join(ARCHITECTURES)})")


def attention_implementation(model_type: str) -> str:
    """SDPA with an additive mask where transformers supports it; eager (also additive) otherwise."""
    return "eager" if model_type == "gemma2" else "sdpa"


def build_llm(config: ModelConfig, tokenizer, base_dir: Path | None = None) -> nn.Module:
    from transformers import AutoModelForCausalLM

    if config.llm.base is None:
        vocab = -(-len(tokenizer) // 16) * 16
        llm_config = tiny_llm_config(config.llm, vocab, tokenizer.pad_token_id or 0)
        llm_config._attn_implementation = attention_implementation(llm_config.model_type)
        torch.manual_seed(config.seed + 1)
        return AutoModelForCausalLM.from_config(llm_config)
    from transformers.utils import logging as hf_logging

    def load(path):
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a local load of a small model: no "Loading weights" bar on every command
        try:
            return AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, dtype=torch.float32)
        finally:
            if shown:
                hf_logging.enable_progress_bar()

    probe = load_pretrained(config, "llm.base", config.llm.base, load, base_dir)
    probe.config._attn_implementation = attention_implementation(probe.config.model_type)
    return probe


def load_pretrained(config: ModelConfig, field: str, name: str, load, base_dir: Path | None = None):
    """``load(resolve(name))`` for the pretrained part ``field`` of a model config; any failure to find or read it
    (no such directory, a hub id that cannot be reached, no safetensors weights, a damaged file) is one line naming
    the field: an InputError, or a SpeechstreamError for a damaged copy of a cached asset (fetch it again).
    A relative path is read from ``base_dir`` (the config's folder) when that folder has it, as ``checkpoint`` is;
    otherwise from the current folder. The name of a known asset is always that asset."""
    from safetensors import SafetensorError

    from speechstream.weights.fetch import ASSETS, resolve

    where = f"model {config.name}: {field}"
    path = None  # (found: a failure after this is one of loading it)
    try:
        relative = base_dir is not None and name not in ASSETS and name != "" \
            and not Path(os.path.expanduser(name)).is_absolute()  # (base_dir / "" is the config's own folder)
        local = base_dir / name if relative else None
        path = resolve(local if local is not None and local.is_dir() else name)
        return load(path)
    except SpeechstreamError as error:  # a path that is no directory, no safetensors, a fetch that failed
        raise type(error)(f"{where}: {error}") from None
    except (*PRETRAINED_LOAD_ERRORS, SafetensorError) as error:
        if out_of_memory(error):  # (not a damaged file: "rebuild it" would send the user the wrong way)
            raise
        reason = " ".join(str(error).split())[:400] or type(error).__name__  # transformers' errors span lines
        where = f"{where} {name!r}"
        if name in ASSETS and path is None:  # its fetch failed (a full disk, say)
            raise SpeechstreamError(f"{where}: cannot fetch it ({reason})") from None
        if name in ASSETS:  # the asset's own cached directory is damaged
            raise SpeechstreamError(f"{where}: cannot load the cached copy {path} ({reason}); rebuild it with "
                                    f"`speechstream fetch --force {name}`") from None
        raise InputError(f"{where}: cannot load it ({reason})") from None


def build_tokenizer(config: ModelConfig, base_dir: Path | None = None):
    if config.tokenizer == "bytes":
        prompt = config.prompt
        texts = [prompt.source_prefix, prompt.source_suffix, prompt.target_prefix, prompt.eoc_token, prompt.eos_token]
        specials = [token for text in texts for token in re.findall(r"<\|[^|>]+\|>", text)]
        return byte_tokenizer(specials)
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(config, "tokenizer", config.tokenizer, AutoTokenizer.from_pretrained, base_dir)
    missing = [t for t in (config.prompt.eoc_token, config.prompt.eos_token) if t not in tokenizer.get_vocab()]
    if missing:
        raise InputError(f"tokenizer {config.tokenizer} lacks the tokens {missing}")
    return tokenizer


class SpeechLLM(nn.Module):
    def __init__(self, config: ModelConfig, tokenizer, llm: nn.Module):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        torch.manual_seed(config.seed)
        self.encoder = StreamingWhisperEncoder(config.encoder)
        hidden = llm.get_input_embeddings().weight.shape[1]
        projector = config.projector
        self.projector = Projector(config.encoder.d_model, hidden, projector.stack, projector.output_scale)
        self.decoder = GPEDecoder(llm, config.llm.phi)
        self.ctc_blank = nn.Parameter(0.02 * torch.randn(hidden))  # CTC blank vector (auxiliary training loss)
        self.ctc_classes: torch.Tensor | None = None  # token ids the CTC head was trained over (None: all)
        self.int8 = False  # the LLM's linear layers are int8 (``quantize_int8``)
        # the fine CTC head for joint decoding (None: decoding scores the speech tokens with the head above)
        self.ctc_head = CTCHead(config.encoder.d_model, hidden, config.projector.stack, config.ctc_hop) \
            if config.ctc_hop else None
        prompt = config.prompt
        self.prefix_ids = self._ids(prompt.source_prefix)  # source group, before the speech
        self.suffix_ids = self._ids(prompt.source_suffix)  # source group, read at the end of the audio
        self.header_ids = self._ids(prompt.target_prefix)  # target group, before the text
        self.eoc_id = tokenizer.convert_tokens_to_ids(prompt.eoc_token)
        self.eos_id = tokenizer.convert_tokens_to_ids(prompt.eos_token)
        for name, token, token_id in (("eoc_token", prompt.eoc_token, self.eoc_id),
                                      ("eos_token", prompt.eos_token, self.eos_id)):
            if token_id is None or token_id == tokenizer.unk_token_id and token != tokenizer.unk_token:
                raise InputError(f"model {config.name}: prompt.{name} {token!r} is not one token of its tokenizer")
        if self.eoc_id == self.eos_id:  # (after the audio, a chunk end still to be written would end the text)
            raise InputError(f"model {config.name}: prompt.eoc_token {prompt.eoc_token!r} must differ from "
                             f"prompt.eos_token {prompt.eos_token!r}: after the audio, a chunk's end would end the "
                             "text")
        if not self.header_ids:  # (its last row predicts the first word: a stream wrote no tokens, training row -1)
            raise InputError(f"model {config.name}: prompt.target_prefix (the assistant header) must be at least one "
                             "token: its last row predicts the first word")
        added_special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        self.special_ids = frozenset(tokenizer.all_special_ids) | added_special | {self.eoc_id, self.eos_id}

    def writable(self) -> torch.Tensor:
        """(V,) bool over the LLM's embedding rows: the tokens a session may write (text, end-of-chunk and end;
        never prompt-format special tokens or padding rows of the table past the tokenizer)."""
        vocab = self.decoder.llm.get_input_embeddings().weight.shape[0]
        allowed = torch.ones(vocab, dtype=torch.bool)
        allowed[[i for i in self.special_ids if i < vocab and i not in (self.eoc_id, self.eos_id)]] = False
        allowed[len(self.tokenizer) :] = False
        return allowed

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        """(n, H) LLM input embeddings of token ids."""
        device = self.decoder.llm.get_input_embeddings().weight.device
        return self.decoder.embed(torch.tensor(ids, dtype=torch.long, device=device))

    def encode(self, audios: list[np.ndarray], chunk_ms: int) -> EncodedBatch:
        """Training-side encoder pass: every item's frames under the block-causal schedule of ``chunk_ms``."""
        mel, mel_len, frame_ends = self._mel_batch(audios, chunk_ms)
        frames = self.encoder(mel, mel_len, frame_ends)  # (B, U, d)
        n_frames = torch.tensor([ends[-1] for ends in frame_ends], device=frames.device)
        keep = torch.arange(frames.shape[1], device=frames.device)[None, :] < n_frames[:, None]
        return EncodedBatch(frames * keep[..., None], frame_ends)

    def encode_frozen(self, audios: list[np.ndarray], chunk_ms: int) -> tuple[list[torch.Tensor], list[list[int]]]:
        """The frozen part of the encoder pass of a partly tuned encoder (``encoder.tuned_layers``): each item's
        rows below the tuned layers (``StreamingWhisperEncoder.lower_rows``) and its segment frame ends;
        ``frames_from_frozen`` finishes the pass."""
        mel, mel_len, frame_ends = self._mel_batch(audios, chunk_ms)
        upto = self.config.encoder.layers - self.config.encoder.tuned_layers
        return self.encoder.lower_rows(mel, mel_len, frame_ends, upto), frame_ends

    def frames_from_frozen(self, rows: torch.Tensor, frame_ends: list[list[int]]) -> torch.Tensor:
        """(B, R, d) padded ``encode_frozen`` rows -> (B, U, d) encoder frames, through the tuned layers."""
        upto = self.config.encoder.layers - self.config.encoder.tuned_layers
        return self.encoder.upper(rows, frame_ends, upto)

    def _mel_batch(self, audios: list[np.ndarray], chunk_ms: int
                   ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        """(B, T, n_mels) padded log-mel on the encoder's device and dtype, (B,) lengths, and each item's
        segment frame ends under the schedule of ``chunk_ms`` (and the encoder's right context)."""
        chunk = chunk_samples(chunk_ms)
        device = self.encoder.conv1.weight.device
        mels = [features.log_mel(a) for a in audios]
        lookahead = self.config.encoder.lookahead_frames
        frame_ends = [schedule.segment_frame_ends(len(a), chunk, lookahead) for a in audios]
        mel_len = torch.tensor([m.shape[0] for m in mels])
        mel = torch.zeros(len(audios), max(1, int(mel_len.max())), features.N_MELS)
        for b, m in enumerate(mels):
            mel[b, : m.shape[0]] = m
        return mel.to(self.encoder.conv1.weight), mel_len.to(device), frame_ends

    def source_from_frames(self, encoded: EncodedBatch) -> SourceBatch:
        """Project encoder frames and frame them with the prompt into the source group."""
        speech = self.projector(encoded.frames)  # (B, ceil(U / stack), H)
        prefix, suffix = self.embed_ids(self.prefix_ids), self.embed_ids(self.suffix_ids)
        tokens = speech.to(prefix.dtype)  # what the LLM reads, in its dtype (as a session feeds them)
        items, unit_ends, speech_lengths = [], [], []
        for b, ends in enumerate(encoded.frame_ends):
            token_ends = schedule.segment_token_ends(ends, self.config.projector.stack)
            items.append(torch.cat([prefix, tokens[b, : token_ends[-1]], suffix]))
            units = [len(prefix) + t for t in token_ends]
            units[-1] += len(suffix)
            unit_ends.append(units)
            speech_lengths.append(token_ends[-1])
        lengths = torch.tensor([len(x) for x in items])
        embeds = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
        return SourceBatch(embeds, lengths, unit_ends, speech, torch.tensor(speech_lengths))

    def source_batch(self, audios: list[np.ndarray], chunk_ms: int) -> SourceBatch:
        """Training-side source: every item's prompt, speech tokens and read units in one pass."""
        return self.source_from_frames(self.encode(audios, chunk_ms))

    def ctc_table(self, classes: torch.Tensor | None = None, blank: torch.Tensor | None = None) -> torch.Tensor:
        """(C + 1, H) the CTC head's class vectors: the LLM's token embeddings (``classes`` rows, or all) and the
        blank last (``blank``, or the speech tokens' head's)."""
        rows = self.decoder.llm.get_input_embeddings().weight
        if classes is not None:
            rows = rows[classes.to(rows.device)]
        return torch.cat([rows, (self.ctc_blank if blank is None else blank)[None].to(rows.dtype)], dim=0)

    def ctc_logits(self, speech: torch.Tensor, classes: torch.Tensor | None = None,
                   table: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, V + 1) CTC scores of speech tokens against the LLM's token embeddings plus a blank (last);
        with ``classes`` (token ids), (B, N, len(classes) + 1) against those rows only; with ``table``, against
        a ``ctc_table`` built before (decoding reuses one instead of gathering the rows at every read). The
        speech tokens are taken before the projector's ``output_scale`` (which only sets what the LLM reads)."""
        speech = speech / self.projector.output_scale
        if table is None:
            table = self.ctc_table(classes)
        return speech.to(table.dtype) @ table.T  # (in the LLM's dtype, as the table: the projector's may differ)

    def fine_ctc_logits(self, vectors: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) vectors of the fine CTC head -> (..., C + 1) scores against the token embeddings (``classes``
        rows, or all) and the head's own blank (last)."""
        table = self.ctc_table(classes, self.ctc_head.blank)
        return vectors.to(table.dtype) @ table.T

    @torch.no_grad()
    def decoding_ctc_table(self) -> torch.Tensor:
        """``ctc_table(ctc_classes)`` for decoding (with the fine head's blank where the model has one), in float32 on
        the CPU, where joint CTC decoding scores (``ctc.JointCTC``): built once and shared by every stream of this
        model, whatever the LLM's dtype and device; built again when the classes, the blank or the embeddings change
        (a checkpoint loaded into them)."""
        rows = self.decoder.llm.get_input_embeddings().weight
        classes = self.ctc_classes
        blank = self.ctc_blank if self.ctc_head is None else self.ctc_head.blank
        key = (None if classes is None else classes._version, blank._version, id(blank), rows._version,
               rows.data_ptr(), rows.dtype)
        cached = getattr(self, "_decoding_ctc_table", None)  # (classes, key, table): holds the classes tensor,
        if cached is None or cached[0] is not classes or cached[1] != key:  # so ``is`` cannot meet a reused id
            cached = (classes, key, self.ctc_table(classes, blank).detach().float().cpu())
            self._decoding_ctc_table = cached
        return cached[2]

    def target_sequence(self, chunk_texts: list[str]) -> list[int]:
        """Target ids: header, the words of each segment separated by end-of-chunk tokens, end marker."""
        ids = list(self.header_ids)
        for j, text in enumerate(chunk_texts):
            if j:
                ids.append(self.eoc_id)
            ids += self._ids(text)
        return ids + [self.eos_id]

    def forward_train(self, source: SourceBatch, targets: list[list[int]], k: int) -> torch.Tensor:
        """(B, T, V) logits of every target row under the wait-k GPE mask."""
        device = source.embeds.device
        target_ids = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(t, dtype=torch.long) for t in targets], batch_first=True, padding_value=self.eos_id
        ).to(device)
        target_lengths = torch.tensor([len(t) for t in targets])
        visible = torch.stack(
            [gpe.target_visibility(target_ids[b].cpu(), ends, self.eoc_id, k, len(self.header_ids))
             for b, ends in enumerate(source.unit_ends)]
        )
        return self.decoder.forward_train(source.embeds, source.lengths, target_ids, target_lengths, visible.to(device))


def model_config_path(name_or_path: str) -> Path:
    """``models/<name>/config.yaml`` or ``<dir>/config.yaml`` or a YAML file itself (a name with a folder in it, or
    starting with ".", is a path only: never looked up in ``models/``). A name the system cannot look
    up (longer than the file system takes, a folder on the way that may not be searched) is an InputError: pathlib's
    checks raise the OSError of all but a missing file."""
    candidate = Path(name_or_path)
    shipped = MODELS_DIR / name_or_path / "config.yaml"
    a_path = len(candidate.parts) > 1 or name_or_path.startswith(".")  # (a folder in it: a path alone, not a name)
    try:
        is_file, is_dir = candidate.is_file(), candidate.is_dir()
        has_config = is_dir and (candidate / "config.yaml").is_file()
        shipped_is_file = not a_path and not is_file and not has_config and shipped.is_file()
    except OSError as error:
        raise InputError(f"model {name_or_path!r}: cannot look it up ({error.strerror or error})") from None
    if is_file:
        return candidate
    if has_config:
        return candidate / "config.yaml"
    if shipped_is_file:
        return shipped
    if is_dir:
        raise InputError(f"{name_or_path}: a model folder needs a config.yaml")
    if a_path:
        raise InputError(f"{name_or_path}: no such model folder or config file")
    known = sorted(p.parent.name for p in MODELS_DIR.glob("*/config.yaml"))
    raise InputError(f"unknown model {name_or_path!r} (shipped models: {', '.join(known)})")


def build_model(config: ModelConfig, base_dir: Path | None = None, for_training: bool = False) -> SpeechLLM:
    """Build a model from its config; load the Whisper encoder and trained checkpoint where given.

    For inference the checkpoint's LoRA adapters are merged into the base weights (same function, less work per
    token) as they load (``load_trainable(..., merge=...)``), without building peft modules first.
    """
    tokenizer = build_tokenizer(config, base_dir)
    model = SpeechLLM(config, tokenizer, build_llm(config, tokenizer, base_dir))
    if config.encoder.weights:
        load_pretrained(config, "encoder.weights", config.encoder.weights,
                        lambda path: load_whisper_encoder(model.encoder, path), base_dir)
    if config.llm.lora_rank and for_training:
        add_lora(model.decoder.llm, config.llm)
    if config.checkpoint:
        path = checkpoint_path(config.checkpoint, base_dir)
        loaded = load_trainable(model, path, merge=config.llm if config.llm.lora_rank and not for_training else None)
        if model.ctc_head is not None and not for_training and not any(n.startswith("ctc_head.") for n in loaded):
            raise InputError(f"{path}: the config asks for a fine CTC head (ctc_hop {config.ctc_hop}) that the "
                             "checkpoint does not have")
    return model.eval()


def merge_lora(llm: nn.Module) -> None:
    """Fold every LoRA adapter into its base layer and put the plain layer back in its place."""
    for name, module in list(llm.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "merge"):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(llm.get_submodule(parent_name) if parent_name else llm, child, module.base_layer)


LORA_TARGETS = {"phi3": ["qkv_proj", "o_proj"]}  # attention projections per model type (default q/k/v/o)
MLP_TARGETS = {"phi3": ["gate_up_proj", "down_proj"]}  # MLP projections per model type (default gate/up/down)


def lora_target_modules(model_type: str, targets: str) -> list[str]:
    """Module names that get LoRA adapters: the attention projections, plus the MLP's for ``targets="all"``."""
    if targets not in ("attention", "all"):
        raise InputError(f"lora_targets must be 'attention' or 'all', not {targets!r}")
    names = LORA_TARGETS.get(model_type, ["q_proj", "k_proj", "v_proj", "o_proj"])
    if targets == "all":
        names = names + MLP_TARGETS.get(model_type, ["gate_proj", "up_proj", "down_proj"])
    return names


def add_lora(llm: nn.Module, config: LLMConfig) -> None:
    """Insert LoRA adapters (peft) into the LLM's projections (``config.lora_targets``), in place."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = lora_target_modules(llm.config.model_type, config.lora_targets)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0, target_modules=targets)
    inject_adapter_in_model(lora, llm)


CTC_CLASSES = "ctc_classes"  # checkpoint entry: the token ids of the CTC head's classes (int64), when a subset


def tuned_encoder_prefixes(config: EncoderConfig) -> tuple[str, ...]:
    """The parameter-name prefixes of a partly tuned encoder's trained part (``tuned_layers``): its last layers and
    its final layer norm; () for a frozen encoder."""
    if not config.tuned_layers:
        return ()
    return (*(f"encoder.layers.{i}." for i in range(config.layers - config.tuned_layers, config.layers)),
            "encoder.layer_norm.")


def trainable_state(model: SpeechLLM) -> dict[str, torch.Tensor]:
    """The weights training changes: projector, CTC blank, fine CTC head, LoRA adapters and the tuned encoder layers
    (``encoder.tuned_layers``), and the CTC class ids."""
    trained = ("projector.", "ctc_head.", *tuned_encoder_prefixes(model.config.encoder))
    state = {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in model.state_dict().items()
        if name.startswith(trained) or name == "ctc_blank" or "lora_" in name
    }
    if model.ctc_classes is not None:
        state[CTC_CLASSES] = model.ctc_classes.detach().cpu().long().contiguous()
    return state


def load_trainable(model: SpeechLLM, path: Path, merge: LLMConfig | None = None,
                   leave_out: tuple[str, ...] = ()) -> list[str]:
    """Load a ``trainable_state`` checkpoint (safetensors); every tensor must find its place, but those whose names
    start with one of ``leave_out``, which are not loaded. Returns the names of the tensors loaded. With ``merge``
    (the LLM config of a model built without adapters, for inference) its LoRA pairs are added into their base
    weights (``merge_lora_pairs``) instead of loaded into peft adapters."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise InputError(f"{path}: checkpoint not found")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise InputError(f"{path}: not a readable safetensors checkpoint ({error})") from None
    state = {name: tensor for name, tensor in state.items() if not name.startswith(leave_out)}
    classes = state.pop(CTC_CLASSES, None)
    if classes is not None:
        vocab = model.decoder.llm.get_input_embeddings().weight.shape[0]
        if classes.dim() != 1 or classes.is_floating_point() or len(classes) == 0 or int(classes.max()) >= vocab \
                or int(classes.min()) < 0:
            raise InputError(f"{path}: {CTC_CLASSES} is not a list of token ids of this LLM")
        model.ctc_classes = classes.long()
    lora = {name: state.pop(name) for name in list(state) if "lora_" in name} if merge is not None else {}
    pairs, unknown, wrong = lora_pairs(model.decoder.llm, lora, merge) if lora else ({}, [], [])
    own = model.state_dict()
    unknown += [name for name in state if name not in own]
    wrong += [name for name in state if name in own and own[name].shape != state[name].shape]
    if unknown or wrong:
        raise InputError(f"{path}: checkpoint does not fit the model (unknown {unknown[:3]}, wrong shape {wrong[:3]})")
    tuned = checkpoint_tuned_layers(list(state), list(own), model.config.encoder, path)
    model.load_state_dict(state, strict=False)
    merge_lora_pairs(model.decoder.llm, pairs, merge.lora_alpha / merge.lora_rank if lora else 1.0)
    if tuned > model.config.encoder.tuned_layers:  # the model is one of a partly tuned encoder (its checkpoint says)
        encoder = replace(model.config.encoder, tuned_layers=tuned)
        model.config = replace(model.config, encoder=encoder)
        model.encoder.config = encoder
    return sorted([*state, *lora])


def checkpoint_tuned_layers(names: list[str], own: list[str], config: EncoderConfig, path: Path) -> int:
    """How many of the encoder's last layers a checkpoint carries (whole, with the final layer norm: a partly
    tuned encoder's trained part, ``tuned_encoder_prefixes``); 0 for none. ``own``: the model's parameter names.
    Any other set of encoder weights is refused (one line): the rest of the encoder is Whisper's."""
    encoder = {name for name in names if name.startswith("encoder.")}  # (all the model's own names: checked)
    if not encoder:
        return 0
    layers = {int(name.split(".")[2]) for name in encoder if name.startswith("encoder.layers.")}
    tuned = config.layers - min(layers) if layers else 0
    expected = tuned_encoder_prefixes(replace(config, tuned_layers=tuned))
    if not expected or encoder != {name for name in own if name.startswith(expected)}:
        raise InputError(f"{path}: its encoder weights are not the encoder's last layers and final layer norm, "
                         "whole (the trained part of a partly tuned encoder)")
    return tuned


LORA_ENTRY = re.compile(r"decoder\.llm\.(.+)\.lora_([AB])\.default\.weight")  # a peft adapter's checkpoint entry


def lora_pairs(llm: nn.Module, lora: dict[str, torch.Tensor], config: LLMConfig
               ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str], list[str]]:
    """A checkpoint's LoRA entries as ``{linear layer: (A, B)}`` for an LLM without adapters, with the entries that
    would not fit the adapters ``add_lora`` makes (unknown: not an A/B of a target layer, or without its other
    half; wrong: not (rank, in) and (out, rank))."""
    targets = set(lora_target_modules(llm.config.model_type, config.lora_targets))
    modules = dict(llm.named_modules())
    halves: dict[str, dict[str, torch.Tensor]] = {}
    unknown, wrong = [], []
    for name, tensor in lora.items():
        match = LORA_ENTRY.fullmatch(name)
        layer = modules.get(match.group(1)) if match else None
        if layer is None or not isinstance(layer, nn.Linear) or match.group(1).rpartition(".")[2] not in targets:
            unknown.append(name)
            continue
        shape = (config.lora_rank, layer.in_features) if match.group(2) == "A" else (layer.out_features,
                                                                                    config.lora_rank)
        if tuple(tensor.shape) != shape:
            wrong.append(name)
        halves.setdefault(match.group(1), {})[match.group(2)] = tensor
    unknown += [f"{layer}.lora_{'B' if 'A' in half else 'A'} (missing)" for layer, half in halves.items()
                if len(half) == 1]
    pairs = {layer: (half["A"], half["B"]) for layer, half in halves.items() if len(half) == 2}
    return pairs, unknown, wrong


@torch.no_grad()
def merge_lora_pairs(llm: nn.Module, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], scaling: float) -> None:
    """Add each layer's ``(B @ A) * scaling`` into its weight, as peft's ``merge`` does (the same operations, so
    the same weights to the bit)."""
    for name, (a, b) in pairs.items():
        weight = llm.get_submodule(name).weight
        weight.data += (b.to(weight) @ a.to(weight)) * scaling


def load_whisper_encoder(encoder: StreamingWhisperEncoder, weights: str | Path) -> None:
    """Copy the ``model.encoder.*`` tensors of a transformers Whisper checkpoint into the encoder. ``weights`` is a
    directory holding ``model.safetensors`` or a hub id (its ``model.safetensors``, from the hub or its cache):
    weights are read from safetensors only."""
    from safetensors import safe_open

    path = Path(weights) / "model.safetensors" if isinstance(weights, Path) else hub_safetensors(weights)
    if not path.is_file():
        raise InputError(f"{weights}: no model.safetensors in this directory (weights are read from safetensors only)")
    prefix = "model.encoder."
    state = {}
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            if key.startswith(prefix):
                state[key[len(prefix) :]] = handle.get_tensor(key)
    # shapes first: load_state_dict raises a RuntimeError listing every mismatch (weights of another Whisper size)
    own = encoder.state_dict()
    wrong = [name for name, tensor in state.items() if name in own and own[name].shape != tensor.shape]
    if wrong:
        raise InputError(f"{weights}: encoder weights do not fit (wrong shape {wrong[:3]}: another encoder size "
                         "than the config's)")
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{weights}: encoder weights do not fit (missing {missing[:3]}, unexpected {unexpected[:3]})")


def hub_safetensors(repo_id: str) -> Path:
    """The local path of a hub model's ``model.safetensors`` (downloaded into the Hugging Face cache unless there)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, "model.safetensors"))


def load_model(name_or_path: str, device: str = "cpu", for_training: bool = False, int8: bool = False,
               dtype: str = "float32") -> SpeechLLM:
    """A shipped model by name (``models/<name>``), a model folder or a config YAML, built and loaded onto ``device``
    (cpu; cuda or mps where present); ``int8``: the CPU speed mode (``quantize_int8``); ``dtype``: the LLM's
    precision (``config.DTYPES``; the encoder, projector and CTC heads stay float32). An unknown name, a device this
    machine lacks, int8 off the CPU or with another dtype than float32 is an InputError before anything loads."""
    check_device(device)
    if not isinstance(int8, bool):  # ("no" would have quantized)
        raise InputError(f"int8 must be True or False, got {int8!r}")
    if int8 and device != "cpu":
        raise InputError(f"int8 is a CPU speed mode (int8 weights on the CPU): not on device {device}")
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if int8 and dtype != "float32":
        raise InputError(f"int8 quantizes float32 weights: not with dtype {dtype}")
    path = model_config_path(name_or_path)
    config = load_model_config(path)
    model = build_model(config, path.parent, for_training).to(device)
    if int8:
        quantize_int8(model)
    if dtype != "float32":
        cast_llm(model, dtype)
    return model


def cast_llm(model: SpeechLLM, dtype: str) -> None:
    """The LLM's weights in ``dtype`` (``config.DTYPES``); the encoder, projector and CTC heads stay float32, and so
    do RoPE's inverse frequencies (its ``inv_freq`` buffers: rounded to bfloat16 they would turn each relative
    position by up to 0.14 rad per 100 positions in SmolLM2; transformers keeps them float32, as it loads them)."""
    llm = model.decoder.llm
    frequencies = {name: buffer for name, buffer in llm.named_buffers() if name.endswith("inv_freq")}
    llm.to(getattr(torch, dtype))
    for name, buffer in frequencies.items():
        owner, _, attribute = name.rpartition(".")
        setattr(llm.get_submodule(owner), attribute, buffer)


def load_decoding_model(name_or_path: str, decoding) -> SpeechLLM:
    """The model as the commands decode with it: on ``decoding.device``, int8 or in ``decoding.dtype`` as it says
    (``config.DecodingConfig``). A note on stderr where bfloat16 is asked of a device that lacks native bfloat16
    (its steps may then gain nothing on float32's)."""
    model = load_model(name_or_path, decoding.device, int8=decoding.int8, dtype=decoding.dtype)
    if decoding.dtype == "bfloat16" and not has_native_bfloat16(decoding.device):
        where = "this CPU (no AVX-512 BF16 or AMX)" if decoding.device == "cpu" else decoding.device
        print(f"speechstream: note: {where} has no native bfloat16: --dtype bfloat16 may decode no faster than "
              "float32 here", file=sys.stderr)
    return model


def has_native_bfloat16(device: str) -> bool:
    """Whether ``device`` (a checked one: ``config.check_device``) computes in bfloat16 natively: a CPU with AVX-512
    BF16 or AMX (oneDNN's check), a CUDA GPU of compute capability 8.0 or later (torch's); MPS is taken as able."""
    kind = torch.device(device).type
    if kind == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if kind != "cpu":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # (a private check: a torch without it says nothing either way)
        return False


def quantize_int8(model: SpeechLLM) -> None:
    """Dynamic int8 quantization of the LLM's linear layers (CPU inference speed-up).

    Activations are quantized per call with a scale taken from that call's rows, so a
    streaming step and the one-pass forward no longer agree to float precision: the
    exactness contract holds for the float model, not for this speed mode.
    """
    import warnings

    if model.decoder.llm.get_input_embeddings().weight.device.type != "cpu":
        raise InputError("int8 quantization is for CPU inference")
    with warnings.catch_warnings():
        # torch announces that its eager quantization API will go (a multi-line notice on every --int8 run); the
        # speed mode works with the torch pinned in requirements.txt, and its tests fail if that changes
        warnings.filterwarnings("ignore", message=r"(?s).*(torch\.ao\.quantization|quantize_per_tensor).*deprecated")
        from torch.ao.quantization import quantize_dynamic

        quantize_dynamic(model.decoder.llm, {nn.Linear}, dtype=torch.qint8, inplace=True)
    model.int8 = True
