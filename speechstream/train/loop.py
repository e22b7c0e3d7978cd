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
from speechstream.train.objective import StreamingLoss, global_batch_loss, spec_augment
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
