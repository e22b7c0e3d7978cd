"""A Whisper-architecture speech encoder that streams.

Parameter names follow transformers' ``WhisperEncoder`` so Whisper checkpoints load
directly. Two things differ from Whisper's forward, identically in batch and stream:

* no padding to 30 s: the encoder runs on the true length;
* block-causal attention: the frames of segment j (``schedule.segment_frame_ends``)
  attend to each other and to at most ``left_frames`` earlier frames, never to later
  segments. The stream keeps a per-layer key/value cache of those ``left_frames``
  frames, so each chunk costs the same however long the stream has run.
* optional right context (``lookahead_frames``, as in Emformer): segment j also sees the
  next ``lookahead_frames`` frames. Those are computed as copies that only segment j
  attends to and are thrown away; the next segment computes them again as its own
  frames, so what the cache keeps never depends on how far the stream has read.

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


def block_layout(segment_ends: list[int], left_frames: int | None, lookahead: int,
                 total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows one item's layers compute and who attends to whom.

    Returns ``(index, mask)``: ``index`` (R,) the frame each row holds -- the ``total`` frames
    themselves, then for each non-empty segment but the last a copy of the ``lookahead`` frames
    after it -- and ``mask`` (R, R) bool, True = attend. Frame u of segment j and the copies of
    segment j attend frames [start_j - left_frames, end_j) and those copies; frames past the
    item's last segment end attend to themselves only (their outputs are ignored).
    """
    n_valid = min(segment_ends[-1], total) if segment_ends else 0
    index = list(range(total))
    blocks = []  # (main start, main end, copy start, copy end) in rows
    start = 0
    for j, end in enumerate(segment_ends):
        end = min(end, total)
        if end > start:
            copies = range(end, min(end + lookahead, n_valid)) if j < len(segment_ends) - 1 else range(0)
            blocks.append((start, end, len(index), len(index) + len(copies)))
            index.extend(copies)
        start = max(start, end)
    mask = torch.zeros(len(index), len(index), dtype=torch.bool)
    for lo_main, end, lo_copy, hi_copy in blocks:
        lo = 0 if left_frames is None else max(0, lo_main - left_frames)
        for rows in (slice(lo_main, end), slice(lo_copy, hi_copy)):
            mask[rows, lo:end] = True
            mask[rows, lo_copy:hi_copy] = True
    idx = torch.arange(n_valid, total)
    mask[idx, idx] = True
    return torch.tensor(index, dtype=torch.long), mask


def batch_mask(item_masks: list[torch.Tensor], rows: int) -> torch.Tensor:
    """(B, rows, rows) bool: each item's ``block_layout`` mask in its top-left corner; the padding rows after an
    item's own attend to themselves only."""
    mask = torch.eye(rows, dtype=torch.bool).repeat(len(item_masks), 1, 1)
    for b, item_mask in enumerate(item_masks):
        mask[b, : len(item_mask), : len(item_mask)] = item_mask
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
        x, mask, total, _ = self._rows(mel, mel_lengths, segment_ends)
        for layer in self.layers:
            x, _ = layer(x, mask)
        return self.layer_norm(x[:, :total])

    def lower_rows(self, mel: torch.Tensor, mel_lengths: torch.Tensor, segment_ends: list[list[int]],
                   upto: int) -> list[torch.Tensor]:
        """What ``forward`` computes up to layer ``upto`` (exclusive), per item: (R, d) rows, the item's frames
        (``segment_ends[b][-1]`` of them) then its look-ahead copies in ``block_layout``'s order. ``upper`` takes
        them from there (the frozen layers of a partly tuned encoder, computed once and cached)."""
        x, mask, total, copies = self._rows(mel, mel_lengths, segment_ends)
        for layer in self.layers[:upto]:
            x, _ = layer(x, mask)
        return [torch.cat([x[b, : min(ends[-1], total)], x[b, total : total + copies[b]]])
                for b, ends in enumerate(segment_ends)]

    def upper(self, rows: torch.Tensor, segment_ends: list[list[int]], start: int) -> torch.Tensor:
        """(B, R, d) padded ``lower_rows`` of layers below ``start`` -> (B, U, d) encoder frames, as ``forward``
        gives them (zero past each item's frames): layers ``start`` on and the final layer norm."""
        layouts = [block_layout(ends, self.config.left_frames, self.config.lookahead_frames, ends[-1])
                   for ends in segment_ends]
        width = rows.shape[1]
        if any(len(index) > width for index, _ in layouts):
            raise ValueError("rows hold fewer rows than the items' frames and look-ahead copies")
        mask = batch_mask([item_mask for _, item_mask in layouts], width)[:, None].to(rows.device)
        x = rows
        for layer in self.layers[start:]:
            x, _ = layer(x, mask)
        frames = max(ends[-1] for ends in segment_ends)
        out = self.layer_norm(x[:, :frames])
        keep = torch.arange(frames, device=x.device)[None, :] < torch.tensor([e[-1] for e in segment_ends],
                                                                             device=x.device)[:, None]
        return out * keep[..., None]

    def _rows(self, mel: torch.Tensor, mel_lengths: torch.Tensor, segment_ends: list[list[int]]
              ) -> tuple[torch.Tensor, torch.Tensor, int, list[int]]:
        """The stem's frames with their positions, each item's look-ahead copies appended after the ``total``
        frames (``block_layout``), the (B, 1, R, R) mask, ``total`` and each item's number of copies."""
        x = self.stem(mel, mel_lengths)
        batch, total, _ = x.shape
        x = x + self.positions(0, total)[None]
        layouts = [block_layout(ends, self.config.left_frames, self.config.lookahead_frames, total)
                   for ends in segment_ends]
        rows = max(len(index) for index, _ in layouts)
        index = torch.zeros(batch, rows, dtype=torch.long)
        for b, (item_index, _) in enumerate(layouts):
            index[b, : len(item_index)] = item_index
        mask = batch_mask([item_mask for _, item_mask in layouts], rows)
        if rows > total:  # some item has look-ahead copies: append them after the frames
            x = torch.gather(x, 1, index.to(x.device)[..., None].expand(-1, -1, x.shape[2]))  # (B, R, d)
        return x, mask[:, None].to(x.device), total, [len(item_index) - total for item_index, _ in layouts]


class EncoderStream:
    """Per-stream encoder state: conv context, frame counts and per-layer key/value caches.

    ``push(mel, final)`` takes new log-mel frames and returns the encoder frames that
    have become computable: all of them up to the look-ahead of the stem (and the
    ``lookahead_frames`` of right context) while the stream is open, the rest when
    ``final`` is set.
    """

    def __init__(self, encoder: StreamingWhisperEncoder):
        self.encoder = encoder
        d = encoder.config.d_model
        param = encoder.conv1.weight  # state lives on the encoder's device, in its dtype (mel comes from the CPU)
        self._mel = param.new_zeros(0, encoder.config.num_mel_bins)  # mel frames from index _mel_start on
        self._mel_start = 0
        self._mel_total = 0  # mel frames received
        self._conv = param.new_zeros(0, d)  # first-conv outputs from index _conv_start on
        self._conv_start = 0
        self._conv_done = 0  # first-conv outputs computed
        self._stem_done = 0  # stem outputs computed
        self._pending = param.new_zeros(0, d)  # stem outputs (with positions) from frames_done to _stem_done
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
        stem_target = (conv_total + 1) // 2 if final else conv_total // 2
        if stem_target > self._stem_done:
            lo, hi = 2 * self._stem_done - 1, 2 * stem_target
            window = self._window(self._conv, self._conv_start, lo, hi, conv_total if final else None)
            frames = F.gelu(F.conv1d(window.T[None], enc.conv2.weight, enc.conv2.bias, stride=2))[0].T
            frames = frames[: stem_target - self._stem_done]
            frames = frames + enc.positions(self._stem_done, frames.shape[0])
            self._pending = torch.cat([self._pending, frames])
            self._stem_done = stem_target
        self._trim()
        # the block: pending frames up to the look-ahead's start, plus the look-ahead as throw-away copies
        lookahead = 0 if final else enc.config.lookahead_frames
        new = max(self._stem_done - lookahead - self.frames_done, 0)
        if new == 0:
            return param.new_zeros(0, enc.config.d_model)
        x = self._pending[None]  # (1, new + look-ahead, d)
        left = enc.config.left_frames
        for i, layer in enumerate(enc.layers):
            past = 0 if self._cache[i] is None else self._cache[i][0].shape[2]
            x, (k, v) = layer(x, None, self._cache[i])
            k, v = k[:, :, : past + new], v[:, :, : past + new]  # the copies are never cached
            self._cache[i] = (k, v) if left is None else (k[:, :, -left:], v[:, :, -left:]) if left else None
        self._pending = self._pending[new:]
        self.frames_done += new
        return enc.layer_norm(x[0, :new])

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
        keep_conv = max(2 * self._stem_done - 1, 0)
        self._conv = self._conv[keep_conv - self._conv_start :]
        self._conv_start = keep_conv
