"""Stage 2 of the ASR recipe: ship a trained run as a model under models/.

    python recipes/asr/export.py runs/smollm2-whisper-base models/smollm2-whisper-base

Copies the run's trainable weights (projector, CTC blank, LoRA, tuned encoder layers) as float16 safetensors
next to the model's config.yaml and points the config's ``checkpoint`` at them. The CTC head's
class ids (``ctc_classes``, for joint CTC decoding) are copied as they are; a run saved before
checkpoints carried them gets them from its recipe (``--recipe``: the same ``ctc_vocab`` and manifest).
``--average-with FILE`` ships the mean of the run's weights and another trainable.safetensors of the same model (a
run this one continued, or the model's own weights, read before they are replaced): every floating tensor averaged,
the CTC class ids of both; the file's metadata records the other's name, sha256 and step. ``--run-weight W``
(0 < W < 1, default 0.5) weighs the run's side W and the other's 1 - W instead of half each (recorded as well).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import RecipeArgumentParser  # noqa: E402
from speechstream.errors import InputError  # noqa: E402
from speechstream.model import CTC_CLASSES  # noqa: E402


def main() -> None:
    parser = RecipeArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="training output folder (holds trainable.safetensors)")
    parser.add_argument("model", type=Path, help="model folder under models/ (holds config.yaml)")
    parser.add_argument("--recipe", help="the run's training recipe: derive ctc_classes when the run lacks them")
    parser.add_argument("--average-with", type=Path, metavar="FILE",
                        help="ship the mean of the run's weights and this trainable.safetensors (same model)")
    parser.add_argument("--run-weight", type=float, default=0.5, metavar="W",
                        help="with --average-with: the run's share of the mean, 0 < W < 1 (default 0.5: half each)")
    try:
        export(parser.parse_args())
    except (InputError, OSError, ValueError, SafetensorError) as error:  # one line, exit 2; nothing half-written
        print(f"export: error: {error}", file=sys.stderr)
        sys.exit(2)


def export(args: argparse.Namespace) -> None:
    for path, what in ((args.run / "trainable.safetensors", "a training run's weights"),
                       (args.run / "progress.json", "a training run's progress"),
                       (args.model / "config.yaml", "a model's config")):
        if not path.is_file():
            raise InputError(f"{path}: not found (expected {what})")
    from speechstream.config import load_model_config

    load_model_config(args.model / "config.yaml")  # (a model's config, as every command reads it, before any work)
    check_model_fits_run(args.run, args.model)
    average_with, run_weight = getattr(args, "average_with", None), getattr(args, "run_weight", 0.5)
    if not 0.0 < run_weight < 1.0:
        raise InputError(f"--run-weight {run_weight:g}: must lie strictly between 0 and 1")
    if average_with is None and run_weight != 0.5:
        raise InputError("--run-weight needs --average-with (the weights to average the run with)")
    progress = read_record(args.run / "progress.json")
    if isinstance(progress.get("step"), bool) or not isinstance(progress.get("step"), int):
        raise InputError(f"{args.run / 'progress.json'}: no step number")
    state = load_file(str(args.run / "trainable.safetensors"))
    if CTC_CLASSES not in state and args.recipe:
        from speechstream.model import load_model
        from speechstream.train import ctc_class_ids, load_train_config, read_examples

        recipe = load_train_config(args.recipe, [])
        model = load_model(str(args.model))
        classes = ctc_class_ids(model, read_examples(recipe.train_manifest, recipe.max_audio_s, recipe.task), recipe)
        if classes is not None:
            state[CTC_CLASSES] = classes
    if average_with is not None:
        state = averaged(state, average_with, run_weight)
    half = {name: tensor.to(torch.float16).contiguous() if tensor.is_floating_point() else tensor.contiguous()
            for name, tensor in state.items()}
    target = args.model / "trainable.safetensors"
    config_path = args.model / "config.yaml"
    text = config_path.read_text()
    config = yaml.safe_load(text)
    # each file through a temporary one and a rename: a kill or a full disk leaves the model as it was
    metadata = {"step": str(progress["step"])}
    if average_with is not None:
        metadata.update(averaged_with_metadata(average_with))
        if run_weight != 0.5:
            metadata["run_weight"] = f"{run_weight:g}"
    replace_atomically(target, lambda tmp: save_file(half, str(tmp), metadata=metadata))
    if config.get("checkpoint") != target.name:
        lines = [line for line in text.splitlines() if not line.startswith("checkpoint:")]  # (no duplicate key)
        new_text = "\n".join(lines).rstrip("\n") + f"\ncheckpoint: {target.name}\n"
        replace_atomically(config_path, lambda tmp: tmp.write_text(new_text))
    size = target.stat().st_size / 2**20
    averaged_note = "" if average_with is None else f", averaged with {average_with}" + (
        "" if run_weight == 0.5 else f" (run weight {run_weight:g})")
    print(f"{target}: {len(half)} tensors, {size:.1f} MiB, step {progress['step']}{averaged_note}")


def averaged(state: dict[str, torch.Tensor], other_path: Path, weight: float = 0.5) -> dict[str, torch.Tensor]:
    """The mean of ``state`` (share ``weight``) and the weights in ``other_path`` (share ``1 - weight``), tensor by
    tensor, of each side as export ships it (float16), in float32; the CTC class ids are the sorted union of both.
    Other names or shapes are an input error: the two must be weights of one model."""
    if not other_path.is_file():
        raise InputError(f"{other_path}: not found (expected trainable weights to average with)")
    other = load_file(str(other_path))
    if set(other) != set(state):
        differ = sorted(set(other) ^ set(state))
        raise InputError(f"{other_path}: not the same model's weights ({len(differ)} tensors in only one of the two, "
                         f"e.g. {differ[0]})")
    out = {}
    for name, tensor in state.items():
        if name == CTC_CLASSES:
            out[name] = torch.unique(torch.cat([tensor, other[name]]))  # (sorted)
        elif other[name].shape != tensor.shape:
            raise InputError(f"{other_path}: {name} has shape {tuple(other[name].shape)}, the run's "
                             f"{tuple(tensor.shape)}")
        elif tensor.is_floating_point():
            mine, theirs = tensor.half().float(), other[name].half().float()  # each as shipped (float16)
            out[name] = weight * mine + (1 - weight) * theirs  # (0.5: exactly the plain (mine + theirs) / 2)
        else:
            out[name] = tensor
    return out


def averaged_with_metadata(path: Path) -> dict[str, str]:
    """What the shipped file records of the checkpoint it was averaged with: its name, its sha256 and, when its own
    metadata has one, its step (a model's trainable.safetensors is replaced by the mean, so its name alone would
    not say which weights went in)."""
    with open(path, "rb") as handle:
        record = {"averaged_with": path.name, "averaged_with_sha256": hashlib.file_digest(handle, "sha256").hexdigest()}
    with safe_open(str(path), "pt") as handle:
        step = (handle.metadata() or {}).get("step")
    if step is not None:
        record["averaged_with_step"] = step
    return record


def read_record(path: Path) -> dict:
    """A JSON object the training run wrote (a one-line input error naming the file when it is not one)."""
    try:
        record = json.loads(path.read_text())
    except ValueError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}: not a JSON object")
    return record


def check_model_fits_run(run: Path, model: Path) -> None:
    """The model settings a recipe can set for its run against the model's config.yaml: other ``lora_targets`` and a
    ``ctc_hop`` where the model has no fine CTC head are refused (adapters or a head that would not load); another
    ``lookahead_frames`` or ``ctc_hop`` is a note (the weights then decode frames or windows they were not trained
    on, which may be the intent: the shipped model reads its stage-1d weights with right context). A run without
    ``recipe.json`` (an earlier version's) is not checked."""
    from speechstream.config import load_model_config

    recipe_path = run / "recipe.json"
    if not recipe_path.is_file():
        return
    recipe = read_record(recipe_path)
    config = load_model_config(model / "config.yaml")
    settings = (("lora_targets", "llm.lora_targets", config.llm.lora_targets, ""),
                ("lookahead_frames", "encoder.lookahead_frames", config.encoder.lookahead_frames, -1),
                ("ctc_hop", "ctc_hop", config.ctc_hop, -1))
    for key, field, value, unset in settings:
        trained = recipe.get(key, unset)
        if trained == unset or trained == value:
            continue
        message = (f"{run} was trained with {key}={trained} ({recipe_path}), but {model / 'config.yaml'} has "
                   f"{field}: {value}")
        if key == "lora_targets" or (key == "ctc_hop" and not value):  # (adapters or a head the model lacks)
            raise InputError(f"{message}; set {field}: {trained} there first")
        print(f"export: note: {message}: it decodes with inputs the weights were not trained on (set {field}: "
              f"{trained} there to decode as trained)", file=sys.stderr)


def replace_atomically(path: Path, write) -> None:
    """``write(tmp)`` writes the new content of ``path`` into a temporary file beside it, flushed, then renamed
    over ``path``; on any error the temporary file goes and ``path`` is left untouched. The new file has the mode of
    the one it replaces, or a new file's under the umask: safetensors writes 0600, which left a model's weights
    readable by their owner alone."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        tmp.chmod(file_mode(path))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def file_mode(path: Path) -> int:
    """The permission bits of ``path`` where it exists, else those a new file gets under the process's umask."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


if __name__ == "__main__":
    main()
