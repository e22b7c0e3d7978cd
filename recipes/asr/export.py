"""Stage 2 of the ASR recipe: ship a trained run as a model under models/.

    python recipes/asr/export.py runs/smollm2-whisper-base models/smollm2-whisper-base

Copies the run's trainable weights (projector, CTC blank, LoRA) as float16 safetensors
next to the model's config.yaml and points the config's ``checkpoint`` at them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="training output folder (holds trainable.safetensors)")
    parser.add_argument("model", type=Path, help="model folder under models/ (holds config.yaml)")
    args = parser.parse_args()
    state = load_file(str(args.run / "trainable.safetensors"))
    half = {name: tensor.to(torch.float16).contiguous() for name, tensor in state.items()}
    target = args.model / "trainable.safetensors"
    progress = json.loads((args.run / "progress.json").read_text())
    save_file(half, str(target), metadata={"step": str(progress["step"])})
    config_path = args.model / "config.yaml"
    text = config_path.read_text()
    config = yaml.safe_load(text)
    if config.get("checkpoint") != target.name:
        config_path.write_text(text.rstrip("\n") + f"\ncheckpoint: {target.name}\n")
    size = target.stat().st_size / 2**20
    print(f"{target}: {len(half)} tensors, {size:.1f} MiB, step {progress['step']}")


if __name__ == "__main__":
    main()
