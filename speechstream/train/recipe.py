"""The training recipe: ``TrainConfig`` (a recipe YAML plus ``key=value`` overrides, every value checked when it is
built) and the record of it a run keeps in ``out_dir/recipe.json``, which a resumed run is held to."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from speechstream.config import (MAX_COUNT, MAX_THREADS, UniqueKeyYamlLoader, _check_type, from_dict, load_yaml,
                                 one_line, read_yaml)
from speechstream.errors import InputError
from speechstream.model import model_config_path


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
    # the encoder's last layers trained (``encoder.tuned_layers``: with the final layer norm, at ``lr_encoder``; the
    # frozen layers below are computed once into the feature cache); -1: as the model config says
    encoder_tuned_layers: int = -1
    lr_encoder: float = 2e-5  # the tuned encoder layers
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
                     "weight_decay", "ctc_weight", "word_margin_s", "lr_projector", "lr_lora", "lr_encoder"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.threads > MAX_THREADS:  # (as --threads: 100,000 ended the run in a MemoryError traceback)
            raise InputError(f"threads must be at most {MAX_THREADS}, not {self.threads}")
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
        if min(self.lookahead_frames, self.ctc_hop, self.encoder_tuned_layers) < -1:
            raise InputError("lookahead_frames, encoder_tuned_layers and ctc_hop must be -1 (the model's) or at "
                             "least 0")
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


def load_train_config(path: str, overrides: list[str]) -> TrainConfig:
    data = read_yaml(path, "training config", UniqueKeyYamlLoader)  # (a key given twice: an error, not the last)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a training config must be a mapping of keys to values")
    if "k_choices" in data:
        data["k_choices"] = k_choices_text(data["k_choices"])
    recipe, given = dict(data), {}  # given: field -> the override that set it (the last one wins)
    for item in overrides:
        if "=" not in item:
            raise InputError(f"override {item!r} is not key=value")
        key, value = item.split("=", 1)
        check_override_key(item, key)
        given[key] = item
        try:
            data[key] = k_choices_text(load_yaml(value)) if key == "k_choices" else load_yaml(value)
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
    config = dataclasses.replace(config, **home_paths(config))
    if path_exists(Path(config.out_dir), "out_dir") and not Path(config.out_dir).is_dir():
        where = f"override {given['out_dir']!r}" if "out_dir" in given else path
        raise InputError(f"{where}: out_dir {config.out_dir} exists and is not a folder")
    base = Path(path).resolve().parent
    fix = {}
    for field in ("model", "train_manifest", "dev_manifest", "init_checkpoint"):  # (a path beside the recipe)
        value = getattr(config, field)
        if value and not Path(value).is_absolute() and not path_exists(Path(value), field) \
                and path_exists(base / value, field):
            fix[field] = str(base / value)
    return dataclasses.replace(config, **fix)


def home_paths(config: TrainConfig) -> dict[str, str]:
    """The recipe's file names, a leading ``~`` or ``~user`` the home folder (a recipe file is read by no shell, nor
    is an override by one that leaves it as written, such as sh); a "~" that names no home folder stays as written
    (``os.path.expanduser``, as a manifest's ``audio``)."""
    return {name: os.path.expanduser(value) for name in PATH_FIELDS if (value := getattr(config, name))}


def path_exists(path: Path, field: str) -> bool:
    """Whether the recipe's ``field`` names an existing ``path``; one the system cannot look up (a name longer than
    the file system takes, a folder on the way that may not be searched) is a one-line input error naming it."""
    try:
        return path.exists()
    except OSError as error:
        raise InputError(f"{field} {path}: cannot look it up ({error.strerror or error})") from None


def k_choices_text(value):
    """A recipe's ``k_choices`` as the text it is kept as: a single k (``k_choices: 2``, the override
    ``k_choices=2``) is a number to YAML, which was refused as "the wrong type"; other values as they are."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


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
    """``k_choices`` ("1,2,3") -> [1, 2, 3]; each a whole number of chunks, at least 1 and at most ``MAX_COUNT`` (a
    k past every clip's chunks reads the whole clip first; one near 2**63 overflowed the wait-k mask's int64 chunk
    counts and ended the first step with an IndexError)."""
    try:
        ks = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise InputError(f"k_choices must be whole numbers separated by commas, not {text!r}") from None
    if not 1 <= min(ks) <= max(ks) <= MAX_COUNT:
        raise InputError(f"k_choices must be from 1 to {MAX_COUNT} each, not {text!r}")
    return ks


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


def recorded_default(key: str):
    """What a ``recipe.json`` without ``key`` recorded for it: a recipe field added since that run started (an
    earlier version wrote none) trained as the field's default does, which is chosen to change nothing; None for a
    key that is no field with a default."""
    field = next((f for f in dataclasses.fields(TrainConfig) if f.name == key), None)
    return None if field is None or field.default is dataclasses.MISSING else field.default


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
        old, new = saved.get(key, recorded_default(key)), record.get(key)
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
