"""The streaming encoder and projector equal their batch forwards, with bounded state."""

import numpy as np
import pytest
import torch

from speechstream import features, schedule
from speechstream.chunker import chunk_samples
from speechstream.config import EncoderConfig
from speechstream.encoder import EncoderStream, StreamingWhisperEncoder, block_layout, sinusoids
from speechstream.projector import Projector, ProjectorStream


def tiny_encoder(left_frames, seed=0, lookahead=0):
    torch.manual_seed(seed)
    config = EncoderConfig(d_model=32, layers=2, heads=4, ffn_dim=64, left_frames=left_frames,
                           lookahead_frames=lookahead)
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


def assert_stream_equals_batch(encoder, audio, chunk_ms):
    with torch.no_grad():
        segments, _ = stream_encode(encoder, audio, chunk_ms)
        ends = schedule.segment_frame_ends(len(audio), chunk_samples(chunk_ms), encoder.config.lookahead_frames)
        mel = features.log_mel(audio)[None]
        batch = encoder(mel, torch.tensor([mel.shape[1]]), [ends])[0]
    assert [s.shape[0] for s in segments] == np.diff([0] + ends).tolist()
    streamed = torch.cat(segments)
    assert streamed.shape == batch.shape
    assert (streamed - batch).abs().max() < 1e-4


@pytest.mark.parametrize("left_frames", [None, 0, 20, 64])
@pytest.mark.parametrize("chunk_ms,seconds", [(640, 3.3), (320, 1.01), (1000, 0.37), (160, 2.0)])
def test_stream_equals_batch(left_frames, chunk_ms, seconds):
    rng = np.random.default_rng(1)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    assert_stream_equals_batch(tiny_encoder(left_frames), audio, chunk_ms)


@pytest.mark.parametrize("lookahead", [1, 8, 32, 40])
@pytest.mark.parametrize("left_frames,chunk_ms,seconds", [(None, 640, 3.3), (20, 320, 2.5), (64, 160, 1.3),
                                                          (0, 640, 0.5)])
def test_stream_with_lookahead_equals_batch(lookahead, left_frames, chunk_ms, seconds):
    rng = np.random.default_rng(4)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    assert_stream_equals_batch(tiny_encoder(left_frames, lookahead=lookahead), audio, chunk_ms)


def test_lookahead_reaches_every_block_but_the_last():
    """Right context changes a block's frames; the last block (nothing after it) is computed as without it."""
    rng = np.random.default_rng(5)
    audio = (0.1 * rng.standard_normal(16000 * 2)).astype(np.float32)
    mel = features.log_mel(audio)[None]
    chunk = chunk_samples(640)
    ends = schedule.segment_frame_ends(len(audio), chunk, 16)
    assert ends == [e - 16 for e in schedule.segment_frame_ends(len(audio), chunk)[:-1]] + [ends[-1]]
    with torch.no_grad():
        ahead = tiny_encoder(0, lookahead=16)(mel, torch.tensor([mel.shape[1]]), [ends])[0]
        blocks_only = tiny_encoder(0)(mel, torch.tensor([mel.shape[1]]), [ends])[0]  # same blocks, no copies
    for start, end in zip([0] + ends[:-2], ends[:-1]):
        assert (ahead[start:end] - blocks_only[start:end]).abs().max() > 1e-3
    assert (ahead[ends[-2] :] - blocks_only[ends[-2] :]).abs().max() < 1e-5


def test_block_layout_copies_the_lookahead_for_each_block_but_the_last():
    index, mask = block_layout([4, 8, 10], left_frames=2, lookahead=2, total=11)
    assert index.tolist() == list(range(11)) + [4, 5, 8, 9]
    # block 1 (frames 4..7) sees frames 2..7 and its copies (rows 13, 14) of frames 8, 9, never the real 8, 9
    assert mask[4:8, 2:8].all() and mask[4:8, :2].sum() == 0 and mask[4:8, 8:11].sum() == 0
    assert mask[4:8, 13:15].all() and mask[4:8, 11:13].sum() == 0
    assert mask[13:15, 2:8].all() and mask[13:15, 13:15].all() and mask[13:15, 8:13].sum() == 0
    assert mask[10, 10] and mask[10].sum() == 1  # past the last end: itself only
    assert block_layout([4, 8, 10], 2, 0, 11)[0].tolist() == list(range(11))  # no look-ahead: no copies


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


@pytest.mark.parametrize("lookahead", [0, 8])
def test_frozen_rows_then_the_upper_layers_give_the_forward(lookahead):
    """A partly tuned encoder's training pass: the rows below layer ``upto`` of a batch of different lengths (frames
    and look-ahead copies, computed once for the feature cache), taken item by item through the layers from
    ``upto`` on, give the frames of the whole forward, at every split (0: everything after the stem)."""
    torch.manual_seed(3)
    config = EncoderConfig(d_model=32, layers=3, heads=4, ffn_dim=64, left_frames=20, lookahead_frames=lookahead)
    encoder = StreamingWhisperEncoder(config).eval()
    rng = np.random.default_rng(5)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (21000, 9000, 33000)]
    mels = [features.log_mel(a) for a in audios]
    ends = [schedule.segment_frame_ends(len(a), chunk_samples(320), lookahead) for a in audios]
    padded = torch.nn.utils.rnn.pad_sequence(mels, batch_first=True)
    lengths = torch.tensor([m.shape[0] for m in mels])
    with torch.no_grad():
        whole = encoder(padded, lengths, ends)
        for upto in range(config.layers + 1):
            rows = encoder.lower_rows(padded, lengths, ends, upto)
            copies = [len(block_layout(e, 20, lookahead, e[-1])[0]) - e[-1] for e in ends]
            assert [len(r) for r in rows] == [e[-1] + c for e, c in zip(ends, copies)]
            frames = encoder.upper(torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), ends, upto)
            assert frames.shape[:2] == (3, max(e[-1] for e in ends))
            for b, e in enumerate(ends):
                assert (frames[b, : e[-1]] - whole[b, : e[-1]]).abs().max() < 1e-5, (upto, b)
                assert not frames[b, e[-1] :].any()  # zero past the item's frames
    assert lookahead == 0 or sum(copies) > 0  # (the right context was exercised)


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
    index, mask = block_layout([3, 7, 10], left_frames=2, lookahead=0, total=10)
    assert index.tolist() == list(range(10))
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


def test_the_stream_runs_where_the_encoder_is_with_mel_from_the_cpu():
    """The stream's buffers (mel and conv context, pending frames) were made on the CPU in float32, so beside an
    encoder on a GPU every push failed ('Expected all tensors to be on the same device'), and in bfloat16 the conv
    met float input. The meta device (shapes, no data) stands in for a GPU here; it fails the same way."""
    encoder = tiny_encoder(20, lookahead=4).to("meta")
    mel = features.log_mel(np.zeros(16000, np.float32))  # (100, 80) on the CPU, as LogMelStream gives it
    stream = EncoderStream(encoder)
    first, rest, tail = stream.push(mel[:50]), stream.push(mel[50:]), stream.push(mel[:0], final=True)
    assert [x.device.type for x in (first, rest, tail)] == ["meta"] * 3
    assert [x.shape[0] for x in (first, rest, tail)] == [20, 25, 5]
    assert stream.push(mel[:0]).device.type == "meta"  # nothing new: an empty result on the encoder's device too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_encoder_streams_what_its_batch_forward_gives(dtype):
    encoder = tiny_encoder(20, lookahead=4).to(dtype)
    audio = (0.1 * np.random.default_rng(6).standard_normal(16000)).astype(np.float32)
    with torch.no_grad():
        segments, _ = stream_encode(encoder, audio, 320)
        ends = schedule.segment_frame_ends(len(audio), chunk_samples(320), 4)
        mel = features.log_mel(audio)[None].to(dtype)
        batch = encoder(mel, torch.tensor([mel.shape[1]]), [ends])[0]
    streamed = torch.cat(segments)
    assert streamed.dtype == dtype and streamed.shape == batch.shape
    assert (streamed.float() - batch.float()).abs().max() < 0.05
