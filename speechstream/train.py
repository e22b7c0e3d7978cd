"""Training the projector and LoRA adapters under the GPE streaming mask.

One step: encoder frames (frozen encoder, cached per utterance and chunk size) ->
projector -> source group; the transcript cut into per-chunk pieces with end-of-chunk
markers (``targets.chunk_texts``) -> target group; one forward under the wait-k mask
(k drawn per step from ``k_choices``); loss = LM cross-entropy on the target text and
markers + ``ctc_weight`` x CTC of the speech tokens against the LLM's own token
embeddings (the alignment signal that gets training off the language-model plateau).
With ``task: translate`` the target group gets each line's ``translation`` instead, its words
placed proportionally to the source words heard (``targets.translation_chunk_texts``), and the
CTC loss keeps aligning the speech to the (source-language) transcript.

Runs through accelerate: the same command trains on one CPU, several GPUs or nodes
(DDP). Each rank takes its slice of a global batch whose order is a pure function of
(seed, step), so a resumed run sees exactly the batches it would have seen; each rank's loss is weighted
by its share of the global batch's target tokens and utterances (``global_batch_loss``), so the weights
and the logged figures are those of one process taking the whole batch.

``out_dir/log.jsonl``: a row every ``log_every`` steps with the means since the last row of ``loss``, ``lm`` (LM
cross-entropy per target token), ``accuracy``, ``ctc`` and ``ctc_unfit``: the share of utterances whose CTC target
has more labels (plus repeats) than their speech frames; their CTC loss counts as 0 (``unfit_ctc_targets``), so a
large share means the CTC signal comes from few utterances; plus ``step``, ``k``, ``lr_factor``, ``elapsed_s``; and
``{"step", "dev_ctc_wer"}`` rows for the dev evaluations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pickle
import shutil
import sys
import time
import typing
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from speechstream.audio import SAMPLE_RATE, audio_seconds, check_audio, load_audio
from speechstream.config import (MAX_COUNT, _check_type, check_ctc_hop, from_dict, load_model_config, load_yaml,
                                 one_line, read_yaml)
from speechstream.ctc_head import ctc_windows
from speechstream.errors import InputError, SpeechstreamError
from speechstream.interrupts import DeferredStop
from speechstream.locks import hold_folder
from speechstream.manifest import audio_path, text_lines, time_field
from speechstream.model import (EncodedBatch, SpeechLLM, build_model, model_config_path,
                                trainable_state)
from speechstream.schedule import ENCODER_FRAME_S
from speechstream.targets import TimedWord, chunk_texts, translation_chunk_texts

TASKS = ("asr", "translate")
PATH_FIELDS = ("model", "train_manifest", "dev_manifest", "out_dir", "init_checkpoint")  # TrainConfig's file names


@dataclass(frozen=True)
class TrainConfig:
    """A training recipe (``recipes/*/<name>.yaml``; ``key=value`` overrides on the command line)."""

    model: str  # model config: a name under models/ or a path
    train_manifest: str  # JSONL with id, audio, text, optional offset/duration and words [{"w", "end"}]
    dev_manifest: str | None = None  # held-out JSONL for periodic evaluation
    out_dir: str = "runs/asr"  # checkpoints, logs, plots, feature cache
    chunk_ms: int = 640  # chunk size the model is trained for
    k_choices: str = "1,2,3"  # wait-k values, one drawn per step
    steps: int = 2000  # optimizer steps
    # utterances per step (global, split across ranks; the loss is the global batch's: LM over all its target
    # tokens, CTC over all its utterances, so N processes compute what one does)
    batch_size: int = 6
    lr_projector: float = 1e-3  # projector and CTC blank
    lr_lora: float = 2e-4  # LoRA adapters
    warmup_steps: int = 50  # linear warm-up, then cosine decay to 10 %
    weight_decay: float = 0.01
    ctc_weight: float = 0.5  # weight of the auxiliary CTC loss
    ctc_only_steps: int = 0  # first steps train the projector with CTC alone (no LLM forward: cheap alignment)
    ctc_only_batch_size: int = 0  # utterances per CTC-only step (0: batch_size); those steps are cheap
    # "train": CTC classes are only the token ids of the training texts (10x cheaper); "train+init": those and the
    # classes of init_checkpoint (a continuation of the same task keeps what it scored)
    ctc_vocab: str = "full"
    word_margin_s: float = 0.1  # a word is written after the chunk covering its end + this margin
    max_audio_s: float = 15.0  # longer utterances are skipped (length: the line's duration, else the file's)
    seed: int = 0
    log_every: int = 10  # steps between log lines
    save_every: int = 100  # steps between checkpoints
    eval_every: int = 0  # steps between dev evaluations (greedy CTC WER; 0: only at the end)
    eval_utterances: int = 20  # dev utterances per evaluation
    cache_batch_size: int = 16  # utterances per encoder pass when the feature cache is filled before training
    # False: no filling before training; each utterance is encoded the first time a step draws it (a short
    # continuation of a large corpus then encodes only what it reads)
    precache: bool = True
    threads: int = 0  # torch threads per process (0: torch's default)
    init_checkpoint: str | None = None  # trainable weights to start from (e.g. a shipped model's), fresh optimizer
    mask_time: float = 0.0  # SpecAugment on the cached encoder frames: fraction of frames zeroed, in spans
    mask_span: int = 5  # frames per time mask (20 ms each)
    mask_channels: float = 0.0  # fraction of encoder channels zeroed per utterance
    fresh: bool = False  # start from freshly initialised weights even where the model config names a checkpoint
    task: str = "asr"  # "translate": the LM target is each line's ``translation``, placed proportionally
    lag_words: int = 1  # translate: a target word also waits for this many more source words (targets.py)
    # which LLM projections get LoRA adapters ("attention" or "all"); "": as the model config says (a recipe of an
    # earlier stage names the adapters it trained, so it reruns the same even after the model config grew more)
    lora_targets: str = ""
    # encoder frames of right context (``encoder.lookahead_frames``); -1: as the model config says
    lookahead_frames: int = -1
    # train only the fine CTC head (speechstream/ctc_head.py) with CTC on the frozen encoder's frames: no LLM pass.
    # The head starts as a copy of the projector and its blank unless the checkpoint loaded already has one
    ctc_head_only: bool = False
    ctc_hop: int = -1  # the model's ``ctc_hop`` (frames between the fine CTC head's windows); -1: as its config says

    def __post_init__(self) -> None:
        """Values a recipe can get wrong are one-line input errors when it is built, before anything runs."""
        from speechstream.chunker import chunk_samples

        if self.task not in TASKS:
            raise InputError(f"unknown task {self.task!r} (known: {', '.join(TASKS)})")
        for name in PATH_FIELDS:  # (as the command line's names: out_dir '' trained into the current folder)
            if getattr(self, name) == "":
                left_out = "; leave it out for none" if name in ("dev_manifest", "init_checkpoint") else ""
                raise InputError(f"{name} must not be empty{left_out}")
        chunk_samples(self.chunk_ms)
        parse_k_choices(self.k_choices)
        for name in ("steps", "batch_size", "log_every", "save_every", "eval_utterances", "cache_batch_size",
                     "mask_span"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("warmup_steps", "ctc_only_steps", "ctc_only_batch_size", "eval_every", "threads", "lag_words",
                     "weight_decay", "ctc_weight", "word_margin_s", "lr_projector", "lr_lora"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.threads > MAX_COUNT:  # (torch takes a C int)
            raise InputError(f"threads must be at most {MAX_COUNT}, not {self.threads}")
        for field in dataclasses.fields(self):  # (a NaN passes every comparison below and trains NaN weights)
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise InputError(f"{field.name} must be a finite number, not {value}")
        if not 0 <= self.seed < 2**63:  # (numpy's generators take no negative seed, torch's none past 64 bits)
            raise InputError(f"seed must be a whole number from 0 to 2**63 - 1, not {self.seed}")
        if not self.max_audio_s > 0:
            raise InputError(f"max_audio_s must be positive, not {self.max_audio_s}")
        for name in ("mask_time", "mask_channels"):
            if not 0 <= getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 0 and below 1, not {getattr(self, name)}")
        if self.ctc_vocab not in ("full", "train", "train+init"):
            raise InputError(f"ctc_vocab must be 'full', 'train' or 'train+init', not {self.ctc_vocab!r}")
        if self.lora_targets not in ("", "attention", "all"):
            raise InputError(f"lora_targets must be '', 'attention' or 'all', not {self.lora_targets!r}")
        if self.lookahead_frames < -1 or self.ctc_hop < -1:
            raise InputError("lookahead_frames and ctc_hop must be -1 (the model's) or at least 0")
        if self.ctc_only_steps > self.steps:
            raise InputError(f"ctc_only_steps ({self.ctc_only_steps}) must not exceed steps ({self.steps})")
        # each phase warms up on its own (phase_learning_rate_factor): a warm-up longer than a phase never ends
        joint = self.steps - self.ctc_only_steps
        if self.ctc_only_steps and self.warmup_steps > self.ctc_only_steps:
            raise InputError(f"warmup_steps ({self.warmup_steps}) must not exceed the CTC-only phase "
                             f"(ctc_only_steps={self.ctc_only_steps}); each phase warms up on its own")
        if joint and self.warmup_steps > joint:
            raise InputError(f"warmup_steps ({self.warmup_steps}) must not exceed the joint phase "
                             f"(steps - ctc_only_steps = {joint}); each phase warms up on its own")


@dataclass(frozen=True)
class Example:
    """One training utterance."""

    id: str  # unique id
    audio: Path  # 16 kHz audio file
    text: str  # reference transcript
    words: tuple[TimedWord, ...]  # word end times (empty: all words after the last chunk)
    translation: str | None = None  # reference translation (the target of task "translate")
    offset: float = 0.0  # seconds into the audio file where the utterance starts (the manifest's ``offset``)
    duration: float | None = None  # seconds of audio from the offset (None: to the end of the file)


def example_audio(example: Example) -> np.ndarray:
    """The utterance's samples: its time range of the audio file (16 kHz mono float32)."""
    return load_audio(example.audio, example.offset, example.duration)


def example_seconds(example: Example) -> float:
    """The utterance's length, from the audio file's header (cheap); a one-line input error when the file is not
    a readable audio file or does not hold the range."""
    check_audio(example.audio, example.offset, example.duration)
    if example.duration is not None:
        return example.duration
    return audio_seconds(example.audio) - example.offset


def load_train_config(path: str, overrides: list[str]) -> TrainConfig:
    data = read_yaml(path, "training config")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a training config must be a mapping of keys to values")
    recipe, given = dict(data), {}  # given: field -> the override that set it (the last one wins)
    for item in overrides:
        if "=" not in item:
            raise InputError(f"override {item!r} is not key=value")
        key, value = item.split("=", 1)
        check_override_key(item, key)
        given[key] = item
        try:
            data[key] = load_yaml(value)
        except yaml.YAMLError as error:
            raise InputError(f"override {item!r}: not a YAML value ({one_line(error)})") from None
        try:  # (a value of the wrong type is the override's, not the recipe file's)
            _check_type(data[key], typing.get_type_hints(TrainConfig)[key], key)
        except InputError as error:
            raise InputError(f"override {item!r}: {error}") from None
    try:
        config = from_dict(TrainConfig, data)  # (TrainConfig checks its values)
    except InputError as error:
        blamed = [item for key, item in given.items() if override_causes(recipe, data, key, str(error))]
        where = f"override{'s' if len(blamed) > 1 else ''} {', '.join(map(repr, blamed))}" if blamed else path
        raise InputError(f"{where}: {error}") from None
    if Path(config.out_dir).exists() and not Path(config.out_dir).is_dir():
        where = f"override {given['out_dir']!r}" if "out_dir" in given else path
        raise InputError(f"{where}: out_dir {config.out_dir} exists and is not a folder")
    base = Path(path).resolve().parent
    fix = {}
    for field in ("model", "train_manifest", "dev_manifest", "init_checkpoint"):  # (a path beside the recipe)
        value = getattr(config, field)
        if value and not Path(value).is_absolute() and not Path(value).exists() and (base / value).exists():
            fix[field] = str(base / value)
    return dataclasses.replace(config, **fix)


def override_causes(recipe: dict, data: dict, key: str, error: str) -> bool:
    """Whether the override of ``key`` is behind ``error``, the recipe ``data`` (``recipe`` with the overrides) is
    refused with: with the recipe file's value of ``key`` (or the default) instead, the error goes or changes."""
    reverted = dict(data)
    if key in recipe:
        reverted[key] = recipe[key]
    elif next(f for f in dataclasses.fields(TrainConfig) if f.name == key).default is not dataclasses.MISSING:
        del reverted[key]
    else:  # a required field the file leaves out: nothing to go back to
        return False
    try:
        from_dict(TrainConfig, reverted)
    except InputError as other:
        return str(other) != error
    return True


def check_override_key(item: str, key: str) -> None:
    """A command-line override names a recipe field (a one-line error naming the override, with the field meant
    where the spelling is close: the recipe file is not to blame)."""
    import difflib

    fields = [field.name for field in dataclasses.fields(TrainConfig)]
    if key not in fields:
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InputError(f"override {item!r}: no recipe field {key!r}{hint}")


def parse_k_choices(text: str) -> list[int]:
    """``k_choices`` ("1,2,3") -> [1, 2, 3]; each a whole number of chunks, at least 1."""
    try:
        ks = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise InputError(f"k_choices must be whole numbers separated by commas, not {text!r}") from None
    if min(ks) < 1:
        raise InputError(f"k_choices must be at least 1 each, not {text!r}")
    return ks


def read_examples(path: str, max_audio_s: float | None = None, task: str = "asr") -> list[Example]:
    """Manifest lines -> examples (audio relative to the manifest's folder; ``offset``/``duration``: the time range
    of the file, word end times counted from its start); task "translate" needs a ``translation`` on every line.
    Utterances longer than ``max_audio_s`` are skipped (their length from ``duration`` or the file's header)."""
    folder = Path(path).resolve().parent
    examples, seen, skipped = [], set(), 0
    try:
        lines = text_lines(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read manifest ({error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row.get("text"), str):
                raise TypeError(f"text must be a string, got {row.get('text')!r}")
            words = tuple(TimedWord(w["w"], float(w["end"])) for w in row.get("words", []))
            ends = [word.end_s for word in words]
            if not all(math.isfinite(end) and end >= 0 for end in ends) or ends != sorted(ends):
                raise ValueError("word end times must be finite, non-negative and in order")
            translation = row.get("translation")
            if task == "translate" and not (isinstance(translation, str) and translation.strip()):
                raise ValueError("task translate needs a translation (a non-empty string) on every line")
            offset, duration = (time_field(row, key, key) for key in ("offset", "duration"))
            example = Example(str(row["id"]), audio_path(folder, row["audio"]), str(row["text"]), words,
                              None if translation is None else str(translation), float(offset or 0.0),
                              None if duration is None else float(duration))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError, OverflowError, InputError) as error:
            raise InputError(f"{path}:{number}: bad manifest line ({type(error).__name__}: {error})") from None
        if not example.audio.is_file():
            raise InputError(f"{path}:{number}: {row['audio']}: no such audio file")
        if example.id in seen:  # features are cached by id: a second utterance would train on the first's audio
            raise InputError(f"{path}:{number}: duplicate id {example.id!r}")
        seen.add(example.id)
        try:
            seconds = example_seconds(example)
        except InputError as error:
            raise InputError(f"{path}:{number}: {error}") from None
        if max_audio_s and seconds > max_audio_s:
            skipped += 1
            continue
        examples.append(example)
    if not examples:
        longer = f" (all {skipped} are longer than max_audio_s={max_audio_s})" if skipped else ""
        raise InputError(f"{path}: no utterances{longer}")
    return examples


def check_texts(train: list[Example], dev: list[Example], config: TrainConfig) -> None:
    """Refuse (one line) an ASR train manifest whose transcripts are all empty (nothing to learn) and a dev set
    whose transcripts all normalise to nothing (its WER, taken after the steps, would be undefined)."""
    from speechstream.eval.quality import normalize_english

    if config.task == "asr" and not any(example.text.split() for example in train):
        raise InputError(f"{config.train_manifest}: every transcript (text) is empty: nothing to learn")
    if dev and not any(normalize_english(example.text).split() for example in dev):
        raise InputError(f"{config.dev_manifest}: every transcript (text) of the dev utterances is empty once "
                         "normalised: their WER is undefined")


def written_words(example: Example) -> list[TimedWord]:
    """The transcript's words as written (case, punctuation) with the aligned end times.

    Alignments may spell words differently (lowercase, no punctuation); when they have as
    many words as the transcript, the transcript's spelling is kept. Without alignments
    every word is placed after the last chunk.
    """
    written = example.text.split()
    if not example.words:
        return [TimedWord(w, float("inf")) for w in written]
    if len(written) == len(example.words):
        return [TimedWord(w, t.end_s) for w, t in zip(written, example.words)]
    return list(example.words)


def example_pieces(example: Example, chunk_s: float, n_segments: int, config: TrainConfig,
                   speech_end_s: float | None = None, lookahead_s: float = 0.0) -> tuple[list[str], str]:
    """(target text cut into the segments, the text the CTC loss aligns the speech to).

    ``lookahead_s``: the encoder's right context; a segment's frames end that much before its chunk, so each
    word waits that much longer.

    ASR: the transcript's words placed by their end times; CTC on the same words. Translate: the translation's
    words placed proportionally to the source words heard (``targets.translation_chunk_texts``), CTC on the
    source transcript (monotonic with the audio, unlike the translation).
    """
    if config.task == "translate":
        pieces = translation_chunk_texts((example.translation or "").split(), list(example.words), chunk_s,
                                         n_segments, config.word_margin_s + lookahead_s, config.lag_words,
                                         speech_end_s)
        return pieces, "".join(" " + word for word in example.text.split())
    pieces = chunk_texts(written_words(example), chunk_s, n_segments, config.word_margin_s + lookahead_s)
    return pieces, "".join(pieces)


def batch_indices(n_examples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Global batch of ``step``: consecutive slices of a per-epoch seeded permutation."""
    per_epoch = max(1, n_examples // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_examples)
    return order[offset * batch_size : (offset + 1) * batch_size].tolist()


def encoder_fingerprint(model: SpeechLLM) -> str:
    """A short digest of what the cached frames depend on besides the audio and the chunk size: the encoder's
    config and weights (another Whisper checkpoint or random seed gives other frames)."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(model.config.encoder), sort_keys=True).encode())
    for name, tensor in sorted(model.encoder.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


def audio_identity(example: Example) -> str:
    """The audio an entry was encoded from (the file's resolved path, size, modification time, and the time range
    where the utterance is one), as stored with it."""
    stat = example.audio.stat()
    identity = {"audio": str(example.audio.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if example.offset or example.duration is not None:
        identity.update(offset=example.offset, duration=example.duration)
    return json.dumps(identity)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except (ProcessLookupError, OverflowError):  # (an id past any a process can have)
        return False
    except PermissionError:  # another user's
        return True
    return True


class FeatureCache:
    """Frozen-encoder frames per utterance, stored as safetensors in a folder per chunk size, right context and
    encoder (``encoder_fingerprint``); each entry records the audio file it came from and is encoded again when
    that file differs (another path, size or modification time)."""

    def __init__(self, folder: Path, model: SpeechLLM, chunk_ms: int):
        lookahead = model.config.encoder.lookahead_frames
        self.folder = folder / (f"chunk{chunk_ms}" + (f"-lookahead{lookahead}" if lookahead else "")
                                + f"-encoder{encoder_fingerprint(model)}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # (recipes/asr/run.sh links a continuation's cache to the run it continues)
            why = (f"a link to {os.readlink(self.folder)}, which is gone: delete the link to encode the features "
                   "again" if self.folder.is_symlink() and not self.folder.exists() else one_line(error))
            raise InputError(f"feature cache {self.folder}: cannot create the folder ({why})") from None
        self.model = model
        self.chunk_ms = chunk_ms

    def path(self, example: Example) -> Path:
        """The entry's file: the id percent-encoded (a '/' or '..' in an id stays inside the folder; a lone
        surrogate, a manifest's \\udcff escape, by its UTF-8 bytes); a long id by its digest."""
        name = quote(example.id, safe="", errors="surrogatepass")
        if len(name) > 180:
            name = "id-" + hashlib.sha256(example.id.encode("utf-8", "surrogatepass")).hexdigest()
        return self.folder / f"{name}.safetensors"

    def _stored(self, example: Example) -> dict | None:
        """The entry's tensors when it exists and was encoded from the example's audio file as it is now."""
        from safetensors import SafetensorError, safe_open

        path = self.path(example)
        try:
            with safe_open(str(path), framework="pt") as handle:
                if (handle.metadata() or {}).get("source") != audio_identity(example):
                    return None
                return {key: handle.get_tensor(key) for key in handle.keys()}
        except (OSError, SafetensorError):  # missing (or torn: written again)
            return None

    def frames(self, example: Example) -> tuple[torch.Tensor, list[int], int]:
        """(U, d) frames, the segment frame ends, and the number of samples."""
        stored = self._stored(example)
        if stored is not None:
            return stored["frames"].float(), stored["frame_ends"].tolist(), int(stored["samples"])
        return self._encode_and_store([example], [example_audio(example)])[0]

    def remove_leftovers(self) -> int:
        """Delete the temporary files of writers that were killed before their rename (``<entry>.<pid>.tmp``
        whose process is gone; never read as entries, but they would pile up); returns how many."""
        removed = 0
        for path in self.folder.glob("*.tmp"):
            pid = path.suffixes[-2][1:] if len(path.suffixes) >= 2 else ""
            if pid.isdigit() and not process_alive(int(pid)):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def missing(self, examples: list[Example]) -> list[Example]:
        """The examples not cached yet (or cached from another audio file), once each, shortest file first."""
        from safetensors import SafetensorError, safe_open

        def current(example: Example) -> bool:
            try:
                with safe_open(str(self.path(example)), framework="pt") as handle:
                    return (handle.metadata() or {}).get("source") == audio_identity(example)
            except (OSError, SafetensorError):
                return False

        missing = list({e.id: e for e in examples if not current(e)}.values())
        missing.sort(key=lambda e: e.audio.stat().st_size if e.audio.exists() else 0)
        return missing

    def fill(self, examples: list[Example], batch_size: int, progress: bool = False) -> int:
        """Encode every example not cached yet (or cached from another audio file), ``batch_size`` utterances of
        similar length per encoder pass (the block-causal mask keeps each item's frames those of a pass of its
        own); returns how many. A killed fill loses only the pass it was in (each entry is renamed into place
        once whole)."""
        return self.encode_passes(self.missing(examples), batch_size, progress)

    def encode_passes(self, missing: list[Example], batch_size: int, progress: bool = False, part: int = 0,
                      parts: int = 1) -> int:
        """Encode ``missing`` (a list ``missing`` gave) ``batch_size`` utterances per encoder pass, as ``fill``;
        with ``parts`` > 1 only every ``parts``-th pass from the ``part``-th (the processes of a multi-process run
        each take theirs of one list: a pass holds the same utterances, so they get the same frames, however many
        processes share the work); returns how many utterances this encoded."""
        from tqdm import tqdm

        size = max(1, batch_size)
        passes = [missing[start : start + size] for start in range(0, len(missing), size)][part::parts]
        total = sum(len(group) for group in passes)
        with tqdm(total=total, disable=not progress or not total, desc="features", unit="utt") as bar:
            for group in passes:
                self._encode_and_store(group, [example_audio(e) for e in group])
                bar.update(len(group))
        return total

    def _encode_and_store(self, examples: list[Example], audios: list[np.ndarray]):
        from safetensors.torch import save_file

        with torch.no_grad():
            encoded = self.model.encode(audios, self.chunk_ms)
        out = []
        for b, (example, audio) in enumerate(zip(examples, audios)):
            ends = encoded.frame_ends[b]
            frames = encoded.frames[b, : ends[-1]].half().cpu().contiguous()
            path = self.path(example)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # DDP processes may draw the same clip at once
            save_file({"frames": frames, "frame_ends": torch.tensor(ends), "samples": torch.tensor(len(audio))},
                      str(tmp), metadata={"source": audio_identity(example)})
            tmp.rename(path)
            out.append((frames.float(), ends, len(audio)))
        return out


def check_dev_ids(train: list[Example], dev: list[Example], dev_manifest: str) -> None:
    """Features are cached by id: a dev utterance with a training utterance's id but other audio is refused
    (one of the two would be read with the other's frames)."""
    audio = {e.id: (e.audio.resolve(), e.offset, e.duration) for e in train}
    for example in dev:
        if example.id in audio and audio[example.id] != (example.audio.resolve(), example.offset, example.duration):
            raise InputError(f"{dev_manifest}: id {example.id!r} is also in the train manifest, with other audio "
                             f"({audio[example.id][0]}); features are cached by id, so give the dev clips other ids")


class StreamingLoss(nn.Module):
    """The training objective; ``forward`` so that DDP sees (and syncs) the trainable weights."""

    def __init__(self, model: SpeechLLM, ctc_weight: float, ctc_classes: torch.Tensor | None = None,
                 ctc_head_only: bool = False):
        super().__init__()
        self.model = model
        self.ctc_weight = ctc_weight
        self.ctc_head_only = ctc_head_only
        # CTC over a subset of the vocabulary: class i is token ctc_classes[i]; lookup maps token -> class
        self.ctc_classes = ctc_classes
        if ctc_classes is not None:
            lookup = torch.full((model.decoder.llm.get_input_embeddings().weight.shape[0],), -1, dtype=torch.long)
            lookup[ctc_classes] = torch.arange(len(ctc_classes))
            self.ctc_lookup = lookup

    def forward(self, frames: torch.Tensor, frame_ends: list[list[int]], targets: list[list[int]],
                texts: list[list[int]], k: int, ctc_only: bool = False) -> dict[str, torch.Tensor]:
        model = self.model
        if self.ctc_head_only:
            ctc = self.head_ctc_loss(frames, frame_ends, texts)
            windows = [-(-ends[-1] // model.ctc_head.hop) for ends in frame_ends]
            return {"ctc": ctc, "loss": ctc, "ctc_unfit": torch.tensor(float(unfit_ctc_targets(windows, texts)))}
        source = model.source_from_frames(EncodedBatch(frames, frame_ends))
        unfit = torch.tensor(float(unfit_ctc_targets(source.speech_lengths.tolist(), texts)))
        if ctc_only:
            ctc = self.ctc_loss(source, texts)
            return {"ctc": ctc, "loss": ctc, "ctc_unfit": unfit}
        logits = model.forward_train(source, targets, k)  # (B, T, V)
        header = len(model.header_ids)
        rows, labels = [], []
        for b, target in enumerate(targets):
            rows.append(logits[b, header - 1 : len(target) - 1])
            labels.append(torch.tensor(target[header:], device=logits.device))
        rows, labels = torch.cat(rows), torch.cat(labels)
        lm_sum = F.cross_entropy(rows.float(), labels, reduction="sum")
        correct = (rows.argmax(-1) == labels).sum()
        lm = lm_sum / len(labels)
        # (sums and counts: train() weighs each rank's share of a global batch by them)
        out = {"lm": lm, "accuracy": correct.float() / len(labels), "lm_sum": lm_sum,
               "tokens": torch.tensor(float(len(labels))), "correct": correct.float()}
        loss = lm
        if self.ctc_weight > 0:
            ctc = self.ctc_loss(source, texts)
            out["ctc"] = ctc
            out["ctc_unfit"] = unfit
            loss = loss + self.ctc_weight * ctc
        out["loss"] = loss
        return out

    def ctc_loss(self, source, texts: list[list[int]]) -> torch.Tensor:
        """CTC of the speech tokens against the transcript's LLM token ids (blank = an extra learned vector)."""
        logits = self.model.ctc_logits(source.speech, self.ctc_classes)  # (B, N, C + 1)
        return self._ctc(logits.float().log_softmax(-1).transpose(0, 1), source.speech_lengths, texts)

    def head_ctc_loss(self, frames: torch.Tensor, frame_ends: list[list[int]], texts: list[list[int]]) -> torch.Tensor:
        """CTC of the fine CTC head's windows (every item's in one pass) against the transcript's token ids."""
        head = self.model.ctc_head
        windows = [ctc_windows(frames[b, : ends[-1]], head.stack, head.hop) for b, ends in enumerate(frame_ends)]
        lengths = [len(w) for w in windows]
        logits = self.model.fine_ctc_logits(head.vectors(torch.cat(windows)), self.ctc_classes)
        per_item = torch.split(logits.float().log_softmax(-1), lengths)
        return self._ctc(nn.utils.rnn.pad_sequence(list(per_item)), torch.tensor(lengths), texts)

    def _ctc(self, log_probs: torch.Tensor, lengths: torch.Tensor, texts: list[list[int]]) -> torch.Tensor:
        """(N, B, C + 1) log-probabilities (blank last), each item's frame count and its token ids -> mean CTC."""
        blank = log_probs.shape[-1] - 1
        flat = torch.tensor([t for text in texts for t in text], dtype=torch.long)
        if self.ctc_classes is not None:
            flat = self.ctc_lookup[flat]
            if bool((flat < 0).any()):
                raise ValueError("a CTC target token is outside ctc_classes")
        return F.ctc_loss(log_probs, flat, lengths, torch.tensor([len(t) for t in texts]),
                          blank=blank, reduction="mean", zero_infinity=True)


def unfit_ctc_targets(lengths: list[int], texts: list[list[int]]) -> int:
    """How many items' CTC targets no path over their frames can emit: a target of L labels with R adjacent
    repeats needs L + R frames (a blank between repeats). Their loss is infinite; the CTC loss counts them as
    zero (``zero_infinity``), so they teach the CTC head nothing and lower its logged figure."""
    return sum(len(text) + sum(a == b for a, b in zip(text, text[1:])) > length
               for length, text in zip(lengths, texts))


def ctc_class_ids(model: SpeechLLM, examples: list[Example], config: TrainConfig) -> torch.Tensor | None:
    """The token ids the CTC loss scores (``ctc_vocab``): None for the whole vocabulary, else the sorted
    ids of every training CTC text; with "train+init" also the classes the model was loaded with (those of
    ``init_checkpoint``: a continuation of the same task keeps what the run it continues scored)."""
    if config.ctc_vocab == "full":  # (else "train" or "train+init": TrainConfig allows no other)
        return None
    chunk_s = config.chunk_ms / 1000
    ids: set[int] = set()
    if config.ctc_vocab == "train+init" and model.ctc_classes is not None:
        ids.update(model.ctc_classes.tolist())
    for example in examples:
        _, ctc_text = example_pieces(example, chunk_s, 1, config)
        ids.update(model._ids(ctc_text))
    return torch.tensor(sorted(ids), dtype=torch.long)


def training_model(config: TrainConfig, device: str) -> SpeechLLM:
    """The model to train: as its config says (with its shipped checkpoint), or freshly initialised; with the
    recipe's ``lora_targets``, ``lookahead_frames`` and ``ctc_hop`` where it names them."""
    path = model_config_path(config.model)
    model_config = load_model_config(path)
    if config.lora_targets:
        model_config = dataclasses.replace(model_config,
                                           llm=dataclasses.replace(model_config.llm, lora_targets=config.lora_targets))
    if config.lookahead_frames >= 0:
        encoder = dataclasses.replace(model_config.encoder, lookahead_frames=config.lookahead_frames)
        model_config = dataclasses.replace(model_config, encoder=encoder)
    if config.ctc_hop >= 0:
        model_config = dataclasses.replace(model_config, ctc_hop=config.ctc_hop)
        check_ctc_hop(model_config, "recipe")
    if config.fresh:
        model_config = dataclasses.replace(model_config, checkpoint=None)
    return build_model(model_config, path.parent, for_training=True).to(device)


def trainable_parameters(model: SpeechLLM, ctc_head_only: bool = False
                         ) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Freeze everything but projector, CTC blank and LoRA; return (projector-group, lora-group). With
    ``ctc_head_only``, everything but the fine CTC head: (its parameters, [])."""
    projector, lora = [], []
    for name, param in model.named_parameters():
        if ctc_head_only:
            param.requires_grad_(name.startswith("ctc_head."))
            if param.requires_grad:
                projector.append(param)
        elif name.startswith("projector.") or name == "ctc_blank":
            param.requires_grad_(True)
            projector.append(param)
        elif "lora_" in name:
            param.requires_grad_(True)
            lora.append(param)
        else:
            param.requires_grad_(False)
    return projector, lora


def spec_augment(frames: torch.Tensor, lengths: list[int], rng: np.random.Generator, time_ratio: float,
                 span: int, channel_ratio: float) -> torch.Tensor:
    """(B, U, d) frames with about ``time_ratio`` of each item's frames zeroed in spans of ``span`` frames and
    ``channel_ratio`` of its channels zeroed (a copy; the same rng gives the same masks)."""
    out = frames.clone()
    for b, length in enumerate(lengths):
        spans = int(round(time_ratio * length / span)) if length > span else 0
        for start in rng.integers(0, max(1, length - span + 1), size=spans):
            out[b, int(start) : int(start) + span] = 0
        channels = int(round(channel_ratio * frames.shape[2]))
        if channels:
            out[b, :, torch.from_numpy(rng.choice(frames.shape[2], channels, replace=False))] = 0
    return out


def global_batch_loss(out: dict[str, torch.Tensor], items: int, ctc_weight: float, reduce_sum, world: int
                      ) -> tuple[torch.Tensor, dict[str, float]]:
    """This rank's loss to back-propagate so that DDP's mean of the ranks' gradients is the gradient of the loss
    of the whole global batch (the LM cross-entropy a mean over all its target tokens, the CTC loss a mean over
    all its utterances, however the batch is split), and the global batch's figures for the log.

    ``out``: ``StreamingLoss``'s figures for this rank's ``items`` utterances (0: a rank left without any, which
    ran a stand-in utterance that must not count); ``reduce_sum``: sum of a tensor over the ranks."""
    weight = 1.0 if items else 0.0
    local = [float(out["lm_sum"].detach()) * weight if "lm_sum" in out else 0.0,
             float(out["tokens"]) * weight if "tokens" in out else 0.0,
             float(out["correct"]) * weight if "correct" in out else 0.0,
             float(out["ctc"].detach()) * items if "ctc" in out else 0.0, float(items),
             float(out["ctc_unfit"]) * weight if "ctc_unfit" in out else 0.0]
    total = [float(x) for x in reduce_sum(torch.tensor(local, dtype=torch.float64))]
    lm_sum, tokens, correct, ctc_sum, n_items, unfit = total
    loss = out["loss"] * 0.0  # (keeps every rank's graph, also one whose share does not count)
    row = {}
    if "lm_sum" in out:
        loss = loss + out["lm_sum"] * (weight * world / max(tokens, 1.0))
        row.update(lm=lm_sum / max(tokens, 1.0), accuracy=correct / max(tokens, 1.0))
    if "ctc" in out:
        joint = "lm_sum" in out
        loss = loss + (ctc_weight if joint else 1.0) * out["ctc"] * (items * world / max(n_items, 1.0))
        row["ctc"] = ctc_sum / max(n_items, 1.0)
        if "ctc_unfit" in out:  # the share of utterances too short in frames for their CTC target
            row["ctc_unfit"] = unfit / max(n_items, 1.0)
    row["loss"] = row.get("lm", 0.0) + (ctc_weight if "lm" in row else 1.0) * row.get("ctc", 0.0)
    return loss, row


def phase_learning_rate_factor(step: int, config: TrainConfig) -> float:
    """The CTC-only phase and the joint phase each get their own warm-up and cosine decay."""
    if step < config.ctc_only_steps:
        return learning_rate_factor(step, config.warmup_steps, config.ctc_only_steps)
    return learning_rate_factor(step - config.ctc_only_steps, config.warmup_steps, config.steps - config.ctc_only_steps)


def learning_rate_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up then cosine decay to 10 %."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def logged_step(line: str) -> int | None:
    """The step of a log row; None for a line that is no row (torn: a kill or a full disk while it was written)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def truncate_log(log_path: Path, step: int) -> None:
    """Drop the log rows written after the last checkpoint, so a resumed run logs each step once, and a torn row
    (always written after the checkpoint: a row is logged before its step is saved)."""
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if (logged := logged_step(line)) is not None and logged <= step]
    if len(kept) < len(lines):
        log_path.write_text("".join(line + "\n" for line in kept))


# recipe fields a resumed run may change: they do not change the weights it computes (log and save points, dev
# evaluation, cache filling, threads); every other field, the train manifest's content and the model config's are
# held to what out_dir/recipe.json recorded when the run started
FREE_FIELDS = ("out_dir", "dev_manifest", "log_every", "save_every", "eval_every", "eval_utterances",
               "cache_batch_size", "precache", "threads")


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (a one-line input error when it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise InputError(f"{path}: cannot read ({one_line(error)})") from None
    return digest.hexdigest()


def recipe_record(config: TrainConfig, mixed_precision: str = "no") -> dict:
    """What ``out_dir/recipe.json`` records: the resolved recipe, the digests of the train manifest and of
    the model config it reads, and the mixed precision the launcher chose (accelerate's ``--mixed_precision`` or
    ``ACCELERATE_MIXED_PRECISION``: "no", "bf16", "fp16"; not a recipe field, but it changes what a step computes)."""
    record = dataclasses.asdict(config)
    record["mixed_precision"] = mixed_precision
    record["train_manifest_sha256"] = file_digest(config.train_manifest)
    record["model_config_sha256"] = file_digest(model_config_path(config.model))
    if config.init_checkpoint:
        record["init_checkpoint_sha256"] = file_digest(config.init_checkpoint)
    return record


def check_same_recipe(out_dir: Path, record: dict, step: int) -> None:
    """A resumed run must continue the trajectory it started: refuse (one line) a recipe that differs from the
    one recorded in ``out_dir/recipe.json`` in anything but ``FREE_FIELDS``."""
    path = out_dir / "recipe.json"
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return  # a run of an earlier version: nothing recorded to hold it to (recipe.json is written now)
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read ({one_line(error)}); delete it to resume without the check") from None
    advice = ("give another out_dir (init_checkpoint= starts from this run's trainable.safetensors) or delete "
              f"{out_dir} to start over")
    for key in sorted(set(record) | set(saved)):
        digest = {"model": "model_config_sha256", "train_manifest": "train_manifest_sha256",
                  "init_checkpoint": "init_checkpoint_sha256"}.get(key)
        if key in FREE_FIELDS or (digest and digest in saved):
            continue  # (a file may move: its content is compared)
        old, new = saved.get(key), record.get(key)
        if old == new or (key == "mixed_precision" and key not in saved):  # (an earlier version recorded none)
            continue
        if key == "mixed_precision":  # (not in the recipe: the launcher's; a resumed run keeps its precision)
            raise InputError(f"{out_dir} holds a run trained with mixed_precision={old!r}, not {new!r}: launch the "
                             f"same command with --mixed_precision {old} (accelerate launch) or with "
                             f"ACCELERATE_MIXED_PRECISION={old} to resume it, or {advice}")
        if key == "steps":
            raise InputError(f"{out_dir} holds a run of steps={old} (at step {step}); steps={new} would change its "
                             f"learning-rate schedule (cosine over steps): {advice}")
        if key.endswith("_sha256"):
            what = {"train_manifest_sha256": "train manifest", "model_config_sha256": "model config",
                    "init_checkpoint_sha256": "init_checkpoint"}[key]
            raise InputError(f"{out_dir} holds a run made with another {what} (its content changed since the run "
                             f"started); {advice}")
        raise InputError(f"{out_dir} holds a run made with {key}={old!r}, not {new!r}; {advice}")


STEP_FILE = "step.json"  # written last into a checkpoint folder: its step (and the pending log window)


def fsync_path(path: Path) -> None:
    """Flush a file (or a folder's entries) to disk; a file system that cannot is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file_durably(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename, flushed to disk."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    fsync_path(path.parent)


def tidy_checkpoints(out_dir: Path) -> None:
    """After a save that was cut short (kill -9, power loss), leave the newest complete checkpoint in
    ``out_dir/state``: a torn ``state.tmp`` is dropped; a kill between the two renames of ``save_checkpoint``
    left the previous checkpoint in ``state.old``. Main process only."""
    state, old, tmp = out_dir / "state", out_dir / "state.old", out_dir / "state.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    if not (state / STEP_FILE).is_file() and (old / STEP_FILE).is_file():
        if state.exists():
            shutil.rmtree(state)
        old.rename(state)
        fsync_path(out_dir)
    if old.exists():
        shutil.rmtree(old)


def checkpoint_folder(out_dir: Path) -> Path | None:
    """The checkpoint to resume from (after ``tidy_checkpoints``), or None to start afresh. A folder without
    its step file is the layout of an earlier version (the step in ``progress.json``), else a torn first save."""
    state = out_dir / "state"
    if (state / STEP_FILE).is_file() or (state.is_dir() and (out_dir / "progress.json").is_file()):
        return state
    return None


def checkpoint_record(state: Path) -> dict:
    """The step (and saved log window) of a checkpoint folder."""
    if (state / STEP_FILE).is_file():
        record = json.loads((state / STEP_FILE).read_text())
    else:  # an earlier version's layout
        record = {"step": json.loads((state.parent / "progress.json").read_text())["step"]}
    if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
        raise ValueError(f"no step number in {state / STEP_FILE}")
    return record


def save_checkpoint(accelerator, out_dir: Path, record: dict) -> None:
    """Save the training state so that a kill at any moment leaves one complete checkpoint: everything goes
    to ``state.tmp`` (flushed, its step file written last), then ``state`` -> ``state.old``, ``state.tmp`` ->
    ``state``, and ``state.old`` is removed. Every process calls it."""
    state, old, tmp = out_dir / "state", out_dir / "state.old", out_dir / "state.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                fsync_path(path)
        write_file_durably(tmp / STEP_FILE, json.dumps(record))
        if old.exists():
            shutil.rmtree(old)
        if state.exists():
            state.rename(old)
        tmp.rename(state)
        fsync_path(out_dir)
        if old.exists():
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def plot_losses(log_path: Path, out_path: Path) -> None:
    if not log_path.exists():  # a checkpoint before the first log row
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    if not any("loss" in r for r in rows):
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("loss", "lm", "ctc"):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    dev = [(r["step"], r["dev_ctc_wer"]) for r in rows if "dev_ctc_wer" in r]
    if dev:
        wer_axis = ax.twinx()
        wer_axis.plot(*zip(*dev), "k.--", label="dev CTC WER %")
        wer_axis.set_ylabel("dev CTC WER (%)")
        wer_axis.legend(loc="upper center")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def save_step(accelerator, objective: nn.Module, out_dir: Path, step: int, window: list[dict]) -> None:
    """Save the run after ``step`` (every rank takes part): the trainable weights, the checkpoint with the figures
    of the steps since the last log row, then ``progress.json``."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # before the state: the weights of a finished run are never older
        save_trainable(accelerator.unwrap_model(objective).model, out_dir / "trainable.safetensors")
    save_checkpoint(accelerator, out_dir, {"step": step, "window": window})
    if accelerator.is_main_process:
        write_file_durably(out_dir / "progress.json", json.dumps({"step": step}))


class TrainingStopped(SpeechstreamError):
    """Ctrl-C or SIGTERM stopped the run after saving its step (exit 130); the message says where, and that the
    same command resumes."""

    exit_code = 130


def agreed_signal(requested: str | None, reduce_max: typing.Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The signal that stops every rank after this step: this rank's (``requested``), else one another rank got
    (``reduce_max``: the largest of a tensor over the ranks), else None."""
    code = DeferredStop.SIGNALS.index(requested) + 1 if requested else 0
    agreed = int(reduce_max(torch.tensor([code])).item())
    return requested or (DeferredStop.SIGNALS[agreed - 1] if agreed else None)


def stop_requested(stop: DeferredStop, accelerator) -> bool:
    """Whether a signal asked any rank's run to stop (the ranks agree: each stops after the same step). A rank
    that got none takes the signal another one got as its own (``stop.requested``): its dev evaluation stops and
    its message names that signal."""
    if accelerator.num_processes == 1:
        return stop.requested is not None
    agreed = agreed_signal(stop.requested, lambda t: accelerator.reduce(t.to(accelerator.device), "max").cpu())
    if agreed and stop.requested is None:
        stop.requested = agreed
    # the answer is the ranks' common one: a signal handled here while they were asked counts at the next question
    # (answering it now left this rank one collective ahead of the others: the run hung)
    return agreed is not None


# the launcher's variables that give a process its rank, as accelerate reads them (set before the processes connect)
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
# how long a process other than the main one keeps an error every process raised to itself: the main process says it
# and exits, and the launcher (torchrun, accelerate launch: 0.1 s) then ends the others
LAUNCHER_GRACE_S = 5.0


def main_process() -> bool:
    """Whether this is the main process of a multi-process launch, or a process run alone."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(list(RANK_VARIABLES), 0) == 0


@contextmanager
def raised_by(every_rank: bool):
    """Marks the one-line errors the block raises (``error.every_rank``) as raised alike by every process of a
    launch (checks of the same recipe, manifests and files: only the main process need say them) or by this one
    alone (its share of the work); the mark of an inner block stands."""
    try:
        yield
    except SpeechstreamError as error:
        if not hasattr(error, "every_rank"):
            error.every_rank = every_rank
        raise


def check_mixed_precision(name: str) -> None:
    """Refuse (one line) a mixed precision accelerate does not know: it takes ACCELERATE_MIXED_PRECISION as it is
    (``bfloat16`` trained in float32, unsaid; ``accelerate launch --mixed_precision`` checks its choices)."""
    from accelerate.utils import PrecisionType

    if name not in PrecisionType.list():
        raise InputError(f"mixed precision {name!r} (ACCELERATE_MIXED_PRECISION) is none of "
                         f"{', '.join(PrecisionType.list())}")


def trained_precision(accelerator) -> str:
    """The mixed precision the steps compute in: accelerate's, but "no" for fp16 where it runs no autocast (on a
    CPU: float32)."""
    return "no" if accelerator.mixed_precision == "fp16" and not accelerator.native_amp else accelerator.mixed_precision


def train(config: TrainConfig, progress: bool = True, stop_after: int | None = None) -> Path:
    """Run (or resume) training; returns the path of the trainable-weights checkpoint.

    ``stop_after`` ends this run after that many steps (a checkpoint is saved), as an
    interruption would; the schedule still follows ``config.steps``. Ctrl-C (SIGINT) or SIGTERM during the steps
    finishes the step in progress, saves it and raises `TrainingStopped` (a second Ctrl-C raises KeyboardInterrupt at
    once); during a dev evaluation it stops the evaluation at the next utterance (no dev row is logged), saves the
    step and raises. With several processes a signal to any of them stops all after the same step.
    A run resumed at an evaluation step without its dev row scores it first.
    """
    from accelerate import Accelerator

    if config.threads:
        torch.set_num_threads(config.threads)
    # the manifests first: a bad line, a missing clip or an empty manifest stops the run before anything is built
    # or written
    examples = read_examples(config.train_manifest, config.max_audio_s, config.task)
    dev = read_examples(config.dev_manifest, task=config.task)[: config.eval_utterances] if config.dev_manifest else []
    check_dev_ids(examples, dev, config.dev_manifest or "")
    check_texts(examples, dev, config)
    from accelerate import DistributedDataParallelKwargs

    # the CTC-only warm-up leaves the LoRA weights without gradients, and ctc_weight 0 the CTC blank: DDP must be told
    ddp = DistributedDataParallelKwargs(find_unused_parameters=config.ctc_only_steps > 0 or config.ctc_weight == 0)
    try:
        accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[ddp])
    except ValueError as error:  # (a launch setting it cannot honour: fp8 without its library)
        raise InputError(f"accelerate: {one_line(error)}") from None
    check_mixed_precision(accelerator.mixed_precision)
    if trained_precision(accelerator) != accelerator.mixed_precision and accelerator.is_main_process:
        print(f"speechstream: note: accelerate runs no {accelerator.mixed_precision} mixed precision on "
              f"{accelerator.device.type}: the steps compute in float32 (recorded as mixed_precision='no')",
              file=sys.stderr)
    out_dir = Path(config.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # (a file on its path, a read-only or virtual file system)
        raise InputError(f"out_dir {out_dir}: cannot create the folder ({one_line(error)})") from None
    # one run at a time writes out_dir (its main process holds out_dir/.lock): a second resumed from the same
    # checkpoint and both wrote it (a launcher killed with -9 leaves its processes training on, unseen)
    with hold_folder(out_dir, "out_dir") if accelerator.is_main_process else nullcontext():
        return train_in_folder(config, accelerator, out_dir, examples, dev, progress, stop_after)


def train_in_folder(config: TrainConfig, accelerator, out_dir: Path, examples: list[Example], dev: list[Example],
                    progress: bool, stop_after: int | None) -> Path:
    """`train` once the manifests are read and ``out_dir`` is this run's."""
    from tqdm import tqdm

    if accelerator.is_main_process:
        tidy_checkpoints(out_dir)
    accelerator.wait_for_everyone()
    state_dir = checkpoint_folder(out_dir)
    record = recipe_record(config, trained_precision(accelerator))
    if state_dir is not None:
        try:
            start_record = checkpoint_record(state_dir)
            start_step = start_record["step"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"{state_dir}: cannot resume from this checkpoint ({type(error).__name__}: "
                             f"{one_line(error)}); give another out_dir or delete this one to start over") from None
        check_same_recipe(out_dir, record, start_step)
    if accelerator.is_main_process and (state_dir is None or not (out_dir / "recipe.json").exists()):
        write_file_durably(out_dir / "recipe.json", json.dumps(record, indent=1) + "\n")
    model = starting_model(config, str(accelerator.device))
    groups = parameter_groups(model, config)
    optimizer = torch.optim.AdamW(groups, weight_decay=config.weight_decay)
    base_lrs = [g["lr"] for g in groups]
    ctc_classes = ctc_class_ids(model, examples, config)
    model.ctc_classes = ctc_classes  # saved with the checkpoints: joint CTC decoding scores these classes
    objective = StreamingLoss(model, config.ctc_weight, ctc_classes, config.ctc_head_only)
    objective, optimizer = accelerator.prepare(objective, optimizer)
    cache = FeatureCache(out_dir / "features", model, config.chunk_ms)
    ks = parse_k_choices(config.k_choices)
    progress_file = out_dir / "progress.json"  # the step of trainable.safetensors (read by recipes/asr/export.py)
    if state_dir is None:
        start_step = 0
    else:
        from safetensors import SafetensorError

        try:
            accelerator.load_state(str(state_dir))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError,
                SafetensorError) as error:
            raise InputError(f"{state_dir}: cannot resume from this checkpoint ({type(error).__name__}: "
                             f"{one_line(error)}); give another out_dir or delete this one to start over") from None
        if accelerator.is_main_process:  # a kill after the checkpoint's rename left the older step here
            write_file_durably(progress_file, json.dumps({"step": start_step}))
    log_path = out_dir / "log.jsonl"
    # the checkpoint's step is an evaluation step whose dev score is missing (the evaluation failed or was stopped):
    # it is scored first (a finished run: only that)
    unscored = start_step > 0 and evaluation_due(config, start_step, dev) and not dev_logged(log_path, start_step)
    if start_step >= config.steps and accelerator.is_main_process:
        print(f"speechstream: note: {out_dir} is already trained to step {start_step} of {config.steps}; "
              + ("only its dev evaluation is left" if unscored else "nothing to do"), file=sys.stderr)
    if accelerator.is_main_process and log_path.exists():
        truncate_log(log_path, start_step)
    if accelerator.is_main_process:  # (the other processes write entries only after the barrier)
        cache.remove_leftovers()
    accelerator.wait_for_everyone()
    if config.precache:  # each process encodes its share (one alone kept the others waiting at the barrier, which
        # gives up after the process group's timeout, 30 minutes: a large corpus ended the run there); the shares are
        # passes of one list, which every process takes before any writes
        missing = cache.missing(examples + dev)
        accelerator.wait_for_everyone()
        with raised_by(every_rank=False):  # (a clip that cannot be read is in one process's share)
            cache.encode_passes(missing, config.cache_batch_size, progress and accelerator.is_main_process,
                                accelerator.process_index, accelerator.num_processes)
    accelerator.wait_for_everyone()
    if unscored and accelerator.is_main_process:
        log_dev_score(accelerator.unwrap_model(objective).model, cache, dev, ctc_classes, config, log_path, start_step)
        plot_losses(log_path, out_dir / "loss.png")
    bar = tqdm(total=config.steps, initial=start_step, disable=not (progress and accelerator.is_main_process),
               desc="train", unit="step")
    # the figures of the steps since the last log row (a resumed run continues the window its checkpoint saved)
    window = list(start_record.get("window", [])) if state_dir is not None else []
    started = time.perf_counter()
    last_step = config.steps if stop_after is None else min(config.steps, start_step + stop_after)
    with DeferredStop() as stop, raised_by(every_rank=False):
        for step in range(start_step, last_step):
            ctc_only = step < config.ctc_only_steps
            batch_size = config.ctc_only_batch_size if ctc_only and config.ctc_only_batch_size else config.batch_size
            indices = batch_indices(len(examples), batch_size, step, config.seed)
            mine = indices[accelerator.process_index :: accelerator.num_processes]
            items = len(mine)
            mine = mine or indices[:1]  # (a batch smaller than the ranks: a stand-in that does not count)
            padded, frame_ends, targets, texts = step_batch(model, cache, [examples[i] for i in mine], config, step,
                                                            accelerator.process_index)
            padded = padded.to(accelerator.device)
            k = ks[np.random.default_rng([config.seed, step, 7]).integers(len(ks))]
            factor = phase_learning_rate_factor(step, config)
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * factor
            out = objective(padded, frame_ends, targets, texts, k, ctc_only=ctc_only)
            loss, figures = global_batch_loss(out, items, config.ctc_weight,
                                              lambda t: accelerator.reduce(t.to(accelerator.device), "sum").cpu(),
                                              accelerator.num_processes)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
            optimizer.step()
            optimizer.zero_grad()
            window.append(figures)
            bar.update(1)
            bar.set_postfix(loss=f"{window[-1]['loss']:.3f}")
            done = step + 1
            # a row every log_every steps, at the end, and at the end of the CTC-only phase (its figures are not mixed
            # with the joint steps'); a run stopped in between keeps its window in the checkpoint instead
            if done % config.log_every == 0 or done in (config.steps, config.ctc_only_steps):
                if accelerator.is_main_process:
                    with log_path.open("a") as log:
                        log.write(json.dumps(window_row(window, step=done, k=k, lr_factor=round(factor, 4),
                                                        elapsed_s=round(time.perf_counter() - started, 1))) + "\n")
                window = []
            # Ctrl-C or SIGTERM (on any rank: every rank stops after the same step) ends the run after this step,
            # saved
            stopping = done < last_step and stop_requested(stop, accelerator)
            save_now = stopping or done % config.save_every == 0 or done in (config.steps, last_step)
            if save_now:  # before the dev evaluation: a failure there loses no step
                save_step(accelerator, objective, out_dir, done, window)
            evaluate_now = evaluation_due(config, done, dev)
            score = None  # (None: not scored here, or a signal cut the evaluation short and the run stops below)
            # the main process scores the dev set; before each utterance every process says whether a signal came
            # (the others, blocked in a collective until the end, heard one only after it and the next step)
            if evaluate_now and accelerator.is_main_process:
                score = log_dev_score(accelerator.unwrap_model(objective).model, cache, dev, ctc_classes, config,
                                      log_path, done, stopped=lambda: stop_requested(stop, accelerator))
            elif evaluate_now:
                any(stop_requested(stop, accelerator) for _ in dev)  # (as many as the main process's, or until true)
            # a signal during the evaluation stops the run now (the final step included), not after the next step
            cut = evaluate_now and not stopping and stop_requested(stop, accelerator)
            if cut and not save_now:
                save_step(accelerator, objective, out_dir, done, window)
            if (save_now or cut) and accelerator.is_main_process:
                plot_losses(log_path, out_dir / "loss.png")
            if stopping or cut:
                bar.close()
                when = "during the dev evaluation after" if cut else "after"
                left = "its dev evaluation is left out; " if cut and score is None else ""
                raise TrainingStopped(f"{stop.requested} {when} step {done} of {config.steps}: {left}its checkpoint "
                                      f"is saved in {out_dir}; the same command resumes")
    bar.close()
    accelerator.wait_for_everyone()
    return out_dir / "trainable.safetensors"


def starting_model(config: TrainConfig, device: str) -> SpeechLLM:
    """The model a run starts from, in training mode: built from the recipe's model config (seeded), its
    ``init_checkpoint`` loaded; a fine CTC head trained alone (``ctc_head_only``) not loaded from it starts as a
    copy of the projector."""
    torch.manual_seed(config.seed)
    model = training_model(config, device)
    if config.init_checkpoint:
        from speechstream.model import load_trainable

        load_trainable(model, Path(config.init_checkpoint))
    if config.ctc_head_only:
        if model.ctc_head is None:
            raise InputError("ctc_head_only needs a model with a fine CTC head: set ctc_hop (1 .. the projector stack)")
        if not bool(model.ctc_head.blank.any()):  # not loaded from a checkpoint: start from the projector
            model.ctc_head.init_from_projector(model.projector, model.ctc_blank)
    model.train()
    return model


def parameter_groups(model: SpeechLLM, config: TrainConfig) -> list[dict]:
    """The optimizer's groups: the projector side at ``lr_projector``, the LoRA adapters (where trained) at
    ``lr_lora``."""
    projector_params, lora_params = trainable_parameters(model, config.ctc_head_only)
    groups = [{"params": projector_params, "lr": config.lr_projector}]
    if lora_params:
        groups.append({"params": lora_params, "lr": config.lr_lora})
    return groups


def step_batch(model: SpeechLLM, cache: FeatureCache, examples: list[Example], config: TrainConfig, step: int,
               rank: int) -> tuple[torch.Tensor, list, list, list]:
    """One process's share of a step: its clips' cached encoder frames padded into one (B, T, D) tensor (with
    SpecAugment, seeded by step and ``rank``), each clip's chunk frame ends, its GPE target sequence (wait-k
    pieces, ``example_pieces``) and the token ids of its CTC text."""
    chunk_s = config.chunk_ms / 1000
    lookahead_s = model.config.encoder.lookahead_frames * ENCODER_FRAME_S
    frames, frame_ends, targets, texts = [], [], [], []
    for example in examples:
        item_frames, ends, samples = cache.frames(example)
        pieces, ctc_text = example_pieces(example, chunk_s, len(ends), config, samples / SAMPLE_RATE, lookahead_s)
        frames.append(item_frames)
        frame_ends.append(ends)
        targets.append(model.target_sequence(pieces))
        texts.append(model._ids(ctc_text))
    padded = torch.nn.utils.rnn.pad_sequence(frames, batch_first=True)
    if config.mask_time or config.mask_channels:
        rng = np.random.default_rng([config.seed, step, rank, 11])
        padded = spec_augment(padded, [len(f) for f in frames], rng, config.mask_time, config.mask_span,
                              config.mask_channels)
    return padded, frame_ends, targets, texts


def window_row(window: list[dict], **fields) -> dict:
    """A log row: the mean of each figure over the steps of ``window`` that have it (the CTC-only steps have no LM
    loss), then ``fields``."""
    row = {key: float(np.mean([w[key] for w in window if key in w])) for key in window[-1]}
    row.update(fields)
    return row


def log_dev_score(model: SpeechLLM, cache: FeatureCache, dev: list[Example], ctc_classes: torch.Tensor | None,
                  config: TrainConfig, log_path: Path, step: int,
                  stopped: typing.Callable[[], bool] = lambda: False) -> float | None:
    """Score the dev set after ``step`` (``dev_ctc_wer``) and log its row; None, and no row, when ``stopped``."""
    model.eval()
    score = dev_ctc_wer(model, cache, dev, ctc_classes, config.ctc_head_only, stopped=stopped)
    model.train()
    if score is not None:
        with log_path.open("a") as log:
            log.write(json.dumps({"step": step, "dev_ctc_wer": round(score, 2)}) + "\n")
    return score


def evaluation_due(config: TrainConfig, step: int, dev: list[Example]) -> bool:
    """Whether the dev set is scored after ``step``: every ``eval_every`` steps and after the last one."""
    return bool(dev) and ((config.eval_every > 0 and step % config.eval_every == 0) or step == config.steps)


def dev_logged(log_path: Path, step: int) -> bool:
    """Whether the log has the dev score of ``step``."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    return any(logged_step(line) == step and "dev_ctc_wer" in json.loads(line) for line in lines)


@torch.no_grad()
def dev_ctc_wer(model: SpeechLLM, cache: FeatureCache, examples: list[Example],
                ctc_classes: torch.Tensor | None = None, fine: bool = False,
                stopped: typing.Callable[[], bool] = lambda: False) -> float | None:
    """Normalized WER of greedy CTC decoding of the projector outputs (``fine``: of the fine CTC head's windows)
    (a cheap view of acoustic progress),
    over the classes the loss scores. The CTC target is the transcript (``text``) in both tasks, the
    source-language one for "translate". None when ``stopped()`` turns true before the last utterance."""
    from speechstream.eval.quality import wer

    hypotheses = []
    for example in examples:
        if stopped():
            return None
        frames, ends, _ = cache.frames(example)
        frames = frames.to(model.ctc_blank.device)
        if fine:
            hypotheses.append(greedy_ctc_text(model, model.ctc_head(frames[: ends[-1]]), ctc_classes, fine=True))
            continue
        source = model.source_from_frames(EncodedBatch(frames[None], [ends]))
        hypotheses.append(greedy_ctc_text(model, source.speech[0, : int(source.speech_lengths[0])], ctc_classes))
    return wer(hypotheses, [e.text for e in examples], normalize=True)


def greedy_ctc_text(model: SpeechLLM, speech: torch.Tensor, ctc_classes: torch.Tensor | None = None,
                    fine: bool = False) -> str:
    """(N, H) speech tokens (``fine``: vectors of the fine CTC head) -> the text of the CTC head's best path
    (repeats merged, blanks dropped)."""
    if fine:
        logits = model.fine_ctc_logits(speech, ctc_classes)
    else:
        logits = model.ctc_logits(speech, ctc_classes)
    best = logits.argmax(-1).tolist()
    blank = logits.shape[-1] - 1  # the last CTC class
    ids = [t for i, t in enumerate(best) if t != blank and (i == 0 or t != best[i - 1])]
    if ctc_classes is not None:
        ids = ctc_classes[ids].tolist()
    return model.tokenizer.decode(ids, skip_special_tokens=True)


def save_trainable(model: SpeechLLM, path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file(trainable_state(model), str(tmp))
    fsync_path(tmp)
    tmp.rename(path)
