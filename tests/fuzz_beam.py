"""A seeded random campaign for the beam search (``speechstream.beam``), run by hand:

    HF_HUB_OFFLINE=1 python -m tests.fuzz_beam FIRST_SEED COUNT [ARCHITECTURE | all]

Each case (one seed) draws a tiny model (the shipped seeded one with its weights perturbed, sometimes with a fine CTC
head; given an architecture of ``model.ARCHITECTURES``, that tiny model in that LLM family; given ``all``, seed s in
family s mod 4), audio (noise, a speech clip, silence), decoding options (chunk size, k, caps, repetition guard, CTC
weight, 1-2 candidates, a beam of 2-16, VAD, context tokens) and feed sizes. Checks:

* at up to three plans of the session, on a vocabulary of 2 candidates and a room of at most 3 tokens (a width of 16 is
  then exhaustive: at most 3 ways on from each hypothesis, 9 live after two tokens): the plan of width 16 has the best
  fused score of every hypothesis an exhaustive search ends with, and a score at least that of width 1 (greedy joint
  decoding's choices, which score no better: ``beam``'s docstring); its LLM scores after each planned token
  (``decoder.Branches``) are those the stream's own steps give; the stream's cache after the plan is the one before it
  to the bit (every attribute of every layer);
* the session never raises, and its target ids, transcript and segment starts do not depend on the feed sizes
  (pieces of 0, 1 or any number of samples against the audio whole), with few LLM positions at times (segments
  then cut where one more chunk could pass them).

Not collected by pytest (a campaign takes minutes).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

from speechstream import beam
from speechstream.audio import load_audio
from speechstream.config import DecodingConfig
from speechstream.ctc import JointCTC
from speechstream.errors import InputError
from speechstream.model import ARCHITECTURES, build_model, load_model
from speechstream.session import StreamingSession
from tests.helpers import cache_attributes, fine_head_model, same_attributes
from speechstream.verify import tiny_config
from tests.test_beam import _exhaustive, _target_step

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CLIPS = ("jfk.wav", "austen-0880.wav", "austen-0930.wav")
EXHAUSTIVE_WIDTH = 16
CHECKS_PER_CASE = 3


def perturbed(base, rng: np.random.Generator):
    """A copy of ``base`` whose LLM, projector and CTC weights moved by a seeded fraction of their spread."""
    model = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    scale = float(rng.uniform(0.1, 1.0))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dtype.is_floating_point and parameter.numel() > 1:
                spread = float(parameter.std()) or 0.02
                parameter.add_(scale * spread * torch.randn(parameter.shape, generator=generator))
    return model


def draw_audio(rng: np.random.Generator) -> np.ndarray:
    """1-3 s of noise, a clip's slice or silence, in one to three parts."""
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(4000, 24000))
        kind = rng.choice(["noise", "clip", "silence"], p=[0.4, 0.5, 0.1])
        if kind == "noise":
            parts.append((float(rng.uniform(0.01, 0.3)) * rng.standard_normal(n)).astype(np.float32))
        elif kind == "clip":
            clip = load_audio(SAMPLES / CLIPS[int(rng.integers(len(CLIPS)))])
            start = int(rng.integers(0, max(clip.size - n, 1)))
            parts.append(clip[start : start + n])
        else:
            parts.append(np.zeros(n, np.float32))
    return np.concatenate(parts)


def draw_decoding(rng: np.random.Generator) -> DecodingConfig:
    vad = bool(rng.random() < 0.3)
    return DecodingConfig(chunk_ms=int(rng.choice([320, 640])), k=int(rng.integers(1, 3)),
                          max_tokens_per_chunk=int(rng.integers(1, 7)), max_tail_tokens=int(rng.integers(2, 21)),
                          max_repeats=int(rng.choice([0, 2, 4])), ctc_weight=float(rng.uniform(0.1, 0.9)),
                          ctc_candidates=int(rng.integers(1, 3)), beam=int(rng.integers(2, 17)), vad=vad,
                          context_tokens=int(rng.choice([0, 2])) if vad else 0)


def feed_sizes(rng: np.random.Generator, total: int) -> list[int]:
    sizes = []
    while sum(sizes) < total:
        sizes.append(int(rng.choice([0, 1, int(rng.integers(2, 400)), int(rng.integers(400, 20000))])))
    return sizes


def run_session(model, decoding, audio, sizes) -> StreamingSession:
    session = StreamingSession(model, decoding, partials=False)
    with torch.no_grad():
        at = 0
        for size in sizes:
            session.feed(audio[at : at + size])
            at += size
        session.finish()
    return session


class PlanChecks:
    """Wraps ``JointCTC.choose``: at up to ``CHECKS_PER_CASE`` plans, the exhaustive and greedy comparisons."""

    def __init__(self):
        self.done = self.improved = 0
        self._original = JointCTC.choose

    def __enter__(self):
        checks = self

        def choose(joint, logits, source_done, planning=None):
            if checks.done < CHECKS_PER_CASE and planning is not None and joint.scorer.frames \
                    and math.isfinite(joint.scorer.psi) and not joint.plan:
                where = planning()
                if where is not None:
                    checks.check(joint, logits, *where)
            return checks._original(joint, logits, source_done, planning)

        JointCTC.choose = choose
        return self

    def __exit__(self, *exc):
        JointCTC.choose = self._original

    def check(self, joint, logits, state, limits):
        limits = beam.Limits(limits.source_done, min(limits.room, 3))
        before = cache_attributes(state)
        wide = beam.plan(joint, state, logits, limits, EXHAUSTIVE_WIDTH)
        assert same_attributes(cache_attributes(state), before), "the plan changed the stream's cache"
        greedy = beam.plan(joint, state, logits, limits, 1)
        root = beam.Hypothesis(0.0, [], joint.scorer, joint.eoc_run, 0)
        ended = _exhaustive(joint.model, joint, copy.deepcopy(state), logits, root, limits)
        best = max(ended, key=lambda h: h.score)
        if best.tokens:  # (an empty best: the text has ended, and plan gives None)
            assert wide is not None and abs(wide.score - best.score) < 1e-4, (wide and wide.tokens, best.tokens)
            assert greedy is not None and wide.score >= greedy.score - 1e-6, (wide.score, greedy.score)
            self.improved += wide.score > greedy.score + 1e-9
            row = copy.deepcopy(state)  # the search's scores after each token: the LLM's, as the stream steps them
            for token, scores in zip(wide.tokens, wide.rows[: len(wide.tokens) - 1]):
                torch.testing.assert_close(scores, _target_step(joint.model, row, [token])[0], rtol=1e-4, atol=1e-4)
        self.done += 1


def run_case(bases: dict, seed: int) -> dict:
    base = bases[ARCHITECTURES[seed % len(ARCHITECTURES)]] if len(bases) > 1 else next(iter(bases.values()))
    rng = np.random.default_rng(seed)
    model = perturbed(fine_head_model(base) if rng.random() < 0.3 else base, rng)
    if rng.random() < 0.3:  # few positions: segments cut where one more chunk could pass them
        model.decoder.llm.config.max_position_embeddings = int(rng.integers(40, 80))
    decoding, audio = draw_decoding(rng), draw_audio(rng)
    try:
        StreamingSession(model, decoding)
    except InputError:  # (positions too few for these caps: refused, as a user would be)
        return {"refused": 1}
    with PlanChecks() as checks:
        whole = run_session(model, decoding, audio, [audio.size])
    pieces = run_session(model, decoding, audio, feed_sizes(rng, audio.size))
    same = (pieces.target_ids, pieces.transcript, pieces.segment_starts) == \
        (whole.target_ids, whole.transcript, whole.segment_starts)
    assert same, f"feed sizes changed the output: {decoding}"
    return {"refused": 0, "checks": checks.done, "improved": checks.improved, "segments": whole.segment + 1,
            "decoding": dataclasses.asdict(decoding)}


def main(argv: list[str]) -> int:
    first, count = (int(a) for a in argv[:2]) if argv else (0, 20)
    family = argv[2] if len(argv) > 2 else None
    if family not in (None, "all", *ARCHITECTURES):
        print(f"unknown architecture {family!r} (known: {', '.join(ARCHITECTURES)}, all)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    families = ARCHITECTURES if family == "all" else (family,)
    bases = {name: load_model("tiny-random") if name is None else build_model(tiny_config(name)).eval()
             for name in families}
    failures, totals = [], {"cases": 0, "refused": 0, "checks": 0, "improved": 0, "segmented": 0}
    for seed in range(first, first + count):
        try:
            result = run_case(bases, seed)
        except Exception:  # noqa: BLE001 (a campaign reports every failure)
            failures.append(seed)
            print(f"seed {seed}: FAILED\n{traceback.format_exc()}", flush=True)
            continue
        totals["cases"] += 1
        totals["refused"] += result["refused"]
        if result["refused"]:
            continue
        totals["checks"] += result["checks"]
        totals["improved"] += result["improved"]
        totals["segmented"] += result["segments"] > 1
    print(f"seeds {first}..{first + count - 1}: {totals}, failed: {failures}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
