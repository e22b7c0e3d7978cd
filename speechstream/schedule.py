"""The read schedule: which encoder frames and source tokens exist after each chunk.

Pure integer arithmetic shared by the streaming path and the training forward, so
both cut the source into exactly the same segments. A stream of ``n`` samples read in
chunks of ``C`` samples has ``n // C + 1`` segments: one per full chunk, and a final
one at ``finish`` holding the frames that needed the end of the signal (the tail of a
partial chunk and the look-ahead of the last frames). An encoder with right context
(``lookahead`` frames) ends every other segment that many frames earlier.
"""

from __future__ import annotations

from speechstream import features
from speechstream.audio import HOP_LENGTH, SAMPLE_RATE

ENCODER_FRAME_S = 2 * HOP_LENGTH / SAMPLE_RATE  # seconds per encoder frame (the stem halves the mel rate)


def conv_frames_ready(mel_frames: int) -> int:
    """Outputs of the first (kernel 3, stride 1) convolution computable from ``mel_frames`` frames."""
    return max(mel_frames - 1, 0)


def encoder_frames_ready(n_samples: int) -> int:
    """Encoder frames (20 ms each) computable from the first ``n_samples`` while the stream is open.

    The stem is two kernel-3 convolutions, the second of stride 2, so encoder frame u
    looks at mel frames 2u-2 .. 2u+2; each mel frame needs 12.5 ms past its centre.
    """
    return conv_frames_ready(features.frames_ready(n_samples)) // 2


def encoder_frames_total(n_samples: int) -> int:
    """Encoder frames of a complete signal of ``n_samples`` (after ``finish``)."""
    return (features.num_frames(n_samples) + 1) // 2


def segment_frame_ends(n_samples: int, chunk_size: int, lookahead: int = 0) -> list[int]:
    """Cumulative encoder frames at the end of each segment (length ``n_samples // chunk_size + 1``).

    With ``lookahead`` frames of right context, a segment ends that many frames before the frames ready
    after its chunk (the encoder needs them to compute it); the last segment still ends at the signal's end.
    """
    n_chunks = n_samples // chunk_size
    ends = [max(encoder_frames_ready((j + 1) * chunk_size) - lookahead, 0) for j in range(n_chunks)]
    return ends + [encoder_frames_total(n_samples)]


def tokens_from_frames(frames: int, stack: int, final: bool) -> int:
    """Source tokens the projector emits from ``frames`` encoder frames (a short last stack is padded at the end)."""
    return -(-frames // stack) if final else frames // stack


def segment_token_ends(frame_ends: list[int], stack: int) -> list[int]:
    """Cumulative speech tokens per segment, given ``segment_frame_ends``."""
    last = len(frame_ends) - 1
    return [tokens_from_frames(f, stack, final=(j == last)) for j, f in enumerate(frame_ends)]


def max_segment_samples(max_speech_tokens: int, chunk_size: int, stack: int) -> int:
    """The most audio, in whole chunks, one segment may hold so that its speech tokens (the last stack padded, as at
    a segment's end) number at most ``max_speech_tokens``; 0 when not even one chunk fits."""
    n = (max_speech_tokens * stack * 2 * HOP_LENGTH // chunk_size + 1) * chunk_size  # a little more than fits
    while n > 0 and tokens_from_frames(encoder_frames_total(n), stack, final=True) > max_speech_tokens:
        n -= chunk_size
    return n
