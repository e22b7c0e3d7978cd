"""The model a run trains: built from its model config with the recipe's changes, ``init_checkpoint`` loaded,
everything but the projector side and the LoRA adapters frozen, and the classes its CTC loss scores."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
from torch import nn

from speechstream.config import check_ctc_hop, check_sizes, load_model_config
from speechstream.errors import InputError
from speechstream.model import SpeechLLM, build_model, model_config_path, tuned_encoder_prefixes
from speechstream.train.examples import Example, example_pieces
from speechstream.train.recipe import TrainConfig


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
    recipe's ``lora_targets``, ``lookahead_frames``, ``encoder_tuned_layers`` and ``ctc_hop`` where it names
    them."""
    path = model_config_path(config.model)
    model_config = load_model_config(path)
    if config.lora_targets:
        model_config = dataclasses.replace(model_config,
                                           llm=dataclasses.replace(model_config.llm, lora_targets=config.lora_targets))
    if config.lookahead_frames >= 0:
        encoder = dataclasses.replace(model_config.encoder, lookahead_frames=config.lookahead_frames)
        model_config = dataclasses.replace(model_config, encoder=encoder)
    if config.encoder_tuned_layers >= 0:
        encoder = dataclasses.replace(model_config.encoder, tuned_layers=config.encoder_tuned_layers)
        model_config = dataclasses.replace(model_config, encoder=encoder)
        check_sizes(model_config, "recipe")
    if config.ctc_hop >= 0:
        model_config = dataclasses.replace(model_config, ctc_hop=config.ctc_hop)
        check_ctc_hop(model_config, "recipe")
    if config.fresh:
        model_config = dataclasses.replace(model_config, checkpoint=None)
    return build_model(model_config, path.parent, for_training=True).to(device)


def trainable_parameters(model: SpeechLLM, ctc_head_only: bool = False
                         ) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """Freeze everything but projector, CTC blank, LoRA and the tuned encoder layers (``encoder.tuned_layers``);
    return (projector group, LoRA group, encoder group). With ``ctc_head_only``, everything but the fine CTC head:
    (its parameters, [], [])."""
    projector, lora, encoder = [], [], []
    tuned = tuned_encoder_prefixes(model.config.encoder)
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
        elif tuned and name.startswith(tuned):
            param.requires_grad_(True)
            encoder.append(param)
        else:
            param.requires_grad_(False)
    return projector, lora, encoder


def starting_model(config: TrainConfig, device: str) -> SpeechLLM:
    """The model a run starts from, in training mode: built from the recipe's model config (seeded), its
    ``init_checkpoint`` loaded; a fine CTC head trained alone (``ctc_head_only``) not loaded from it starts as a
    copy of the projector. The fine CTC head of an ``init_checkpoint`` is left out (with a note) where the model
    has none: the translation model (no ``ctc_hop``) starts from the English model's weights, which have one."""
    torch.manual_seed(config.seed)
    model = training_model(config, device)
    if config.init_checkpoint:
        from safetensors import safe_open

        from speechstream.model import load_trainable

        path = Path(config.init_checkpoint)
        leave_out = ("ctc_head.",) if model.ctc_head is None else ()
        load_trainable(model, path, leave_out=leave_out)
        with safe_open(str(path), "pt") as weights:  # (only the names, from the header)
            left_out = any(name.startswith(leave_out) for name in weights.keys()) if leave_out else False
        if left_out:
            print(f"speechstream: note: init_checkpoint {path}: its fine CTC head (ctc_head.*) is left out: model "
                  f"{model.config.name} has none (no ctc_hop)", file=sys.stderr)
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
    projector_params, lora_params, encoder_params = trainable_parameters(model, config.ctc_head_only)
    groups = [{"params": projector_params, "lr": config.lr_projector}]
    if lora_params:
        groups.append({"params": lora_params, "lr": config.lr_lora})
    if encoder_params:
        groups.append({"params": encoder_params, "lr": config.lr_encoder})
    return groups
