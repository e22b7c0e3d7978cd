"""The systems ``speechstream eval --baseline NAME`` evaluates, behind one small interface.

A system turns one utterance's audio file into the events a streaming session returns ("final" events, then
the "end" event); `speechstream.eval.run` logs and scores those events the same way whatever produced them, so
every system is measured by the same word delays, latency metrics and RTF.

- ``gpe``: this package's streaming decoder, fed chunk by chunk through `speechstream.transcribe.transcribe_file`
  (the loop ``speechstream transcribe`` uses, so evaluation measures what ships). Its model is a GPE model.
- ``whisper-offline``: a Whisper model (an asset name such as ``whisper-base`` or ``whisper-tiny.en``, a
  transformers Whisper directory, or a hub id) run offline with transformers'
  ``WhisperForConditionalGeneration.generate``: greedy, told the speech language (``--source-lang``, else the
  manifest's ``source_lang``, else English; no language detection) and, for multilingual models, the task
  (``transcribe``, or ``translate`` for task translate: Whisper translates into English only), no timestamps, at
  most ``max_target_positions // 2`` new tokens per window (OpenAI's ``sample_len``). It reads the whole audio
  before writing anything, then emits every word in one "final" event: each word's delay is the source length (AL
  = source length by construction) and its elapsed time adds the compute time. Whisper sees at most one 30 s
  window (its encoder's input length); longer audio is cut into ``ceil(duration / 30 s)`` equal windows, each
  transcribed on its own (no previous-text prompt) and the texts joined with a space, so a word straddling a cut
  may be garbled, lost or doubled.
- ``whisper-la2``: the same Whisper models re-run over a growing audio buffer with LocalAgreement-2, as
  ufal/whisper_streaming does (`speechstream.local_agreement`): every ``--chunk-ms`` of new audio (whisper_streaming's
  ``min_chunk``; it defaults to 1 s, so ``--chunk-ms 1000`` matches it) the buffer since its last trim point is
  transcribed with segment and token timestamps (cross-attention DTW over the alignment heads), the committed text
  before the buffer as the prompt (at most 200 characters, and of those the last tokens that fit beside Whisper's
  new tokens, as OpenAI's decoding keeps them); words two consecutive hypotheses agree on are committed as one
  "final" event whose ``source_s`` is the audio read so far and ``wall_s`` the compute clock; the last hypothesis
  is committed when the audio ends. The buffer is trimmed at the end of a committed sentence or segment once it is
  longer than ``LA2_TRIM_S``, and at the last committed word before it would outgrow Whisper's window. Each run
  re-encodes the whole buffer (padded to 30 s, as Whisper requires), so compute grows with the chunk rate.

This module is light to import (torch and transformers load when a system is built): ``eval``'s usage checks
run before them.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from speechstream.errors import InputError

if TYPE_CHECKING:
    from speechstream.config import DecodingConfig
    from speechstream.session import Event

# Systems `--baseline` can name. Only systems that really exist are listed; add a name together with its class.
BASELINES = ("gpe", "whisper-offline", "whisper-la2")
# The model each baseline other than gpe runs when none is given (`--baseline-model`).
DEFAULT_BASELINE_MODELS = {"whisper-offline": "whisper-base", "whisper-la2": "whisper-base"}
# Tasks each baseline can do (gpe: every task the eval driver knows).
BASELINE_TASKS = {"gpe": ("asr", "translate"), "whisper-offline": ("asr", "translate"),
                  "whisper-la2": ("asr", "translate")}
# The Whisper baselines' speech language where neither --source-lang nor the manifest names one (they detect none),
# the only one an English-only model takes, and the one Whisper translates into.
WHISPER_LANGUAGE = "en"
# The most start tokens Whisper's generate puts after a prompt: <|startoftranscript|>, the language, the task and
# <|notimestamps|>
WHISPER_START_TOKENS = 4
# whisper-la2: trim the buffer at a committed sentence or segment end once it is longer than this (s);
# whisper_streaming's default buffer_trimming_sec
LA2_TRIM_S = 15.0


class System:
    """One evaluated system: audio file in, the events of its transcript out."""

    last_stats: dict | None = None  # extra numbers about the last decode, logged with its record (gpe: LLM tokens)

    def decode(self, audio_path: str, offset_s: float = 0.0, duration_s: float | None = None) -> list[Event]:
        """Transcribe one audio file: "final" events (their texts concatenate to the transcript), then "end".

        ``offset_s`` and ``duration_s`` (seconds) take only that time range of the file (None: to its end).

        The "end" event carries ``audio_s`` (duration) and ``compute_s`` (processing seconds); each event's
        ``source_s`` is the audio (s) read when it was emitted and ``wall_s`` the seconds since processing began.
        Raises InputError for audio that cannot be read.
        """
        raise NotImplementedError


class StreamingSystem(System):
    """The GPE streaming decoder: every utterance streamed through a fresh `StreamingSession`."""

    def __init__(self, model_name: str, decoding: DecodingConfig):
        from speechstream.model import load_decoding_model

        self.model = load_decoding_model(model_name, decoding)
        self.decoding = decoding

    def decode(self, audio_path: str, offset_s: float = 0.0, duration_s: float | None = None) -> list[Event]:
        from speechstream.transcribe import transcribe_file

        decoder = self.model.decoder
        fed, reencoded = decoder.fed_total, decoder.reencoded_total
        events = transcribe_file(self.model, self.decoding, audio_path, lambda event: None, partials=False,
                                 offset_s=offset_s, duration_s=duration_s)
        # LLM work of this utterance: tokens fed, and the extra ones ablation "reencode" fed again
        self.last_stats = {"llm_tokens": decoder.fed_total - fed,
                           "llm_reencoded_tokens": decoder.reencoded_total - reencoded}
        return events


class WhisperOffline(System):
    """Offline Whisper: features of the whole audio, greedy ``generate``, all words at once at the end."""

    def __init__(self, model_name: str, device: str = "cpu", task: str = "asr", language: str = WHISPER_LANGUAGE):
        from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

        from speechstream.audio import ENCODER_STRIDE
        from speechstream.model import PRETRAINED_LOAD_ERRORS, out_of_memory
        from speechstream.weights.fetch import resolve

        directory = resolve(model_name)
        try:
            with _quiet_transformers():
                self.model = WhisperForConditionalGeneration.from_pretrained(directory, use_safetensors=True)
            self.features = WhisperFeatureExtractor.from_pretrained(directory)
            self.tokenizer = AutoTokenizer.from_pretrained(directory)
        except PRETRAINED_LOAD_ERRORS as error:  # (a config.json that does not fit its weights, too)
            if out_of_memory(error):  # (the machine's, not the folder's)
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InputError(f"{model_name}: cannot load a Whisper model ({reason})") from None
        self.model = self.model.eval().to(device)
        self.device = device
        config = self.model.config
        # samples per window: the encoder takes max_source_positions frames after its stride-2 convolution
        self.window_samples = config.max_source_positions * ENCODER_STRIDE * self.features.hop_length
        self.generate_options = {"do_sample": False, "num_beams": 1, "return_timestamps": False,
                                 "max_new_tokens": config.max_target_positions // 2}
        generation = self.model.generation_config
        if getattr(generation, "is_multilingual", False):
            if f"<|{language}|>" not in (getattr(generation, "lang_to_id", None) or {}):
                raise InputError(f"{model_name} does not take {language} speech (not among its languages)")
            self.generate_options |= {"language": language,
                                      "task": "translate" if task == "translate" else "transcribe"}
        elif task == "translate" or language != WHISPER_LANGUAGE:
            raise InputError(f"{model_name} is an English-only Whisper model: it transcribes English speech only")

    def decode(self, audio_path: str, offset_s: float = 0.0, duration_s: float | None = None) -> list[Event]:
        import torch

        from speechstream.audio import SAMPLE_RATE, load_audio
        from speechstream.session import Event

        audio = load_audio(audio_path, offset_s, duration_s)  # (T,) float32 at 16 kHz
        started = time.perf_counter()
        texts = []
        with torch.no_grad(), _quiet_transformers():
            for window in split_windows(audio, self.window_samples):
                features = self.features(window, sampling_rate=SAMPLE_RATE, max_length=self.window_samples,
                                         return_tensors="pt").input_features  # (1, n_mels, frames)
                tokens = self.model.generate(features.to(self.device, self.model.dtype), **self.generate_options)
                texts.append(self.tokenizer.decode(tokens[0], skip_special_tokens=True).strip())
        text = " ".join(text for text in texts if text)
        compute_s = time.perf_counter() - started
        audio_s = len(audio) / SAMPLE_RATE
        source_s, wall_s = round(audio_s, 3), round(compute_s, 3)  # rounded as the session rounds its events
        events = [Event("final", text, source_s, wall_s)] if text else []
        return events + [Event("end", text, source_s, wall_s, audio_s=round(audio_s, 6),
                               compute_s=round(compute_s, 6))]


class WhisperLocalAgreement(WhisperOffline):
    """Whisper re-run over a growing buffer every chunk; LocalAgreement-2 commits what two runs agree on."""

    def __init__(self, model_name: str, device: str = "cpu", chunk_ms: int = 1000, trim_s: float = LA2_TRIM_S,
                 task: str = "asr", language: str = WHISPER_LANGUAGE):
        from speechstream.audio import ENCODER_STRIDE
        from speechstream.chunker import chunk_samples

        super().__init__(model_name, device, task, language)
        self.chunk_samples = chunk_samples(chunk_ms)
        # two runs over one buffer must fit in the window: with a longer chunk every run is cut off and flushed as it
        # comes (forced_trim_point), unagreed
        if 2 * self.chunk_samples > self.window_samples:
            raise InputError(f"whisper-la2: a chunk of {chunk_ms} ms does not fit twice in the model's window")
        self.trim_s = trim_s
        # The least audio a run is given: one encoder frame. Only the last scraps of a recording after a cut at
        # the buffer's end are shorter; Whisper hears nothing in them but writes a stock phrase ("Thank you for
        # watching."), without word times, so the end then commits what the run before heard.
        self.min_run_samples = ENCODER_STRIDE * self.features.hop_length
        generation = self.model.generation_config
        if not getattr(generation, "alignment_heads", None):
            raise InputError(f"{model_name}: its generation config has no alignment_heads (needed for word times)")
        self.end_of_text = generation.eos_token_id
        self.timestamp_begin = generation.no_timestamps_token_id + 1
        self.generate_options |= {"return_timestamps": True, "return_token_timestamps": True}
        # the prompt's tokens that fit (its last ones): the positions left beside <|startofprev|>, the start tokens
        # and the new tokens (200 characters of Bengali or Georgian are twice that many of whisper-base's)
        self.prompt_tokens = (self.model.config.max_target_positions - self.generate_options["max_new_tokens"]
                              - WHISPER_START_TOKENS - 1)

    def decode(self, audio_path: str, offset_s: float = 0.0, duration_s: float | None = None) -> list[Event]:
        from speechstream.audio import SAMPLE_RATE, load_audio
        from speechstream.local_agreement import LocalAgreement, forced_trim_point, prompt_text, trim_point
        from speechstream.session import Event

        audio = load_audio(audio_path, offset_s, duration_s)
        started = time.perf_counter()
        agreement = LocalAgreement()
        events: list[Event] = []

        def emit(words, read: int) -> None:
            if words:
                text = (" " if events else "") + " ".join(word.text for word in words)
                events.append(Event("final", text, round(read / SAMPLE_RATE, 3),
                                    round(time.perf_counter() - started, 3)))

        buffer_start = read = 0  # samples
        while read < len(audio):
            read = min(read + self.chunk_samples, len(audio))
            start_s, end_s = buffer_start / SAMPLE_RATE, read / SAMPLE_RATE
            words = []
            if read - buffer_start >= self.min_run_samples:
                words = agreement.insert(self.transcribe(audio[buffer_start:read], start_s,
                                                         prompt_text(agreement.committed, start_s)))
            if read == len(audio):
                words += agreement.flush()
            emit(words, read)
            cut = trim_point(agreement.committed, start_s, end_s, self.trim_s)
            if cut is None and read + self.chunk_samples - buffer_start > self.window_samples:
                cut = forced_trim_point(agreement.committed, start_s, end_s)
                if cut is None:  # a window without a committed word: commit what the last run heard, cut there
                    emit(agreement.flush(), read)
                    cut = forced_trim_point(agreement.committed, start_s, end_s) or end_s
            if cut is not None:
                buffer_start = max(buffer_start, min(read, round(cut * SAMPLE_RATE)))

        text = "".join(event.text for event in events)
        compute_s = time.perf_counter() - started
        audio_s = len(audio) / SAMPLE_RATE
        return events + [Event("end", text, round(audio_s, 3), round(compute_s, 3), audio_s=round(audio_s, 6),
                               compute_s=round(compute_s, 6))]

    def transcribe(self, samples: np.ndarray, offset_s: float, prompt: str) -> list:
        """One Whisper run over the buffer ``samples`` (starting at ``offset_s``): its words with stream times."""
        import torch

        from speechstream.audio import SAMPLE_RATE

        features = self.features(samples, sampling_rate=SAMPLE_RATE, max_length=self.window_samples,
                                 return_tensors="pt", return_attention_mask=True)
        options = dict(self.generate_options)
        if prompt and self.prompt_tokens > 0:
            ids = self.tokenizer.get_prompt_ids(" " + prompt)  # <|startofprev|>, then the prompt's tokens
            ids = [ids[0], *ids[max(1, len(ids) - self.prompt_tokens):]]
            options["prompt_ids"] = torch.tensor(ids, device=self.device)
        with torch.no_grad(), _quiet_transformers():
            output = self.model.generate(features.input_features.to(self.device, self.model.dtype),
                                         attention_mask=features.attention_mask.to(self.device), **options)
        tokens = output["sequences"][0].tolist()
        times = output["token_timestamps"][0].tolist()
        if len(times) != len(tokens):
            raise RuntimeError(f"Whisper gave {len(times)} token times for {len(tokens)} tokens")
        pieces = self.tokenizer.convert_ids_to_tokens(tokens)
        return hypothesis_words(tokens, times, pieces, self.tokenizer.decode, offset_s,
                                offset_s + len(samples) / SAMPLE_RATE, self.end_of_text, self.timestamp_begin)


def hypothesis_words(tokens: list[int], times: list[float], pieces: list[str], decode, offset_s: float,
                     end_s: float, end_of_text: int, timestamp_begin: int) -> list:
    """Whisper's output tokens -> `speechstream.local_agreement.Word` list with stream times.

    ``times``: each token's time (s) in the window (transformers' ``token_timestamps``); ``pieces``: the tokens'
    byte-level strings (a word starts at a piece beginning with a space, "Ġ", or after a timestamp token);
    ``decode``: token ids -> text. Tokens from ``end_of_text`` up that are not timestamps are skipped. A word
    starts at its first token's time and ends at the next token's time; a timestamp token right after a word
    closes a segment, and the word ends at that timestamp's value. Times are clamped to [offset_s, end_s].
    """
    from speechstream.audio import ENCODER_FRAME_MS
    from speechstream.local_agreement import Word

    def clamp(value: float) -> float:
        return round(min(max(offset_s + value, offset_s), end_s), 3)

    groups: list[dict] = []  # {"ids", "start", "end", "segment_end"}
    after_timestamp = True
    for index, (token, piece) in enumerate(zip(tokens, pieces)):
        if token >= timestamp_begin:
            if groups and not after_timestamp:
                groups[-1]["segment_end"] = True
                groups[-1]["end"] = (token - timestamp_begin) * ENCODER_FRAME_MS / 1000
            after_timestamp = True
            continue
        if token >= end_of_text:
            continue
        if after_timestamp or not groups or (piece or "").startswith("Ġ"):
            groups.append({"ids": [], "start": times[index], "end": times[index], "segment_end": False})
        groups[-1]["ids"].append(token)
        groups[-1]["end"] = times[index + 1] if index + 1 < len(times) else times[index]
        after_timestamp = False
    words = []
    for group in groups:
        text = decode(group["ids"]).strip()
        if text:
            start = clamp(group["start"])
            words.append(Word(text, start, max(start, clamp(group["end"])), group["segment_end"]))
    return words


def split_windows(samples: np.ndarray, max_samples: int) -> list[np.ndarray]:
    """Cut ``samples`` into ``ceil(len / max_samples)`` consecutive windows of (nearly) equal length.

    Equal windows avoid a last window of a few ms, on which Whisper tends to invent words.
    """
    if max_samples < 1:
        raise ValueError("max_samples must be at least 1")
    count = max(1, math.ceil(len(samples) / max_samples))
    bounds = [index * len(samples) // count for index in range(count + 1)]
    return [samples[start:end] for start, end in zip(bounds, bounds[1:])]


def check_baseline(baseline: str, task: str) -> None:
    """InputError for an unknown baseline, or a task the baseline cannot do."""
    if baseline not in BASELINES:
        raise InputError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
    if task not in BASELINE_TASKS[baseline]:
        tasks = ", ".join(BASELINE_TASKS[baseline])
        raise InputError(f"baseline {baseline} does not do task {task} (it does: {tasks})")


def system_options(baseline: str, decoding: DecodingConfig, language: str | None = WHISPER_LANGUAGE) -> dict:
    """The options that shape a baseline's output, as recorded in config.json (a resume must match them);
    ``language``: the speech language a Whisper baseline is told (the task is recorded beside these)."""
    import dataclasses

    if baseline == "gpe":
        return dataclasses.asdict(decoding)
    if baseline == "whisper-la2":
        return {"device": decoding.device, "search": "greedy", "language": language, "timestamps": True,
                "policy": "local-agreement-2", "min_chunk_ms": decoding.chunk_ms, "trim_s": LA2_TRIM_S}
    return {"device": decoding.device, "search": "greedy", "language": language, "timestamps": False}


def gpe_languages(model_name: str) -> tuple[str | None, str | None]:
    """(speech language, text language) of the GPE model ``model_name``: ``source_lang`` and ``target_lang`` of
    its config.yaml, None where it declares none."""
    from speechstream.config import load_model_config
    from speechstream.model import model_config_path

    config = load_model_config(model_config_path(model_name))
    return config.source_lang, config.target_lang


def whisper_speech_languages(model_name: str) -> frozenset[str]:
    """The speech languages the Whisper model ``model_name`` takes, known before it loads: from its
    generation_config.json where that is on this machine (an asset in the cache, a directory): English alone where
    it says ``is_multilingual: false``, else the codes of its ``lang_to_id``. Otherwise (an asset not fetched yet,
    a hub id) English alone for a name ending in ".en" (OpenAI's English-only models), else Whisper's language
    codes; loading checks again (`WhisperOffline`)."""
    import json
    from pathlib import Path

    from speechstream.weights.fetch import ASSETS, cache_root

    directory = cache_root() / model_name if model_name in ASSETS else Path(os.path.expanduser(model_name))
    try:
        generation = json.loads((directory / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        generation = None
    if isinstance(generation, dict) and "is_multilingual" in generation:
        if not generation["is_multilingual"]:
            return frozenset({WHISPER_LANGUAGE})
        codes = frozenset(key[2:-2] for key in generation.get("lang_to_id") or {}
                          if key.startswith("<|") and key.endswith("|>"))
        if codes:
            return codes
    if model_name.rstrip("/").endswith(".en"):
        return frozenset({WHISPER_LANGUAGE})
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return frozenset(LANGUAGES)


def _given_language(flag: str, given) -> str | None:
    """A ``--source-lang`` / ``--target-lang`` value stripped and in lower case (None: not given); InputError for
    one that is not a language code."""
    if given is not None and (not isinstance(given, str) or not given.strip()):
        raise InputError(f"{flag} must be a language code such as en, got {given!r}")
    return None if given is None else given.strip().lower()


def resolve_languages(baseline: str, model_name: str, source_lang: str | None, target_lang: str | None,
                      task: str = "asr", declared: tuple[str | None, str | None] = (None, None)
                      ) -> tuple[str | None, str | None]:
    """The (speech, text) languages a run decodes with; InputError, naming what the model supports, for a given
    language it does not.

    gpe: the model's where not given (None); a model that declares none takes any. The Whisper baselines: the
    speech language given, else the one the manifest's lines declare (``declared``), else English; the text
    language is the speech's for task asr and English for task translate (an English-only model does not
    translate)."""
    source, target = _given_language("--source-lang", source_lang), _given_language("--target-lang", target_lang)
    if baseline != "gpe":
        source = source or declared[0] or WHISPER_LANGUAGE
        known = whisper_speech_languages(model_name)
        english_only = known == {WHISPER_LANGUAGE}
        if source not in known:
            what = "an English-only Whisper model" if english_only else "not one of its language codes"
            raise InputError(f"{model_name} does not take {source} speech ({what})")
        if task == "translate" and english_only:
            raise InputError(f"{model_name} is an English-only Whisper model: it does not translate "
                             "(whisper-base does, into English)")
        text = WHISPER_LANGUAGE if task == "translate" else source
        if target is not None and target != text:
            why = "Whisper translates into English only" if task == "translate" else "it transcribes the speech"
            raise InputError(f"--target-lang {target}: the {baseline} baseline writes {text} text here ({why})")
        return source, text
    supported = gpe_languages(model_name)
    resolved = []
    for flag, given, language in (("--source-lang", source, supported[0]), ("--target-lang", target, supported[1])):
        if given is not None and language is not None and given != language:
            what = "speech" if flag == "--source-lang" else "text"
            raise InputError(f"{flag} {given}: {model_name} supports {supported[0]} speech to {supported[1]} "
                             f"text ({flag} {language}), not {given} {what}")
        resolved.append(given if language is None else language)
    return resolved[0], resolved[1]


def model_fingerprint(baseline: str, model_name: str) -> dict:
    """What identifies the model ``baseline`` runs under ``model_name``, as recorded in eval's config.json: the same
    model under another name or path has the same fingerprint, another model under the same name another one.

    gpe: a hash of its config.yaml's content (parsed: comments and layout do not count; the base weights it names
    are verified assets) and the size and sha256 of its trainable weights file (``checkpoint``). Whisper: the asset
    name (its files are verified when fetched; its cache directory given as a path counts as the name), or for
    another directory the hashes of its ``*.json`` files and the size
    and sha256 of its ``*.safetensors``, or a hub id as given. Raises InputError for a GPE model that is not there.
    """
    import hashlib
    import json

    def file_hash(path) -> dict:
        digest = hashlib.sha256()
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}

    if baseline == "gpe":
        from speechstream.config import load_model_config, load_yaml
        from speechstream.model import checkpoint_path, model_config_path

        path = model_config_path(model_name)
        config = load_model_config(path)  # checks it
        # (parsed as the model is loaded: 0.5 and 5e-1 are one value)
        content = json.dumps(load_yaml(path.read_text(encoding="utf-8")), sort_keys=True, default=str)
        checkpoint = checkpoint_path(config.checkpoint, path.parent) if config.checkpoint else None
        return {"config_sha256": hashlib.sha256(content.encode("utf-8")).hexdigest(),
                "checkpoint": file_hash(checkpoint) if checkpoint and checkpoint.is_file() else None}
    from pathlib import Path

    from speechstream.weights.fetch import ASSETS, cache_root

    directory = Path(os.path.expanduser(model_name))
    if model_name not in ASSETS and directory.is_dir():
        cached = {(cache_root() / name).resolve(): name for name in ASSETS}
        if directory.resolve() in cached:  # an asset's own cache directory is that asset
            return {"asset": cached[directory.resolve()]}
        return {"files": {file.name: file_hash(file) for file in sorted(directory.iterdir())
                          if file.is_file() and file.suffix in (".json", ".safetensors")}}
    return {"asset" if model_name in ASSETS else "hub_id": model_name}


def load_system(baseline: str, model_name: str, decoding: DecodingConfig, task: str = "asr",
                language: str | None = WHISPER_LANGUAGE) -> System:
    """Build the system ``baseline`` with its model (loads weights: slow). ``task`` and the speech ``language``
    (as `resolve_languages` gave it) are for the Whisper baselines; a GPE model's config holds its own."""
    if baseline == "gpe":
        return StreamingSystem(model_name, decoding)
    if baseline == "whisper-offline":
        return WhisperOffline(model_name, decoding.device, task, language)
    if baseline == "whisper-la2":
        return WhisperLocalAgreement(model_name, decoding.device, decoding.chunk_ms, task=task, language=language)
    raise InputError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")


@contextlib.contextmanager
def _quiet_transformers():
    """Hide transformers' advice warnings (about its own generate arguments) and its "Loading weights" bar while
    Whisper loads and runs, and torch's warning about a standard deviation over no rows, which transformers' token
    timestamps raise for a run that wrote no text token (whisper-la2 over a buffer without speech; those times are
    not used)."""
    import warnings

    from transformers.utils import logging as hf_logging

    previous, shown = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"std\(\): degrees of freedom is <= 0", category=UserWarning)
            yield
    finally:
        hf_logging.set_verbosity(previous)
        if shown:
            hf_logging.enable_progress_bar()
