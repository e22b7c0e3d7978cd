"""Training utterances: manifest lines read into ``Example``s, the checks on them, each utterance's target text cut
into the chunks of a wait-k schedule (``example_pieces``), and the seeded order of the global batches."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechstream.audio import audio_seconds, check_audio, load_audio
from speechstream.errors import InputError
from speechstream.manifest import audio_path, text_lines, time_field
from speechstream.targets import TimedWord, chunk_texts, translation_chunk_texts
from speechstream.train.recipe import TrainConfig


@dataclass(frozen=True)
class Example:
    """One training utterance."""

    id: str  # unique id
    audio: Path  # 16 kHz audio file
    text: str  # reference transcript
    words: tuple[TimedWord, ...]  # word end times (empty: all words after the last chunk)
    translation: str | None = None  # reference translation (the target of task "translate")
    offset: float = 0.0  # seconds into the audio file where the utterance starts (the manifest's ``offset``)
    duration: float | None = None  # seconds of audio from the offset (None: to the end of the file)


def example_audio(example: Example) -> np.ndarray:
    """The utterance's samples: its time range of the audio file (16 kHz mono float32)."""
    return load_audio(example.audio, example.offset, example.duration)


def example_seconds(example: Example) -> float:
    """The utterance's length, from the audio file's header (cheap); a one-line input error when the file is not
    a readable audio file or does not hold the range."""
    check_audio(example.audio, example.offset, example.duration)
    if example.duration is not None:
        return example.duration
    return audio_seconds(example.audio) - example.offset


def read_examples(path: str, max_audio_s: float | None = None, task: str = "asr") -> list[Example]:
    """Manifest lines -> examples (audio relative to the manifest's folder; ``offset``/``duration``: the time range
    of the file, word end times counted from its start); task "translate" needs a ``translation`` on every line.
    Utterances longer than ``max_audio_s`` are skipped (their length from ``duration`` or the file's header)."""
    folder = Path(path).resolve().parent
    examples, seen, skipped = [], set(), 0
    try:
        lines = text_lines(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read manifest ({error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row.get("text"), str):
                raise TypeError(f"text must be a string, got {row.get('text')!r}")
            aligned = row.get("words")  # (null: no alignment, as any optional field's null is no value)
            words = tuple(TimedWord(w["w"], float(w["end"])) for w in (() if aligned is None else aligned))
            if not all(isinstance(word.word, str) for word in words):  # (an aligned word is written into the
                # targets where the alignment's words are not the transcript's: a number there failed a step)
                raise TypeError("each word's w must be a string")
            ends = [word.end_s for word in words]
            if not all(math.isfinite(end) and end >= 0 for end in ends) or ends != sorted(ends):
                raise ValueError("word end times must be finite, non-negative and in order")
            translation = row.get("translation")
            if task == "translate" and not (isinstance(translation, str) and translation.strip()):
                raise ValueError("task translate needs a translation (a non-empty string) on every line")
            offset, duration = (time_field(row, key, key) for key in ("offset", "duration"))
            example = Example(str(row["id"]), audio_path(folder, row["audio"]), str(row["text"]), words,
                              None if translation is None else str(translation), float(offset or 0.0),
                              None if duration is None else float(duration))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError, OverflowError, InputError) as error:
            raise InputError(f"{path}:{number}: bad manifest line ({type(error).__name__}: {error})") from None
        try:
            found = example.audio.is_file()
        except OSError as error:  # a name too long, a folder on the way that may not be searched
            raise InputError(f"{path}:{number}: {row['audio']}: cannot look the file up ({error.strerror or error})"
                             ) from None
        if not found:
            raise InputError(f"{path}:{number}: {row['audio']}: no such audio file")
        if example.id in seen:  # features are cached by id: a second utterance would train on the first's audio
            raise InputError(f"{path}:{number}: duplicate id {example.id!r}")
        seen.add(example.id)
        try:
            seconds = example_seconds(example)
        except InputError as error:
            raise InputError(f"{path}:{number}: {error}") from None
        if max_audio_s and seconds > max_audio_s:
            skipped += 1
            continue
        examples.append(example)
    if not examples:
        longer = f" (all {skipped} are longer than max_audio_s={max_audio_s})" if skipped else ""
        raise InputError(f"{path}: no utterances{longer}")
    return examples


def check_texts(train: list[Example], dev: list[Example], config: TrainConfig) -> None:
    """Refuse (one line) an ASR train manifest whose transcripts are all empty (nothing to learn) and a dev set
    whose transcripts all normalise to nothing (its WER, taken after the steps, would be undefined)."""
    from speechstream.eval.quality import normalize_english

    if config.task == "asr" and not any(example.text.split() for example in train):
        raise InputError(f"{config.train_manifest}: every transcript (text) is empty: nothing to learn")
    if dev and not any(normalize_english(example.text).split() for example in dev):
        raise InputError(f"{config.dev_manifest}: every transcript (text) of the dev utterances is empty once "
                         "normalised: their WER is undefined")


def written_words(example: Example) -> list[TimedWord]:
    """The transcript's words as written (case, punctuation) with the aligned end times.

    Alignments may spell words differently (lowercase, no punctuation); when they have as
    many words as the transcript, the transcript's spelling is kept. Without alignments
    every word is placed after the last chunk.
    """
    written = example.text.split()
    if not example.words:
        return [TimedWord(w, float("inf")) for w in written]
    if len(written) == len(example.words):
        return [TimedWord(w, t.end_s) for w, t in zip(written, example.words)]
    return list(example.words)


def example_pieces(example: Example, chunk_s: float, n_segments: int, config: TrainConfig,
                   speech_end_s: float | None = None, lookahead_s: float = 0.0) -> tuple[list[str], str]:
    """(target text cut into the segments, the text the CTC loss aligns the speech to).

    ``lookahead_s``: the encoder's right context; a segment's frames end that much before its chunk, so each
    word waits that much longer.

    ASR: the transcript's words placed by their end times; CTC on the same words. Translate: the translation's
    words placed proportionally to the source words heard (``targets.translation_chunk_texts``), CTC on the
    source transcript (monotonic with the audio, unlike the translation).
    """
    if config.task == "translate":
        pieces = translation_chunk_texts((example.translation or "").split(), list(example.words), chunk_s,
                                         n_segments, config.word_margin_s + lookahead_s, config.lag_words,
                                         speech_end_s)
        return pieces, "".join(" " + word for word in example.text.split())
    pieces = chunk_texts(written_words(example), chunk_s, n_segments, config.word_margin_s + lookahead_s)
    return pieces, "".join(pieces)


def batch_indices(n_examples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Global batch of ``step``: consecutive slices of a per-epoch seeded permutation."""
    per_epoch = max(1, n_examples // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_examples)
    return order[offset * batch_size : (offset + 1) * batch_size].tolist()


def check_dev_ids(train: list[Example], dev: list[Example], dev_manifest: str) -> None:
    """Features are cached by id: a dev utterance with a training utterance's id but other audio is refused
    (one of the two would be read with the other's frames)."""
    audio = {e.id: (e.audio.resolve(), e.offset, e.duration) for e in train}
    for example in dev:
        if example.id in audio and audio[example.id] != (example.audio.resolve(), example.offset, example.duration):
            raise InputError(f"{dev_manifest}: id {example.id!r} is also in the train manifest, with other audio "
                             f"({audio[example.id][0]}); features are cached by id, so give the dev clips other ids")
