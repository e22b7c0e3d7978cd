"""Shared fixtures: one thread (tiny tensors run faster and the machine is shared), offline hubs."""

import os
import signal

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    """The shipped tiny seeded model (Llama architecture)."""
    from speechstream.model import load_model

    return load_model("tiny-random")


def text_favouring_chooser(model, rng_seed: int = 0):
    """Greedy over printable ASCII bytes plus the chunk and end markers.

    The untrained tiny model would otherwise write mostly special tokens; this keeps
    decoding deterministic (a function of the logits) while producing real words.
    """
    allowed = torch.zeros(model.decoder.llm.get_input_embeddings().weight.shape[0], dtype=torch.bool)
    allowed[32:127] = True
    allowed[model.eoc_id] = True
    allowed[model.eos_id] = True

    def choose(logits: torch.Tensor) -> int:
        nonlocal allowed
        if allowed.device != logits.device:  # (a model on an accelerator: a host mask beside its logits fails)
            allowed = allowed.to(logits.device)
        return int(torch.argmax(logits.masked_fill(~allowed, float("-inf"))))

    return choose


@pytest.fixture
def ctrl_c_as_at_a_terminal():
    """SIGINT raising KeyboardInterrupt in this process, as in a terminal, for the test: a shell that starts the tests
    in the background (``make test &``) hands them SIGINT ignored, and a Ctrl-C test would then test nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
