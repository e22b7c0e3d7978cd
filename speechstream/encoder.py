"""A Whisper-architecture speech encoder that streams.

Parameter names follow transformers' ``WhisperEncoder`` so Whisper checkpoints load
directly. Two things differ from Whisper's forward, identically in batch and stream:

* no padding to 30 s: the encoder runs on the true length;
* block-causal attention: the frames of segment j (``schedule.segment_frame_ends``)
  attend to each other and to at most ``left_frames`` earlier frames, never to later
  segments. The stream keeps a per-layer key/value cache of those ``left_frames``
  frames, so each chunk costs the same however long the stream has run.

Positions past the 1500-row table continue Whisper's sinusoid formula.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from speechstream.config import EncoderConfig


def sinusoids(start: int, count: int, channels: int) -> torch.Tensor:
    """(count, channels) Whisper's sinusoidal position rows for positions start .. start+count-1."""
    increment = math.log(10000) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled = torch.arange(start, start + count, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer (Whisper's layout; k_proj has no bias)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        d = config.d_model
        self.heads = config.heads
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, d)
        self.self_attn.k_proj = nn.Linear(d, d, bias=False)
        self.self_attn.v_proj = nn.Linear(d, d)
        self.self_attn.out_proj = nn.Linear(d, d)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        return x.view(batch, time, self.heads, width // self.heads).transpose(1, 2)  # (B, H, T, D)

    def forward(
        self,
        x: torch.Tensor,  # (B, Q, d) new frames
        mask: torch.Tensor | None,  # (B, 1, Q, K) bool, True = attend; None = attend to all keys
        past: tuple[torch.Tensor, torch.Tensor] | None = None,  # cached (B, H, P, D) keys and values
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h = self.self_attn_layer_norm(x)
        q = self._split(self.self_attn.q_proj(h))
        k = self._split(self.self_attn.k_proj(h))
        v = self._split(self.self_attn.v_proj(h))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, Q, D)
        attended = attended.transpose(1, 2).reshape(x.shape)
        x = x + self.self_attn.out_proj(attended)
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        return x, (k, v)


def block_attention_mask(segment_ends: list[int], left_frames: int | None, total: int) -> torch.Tensor:
    """(total, total) bool: frame u of segment j attends frames [start_j - left_frames, end_j)."""
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for end in segment_ends:
        end = min(end, total)
        if end > start:
            lo = 0 if left_frames is None else max(0, start - left_frames)
            mask[start:end, lo:end] = True
        start = max(start, end)
    return mask


class StreamingWhisperEncoder(nn.Module):
    """Conv stem + block-causal transformer; ``forward`` for training, ``EncoderStream`` for streaming."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.embed_positions.weight.data.copy_(sinusoids(0, config.max_source_positions, d))
        self.embed_positions.requires_grad_(False)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.layers))
        self.layer_norm = nn.LayerNorm(d)

    def positions(self, start: int, count: int) -> torch.Tensor:
        """(count, d) position rows: the table where it reaches, the sinusoid formula beyond."""
        table = self.embed_positions.weight
        inside = max(0, min(count, table.shape[0] - start))
        rows = [table[start : start + inside]]
        if inside < count:
            extra = sinusoids(start + inside, count - inside, table.shape[1]).to(table)
            rows.append(extra)
        return torch.cat(rows, dim=0)

    def stem(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, n_mels) -> (B, ceil(T / 2), d): both convolutions, zero-padded at each item's end."""
        valid = torch.arange(mel.shape[1], device=mel.device)[None, :] < mel_lengths[:, None]  # (B, T)
        x = self.conv1((mel * valid[..., None]).transpose(1, 2))  # (B, d, T)
        x = F.gelu(x) * valid[:, None, :]
        x = F.gelu(self.conv2(x))
        return x.transpose(1, 2)

    def forward(
        self,
        mel: torch.Tensor,  # (B, T, n_mels) padded log-mel
        mel_lengths: torch.Tensor,  # (B,) valid mel frames per item
        segment_ends: list[list[int]],  # per item, cumulative encoder frames per segment
    ) -> torch.Tensor:  # (B, U, d), U = ceil(T / 2); frames past an item's length are undefined
        x = self.stem(mel, mel_lengths)
        batch, total, _ = x.shape
        x = x + self.positions(0, total)[None]
        masks = []
        for ends in segment_ends:
            mask = block_attention_mask(ends, self.config.left_frames, total)
            # frames past the item's end attend to themselves only (their outputs are ignored)
            n_valid = min(ends[-1], total) if ends else 0
            idx = torch.arange(n_valid, total)
            mask[idx, idx] = True
            masks.append(mask)
        mask = torch.stack(masks)[:, None]  # (B, 1, U, U)
        for layer in self.layers:
            x, _ = layer(x, mask)
        return self.layer_norm(x)


class EncoderStream:
    """Per-stream encoder state: conv context, frame counts and per-layer key/value caches.

    ``push(mel, final)`` takes new log-mel frames and returns the encoder frames that
    have become computable: all of them up to the look-ahead of the stem while the
    stream is open, the rest when ``final`` is set.
    """

    def __init__(self, encoder: StreamingWhisperEncoder):
        self.encoder = encoder
        d = encoder.config.d_model
        self._mel = torch.zeros(0, encoder.config.num_mel_bins)  # mel frames from index _mel_start on
        self._mel_start = 0
        self._mel_total = 0  # mel frames received
        self._conv = torch.zeros(0, d)  # first-conv outputs from index _conv_start on
        self._conv_start = 0
        self._conv_done = 0  # first-conv outputs computed
        self.frames_done = 0  # encoder frames emitted
        self._cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(encoder.layers)

    @torch.no_grad()
    def push(self, mel: torch.Tensor, final: bool = False) -> torch.Tensor:
        """(n, n_mels) new mel frames -> (m, d) new encoder frames."""
        enc = self.encoder
        param = enc.conv1.weight
        if mel.shape[0]:
            self._mel = torch.cat([self._mel, mel.to(param)])
            self._mel_total += mel.shape[0]
        # first convolution: output t needs mel t-1 .. t+1 (zeros outside the signal)
        conv_target = self._mel_total if final else max(self._mel_total - 1, 0)
        if conv_target > self._conv_done:
            lo, hi = self._conv_done - 1, conv_target + 1
            window = self._window(self._mel, self._mel_start, lo, hi, self._mel_total)
            out = F.gelu(F.conv1d(window.T[None], enc.conv1.weight, enc.conv1.bias))[0].T
            self._conv = torch.cat([self._conv, out])
            self._conv_done = conv_target
        # second convolution (stride 2): output u needs conv outputs 2u-1 .. 2u+1
        conv_total = self._conv_done
        frame_target = (conv_total + 1) // 2 if final else conv_total // 2
        if frame_target <= self.frames_done:
            self._trim()
            return torch.zeros(0, enc.config.d_model)
        lo, hi = 2 * self.frames_done - 1, 2 * frame_target
        window = self._window(self._conv, self._conv_start, lo, hi, conv_total if final else None)
        frames = F.gelu(F.conv1d(window.T[None], enc.conv2.weight, enc.conv2.bias, stride=2))[0].T
        frames = frames[: frame_target - self.frames_done]
        x = (frames + enc.positions(self.frames_done, frames.shape[0]))[None]  # (1, m, d)
        left = enc.config.left_frames
        for i, layer in enumerate(enc.layers):
            x, (k, v) = layer(x, None, self._cache[i])
            self._cache[i] = (k, v) if left is None else (k[:, :, -left:], v[:, :, -left:]) if left else None
        self.frames_done = frame_target
        self._trim()
        return enc.layer_norm(x)[0]

    @staticmethod
    def _window(buf: torch.Tensor, buf_start: int, lo: int, hi: int, total: int | None) -> torch.Tensor:
        """Rows lo .. hi-1 of a sequence held from buf_start on, zero rows outside [0, total)."""
        rows = []
        if lo < 0:
            rows.append(buf.new_zeros(-lo, buf.shape[1]))
        avail_hi = min(hi, buf_start + buf.shape[0])
        rows.append(buf[max(lo, 0) - buf_start : avail_hi - buf_start])
        if hi > avail_hi:
            if total is None or avail_hi < total:
                raise RuntimeError("encoder stream asked for frames it has not received")
            rows.append(buf.new_zeros(hi - avail_hi, buf.shape[1]))
        return torch.cat(rows)

    def _trim(self) -> None:
        """Drop conv context that no future output needs."""
        keep_mel = max(self._conv_done - 1, 0)
        self._mel = self._mel[keep_mel - self._mel_start :]
        self._mel_start = keep_mel
        keep_conv = max(2 * self.frames_done - 1, 0)
        self._conv = self._conv[keep_conv - self._conv_start :]
        self._conv_start = keep_conv
