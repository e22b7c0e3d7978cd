"""The streaming encoder and projector equal their batch forwards, with bounded state."""

import numpy as np
import pytest
import torch

from speechstream import features, schedule
from speechstream.chunker import chunk_samples
from speechstream.config import EncoderConfig
from speechstream.encoder import EncoderStream, StreamingWhisperEncoder, block_attention_mask, sinusoids
from speechstream.projector import Projector, ProjectorStream


def tiny_encoder(left_frames, seed=0):
    torch.manual_seed(seed)
    config = EncoderConfig(d_model=32, layers=2, heads=4, ffn_dim=64, left_frames=left_frames)
    return StreamingWhisperEncoder(config).eval()


def stream_encode(encoder, audio, chunk_ms):
    """Run mel + encoder streams chunk by chunk; return per-segment frames."""
    size = chunk_samples(chunk_ms)
    mel, enc = features.LogMelStream(), EncoderStream(encoder)
    segments = []
    n_chunks = len(audio) // size
    for j in range(n_chunks):
        segments.append(enc.push(mel.push(audio[j * size : (j + 1) * size])))
    tail = torch.cat([mel.push(audio[n_chunks * size :]), mel.finish()])
    segments.append(enc.push(tail, final=True))
    return segments, enc


@pytest.mark.parametrize("left_frames", [None, 0, 20, 64])
@pytest.mark.parametrize("chunk_ms,seconds", [(640, 3.3), (320, 1.01), (1000, 0.37), (160, 2.0)])
def test_stream_equals_batch(left_frames, chunk_ms, seconds):
    encoder = tiny_encoder(left_frames)
    rng = np.random.default_rng(1)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    with torch.no_grad():
        segments, _ = stream_encode(encoder, audio, chunk_ms)
        ends = schedule.segment_frame_ends(len(audio), chunk_samples(chunk_ms))
        mel = features.log_mel(audio)[None]
        batch = encoder(mel, torch.tensor([mel.shape[1]]), [ends])[0]
    assert [s.shape[0] for s in segments] == np.diff([0] + ends).tolist()
    streamed = torch.cat(segments)
    assert streamed.shape == batch.shape
    assert (streamed - batch).abs().max() < 1e-4


def test_batch_items_of_different_lengths_match_single_items():
    encoder = tiny_encoder(30)
    rng = np.random.default_rng(2)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (5000, 23456, 16000)]
    chunk = chunk_samples(320)
    mels = [features.log_mel(a) for a in audios]
    ends = [schedule.segment_frame_ends(len(a), chunk) for a in audios]
    padded = torch.nn.utils.rnn.pad_sequence(mels, batch_first=True)
    with torch.no_grad():
        batch = encoder(padded, torch.tensor([m.shape[0] for m in mels]), ends)
        for b, (m, e) in enumerate(zip(mels, ends)):
            single = encoder(m[None], torch.tensor([m.shape[0]]), [e])[0]
            assert (batch[b, : e[-1]] - single).abs().max() < 1e-5


def test_cache_is_bounded_by_left_window():
    encoder = tiny_encoder(left_frames=25)
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(16000 * 20)).astype(np.float32)
    with torch.no_grad():
        _, stream = stream_encode(encoder, audio, 320)
    for keys, values in stream._cache:
        assert keys.shape[2] <= 25 and values.shape[2] <= 25
    assert stream._mel.shape[0] <= 4 and stream._conv.shape[0] <= 4


def test_block_mask_never_looks_ahead():
    mask = block_attention_mask([3, 7, 10], left_frames=2, total=10)
    assert mask[0:3, 3:].sum() == 0
    assert mask[3:7, 7:].sum() == 0
    assert mask[3:7, :1].sum() == 0 and mask[3:7, 1:7].all()
    assert mask[7:10, 5:10].all() and mask[7:10, :5].sum() == 0


def test_positions_extend_the_table_with_the_formula():
    encoder = tiny_encoder(None)
    table = encoder.embed_positions.weight
    assert torch.allclose(table, sinusoids(0, table.shape[0], table.shape[1]))
    rows = encoder.positions(1490, 20)
    assert torch.allclose(rows, sinusoids(1490, 20, table.shape[1]), atol=1e-5)


@pytest.mark.parametrize("pieces,scale", [([7], 1.0), ([1, 2, 3, 1], 1.0), ([4, 4, 4], 0.1), ([0, 5, 2], 0.1)])
def test_projector_stream_equals_batch(pieces, scale):
    torch.manual_seed(0)
    projector = Projector(encoder_dim=16, llm_dim=24, stack=4, output_scale=scale).eval()
    frames = torch.randn(sum(pieces), 16)
    stream = ProjectorStream(projector)
    out, start = [], 0
    with torch.no_grad():
        for i, size in enumerate(pieces):
            out.append(stream.push(frames[start : start + size], final=i == len(pieces) - 1))
            start += size
        batch = projector(frames[None])[0]
    streamed = torch.cat(out)
    assert streamed.shape[0] == -(-sum(pieces) // 4)
    assert (streamed - batch).abs().max() < 1e-5
