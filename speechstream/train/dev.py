"""The dev evaluation during training: greedy CTC decoding of the speech tokens (or of the fine CTC head), scored as
normalized WER: a cheap view of the acoustic side's progress, logged as ``dev_ctc_wer``."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import torch

from speechstream.model import EncodedBatch, SpeechLLM
from speechstream.train.examples import Example
from speechstream.train.feature_cache import FeatureCache
from speechstream.train.recipe import TrainConfig


def log_dev_score(model: SpeechLLM, cache: FeatureCache, dev: list[Example], ctc_classes: torch.Tensor | None,
                  config: TrainConfig, log_path: Path, step: int,
                  stopped: typing.Callable[[], bool] = lambda: False) -> float | None:
    """Score the dev set after ``step`` (``dev_ctc_wer``) and log its row; None, and no row, when ``stopped``."""
    model.eval()
    score = dev_ctc_wer(model, cache, dev, ctc_classes, config.ctc_head_only, stopped=stopped)
    model.train()
    if score is not None:
        with log_path.open("a") as log:
            log.write(json.dumps({"step": step, "dev_ctc_wer": round(score, 2)}) + "\n")
    return score


def evaluation_due(config: TrainConfig, step: int, dev: list[Example]) -> bool:
    """Whether the dev set is scored after ``step``: every ``eval_every`` steps and after the last one."""
    return bool(dev) and ((config.eval_every > 0 and step % config.eval_every == 0) or step == config.steps)


@torch.no_grad()
def dev_ctc_wer(model: SpeechLLM, cache: FeatureCache, examples: list[Example],
                ctc_classes: torch.Tensor | None = None, fine: bool = False,
                stopped: typing.Callable[[], bool] = lambda: False) -> float | None:
    """Normalized WER of greedy CTC decoding of the projector outputs (``fine``: of the fine CTC head's windows)
    (a cheap view of acoustic progress),
    over the classes the loss scores. The CTC target is the transcript (``text``) in both tasks, the
    source-language one for "translate". None when ``stopped()`` turns true before the last utterance."""
    from speechstream.eval.quality import wer

    hypotheses = []
    for example in examples:
        if stopped():
            return None
        frames, ends, _ = cache.frames(example)
        frames = frames.to(model.ctc_blank.device)
        if model.config.encoder.tuned_layers:  # (the cache holds the rows below the tuned layers)
            frames = model.frames_from_frozen(frames[None], [ends])[0]
        if fine:
            hypotheses.append(greedy_ctc_text(model, model.ctc_head(frames[: ends[-1]]), ctc_classes, fine=True))
            continue
        source = model.source_from_frames(EncodedBatch(frames[None], [ends]))
        hypotheses.append(greedy_ctc_text(model, source.speech[0, : int(source.speech_lengths[0])], ctc_classes))
    return wer(hypotheses, [e.text for e in examples], normalize=True)


def greedy_ctc_text(model: SpeechLLM, speech: torch.Tensor, ctc_classes: torch.Tensor | None = None,
                    fine: bool = False) -> str:
    """(N, H) speech tokens (``fine``: vectors of the fine CTC head) -> the text of the CTC head's best path
    (repeats merged, blanks dropped)."""
    if fine:
        logits = model.fine_ctc_logits(speech, ctc_classes)
    else:
        logits = model.ctc_logits(speech, ctc_classes)
    best = logits.argmax(-1).tolist()
    blank = logits.shape[-1] - 1  # the last CTC class
    ids = [t for i, t in enumerate(best) if t != blank and (i == 0 or t != best[i - 1])]
    if ctc_classes is not None:
        ids = ctc_classes[ids].tolist()
    return model.tokenizer.decode(ids, skip_special_tokens=True)
