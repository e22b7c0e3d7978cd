"""The training loop: ``train`` reads the manifests, takes ``out_dir`` and runs (or resumes) the steps, saving,
logging and evaluating on the way; ``step_batch`` builds one process's share of a step."""

from __future__ import annotations

import json
import math
import pickle
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from speechstream.audio import SAMPLE_RATE
from speechstream.config import one_line
from speechstream.errors import InputError
from speechstream.interrupts import DeferredStop
from speechstream.locks import hold_folder
from speechstream.model import SpeechLLM
from speechstream.schedule import ENCODER_FRAME_S
from speechstream.train.checkpoints import (checkpoint_folder, checkpoint_record, save_step, tidy_checkpoints,
                                            write_file_durably)
from speechstream.train.dev import evaluation_due, log_dev_score
from speechstream.train.examples import (Example, batch_indices, check_dev_ids, check_texts, example_pieces,
                                         read_examples)
from speechstream.train.feature_cache import FeatureCache
from speechstream.train.log import dev_logged, plot_losses, truncate_log, window_row
from speechstream.train.model_setup import ctc_class_ids, parameter_groups, starting_model
from speechstream.train.objective import StreamingLoss, global_batch_loss, spec_augment_mask
from speechstream.train.processes import (TrainingStopped, check_mixed_precision, raised_by, stop_requested,
                                          trained_precision)
from speechstream.train.recipe import TrainConfig, check_same_recipe, parse_k_choices, recipe_record


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

    state_dir, start = resume_point(config, accelerator, out_dir)
    start_step = start["step"]
    run = Run(config, accelerator, out_dir, examples, dev)
    if state_dir is not None:
        run.load_state(state_dir, start_step)
    # the checkpoint's step is an evaluation step whose dev score is missing (the evaluation failed or was stopped):
    # it is scored first (a finished run: only that)
    unscored = start_step > 0 and evaluation_due(config, start_step, dev) and not dev_logged(run.log_path, start_step)
    if start_step >= config.steps and run.main:
        print(f"speechstream: note: {out_dir} is already trained to step {start_step} of {config.steps}; "
              + ("only its dev evaluation is left" if unscored else "nothing to do"), file=sys.stderr)
    if run.main and run.log_path.exists():
        truncate_log(run.log_path, start_step)
    run.fill_cache(progress)
    if unscored and run.main:
        run.score(start_step)
        plot_losses(run.log_path, out_dir / "loss.png")
    # the figures of the steps since the last log row (a resumed run continues the window its checkpoint saved)
    window = list(start.get("window", []))
    started = time.perf_counter()
    last_step = config.steps if stop_after is None else min(config.steps, start_step + stop_after)
    with (tqdm(total=config.steps, initial=start_step, disable=not (progress and run.main), desc="train",
               unit="step") as bar, DeferredStop() as stop, raised_by(every_rank=False)):
        for step in range(start_step, last_step):
            figures, k, factor = run.step(step)
            window.append(figures)
            bar.update(1)
            bar.set_postfix(loss=f"{figures['loss']:.3f}")
            done = step + 1
            # a row every log_every steps, at the end, and at the end of the CTC-only phase (its figures are not mixed
            # with the joint steps'); a run stopped in between keeps its window in the checkpoint instead
            if done % config.log_every == 0 or done in (config.steps, config.ctc_only_steps):
                if run.main:
                    with run.log_path.open("a") as log:
                        log.write(json.dumps(window_row(window, step=done, k=k, lr_factor=round(factor, 4),
                                                        elapsed_s=round(time.perf_counter() - started, 1))) + "\n")
                window = []
            run.save_and_score(done, last_step, window, stop)
    accelerator.wait_for_everyone()
    return out_dir / "trainable.safetensors"


def resume_point(config: TrainConfig, accelerator, out_dir: Path) -> tuple[Path | None, dict]:
    """The checkpoint folder a run resumes from (None: it starts afresh) and its record (``step``, and the saved
    log ``window``), once a save cut short is tidied (``tidy_checkpoints``) and the recipe is held to the one the run
    started with (``check_same_recipe``); a fresh run records its recipe in ``out_dir/recipe.json``."""
    if accelerator.is_main_process:
        tidy_checkpoints(out_dir)
    accelerator.wait_for_everyone()
    state_dir = checkpoint_folder(out_dir)
    record = recipe_record(config, trained_precision(accelerator))
    start = {"step": 0}
    if state_dir is not None:
        try:
            start = checkpoint_record(state_dir)
            start_step = start["step"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise cannot_resume(state_dir, error) from None
        check_same_recipe(out_dir, record, start_step)
    if accelerator.is_main_process and (state_dir is None or not (out_dir / "recipe.json").exists()):
        write_file_durably(out_dir / "recipe.json", json.dumps(record, indent=1) + "\n")
    return state_dir, start


def cannot_resume(state_dir: Path, error: Exception) -> InputError:
    """The one-line error of a checkpoint folder that cannot be read."""
    return InputError(f"{state_dir}: cannot resume from this checkpoint ({type(error).__name__}: {one_line(error)}); "
                      "give another out_dir or delete this one to start over")


class Run:
    """One training run's parts: the model with its objective, optimizer and feature cache, the examples, and
    ``out_dir``; ``step`` computes one step, ``save_and_score`` what follows it."""

    def __init__(self, config: TrainConfig, accelerator, out_dir: Path, examples: list[Example], dev: list[Example]):
        self.config, self.accelerator, self.out_dir = config, accelerator, out_dir
        self.examples, self.dev = examples, dev
        self.main = accelerator.is_main_process
        self.log_path = out_dir / "log.jsonl"
        self.model = model = starting_model(config, str(accelerator.device))
        self.groups = parameter_groups(model, config)
        optimizer = torch.optim.AdamW(self.groups, weight_decay=config.weight_decay)
        self.base_lrs = [g["lr"] for g in self.groups]
        self.ctc_classes = ctc_class_ids(model, examples, config)
        model.ctc_classes = self.ctc_classes  # saved with the checkpoints: joint CTC decoding scores these classes
        objective = StreamingLoss(model, config.ctc_weight, self.ctc_classes, config.ctc_head_only)
        self.objective, self.optimizer = accelerator.prepare(objective, optimizer)
        self.cache = FeatureCache(out_dir / "features", model, config.chunk_ms)
        self.ks = parse_k_choices(config.k_choices)

    def load_state(self, state_dir: Path, step: int) -> None:
        """Resume the weights, optimizer and random states of the checkpoint of ``step``."""
        from safetensors import SafetensorError

        try:
            self.accelerator.load_state(str(state_dir))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError,
                SafetensorError) as error:
            raise cannot_resume(state_dir, error) from None
        if self.main:  # a kill after the checkpoint's rename left the older step in progress.json (the step of
            # trainable.safetensors, read by recipes/asr/export.py)
            write_file_durably(self.out_dir / "progress.json", json.dumps({"step": step}))

    def fill_cache(self, progress: bool) -> None:
        """Encode the examples (and dev clips) not in the feature cache yet, where the recipe precaches; each
        process encodes its share (one alone kept the others waiting at the barrier, which gives up after the
        process group's timeout, 30 minutes: a large corpus ended the run there); the shares are passes of one
        list, which every process takes before any writes."""
        accelerator = self.accelerator
        if self.main:  # (the other processes write entries only after the barrier)
            self.cache.remove_leftovers()
        accelerator.wait_for_everyone()
        if self.config.precache:
            missing = self.cache.missing(self.examples + self.dev)
            accelerator.wait_for_everyone()
            with raised_by(every_rank=False):  # (a clip that cannot be read is in one process's share)
                self.cache.encode_passes(missing, self.config.cache_batch_size, progress and self.main,
                                         accelerator.process_index, accelerator.num_processes)
        accelerator.wait_for_everyone()

    def step(self, step: int) -> tuple[dict[str, float], int, float]:
        """Compute and apply ``step``: this process's share of its global batch, the loss of the whole batch
        (``global_batch_loss``); returns the batch's figures, the step's k and its learning-rate factor."""
        config, accelerator = self.config, self.accelerator
        ctc_only = step < config.ctc_only_steps
        batch_size = config.ctc_only_batch_size if ctc_only and config.ctc_only_batch_size else config.batch_size
        indices = batch_indices(len(self.examples), batch_size, step, config.seed)
        mine = indices[accelerator.process_index :: accelerator.num_processes]
        items = len(mine)
        mine = mine or indices[:1]  # (a batch smaller than the ranks: a stand-in that does not count)
        padded, frame_ends, targets, texts, keep = step_batch(self.model, self.cache,
                                                              [self.examples[i] for i in mine], config, step,
                                                              accelerator.process_index)
        padded = padded.to(accelerator.device)
        k = self.ks[np.random.default_rng([config.seed, step, 7]).integers(len(self.ks))]
        factor = phase_learning_rate_factor(step, config)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor
        out = self.objective(padded, frame_ends, targets, texts, k, ctc_only=ctc_only, keep=keep)
        loss, figures = global_batch_loss(out, items, config.ctc_weight,
                                          lambda t: accelerator.reduce(t.to(accelerator.device), "sum").cpu(),
                                          accelerator.num_processes)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_([p for g in self.groups for p in g["params"]], 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return figures, k, factor

    def score(self, step: int, stopped: Callable[[], bool] = lambda: False) -> float | None:
        """Score the dev set after ``step`` and log its row (main process; ``log_dev_score``)."""
        return log_dev_score(self.accelerator.unwrap_model(self.objective).model, self.cache, self.dev,
                             self.ctc_classes, self.config, self.log_path, step, stopped=stopped)

    def save_and_score(self, done: int, last_step: int, window: list[dict], stop: DeferredStop) -> None:
        """After step ``done``: save the run where due (every ``save_every`` steps, at the end, and when a signal
        asked it to stop), score the dev set where due, and raise `TrainingStopped` once a signal stopped it."""
        config, accelerator = self.config, self.accelerator
        # Ctrl-C or SIGTERM (on any rank: every rank stops after the same step) ends the run after this step, saved
        stopping = done < last_step and stop_requested(stop, accelerator)
        save_now = stopping or done % config.save_every == 0 or done in (config.steps, last_step)
        if save_now:  # before the dev evaluation: a failure there loses no step
            save_step(accelerator, self.objective, self.out_dir, done, window)
        evaluate_now = evaluation_due(config, done, self.dev)
        score = None  # (None: not scored here, or a signal cut the evaluation short and the run stops below)
        # the main process scores the dev set; before each utterance every process says whether a signal came
        # (the others, blocked in a collective until the end, heard one only after it and the next step)
        if evaluate_now and self.main:
            score = self.score(done, stopped=lambda: stop_requested(stop, accelerator))
        elif evaluate_now:
            any(stop_requested(stop, accelerator) for _ in self.dev)  # (as many as the main process's, or until true)
        # a signal during the evaluation stops the run now (the final step included), not after the next step
        cut = evaluate_now and not stopping and stop_requested(stop, accelerator)
        if cut and not save_now:
            save_step(accelerator, self.objective, self.out_dir, done, window)
        if (save_now or cut) and self.main:
            plot_losses(self.log_path, self.out_dir / "loss.png")
        if stopping or cut:
            when = "during the dev evaluation after" if cut else "after"
            left = "its dev evaluation is left out; " if cut and score is None else ""
            raise TrainingStopped(f"{stop.requested} {when} step {done} of {config.steps}: {left}its checkpoint "
                                  f"is saved in {self.out_dir}; the same command resumes")


def step_batch(model: SpeechLLM, cache: FeatureCache, examples: list[Example], config: TrainConfig, step: int,
               rank: int) -> tuple[torch.Tensor, list, list, list, torch.Tensor | None]:
    """One process's share of a step: its clips' cached encoder frames (or rows below a partly tuned encoder's tuned
    layers) padded into one (B, T, D) tensor, each clip's chunk frame ends, its GPE target sequence (wait-k pieces,
    ``example_pieces``), the token ids of its CTC text, and the SpecAugment mask of its encoder frames (seeded by
    step and ``rank``; None without SpecAugment), which the objective applies after any tuned encoder layers."""
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
    keep = None
    if config.mask_time or config.mask_channels:
        rng = np.random.default_rng([config.seed, step, rank, 11])
        lengths = [ends[-1] for ends in frame_ends]
        keep = spec_augment_mask((len(frames), max(lengths), padded.shape[2]), lengths, rng, config.mask_time,
                                 config.mask_span, config.mask_channels)
    return padded, frame_ends, targets, texts, keep
