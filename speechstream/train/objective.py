"""The training objective: LM cross-entropy on the target group under the wait-k GPE mask plus ``ctc_weight`` x CTC
of the speech tokens (or of the fine CTC head alone), and the global-batch weighting that makes N processes compute
what one does."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from speechstream.ctc_head import ctc_windows
from speechstream.model import EncodedBatch, SpeechLLM


class StreamingLoss(nn.Module):
    """The training objective; ``forward`` so that DDP sees (and syncs) the trainable weights."""

    def __init__(self, model: SpeechLLM, ctc_weight: float, ctc_classes: torch.Tensor | None = None,
                 ctc_head_only: bool = False):
        super().__init__()
        self.model = model
        self.ctc_weight = ctc_weight
        self.ctc_head_only = ctc_head_only
        # CTC over a subset of the vocabulary: class i is token ctc_classes[i]; lookup maps token -> class
        self.ctc_classes = ctc_classes
        if ctc_classes is not None:
            lookup = torch.full((model.decoder.llm.get_input_embeddings().weight.shape[0],), -1, dtype=torch.long)
            lookup[ctc_classes] = torch.arange(len(ctc_classes))
            self.ctc_lookup = lookup

    def forward(self, frames: torch.Tensor, frame_ends: list[list[int]], targets: list[list[int]],
                texts: list[list[int]], k: int, ctc_only: bool = False,
                keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``frames``: (B, U, d) encoder frames (a partly tuned encoder's: the cached rows below its tuned layers);
        ``keep``: a SpecAugment mask (``spec_augment_mask``) the encoder frames are multiplied by."""
        model = self.model
        if model.config.encoder.tuned_layers:  # cached rows below the tuned layers -> encoder frames
            frames = model.frames_from_frozen(frames, frame_ends)
        if keep is not None:
            frames = frames * keep.to(frames)
        if self.ctc_head_only:
            ctc = self.head_ctc_loss(frames, frame_ends, texts)
            windows = [-(-ends[-1] // model.ctc_head.hop) for ends in frame_ends]
            return {"ctc": ctc, "loss": ctc, "ctc_unfit": torch.tensor(float(unfit_ctc_targets(windows, texts)))}
        source = model.source_from_frames(EncodedBatch(frames, frame_ends))
        unfit = torch.tensor(float(unfit_ctc_targets(source.speech_lengths.tolist(), texts)))
        if ctc_only:
            ctc = self.ctc_loss(source, texts)
            return {"ctc": ctc, "loss": ctc, "ctc_unfit": unfit}
        logits = model.forward_train(source, targets, k)  # (B, T, V)
        header = len(model.header_ids)
        rows, labels = [], []
        for b, target in enumerate(targets):
            rows.append(logits[b, header - 1 : len(target) - 1])
            labels.append(torch.tensor(target[header:], device=logits.device))
        rows, labels = torch.cat(rows), torch.cat(labels)
        lm_sum = F.cross_entropy(rows.float(), labels, reduction="sum")
        correct = (rows.argmax(-1) == labels).sum()
        lm = lm_sum / len(labels)
        # (sums and counts: train() weighs each rank's share of a global batch by them)
        out = {"lm": lm, "accuracy": correct.float() / len(labels), "lm_sum": lm_sum,
               "tokens": torch.tensor(float(len(labels))), "correct": correct.float()}
        loss = lm
        if self.ctc_weight > 0:
            ctc = self.ctc_loss(source, texts)
            out["ctc"] = ctc
            out["ctc_unfit"] = unfit
            loss = loss + self.ctc_weight * ctc
        out["loss"] = loss
        return out

    def ctc_loss(self, source, texts: list[list[int]]) -> torch.Tensor:
        """CTC of the speech tokens against the transcript's LLM token ids (blank = an extra learned vector)."""
        logits = self.model.ctc_logits(source.speech, self.ctc_classes)  # (B, N, C + 1)
        return self._ctc(logits.float().log_softmax(-1).transpose(0, 1), source.speech_lengths, texts)

    def head_ctc_loss(self, frames: torch.Tensor, frame_ends: list[list[int]], texts: list[list[int]]) -> torch.Tensor:
        """CTC of the fine CTC head's windows (every item's in one pass) against the transcript's token ids."""
        head = self.model.ctc_head
        windows = [ctc_windows(frames[b, : ends[-1]], head.stack, head.hop) for b, ends in enumerate(frame_ends)]
        lengths = [len(w) for w in windows]
        logits = self.model.fine_ctc_logits(head.vectors(torch.cat(windows)), self.ctc_classes)
        per_item = torch.split(logits.float().log_softmax(-1), lengths)
        return self._ctc(nn.utils.rnn.pad_sequence(list(per_item)), torch.tensor(lengths), texts)

    def _ctc(self, log_probs: torch.Tensor, lengths: torch.Tensor, texts: list[list[int]]) -> torch.Tensor:
        """(N, B, C + 1) log-probabilities (blank last), each item's frame count and its token ids -> mean CTC."""
        blank = log_probs.shape[-1] - 1
        flat = torch.tensor([t for text in texts for t in text], dtype=torch.long)
        if self.ctc_classes is not None:
            flat = self.ctc_lookup[flat]
            if bool((flat < 0).any()):
                raise ValueError("a CTC target token is outside ctc_classes")
        return F.ctc_loss(log_probs, flat, lengths, torch.tensor([len(t) for t in texts]),
                          blank=blank, reduction="mean", zero_infinity=True)


def unfit_ctc_targets(lengths: list[int], texts: list[list[int]]) -> int:
    """How many items' CTC targets no path over their frames can emit: a target of L labels with R adjacent
    repeats needs L + R frames (a blank between repeats). Their loss is infinite; the CTC loss counts them as
    zero (``zero_infinity``), so they teach the CTC head nothing and lower its logged figure."""
    return sum(len(text) + sum(a == b for a, b in zip(text, text[1:])) > length
               for length, text in zip(lengths, texts))


def spec_augment_mask(shape: tuple[int, int, int] | torch.Size, lengths: list[int], rng: np.random.Generator,
                      time_ratio: float, span: int, channel_ratio: float) -> torch.Tensor:
    """SpecAugment as a (B, U, d) mask to multiply (B, U, d) frames by: about ``time_ratio`` of each item's
    ``lengths[b]`` frames zeroed in spans of ``span`` frames and ``channel_ratio`` of its channels zeroed (0 where
    it zeroes, 1 elsewhere; the same rng gives the same mask)."""
    keep = torch.ones(tuple(shape))
    for b, length in enumerate(lengths):
        spans = int(round(time_ratio * length / span)) if length > span else 0
        for start in rng.integers(0, max(1, length - span + 1), size=spans):
            keep[b, int(start) : int(start) + span] = 0
        channels = int(round(channel_ratio * shape[2]))
        if channels:
            keep[b, :, torch.from_numpy(rng.choice(shape[2], channels, replace=False))] = 0
    return keep


def global_batch_loss(out: dict[str, torch.Tensor], items: int, ctc_weight: float, reduce_sum, world: int
                      ) -> tuple[torch.Tensor, dict[str, float]]:
    """This rank's loss to back-propagate so that DDP's mean of the ranks' gradients is the gradient of the loss
    of the whole global batch (the LM cross-entropy a mean over all its target tokens, the CTC loss a mean over
    all its utterances, however the batch is split), and the global batch's figures for the log.

    ``out``: ``StreamingLoss``'s figures for this rank's ``items`` utterances (0: a rank left without any, which
    ran a stand-in utterance that must not count); ``reduce_sum``: sum of a tensor over the ranks."""
    weight = 1.0 if items else 0.0
    local = [float(out["lm_sum"].detach()) * weight if "lm_sum" in out else 0.0,
             float(out["tokens"]) * weight if "tokens" in out else 0.0,
             float(out["correct"]) * weight if "correct" in out else 0.0,
             float(out["ctc"].detach()) * items if "ctc" in out else 0.0, float(items),
             float(out["ctc_unfit"]) * weight if "ctc_unfit" in out else 0.0]
    total = [float(x) for x in reduce_sum(torch.tensor(local, dtype=torch.float64))]
    lm_sum, tokens, correct, ctc_sum, n_items, unfit = total
    loss = out["loss"] * 0.0  # (keeps every rank's graph, also one whose share does not count)
    row = {}
    if "lm_sum" in out:
        loss = loss + out["lm_sum"] * (weight * world / max(tokens, 1.0))
        row.update(lm=lm_sum / max(tokens, 1.0), accuracy=correct / max(tokens, 1.0))
    if "ctc" in out:
        joint = "lm_sum" in out
        loss = loss + (ctc_weight if joint else 1.0) * out["ctc"] * (items * world / max(n_items, 1.0))
        row["ctc"] = ctc_sum / max(n_items, 1.0)
        if "ctc_unfit" in out:  # the share of utterances too short in frames for their CTC target
            row["ctc_unfit"] = unfit / max(n_items, 1.0)
    row["loss"] = row.get("lm", 0.0) + (ctc_weight if "lm" in row else 1.0) * row.get("ctc", 0.0)
    return loss, row
