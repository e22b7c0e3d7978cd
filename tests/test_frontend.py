"""The front end of one segment: chunks cut on the grid, streamed speech tokens equal the training-side source."""

import numpy as np
import pytest
import torch

from speechstream.frontend import FrontEnd
from speechstream.model import SpeechLLM
from tests.helpers import fine_head_model


def stream(front: FrontEnd, audio: np.ndarray, sizes: list[int]):
    """Feed ``audio`` in slices of ``sizes`` (cycled); encode each chunk, then the tail as the last one."""
    chunks, at, i = [], 0, 0
    while at < audio.size:
        piece = audio[at : at + sizes[i % len(sizes)]]
        at, i = at + piece.size, i + 1
        chunks += [front.encode(chunk, final=False) for chunk in front.split(piece)]
    return chunks + [front.encode(front.tail(), final=True)]


def test_split_and_tail_cut_the_audio_on_the_chunk_grid(tiny_model):
    front = FrontEnd(tiny_model, 320)
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, 3 * 5120 + 700).astype(np.float32)
    pieces = front.split(audio[:4000]) + front.split(audio[4000:])
    assert [p.size for p in pieces] == [5120] * 3 and front.chunk_size == 5120
    rest = front.tail()
    assert np.array_equal(np.concatenate(pieces + [rest]), audio) and front.tail().size == 0
    assert front.chunks == 0  # counted when encoded


@pytest.mark.parametrize("sizes", [[16_000], [777, 3_001], [10_240]])
def test_streamed_tokens_equal_the_training_side_source(tiny_model, sizes):
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, 30_000).astype(np.float32)
    front = FrontEnd(tiny_model, 640)
    with torch.no_grad():
        chunks = stream(front, audio, sizes)
        batch = tiny_model.source_batch([audio], 640)
    assert front.chunks == len(chunks) == 3  # two whole 640 ms chunks and the tail
    tokens = torch.cat([c.tokens for c in chunks])
    assert tokens.shape[0] == int(batch.speech_lengths[0])
    torch.testing.assert_close(tokens, batch.speech[0, : tokens.shape[0]], atol=1e-5, rtol=1e-4)
    assert all(c.ctc_vectors is None for c in chunks)


def test_the_fine_ctc_head_scores_windows_of_the_same_frames(tiny_model):
    model: SpeechLLM = fine_head_model(tiny_model)
    audio = np.random.default_rng(2).uniform(-0.5, 0.5, 24_000).astype(np.float32)
    with torch.no_grad():
        chunks = stream(FrontEnd(model, 640, fine_ctc=True), audio, [24_000])
        frames = torch.cat([c.frames for c in chunks])
        vectors = torch.cat([c.ctc_vectors for c in chunks])
        assert vectors.shape[0] == -(-frames.shape[0] // 2)  # a window every 2 encoder frames
        whole = stream(FrontEnd(model, 640, fine_ctc=True), audio, [1_000])
    torch.testing.assert_close(torch.cat([c.ctc_vectors for c in whole]), vectors)
