"""Checkpoints that survive a kill at any moment: the trainable weights and accelerate's state written to a
temporary folder, flushed, and renamed into place; ``tidy_checkpoints`` repairs a save that was cut short."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from torch import nn

from speechstream.model import SpeechLLM, trainable_state


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


def save_step(accelerator, objective: nn.Module, out_dir: Path, step: int, window: list[dict]) -> None:
    """Save the run after ``step`` (every rank takes part): the trainable weights, the checkpoint with the figures
    of the steps since the last log row, then ``progress.json``."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # before the state: the weights of a finished run are never older
        save_trainable(accelerator.unwrap_model(objective).model, out_dir / "trainable.safetensors")
    save_checkpoint(accelerator, out_dir, {"step": step, "window": window})
    if accelerator.is_main_process:
        write_file_durably(out_dir / "progress.json", json.dumps({"step": step}))


def save_trainable(model: SpeechLLM, path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file(trainable_state(model), str(tmp))
    fsync_path(tmp)
    tmp.rename(path)
