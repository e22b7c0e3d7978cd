"""The source side of one segment: samples -> chunks -> log-mel -> encoder frames -> speech tokens.

``FrontEnd`` chains the streaming stages: ``Chunker`` cuts the audio on the read schedule's grid, ``LogMelStream``,
``EncoderStream`` (block-causal) and ``ProjectorStream`` each keep only what their next output needs, and with joint
CTC decoding on a model with a fine CTC head ``CTCWindowStream`` scores windows of the same encoder frames. A segment
cut (a VAD pause, the LLM's positions) starts a new ``FrontEnd``, so memory and per-chunk work stay flat over hours.
The session turns each ``SourceChunk`` into a unit for the LLM (prompt and end marker added).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from speechstream.chunker import Chunker
from speechstream.ctc_head import CTCWindowStream
from speechstream.encoder import EncoderStream
from speechstream.features import LogMelStream
from speechstream.model import SpeechLLM
from speechstream.projector import ProjectorStream


@dataclass(frozen=True)
class SourceChunk:
    """What one chunk of audio (or the segment's short last one) adds to the source side."""

    frames: torch.Tensor  # (T, d) encoder frames the chunk completed
    tokens: torch.Tensor  # (N, D) projected speech tokens, before the prompt and the end marker
    ctc_vectors: torch.Tensor | None  # (W, H) the fine CTC head's window vectors over the frames; None without it


class FrontEnd:
    """One segment's streaming source stages; ``chunks`` counts the chunks encoded so far."""

    def __init__(self, model: SpeechLLM, chunk_ms: int, fine_ctc: bool = False):
        """``fine_ctc``: also run the model's fine CTC head (joint CTC decoding with a model that has one)."""
        self.chunker = Chunker(chunk_ms)
        self.mel = LogMelStream()
        self.encoder = EncoderStream(model.encoder)
        self.projector = ProjectorStream(model.projector)
        self.ctc_windows = CTCWindowStream(model.ctc_head) if fine_ctc else None
        self.chunks = 0

    @property
    def chunk_size(self) -> int:
        """Samples per chunk."""
        return self.chunker.chunk_size

    def split(self, samples: np.ndarray) -> list[np.ndarray]:
        """Buffer samples; return every chunk they complete (each to ``encode``)."""
        return self.chunker.push(samples)

    def tail(self) -> np.ndarray:
        """The samples that did not fill a whole chunk (the segment's last, short chunk), forgotten here."""
        return self.chunker.flush()

    def encode(self, samples: np.ndarray, final: bool) -> SourceChunk:
        """Run one chunk through the stages; ``final``: the segment's last chunk, which flushes every stage."""
        mel = self.mel.push(samples)
        if final:
            mel = torch.cat([mel, self.mel.finish()])
        frames = self.encoder.push(mel, final=final)
        tokens = self.projector.push(frames, final=final)
        ctc = self.ctc_windows.push(frames, final=final) if self.ctc_windows is not None else None
        self.chunks += 1
        return SourceChunk(frames, tokens, ctc)
