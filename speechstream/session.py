"""The streaming session: the one object that owns a stream's state.

``feed(samples)`` takes 16 kHz float samples in buffers of any size and returns
events; ``finish()`` reads the rest of the audio and the end-of-source marker, writes
the remaining text and returns the last events, ending with ``type == "end"``.
The microphone, the server, file transcription and evaluation all drive this class.

Pipeline per chunk: chunker -> log-mel stream -> encoder stream -> projector stream
-> a source unit queued for the LLM; then the policy loop reads units and writes
tokens until it needs audio that has not arrived.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from speechstream import gpe
from speechstream.audio import SAMPLE_RATE, check_finite
from speechstream.chunker import Chunker
from speechstream.config import DecodingConfig
from speechstream.encoder import EncoderStream
from speechstream.errors import InputError
from speechstream.features import LogMelStream
from speechstream.model import SpeechLLM
from speechstream.policy import Policy, Read, StreamView, Write, make_policy
from speechstream.projector import ProjectorStream
from speechstream.text import TextAssembler


@dataclass(frozen=True)
class Event:
    """A transcript event (the JSON lines of ``transcribe --format jsonl``)."""

    type: str  # "final" (newly committed text), "partial" (current uncommitted tail) or "end"
    text: str  # committed text, tail, or the whole transcript for "end"
    source_s: float  # seconds of audio the LLM had read when the event was emitted
    wall_s: float  # seconds since the first feed
    audio_s: float | None = None  # "end" only: duration of the audio
    compute_s: float | None = None  # "end" only: seconds spent processing

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class UnitStats:
    """Work done for one source unit (one chunk, or the final flush)."""

    encoder_frames: int  # encoder frames computed for this unit
    source_tokens: int  # LLM source tokens fed for this unit
    target_tokens: int = 0  # LLM target tokens fed while this unit was the latest read


@dataclass(frozen=True)
class LLMRequest:
    """One LLM step a session needs: source embeddings to read, or target tokens to write."""

    embeds: torch.Tensor  # (n, H) input embeddings
    kind: int  # gpe.SOURCE or gpe.TARGET
    tokens: list[int] | None = None  # target token ids
    is_text: bool = False  # target tokens that belong to the transcript (not the header)


@dataclass
class _Unit:
    embeds: torch.Tensor  # (n, H) source embeddings (prompt prefix included in unit 0, suffix in the last)
    source_s: float  # audio seconds covered once this unit is read
    stats: UnitStats


TokenChooser = Callable[[torch.Tensor], int]  # (V,) logits of the last fed row -> next token
RECENT_TOKENS = 32  # target tokens a policy sees (for its repetition guard)


def greedy_chooser(model: SpeechLLM) -> TokenChooser:
    """Greedy choice that never writes prompt-format special tokens (only text, end-of-chunk, end)."""
    vocab = model.decoder.llm.get_input_embeddings().weight.shape[0]
    banned = torch.zeros(vocab, dtype=torch.bool)
    banned[[i for i in model.special_ids if i < vocab and i not in (model.eoc_id, model.eos_id)]] = True
    banned[len(model.tokenizer) :] = True  # embedding rows past the tokenizer (padding of the table)

    def choose(logits: torch.Tensor) -> int:
        return int(torch.argmax(logits.masked_fill(banned.to(logits.device), float("-inf"))))

    return choose


class StreamingSession:
    """One stream: feed audio, get text. Use as a context manager or call ``finish``."""

    def __init__(
        self,
        model: SpeechLLM,
        decoding: DecodingConfig = DecodingConfig(),
        policy: Policy | None = None,
        choose: TokenChooser | None = None,
        partials: bool = True,
        own_llm: bool = True,
    ):
        """``own_llm=False`` leaves the LLM to an outside driver that batches several sessions."""
        self.model = model
        self.decoding = decoding
        self.policy = policy or make_policy(
            decoding.policy, decoding.k, decoding.max_tokens_per_chunk, decoding.max_tail_tokens, decoding.max_repeats
        )
        self.choose = choose or greedy_chooser(model)
        self.partials = partials
        self.chunker = Chunker(decoding.chunk_ms)
        self.mel = LogMelStream()
        self.encoder = EncoderStream(model.encoder)
        self.projector = ProjectorStream(model.projector)
        self.llm = model.decoder.new_state(1) if own_llm else None
        self.text = TextAssembler(model.tokenizer)
        self.units: deque[_Unit] = deque()  # units computed but not yet read by the LLM
        self.stats: list[UnitStats] = []  # per unit, in order
        self.target_ids: list[int] = []  # every target token fed (header, text, markers)
        self.logits: list[torch.Tensor] = []  # (V,) per fed target row, when record_logits is set
        self.record_logits = False
        self._chunks_made = 0
        self._samples_in = 0
        self._units_read = 0
        self._source_s = 0.0
        self._audio_done = False
        self._pending: int | None = None
        self._reads_since_prediction = 0
        self._tokens_since_read = 0
        self._last_partial = ""
        self._stopped = False
        self._started_at: float | None = None
        self._compute_s = 0.0
        self.finished = False

    # -- public API -------------------------------------------------------------------------

    def feed(self, samples: np.ndarray) -> list[Event]:
        """Add 16 kHz mono float32 samples; return the events they caused."""
        if self.finished:
            raise InputError("the session has already finished")
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        check_finite(samples)
        start = self._clock_start()
        self._samples_in += samples.size
        events: list[Event] = []
        with torch.no_grad():
            for chunk in self.chunker.push(samples):
                self._add_unit(chunk, final=False)
                events += self._advance()
        self._compute_s += time.perf_counter() - start
        return events

    def finish(self) -> list[Event]:
        """Read the rest of the audio and the end marker; write the rest; end with an "end" event."""
        if self.finished:
            return []
        start = self._clock_start()
        with torch.no_grad():
            self.end_audio()
            events = self._advance()
        self._compute_s += time.perf_counter() - start
        return events + self.close()

    def end_audio(self) -> None:
        """Turn the unchunked tail and the end-of-source marker into the last unit (no LLM work)."""
        if not self._audio_done:
            self._add_unit(self.chunker.flush(), final=True)

    def close(self) -> list[Event]:
        """Commit whatever text is left and return it with the "end" event."""
        if self.finished:
            return []
        events = []
        tail = self.text.commit_all(force=True)
        if tail:
            events.append(self._event("final", tail))
        self.finished = True
        audio_s = self._samples_in / SAMPLE_RATE
        events.append(
            Event("end", self.text.committed, round(self._source_s, 3), round(self._wall(), 3),
                  audio_s=round(audio_s, 6), compute_s=round(self._compute_s, 6))
        )
        return events

    @property
    def waiting_for_llm(self) -> bool:
        """True while the policy loop has not stopped (an outside driver keeps stepping it)."""
        return not self._stopped

    def __enter__(self) -> "StreamingSession":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.finish()

    @property
    def transcript(self) -> str:
        return self.text.committed

    # -- source side --------------------------------------------------------------------------

    def _add_unit(self, samples: np.ndarray, final: bool) -> None:
        mel = self.mel.push(samples)
        if final:
            mel = torch.cat([mel, self.mel.finish()])
        frames = self.encoder.push(mel, final=final)
        tokens = self.projector.push(frames, final=final)
        parts = []
        if self._chunks_made == 0:
            parts.append(self.model.embed_ids(self.model.prefix_ids))
        parts.append(tokens.to(self.model.decoder.dtype))
        if final:
            parts.append(self.model.embed_ids(self.model.suffix_ids))
        embeds = torch.cat(parts)
        self._chunks_made += 1
        source_s = self._samples_in / SAMPLE_RATE if final else self._chunks_made * self.chunker.chunk_size / SAMPLE_RATE
        stats = UnitStats(encoder_frames=frames.shape[0], source_tokens=embeds.shape[0])
        self.stats.append(stats)
        self.units.append(_Unit(embeds, source_s, stats))
        if final:
            self._audio_done = True

    @property
    def _source_done(self) -> bool:
        return self._audio_done and not self.units

    # -- the policy loop ------------------------------------------------------------------------

    def next_request(self) -> LLMRequest | None:
        """Ask the policy what to do; return the LLM step it needs, or None to wait for audio / when stopped."""
        while not self._stopped:
            action = self.policy.decide(self._view())
            if isinstance(action, Read):
                if not self.units:
                    return None
                unit = self.units.popleft()
                self._units_read += 1
                self._source_s = unit.source_s
                self._reads_since_prediction += 1
                self._tokens_since_read = 0
                if unit.embeds.shape[0]:
                    return LLMRequest(unit.embeds, gpe.SOURCE)
            elif isinstance(action, Write):
                if self._pending is None:
                    tokens, is_text = list(self.model.header_ids), False
                else:
                    tokens, is_text = [self._pending if action.token is None else action.token], True
                return LLMRequest(self.model.embed_ids(tokens), gpe.TARGET, tokens, is_text)
            else:
                self._stopped = True
        return None

    def apply(self, request: LLMRequest, logits: torch.Tensor) -> list[Event]:
        """Take the (n, V) logits of a request's rows; for target tokens, emit their text."""
        if request.kind == gpe.SOURCE:
            return []
        tokens = request.tokens
        if self.record_logits:
            self.logits += list(logits)
        self.target_ids += tokens
        self._tokens_since_read += len(tokens)
        self.stats[max(self._units_read - 1, 0)].target_tokens += len(tokens)
        self._pending = self.choose(logits[-1])
        self._reads_since_prediction = 0
        events: list[Event] = []
        for token in tokens if request.is_text else []:
            if token in self.model.special_ids:
                if token == self.model.eoc_id:
                    events += self._final(self.text.commit_all())
                continue
            events += self._final(self.text.add(token))
        return events

    def _view(self) -> StreamView:
        return StreamView(
            units_read=self._units_read,
            source_done=self._source_done,
            pending=self._pending,
            reads_since_prediction=self._reads_since_prediction,
            tokens_since_read=self._tokens_since_read,
            eoc_id=self.model.eoc_id,
            eos_id=self.model.eos_id,
            recent=tuple(self.target_ids[-RECENT_TOKENS:]),
        )

    def _advance(self) -> list[Event]:
        """Run the policy loop on this session's own LLM state until it waits or stops."""
        events: list[Event] = []
        if self.llm is None:  # an outside driver (``batch.BatchDecoder``) runs the LLM
            return events
        while (request := self.next_request()) is not None:
            kinds = torch.full((1, request.embeds.shape[0]), request.kind, dtype=torch.long)
            logits = self.model.decoder.step(self.llm, request.embeds[None], kinds)[0]
            events += self.apply(request, logits)
        return events + self._partial()

    def _partial(self) -> list[Event]:
        if not self.partials or self._stopped:
            return []
        tail = self.text.tail()
        if tail == self._last_partial:
            return []
        self._last_partial = tail
        return [self._event("partial", tail)]

    def _final(self, text: str) -> list[Event]:
        if not text:
            return []
        self._last_partial = ""
        return [self._event("final", text)]

    # -- time -------------------------------------------------------------------------------------

    def _clock_start(self) -> float:
        now = time.perf_counter()
        if self._started_at is None:
            self._started_at = now
        return now

    def _wall(self) -> float:
        return 0.0 if self._started_at is None else time.perf_counter() - self._started_at

    def _event(self, kind: str, text: str) -> Event:
        return Event(kind, text, round(self._source_s, 3), round(self._wall(), 3))


def transcribe_file(model: SpeechLLM, decoding: DecodingConfig, path: str, on_event: Callable[[Event], None],
                    partials: bool = True) -> list[Event]:
    """Stream one audio file through a session chunk by chunk (as a live source would); return its events.

    ``transcribe`` and ``eval`` both use this loop, so evaluation measures what ships.
    """
    from speechstream.audio import load_audio
    from speechstream.chunker import chunk_samples

    audio = load_audio(path)
    session = StreamingSession(model, decoding, partials=partials)
    step = chunk_samples(decoding.chunk_ms)
    events = []
    for start in range(0, len(audio), step):
        for event in session.feed(audio[start : start + step]):
            events.append(event)
            on_event(event)
    for event in session.finish():
        events.append(event)
        on_event(event)
    return events
