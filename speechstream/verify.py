"""Exactness check: teacher-forced streaming reproduces the one-pass training forward.

For a model, a seeded noise signal whose length is not a multiple of the chunk and a
random target with end-of-chunk tokens, compare the logits of every target row
computed (a) by ``StreamingSession`` chunk by chunk with the KV cache and (b) by
``SpeechLLM.forward_train`` under the GPE wait-k mask in one pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from speechstream.config import DecodingConfig, ModelConfig
from speechstream.chunker import chunk_samples
from speechstream.model import ARCHITECTURES, MODELS_DIR, SpeechLLM, build_model, cast_llm, load_model
from speechstream.policy import WaitK
from speechstream.session import StreamingSession

HALF_EPSILONS = 4  # in bfloat16: the epsilons (times the logits' scale) a delta may reach (``VerifyResult.bound``)
TOLERANCE = 1e-4  # max |delta logit| accepted in float32 (INTERFACES.md); float32 sums taken in another order
# differ in proportion to their size: the shipped SmolLM2-135M models (logits up to ~36) measure 4.6e-5 to 8.3e-5


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one exactness check."""

    name: str  # model or architecture
    k: int  # wait-k
    chunk_ms: int  # chunk duration
    target_tokens: int  # target rows compared
    max_delta: float  # max |streaming logit - training logit|
    logit_scale: float = 0.0  # max |training logit|
    dtype: str = "float32"  # the LLM's precision (config.DTYPES)

    @property
    def bound(self) -> float:
        """The largest delta accepted: in float32 ``TOLERANCE`` (the contract's 1e-4, whatever the size of the
        logits); in bfloat16 ``HALF_EPSILONS`` of its epsilons times the logits' scale (at least 1): its sums round
        at every product, in another order in each pass."""
        if self.dtype == "float32":
            return TOLERANCE
        return HALF_EPSILONS * torch.finfo(getattr(torch, self.dtype)).eps * max(1.0, self.logit_scale)

    @property
    def ok(self) -> bool:
        return self.max_delta <= self.bound


# The largest wait-k `speechstream verify --k` checks: k + 3 chunks in one pass (over a minute of 640 ms chunks).
MAX_K = 100


def tiny_config(architecture: str) -> ModelConfig:
    """The shipped tiny config with its LLM switched to ``architecture``."""
    from speechstream.config import load_model_config

    base = load_model_config(MODELS_DIR / "tiny-random" / "config.yaml")
    llm = dataclasses.replace(base.llm, architecture=architecture)
    return dataclasses.replace(base, name=f"tiny-{architecture}", llm=llm)


def random_target(model: SpeechLLM, n_segments: int, rng: np.random.Generator) -> list[int]:
    """Header, 0-3 random words per segment separated by end-of-chunk tokens, end marker."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    chunk_texts = []
    for _ in range(n_segments):
        words = ["".join(rng.choice(letters, rng.integers(1, 6))) for _ in range(rng.integers(0, 4))]
        chunk_texts.append("".join(" " + w for w in words))
    return model.target_sequence(chunk_texts)


def teacher_forced_logits(model: SpeechLLM, audio: np.ndarray, target: list[int], k: int, chunk_ms: int,
                          feed_size: int = 4000) -> torch.Tensor:
    """(T - 1, V) logits of target rows 0..T-2 from a streaming session forced to write ``target``."""
    decoding = DecodingConfig(chunk_ms=chunk_ms, k=k)
    policy = WaitK(k, max_tokens=10**9, max_tail_tokens=10**9, max_repeats=0)
    session: StreamingSession

    def forced(_logits: torch.Tensor) -> int:
        fed = len(session.target_ids)
        return target[fed] if fed < len(target) else model.eos_id

    session = StreamingSession(model, decoding, policy=policy, choose=forced, partials=False)
    session.record_logits = True
    for start in range(0, len(audio), feed_size):
        session.feed(audio[start : start + feed_size])
    session.finish()
    if session.target_ids != target[:-1]:
        raise RuntimeError("the forced session did not write the target it was given")
    return torch.stack(session.logits)


def verify_model(model: SpeechLLM, name: str, k: int, chunk_ms: int = 640, seconds: float = 3.3,
                 seed: int = 0) -> VerifyResult:
    rng = np.random.default_rng(seed)
    seconds = max(seconds, (k + 3) * chunk_ms / 1000)  # chunks past the first k: writes interleave with reads
    n_samples = int(seconds * 16000)
    if n_samples % chunk_samples(chunk_ms) == 0:
        n_samples += 777  # never a whole number of chunks
    audio = (0.1 * rng.standard_normal(n_samples)).astype(np.float32)
    n_segments = n_samples // chunk_samples(chunk_ms) + 1
    target = random_target(model, n_segments, rng)
    with torch.no_grad():
        source = model.source_batch([audio], chunk_ms)
        batch_logits = model.forward_train(source, [target], k)[0, : len(target) - 1]
        stream_logits = teacher_forced_logits(model, audio, target, k, chunk_ms)
    delta = float((stream_logits - batch_logits).abs().max())
    dtype = str(model.decoder.dtype).removeprefix("torch.")
    return VerifyResult(name, k, chunk_ms, len(target) - 1, delta, float(batch_logits.abs().max()), dtype)


def verify_architectures(ks: tuple[int, ...] = (1, 3), chunk_ms: int = 640,
                         dtype: str = "float32") -> list[VerifyResult]:
    results = []
    for architecture in ARCHITECTURES:
        model = build_model(tiny_config(architecture))
        cast_llm(model, dtype)
        results += [verify_model(model, f"tiny-{architecture}", k, chunk_ms) for k in ks]
    return results


def verify_named(name: str, ks: tuple[int, ...] = (1, 3), chunk_ms: int = 640,
                 dtype: str = "float32") -> list[VerifyResult]:
    model = load_model(name, dtype=dtype)
    return [verify_model(model, name, k, chunk_ms) for k in ks]
