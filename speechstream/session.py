"""The streaming session: the one object that owns a stream's state.

``feed(samples)`` takes 16 kHz float samples in buffers of any size and returns
events; ``finish()`` reads the rest of the audio and the end-of-source marker, writes
the remaining text and returns the last events, ending with ``type == "end"``.
The microphone, the server, file transcription and evaluation all drive this class.
``gap(n)`` says that n samples of the stream were lost before they reached it (the microphone's
queue overflowed): they are never read, but every later time counts them.

Long sessions (``DecodingConfig.vad``): a Silero VAD endpointer (``speechstream.vad``)
watches the audio; at a pause the current *segment* ends as a stream would end (the rest
of its audio and the end-of-source marker are read, the rest of its text is written and
committed), then the front end (chunker, mel, encoder, projector) and the LLM cache start
afresh, so memory and per-chunk work stay flat over hours. The transcript and all times
(``source_s``) continue from the start of the stream. ``segment`` counts the resets.
With ``context_tokens`` > 0 the next segment's target group starts with the last tokens of the
committed text (tokenized again, so the space between segments is kept) after the assistant
header (fed, never emitted again); the default is 0
because the shipped models were trained without such context (their targets always
start at the audio's first word), so they tend to treat context words as already
transcribed speech.
Without VAD a segment ends only where its source group would pass the LLM's positions
(``max_position_embeddings``; under LongRoPE its ``original_max_position_embeddings``: ``llm_positions``), as at a VAD
cut; with or without VAD it also ends, after a chunk, where the writing the
decoding caps still allow could take its target group (positions phi on) past them (``_cut_due``). Under ablation
"interleaved" both groups share one sequence of positions: a segment holds as many chunks as fit with their worst-case
writing (``_interleaved_limit``).

Word times (``words``): with joint CTC decoding on a model with a fine CTC head, when a segment's text is all
committed (its end, or ``close``) it is force-aligned to the segment's CTC frames (``speechstream.align``), and its
words with the times they were spoken (on the stream's timeline) are added to ``words``; otherwise ``words`` stays [].

Contract with outside LLM drivers (``own_llm=False``): when ``segment`` has changed
since a stream's previous request, give that stream a fresh LLM row (a state as from
``model.decoder.new_state``) before stepping its next request. The change happens inside
``apply`` (or in a ``next_request`` that returns None), never in a call that returns a
request, so checking ``segment`` before each ``next_request`` is enough. While a stream waits for
audio (``next_request`` returned None), ``pending_events()`` gives the events to send meanwhile.
A driver takes a session only while ``segment_started`` is False: a row cannot be rebuilt elsewhere.
Such a session's ``feed``, ``gap`` and ``end_audio`` only route the audio; its front end runs inside
``next_request`` when the LLM asks for audio, a chunk at a time, so that each segment cut that depends on what the LLM
has written (``_cut_due``) is decided where a session alone decides it, however far the driver's LLM lags behind the
feeds (``chunks_waiting`` counts what waits).

Pipeline per feed: the router (``speechstream.routing``: with VAD, silence dropped, segment starts and cuts) -> per
chunk, the front end (``speechstream.frontend``: chunker -> log-mel stream -> encoder stream -> projector stream)
-> a source unit queued for the LLM; then the policy loop reads units and writes tokens until it needs audio that has
not arrived.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
import torch

from speechstream import gpe, schedule
from speechstream.align import Word, alignable, segment_words, token_pieces
from speechstream.beam import Limits
from speechstream.audio import HOP_LENGTH, SAMPLE_RATE, check_finite
from speechstream.config import DecodingConfig, with_model_defaults
from speechstream.ctc import JointCTC
from speechstream.decoder import DecoderState, last_rows
from speechstream.errors import InputError
from speechstream.frontend import FrontEnd
from speechstream.model import SpeechLLM
from speechstream.policy import POLICIES, Action, Policy, Read, Stop, StreamView, Write
from speechstream.routing import Router
from speechstream.text import TextAssembler
from speechstream.vad import Endpoint, Endpointer, VADConfig

CONTEXT_CHARS_PER_TOKEN = 16  # context_tokens: committed characters re-tokenized per token wanted (plenty)


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
    """One LLM step a session needs: source embeddings to read, target tokens to write, or a read and the
    write the policy asks for right after it (source rows first), which share one step."""

    embeds: torch.Tensor  # (n, H) input embeddings
    kinds: torch.Tensor  # (n,) gpe.SOURCE / gpe.TARGET per row, source rows first
    tokens: list[int] | None = None  # ids of the target rows (None for a read alone)
    is_text: bool = False  # target tokens that belong to the transcript (not the header)

    @classmethod
    def read(cls, source: torch.Tensor, then: "LLMRequest | None" = None) -> "LLMRequest":
        """A read of source embeddings (n, H); with ``then``, that write follows it in the same step."""
        kinds = torch.full((source.shape[0],), gpe.SOURCE, dtype=torch.long)
        if then is None:
            return cls(source, kinds)
        return cls(torch.cat([source, then.embeds]), torch.cat([kinds, then.kinds]), then.tokens, then.is_text)


@dataclass
class _Unit:
    embeds: torch.Tensor  # (n, H) source embeddings (prompt prefix included in unit 0, suffix in the last)
    source_s: float  # audio seconds covered once this unit is read
    stats: UnitStats
    last: bool = False  # the last unit of its segment (its audio tail and the end-of-source marker)
    segment: int = 0  # the segment it belongs to
    ctc: np.ndarray | None = None  # joint CTC decoding: the CTC head's frame vectors (of its speech tokens or windows)
    origin_s: float = 0.0  # where its segment's audio starts on the stream's timeline (seconds)


TokenChooser = Callable[[torch.Tensor], int]  # (V,) logits of the last fed row -> next token


def greedy_chooser(model: SpeechLLM) -> TokenChooser:
    """Greedy choice that never writes prompt-format special tokens (only text, end-of-chunk, end)."""
    banned = ~model.writable()

    def choose(logits: torch.Tensor) -> int:
        nonlocal banned
        if banned.device != logits.device:  # once, not at every token: a copy to an accelerator waits for its queue
            banned = banned.to(logits.device)
        return int(torch.argmax(logits.masked_fill(banned, float("-inf"))))

    return choose


def feed_samples(samples) -> np.ndarray:
    """What ``feed`` takes: a 1-D float array (16 kHz mono) -> float32 clipped to [-1, 1]; anything else (integer
    PCM, several channels, NaN) is an input error rather than a wrong transcript."""
    array = np.asarray(samples) if isinstance(samples, (np.ndarray, list, tuple)) else None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind != "f"):
        what = f"{array.dtype} array of shape {array.shape}" if array is not None else type(samples).__name__
        raise InputError(f"feed takes a 1-D float array of 16 kHz mono samples in [-1, 1], not: {what} (int16 PCM: "
                         "speechstream.audio.int16_to_float; files and other rates: speechstream.audio.load_audio)")
    check_finite(array)  # (before the cast: a float64 past float32's range is loud, not infinite: clipped)
    return np.clip(array, -1.0, 1.0).astype(np.float32, copy=False)


def check_placement(model: SpeechLLM, decoding: DecodingConfig) -> None:
    """A session runs its model where and as it was loaded; ``decoding.device``, ``decoding.int8`` and
    ``decoding.dtype`` are what the commands load it with (``model.load_decoding_model``). A config that names another
    device (not the default "cpu", which takes a model anywhere), int8 for a float model or bfloat16 for a float32
    LLM (the default "float32" takes any) is an input error, not ignored."""
    where = model.decoder.llm.get_input_embeddings().weight.device
    wanted = torch.device(decoding.device)
    if decoding.device != "cpu" and (where.type != wanted.type or wanted.index not in (None, where.index)):
        raise InputError(f"DecodingConfig(device={decoding.device!r}), but the model is on {where}: a session runs "
                         f"where its model is (load_model(name, device={decoding.device!r}))")
    if decoding.int8 and not model.int8:
        raise InputError("DecodingConfig(int8=True), but the model's LLM is not int8: load it with "
                         "load_model(name, int8=True)")
    if decoding.dtype != "float32" and model.decoder.dtype != getattr(torch, decoding.dtype):
        raise InputError(f"DecodingConfig(dtype={decoding.dtype!r}), but the model's LLM is {model.decoder.dtype}: "
                         f"load it with load_model(name, dtype={decoding.dtype!r})")


def session_decoding(model: SpeechLLM, decoding: DecodingConfig, own_chooser: bool, own_llm: bool) -> DecodingConfig:
    """The decoding a session of ``model`` runs: its arguments checked (``TypeError`` for a wrong kind of object,
    ``InputError`` for options this model or driver cannot run), the model's defaults filled in. ``own_chooser``: the
    caller passed its own token chooser (then joint CTC decoding is off unless asked for, and asking for it is an
    error); ``own_llm``: the session runs its own LLM (a beam needs that)."""
    if not isinstance(model, SpeechLLM):  # (a name or None failed deep inside, with an AttributeError)
        raise TypeError(f"model must be a SpeechLLM (speechstream.model.load_model), not {type(model).__name__}")
    if not isinstance(decoding, DecodingConfig):
        raise TypeError(f"decoding must be a DecodingConfig, not {type(decoding).__name__}")
    check_placement(model, decoding)
    if own_chooser and decoding.ctc_weight is None:
        decoding = replace(decoding, ctc_weight=0.0)  # the caller's chooser, not the model's default
    decoding = with_model_defaults(decoding, model.config)
    if own_chooser and decoding.ctc_weight > 0:
        raise ValueError("joint CTC decoding (ctc_weight > 0) chooses the tokens itself: pass no choose")
    if decoding.beam > 1 and not own_llm:
        raise InputError("--beam above 1 needs a stream that runs its own LLM: batched streams (serve, "
                         "batch.BatchDecoder) decode greedily")
    return decoding


def llm_positions(llm_config) -> int | None:
    """The positions one segment may give the LLM: ``max_position_embeddings`` (None: no limit); under LongRoPE
    (Phi-3-128k, Phi-3.5) only its ``original_max_position_embeddings``, because transformers picks the short or the
    long RoPE factors per call from that call's largest position: steps on both sides of the threshold would rotate
    one segment's keys with two sets of frequencies, its one-pass forward with one."""
    limit = getattr(llm_config, "max_position_embeddings", None)
    rope = getattr(llm_config, "rope_parameters", None) or getattr(llm_config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) != "longrope":
        return limit
    original = rope.get("original_max_position_embeddings") or getattr(llm_config, "original_max_position_embeddings",
                                                                       None)
    return min(limit, original) if limit and original else original or limit


def _own_work(method: Callable) -> Callable:
    """A session method an outside driver calls inside its batched step (``next_request``: the front end runs there
    when the LLM asks for audio; ``apply``: the token choice, joint CTC's scoring, the text): with such a driver its
    time counts in this stream's ``compute_s``, not in the step the driver shares. Alone, the call that routed the
    audio (``feed``, ``gap``, ``finish``) times it."""

    @functools.wraps(method)
    def timed(self: "StreamingSession", *args, **kwargs):
        if self.llm is not None:
            return method(self, *args, **kwargs)
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._compute_s += time.perf_counter() - start

    return timed


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
        decoding = session_decoding(model, decoding, choose is not None, own_llm)
        self.model = model
        self.decoding = decoding
        self.policy = policy or POLICIES[decoding.policy](  # a policy, k and caps DecodingConfig has checked
            decoding.k, decoding.max_tokens_per_chunk, decoding.max_tail_tokens, decoding.max_repeats
        )
        self.choose = choose or greedy_chooser(model)
        # joint CTC decoding: the CTC head's prefix scores re-rank the LLM's best next tokens
        self.joint = (JointCTC(model, decoding.ctc_weight, decoding.ctc_candidates, decoding.beam)
                      if decoding.ctc_weight > 0 else None)
        self.partials = partials
        self.front = self._new_front()  # the source side of the segment the front end builds; anew at each segment
        self.llm = self._new_llm_state() if own_llm else None
        self._llm_cache_peak = 0  # the most slots self.llm held after a step since ``take_llm_cache_peak``
        # writes of a beam plan's tokens whose scores the search computed: fed to self.llm with the next step
        self._deferred: list[LLMRequest] = []
        self.text = TextAssembler(model.tokenizer)
        self.units: deque[_Unit] = deque()  # units computed but not yet read by the LLM
        self.stats: list[UnitStats] = []  # per unit, in order
        self.target_ids: list[int] = []  # every target token fed (header, text, markers)
        # the segment's last text tokens (no end-of-chunk markers), as many as the policy looks back on
        self._recent: deque[int] = deque(maxlen=getattr(self.policy, "recent_tokens", 0))
        self.logits: list[torch.Tensor] = []  # (V,) per fed target row, when record_logits is set
        self.record_logits = False
        self._samples_in = 0  # samples of the stream so far: fed, and lost in gaps
        self.lost_samples = 0  # samples lost in gaps (``gap``): counted on the timeline, never read
        self._units_read = 0
        self._source_s = 0.0
        self._audio_done = False
        self._pending: int | None = None
        self._reads_since_prediction = 0
        self._tokens_since_read = 0
        self._text_since_read = 0  # of those, text tokens (no header, context or marker): what max_tokens counts
        self._last_partial = ""
        self._reported = 0  # characters of the committed text given in "final" events (``_final``)
        self._stopped = False
        self._started_at: float | None = None
        self._compute_s = 0.0
        self.finished = False
        # long sessions (decoding.vad): segments cut at pauses, each with a fresh front end and LLM cache
        self.segment = 0  # the segment the LLM reads and writes; +1 at each reset (outside drivers: a fresh row)
        vad = Endpointer(VADConfig(min_silence_ms=decoding.vad_min_silence_ms)) if decoding.vad else None
        self.router = Router(vad)  # what the fed samples are: audio to encode, silence to drop, segment starts and cuts
        # where each segment's audio starts (absolute samples; VAD speech starts); without VAD the first segment's (0)
        # is not listed, only those that begin after a gap or a cut at the LLM's positions
        self.segment_starts: list[int] = []
        self._front_segment = 0  # the segment the front end is building (ahead of ``segment`` until read)
        self._front_start = 0  # absolute sample where the front end's segment starts
        self._front_open = vad is None  # the front end's segment has audio (with VAD: once its speech starts)
        self._released = 0  # absolute samples passed on to the front end or dropped as silence (behind router.routed
        # while steps wait in _steps)
        # outside drivers: front-end steps (routed, gaps, the end) carried out when the LLM asks for audio, each
        # with the ``advance`` it was given (whether a session alone lets its LLM work after each of its chunks)
        self._steps: deque[tuple[str, object, bool]] = deque()
        self._cut_check = False  # outside drivers: the segment cut after the last chunk is still to be decided
        self._silent_end = False  # with VAD, the audio ended in silence after the last segment (nothing to read)
        self._segment_read_done = False  # the last unit of ``segment`` has been read
        self._stats_base = 0  # index in stats of this segment's first unit
        self._context_ids: list[int] = []  # text tokens fed after this segment's header (not emitted)
        self._held: list[Event] = []  # events made inside next_request, returned by the next call
        self._failure: str | None = None  # an exception escaped a call mid-way: the state is no longer whole
        # the most a segment may hold within the LLM's positions (None: no limit): audio, by its source group, and
        # target tokens, from phi on; ``_cut_due`` ends a segment (as at a VAD cut) before either would pass them
        self._segment_targets_from = 0  # index in target_ids of the LLM segment's first target token
        self._segment_samples, self._target_room = self._position_limit()
        # word times (``speechstream.align``): with joint decoding on the fine CTC head, at each segment's end its text
        # is aligned to its CTC frames; ``words`` holds every finished segment's words
        self.words: list[Word] = []
        self._aligns = self.joint is not None and self.model.ctc_head is not None
        self._segment_origin_s = 0.0  # where the LLM's segment starts on the timeline
        self._segment_ids_from = 0  # index in text.ids of the segment's first text token
        self._written_s: list[float] = []  # per text token of the segment: source_s when it was written

    def _position_limit(self) -> tuple[int | None, int | None]:
        """(samples, target tokens) of one segment whose source group (prompt, speech tokens, end marker) and whose
        target group (positions phi on) take every position the LLM has (``llm_positions``); (None, None) when its
        config names no limit."""
        limit = llm_positions(self.model.decoder.llm.config)
        if not limit:
            return None, None
        if self.decoding.ablation == "interleaved":
            return self._interleaved_limit(limit)
        speech = limit - len(self.model.prefix_ids) - len(self.model.suffix_ids)
        samples = schedule.max_segment_samples(speech, self.front.chunk_size, self.model.config.projector.stack)
        if samples <= 0:
            raise InputError(f"model {self.model.config.name}: its LLM has {limit} positions, too few for the prompt "
                             f"and one {self.decoding.chunk_ms} ms chunk")
        target = limit - self.model.decoder.phi
        if target <= 0:
            raise InputError(f"model {self.model.config.name}: llm.phi ({self.model.decoder.phi}) leaves none of its "
                             f"LLM's {limit} positions to the target group")
        if target < self._target_worst(queued=1):
            context = self.decoding.context_tokens
            raise InputError(f"model {self.model.config.name}: its LLM's target positions ({target}, from phi on) are "
                             f"too few for the header{f' and its {context} context tokens' if context else ''}, one "
                             f"chunk's text (--max-tokens-per-chunk {self.decoding.max_tokens_per_chunk}) and the "
                             f"tail (max_tail_tokens {self.decoding.max_tail_tokens})")
        return samples, target

    def _interleaved_limit(self, limit: int) -> tuple[int, int]:
        """``_position_limit`` under ablation "interleaved", where a segment's source and target tokens take one
        sequence of positions in arrival order: the most whole chunks whose source group and worst-case writing fit
        in ``limit`` together; the target group gets the positions that source group leaves."""
        chunk, stack = self.front.chunk_size, self.model.config.projector.stack
        prompt = len(self.model.prefix_ids) + len(self.model.suffix_ids)

        def source(chunks: int) -> int:
            frames = schedule.encoder_frames_total(chunks * chunk)
            return prompt + schedule.tokens_from_frames(frames, stack, final=True)

        chunks = 0
        while source(chunks + 1) + self._target_worst(queued=chunks + 1) <= limit:
            chunks += 1
        if chunks == 0:
            raise InputError(f"model {self.model.config.name}: its LLM has {limit} positions, too few under ablation "
                             f"interleaved (source and target in one sequence) for the prompt, one "
                             f"{self.decoding.chunk_ms} ms chunk and its text (--max-tokens-per-chunk "
                             f"{self.decoding.max_tokens_per_chunk}, max_tail_tokens {self.decoding.max_tail_tokens})")
        return chunks * chunk, limit - source(chunks)

    def _target_worst(self, queued: int) -> int:
        """The most target tokens the front end's segment could hold if ``queued`` more units were read in it before
        its last one: those fed so far, the header (and context) if not yet fed, then up to the policy's caps (one
        end-of-chunk marker and ``max_tokens_per_chunk`` text tokens after each read, ``max_tail_tokens`` after the
        last, as the decoding config names them: a policy of one's own that writes more meets ``_decide``'s guard)."""
        max_tokens, max_tail = self.decoding.max_tokens_per_chunk, self.decoding.max_tail_tokens
        header = len(self.model.header_ids) + self.decoding.context_tokens
        fed = current = 0
        if self._front_segment == self.segment:
            fed = len(self.target_ids) - self._segment_targets_from
            header = 0 if self._pending is not None else header
            current = max(max_tokens - self._text_since_read, 0) + 1 if self._units_read else 0
        return fed + header + current + queued * (max_tokens + 1) + max_tail

    def _cut_due(self) -> bool:
        """After a chunk: the front end's segment must end here when one more chunk could carry its source group
        or its target group past the LLM's positions (each segment is checked before it grows)."""
        if self._segment_samples is not None and self.front.chunks * self.front.chunk_size >= self._segment_samples:
            return True
        if self._target_room is None:
            return False
        queued = sum(unit.segment == self._front_segment for unit in self.units) + 1  # (+1: the next chunk)
        return self._target_worst(queued) > self._target_room

    def _new_llm_state(self):
        """A fresh one-row LLM state (at the start and at each segment)."""
        return self.model.decoder.new_state(1, mode=self.decoding.ablation)

    # -- public API -------------------------------------------------------------------------

    def feed(self, samples: np.ndarray) -> list[Event]:
        """Add 16 kHz mono float samples in [-1, 1] (a 1-D float array; louder values are clipped, as ``load_audio``
        clips); return the events they caused."""
        if self.finished:
            raise InputError("the session has already finished")
        if self._audio_done:
            raise InputError("the audio has ended (end_audio was called): no more samples can be fed")
        samples = feed_samples(samples)
        self._check_whole()
        start = self._clock_start()
        with torch.no_grad(), self._failing():
            steps = self.router.route(samples)
            self._samples_in += samples.size  # (before the steps: a Ctrl-C inside them ends a stream these samples
            events = self._carry_out(steps)  # were routed in, so its "end" counts them in audio_s, as source_s does)
        self._compute_s += time.perf_counter() - start
        return events

    def _carry_out(self, steps: list[tuple[str, object]], advance: bool = True) -> list[Event]:
        """Carry out front-end steps (``_front``) and return the events of the LLM work they allowed. With an outside
        driver they are queued instead and carried out when its LLM asks for audio (``_pump``): a chunk's segment cut
        (``_cut_due``) depends on what the LLM has written by then, and a driver's LLM lags behind the feeds."""
        if self.llm is None:
            self._steps.extend((kind, value, advance) for kind, value in steps)
            return self._advance() if advance else []
        events: list[Event] = []
        for step in steps:
            events += self._front(step, advance)
        return events

    def _pump(self) -> None:
        """Outside drivers: carry out queued front-end steps until a unit waits for the LLM or none is left. The cut
        after a chunk is decided here, once the LLM has read that chunk and written until it needs audio: a session
        alone decides it at that point too, so a batched stream's segments are its solo ones however it is fed."""
        with torch.no_grad(), self._failing():
            while not self.units and (self._steps or self._cut_check):
                if self._cut_check:
                    self._cut_check = False
                    if self._cut_due():
                        self._end_front_segment()
                    continue
                kind, value, advance = self._steps.popleft()
                if kind == "audio" and advance:  # up to the end of one chunk, whose cut waits for the LLM to read it
                    size = self.front.chunk_size
                    n = size - (self._released - self._front_start) % size if self._front_open else size
                    if n < value.size:
                        self._steps.appendleft((kind, value[n:], advance))
                        value = value[:n]
                # (the audio of an end or a gap is all queued with no LLM work between its chunks, as alone)
                self._front((kind, value), advance=False, later=advance)

    @property
    def compute_s(self) -> float:
        """Seconds this stream has spent processing so far (the "end" event's ``compute_s``). With an outside driver:
        its own work (``_own_work``: its routing, its requests with the front end they run, its logits taken); the
        driver adds its share of the batched LLM calls (``serve``: each step's time, less the streams' own work in it,
        split evenly among the streams served)."""
        return self._compute_s

    @property
    def chunks_waiting(self) -> int:
        """Chunks the LLM has not read yet: encoded units, and (outside drivers) queued audio in whole chunks."""
        queued = sum(value.size for kind, value, _ in self._steps if kind == "audio")
        return len(self.units) + queued // self.front.chunk_size

    def _check_whole(self) -> None:
        """Refuse more work once an earlier call failed mid-way (``_failing``)."""
        if self._failure is not None:
            raise InputError(f"the session failed in an earlier call ({self._failure}) and cannot go on: its state "
                             "is partly updated; close() gives the text committed so far")

    @contextlib.contextmanager
    def _failing(self):
        """Around work that changes the state: an exception that escapes it (a device error, Ctrl-C) leaves a
        chunk, a read or a step half done, so the session refuses further work instead of going on without it. The
        events the call had made are lost with it: the text of its "final" events counts as not given (``close``
        gives it)."""
        reported = self._reported
        try:
            yield
        except BaseException as error:
            self._failure = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            self._reported = reported
            raise

    def _front(self, step: tuple[str, object], advance: bool = True, later: bool = False) -> list[Event]:
        """Carry out one routing step (``Router.route``), or ("gap", where the audio goes on) or ("end", None), on
        the front end; return the events of the LLM work it allowed (none with ``advance`` False: the units are only
        queued). ``later``: the cut after a chunk is left to ``_pump`` (``_cut_check``), which decides it once the LLM
        has read the chunk."""
        kind, value = step
        if kind == "skip":
            self._released += value
            return []
        if kind == "end":  # the end of the audio (``end_audio``)
            if self._front_open:
                self._add_unit(self.front.tail(), final=True)
            else:  # only silence since the last cut (or since the start): it is passed over, not read
                self._silent_end = True
            return []
        if kind == "gap":  # lost audio (``gap``): the segment being heard ends; ``value``: where the audio goes on
            if self._front_open and self._released > self._front_start:
                self._end_front_segment()
            self._front_open = False
            self._released = value
            return self._advance() if advance else []
        if kind == "start":
            self._front_start = value
            self.segment_starts.append(value)
            self._front_open = True
            return []
        events = []
        if kind == "cut":
            if self._front_open:  # (not when the segment was just ended at the positions' limit: ``_cut_due``)
                self._end_front_segment()
            return self._advance() if advance else []
        chunk_size = self.front.chunk_size
        while value.size:  # up to the end of one chunk at a time: a segment may end after any chunk
            if not self._front_open:  # without VAD after a gap or a cut, with it after a cut inside speech
                self._front(("start", self._released))
            piece = value[: chunk_size - (self._released - self._front_start) % chunk_size]
            value = value[piece.size :]
            self._released += piece.size
            for chunk in self.front.split(piece):
                self._add_unit(chunk, final=False)
                if later:  # an outside driver: decided once its LLM has read the chunk (``_pump``)
                    self._cut_check = True
                    continue
                events += self._advance() if advance else []
                if self._cut_due():  # as at a VAD cut: past here the LLM would run on positions it never learned
                    self._end_front_segment()
                    events += self._advance() if advance else []
        return events

    def _end_front_segment(self) -> None:
        """A VAD cut: the segment's last unit (audio tail + end marker) is queued; the front end starts afresh."""
        self._add_unit(self.front.tail(), final=True)
        self._front_segment += 1
        self._front_open = False
        self.front = self._new_front()

    def finish(self) -> list[Event]:
        """Read the rest of the audio and the end marker; write the rest; end with an "end" event."""
        if self.finished:
            return []
        if self.llm is None:
            raise ValueError("a batched session (own_llm=False) is finished by its driver: end_audio(), run the "
                             "batch until it stops, then close()")
        self._check_whole()
        start = self._clock_start()
        with torch.no_grad(), self._failing():  # (the close too: a stop inside its alignment loses these events)
            self.end_audio()
            events = self._advance()
            self._compute_s += time.perf_counter() - start
            return events + self.close()

    def end_audio(self) -> None:
        """Turn the unchunked tail and the end-of-source marker into the last unit (no LLM work). With VAD, speech
        heard but not yet confirmed (a word shorter than ``min_speech_ms``) is read too; a last segment with no speech
        at all is not read (nothing is written for silence). Nothing to do once the session is closed."""
        if self._audio_done or self.finished:
            return
        self._check_whole()
        with torch.no_grad(), self._failing():
            self._carry_out(self.router.onset() + [("end", None)], advance=False)
            self._audio_done = True

    def gap(self, samples: int) -> list[Event]:
        """``samples`` samples of the stream were lost before they reached the session (``live``: the capture queue
        was full). The segment being heard ends there as at a VAD cut (its audio tail is read, its text committed),
        the lost audio is never read, and every later time counts it: ``source_s``, ``audio_s`` and the segment
        starts stay on the timeline of the real audio. Returns the events of the LLM work this allowed (as ``feed``).
        """
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
            raise InputError(f"gap takes a whole number of samples >= 0, not {samples!r}")
        if self.finished:
            raise InputError("the session has already finished")
        if self._audio_done:
            raise InputError("the audio has ended (end_audio was called): no gap can follow")
        if samples == 0:
            return []
        self._check_whole()
        start = self._clock_start()
        with torch.no_grad(), self._failing():
            onset = self.router.onset()
            self._samples_in += int(samples)
            self.lost_samples += int(samples)
            self.router.lose(int(samples))
            events = self._carry_out(onset, advance=False) + self._carry_out([("gap", self._samples_in)])
        self._compute_s += time.perf_counter() - start
        return events

    def close(self) -> list[Event]:
        """Commit whatever text is left and return it with the "end" event (also after a call that failed mid-way,
        which leaves the session refusing any other work: the text that call committed is given here too, its own
        "final" events having been lost with it)."""
        if self.finished:
            return []
        with self._failing():  # (a stop inside the alignment: the next close gives this text again)
            return self._close()

    def _close(self) -> list[Event]:
        """``close``'s work: the held events (kept until the alignment is done), the text not yet given, the end."""
        events = list(self._held)
        if self._silent_end:  # the audio after the last segment was silence: all of it has been passed by now
            self._source_s = max(self._source_s, self._samples_in / SAMPLE_RATE)
        self.text.commit_all(force=True)
        events += self._final(self.text.committed[self._reported :])
        self._align_segment()
        self._held.clear()
        self.finished = True
        self._stopped = True  # an outside driver gets no more requests: the "end" event has the whole transcript
        audio_s = self._samples_in / SAMPLE_RATE
        events.append(
            Event("end", self.text.committed, round(self._source_s, 3), round(self._wall(), 3),
                  audio_s=round(audio_s, 6), compute_s=round(self._compute_s, 6))
        )
        return events

    def pending_events(self) -> list[Event]:
        """For outside LLM drivers, while this session waits for audio: the events held back since the last
        call (a VAD segment's final text, made inside ``next_request``), then the uncommitted tail as a
        "partial" event if it changed since the last one (with ``partials`` on). Runs no model; [] once finished.
        """
        if self.finished:
            return []
        return self._take_held() + self._partial()

    @property
    def segment_started(self) -> bool:
        """The LLM has read or written in the current segment: that state (an outside driver's row) cannot be
        rebuilt, so the session cannot join another batch until its next segment."""
        return self._units_read > 0 or self._pending is not None

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

    @property
    def endpoints(self) -> list[Endpoint]:
        """With VAD, the segment ends found so far (absolute samples); [] without."""
        return self.router.endpoints

    @property
    def segment_start_times(self) -> list[float]:
        """``segment_starts`` in seconds from the start of the stream (for ``outputs.cues``; without VAD the first
        segment's start, 0, is not in it)."""
        return [start / SAMPLE_RATE for start in self.segment_starts]

    @property
    def llm_cache_length(self) -> int | None:
        """Slots in this session's own LLM cache (None with an outside driver)."""
        return None if self.llm is None else int(self.llm.kinds.shape[1])

    def take_llm_cache_peak(self) -> int | None:
        """The most slots this session's own LLM cache held since the previous call (or the start), and start counting
        afresh (None with an outside driver). ``llm_cache_length`` read between feeds never sees a segment's largest
        cache: the segment end that writes its tail also resets the cache, inside the same feed."""
        if self.llm is None:
            return None
        peak, self._llm_cache_peak = max(self._llm_cache_peak, self.llm_cache_length), 0
        return peak

    # -- source side --------------------------------------------------------------------------

    def _new_front(self) -> FrontEnd:
        """A fresh front end (at the start and at each segment); with joint CTC decoding on a model with a fine CTC
        head it also runs that head."""
        fine = self.joint is not None and self.model.ctc_head is not None
        return FrontEnd(self.model, self.decoding.chunk_ms, fine_ctc=fine)

    def _add_unit(self, samples: np.ndarray, final: bool) -> None:
        """Encode one chunk (``final``: the segment's last) and queue it for the LLM as a unit: the prompt before the
        segment's first speech tokens, the end-of-source marker after its last."""
        chunk = self.front.encode(samples, final)
        parts = []
        if self.front.chunks == 1:
            parts.append(self.model.embed_ids(self.model.prefix_ids))
        parts.append(chunk.tokens.to(self.model.decoder.dtype))
        if final:
            parts.append(self.model.embed_ids(self.model.suffix_ids))
        embeds = torch.cat(parts)
        chunk_end = self._front_start + self.front.chunks * self.front.chunk_size  # absolute samples
        source_s = self._released / SAMPLE_RATE if final else chunk_end / SAMPLE_RATE
        stats = UnitStats(encoder_frames=chunk.frames.shape[0], source_tokens=embeds.shape[0])
        self.stats.append(stats)
        ctc = None
        if chunk.ctc_vectors is not None:
            ctc = self.joint.frame_vectors(chunk.ctc_vectors, fine=True)
        elif self.joint is not None:
            ctc = self.joint.frame_vectors(chunk.tokens)
        self.units.append(_Unit(embeds, source_s, stats, last=final, segment=self._front_segment, ctc=ctc,
                                origin_s=self._front_start / SAMPLE_RATE))

    @property
    def _source_done(self) -> bool:
        """Every unit of the current segment (the whole stream without VAD) has been read."""
        return self._segment_read_done

    @property
    def _segment_cut(self) -> bool:
        """The current segment was ended by the VAD (a later segment follows), not by the end of the stream."""
        return self._front_segment > self.segment

    def _end_segment(self) -> list[Event]:
        """The current VAD segment has stopped: commit its text, then start the next with a fresh LLM state."""
        events = self._final(self.text.commit_all(force=True))
        self._align_segment()
        self.segment += 1
        self._context_ids = self._context(self.decoding.context_tokens)
        self.text.start_segment()
        if self.joint is not None:
            self.joint.reset()
        if self.llm is not None:
            self.llm = self._new_llm_state()
        self._deferred.clear()  # (written, never to be read after: the segment's cache is gone)
        self._units_read = 0
        self._segment_read_done = False
        self._pending = None
        self._reads_since_prediction = 0
        self._tokens_since_read = self._text_since_read = 0
        self._stopped = False
        self._last_partial = ""
        self._recent.clear()
        self._segment_targets_from = len(self.target_ids)
        self._stats_base = len(self.stats) - len(self.units)
        return events

    def _context(self, n: int) -> list[int]:
        """The last ``n`` tokens of the committed text, tokenized again: the text ids of earlier segments hold no
        space between one segment's last word and the next one's first, the committed text does."""
        if n <= 0 or not self.text.committed:
            return []
        tail = self.text.committed[-CONTEXT_CHARS_PER_TOKEN * n :]
        return list(self.model.tokenizer.encode(tail, add_special_tokens=False))[-n:]

    def _align_segment(self) -> None:
        """The segment's text is all committed: add its words with their times to ``words`` (``align``). The
        segment's tokens are marked done only once its words are in: an alignment interrupted (Ctrl-C) is done again
        by ``close``, its words are not lost."""
        ids = self.text.ids[self._segment_ids_from :]
        if self._aligns and ids:
            classes, labels = self.joint.text_labels(ids)
            log_probs = self.joint.text_log_probs(classes) if alignable(self.joint.scorer.frames, labels) else None
            frame_s = self.model.ctc_head.hop * 2 * HOP_LENGTH / SAMPLE_RATE  # encoder frames: 2 mel frames (20 ms)
            pieces = token_pieces(self.model.tokenizer, ids)
            # (the segment's audio ends where its last unit ends: _source_s)
            self.words += segment_words(log_probs, labels, pieces, self._written_s, frame_s, self._segment_origin_s,
                                        self._source_s)
        self._segment_ids_from, self._written_s = len(self.text.ids), []

    def _take_held(self) -> list[Event]:
        held, self._held = self._held, []
        return held

    # -- the policy loop ------------------------------------------------------------------------

    @_own_work
    def next_request(self) -> LLMRequest | None:
        """Ask the policy what to do; return the LLM step it needs, or None to wait for audio / when stopped.

        A read is followed at once by the policy's next decision: when that is a write (after the first
        ``k`` reads it always is: the pending end-of-chunk token, or the header), both go in one request, so
        a chunk costs one LLM step less (not under ablation ``reencode``, which needs them apart)."""
        while not self._stopped:
            action = self._decide()
            if isinstance(action, Read):
                if not self.units:
                    self._pump()  # (outside drivers: the front end's queued steps)
                if not self.units:
                    if self._audio_done:  # an empty segment after the last cut: nothing to read or write
                        self._stopped = True
                        continue
                    return None
                unit = self.units.popleft()
                self._units_read += 1
                self._segment_read_done = unit.last
                self._source_s = unit.source_s
                self._segment_origin_s = unit.origin_s
                self._reads_since_prediction += 1
                self._tokens_since_read = self._text_since_read = 0
                if self.joint is not None:
                    self.joint.add_frames(unit.ctc)
                if unit.embeds.shape[0]:
                    after = self._decide() if self.decoding.ablation != "reencode" else None
                    return LLMRequest.read(unit.embeds, self._write(after) if isinstance(after, Write) else None)
            elif isinstance(action, Write):
                return self._write(action)
            else:
                self._stopped = True
                if self._segment_cut:  # (apply normally catches this stop first)
                    self._held += self._end_segment()
                    return None
        return None

    def _decide(self) -> Action:
        """The policy's decision, except a write the target group has no positions left for (``_cut_due`` ends a
        segment before that with the built-in policy; this guards any other): the segment then reads on and stops."""
        action = self.policy.decide(self._view())
        if isinstance(action, Write) and self._target_room is not None:
            fed = len(self.target_ids) - self._segment_targets_from
            if fed + len(self._write_tokens(action)) > self._target_room:
                return Stop() if self._source_done else Read()
        return action

    def _write_tokens(self, action: Write) -> list[int]:
        """The target tokens a write feeds: the header first (and any context tokens), then one token at a time."""
        if self._pending is None:
            return list(self.model.header_ids) + self._context_ids
        return [self._pending if action.token is None else action.token]

    def _write(self, action: Write) -> LLMRequest:
        """The request of a write (``_write_tokens``)."""
        tokens, is_text = self._write_tokens(action), self._pending is not None
        kinds = torch.full((len(tokens),), gpe.TARGET, dtype=torch.long)
        return LLMRequest(self.model.embed_ids(tokens), kinds, tokens, is_text)

    def logit_rows(self, request: LLMRequest) -> int:
        """How many of a request's last rows need logits: the last row of a write (its next token), none of a
        read alone. With ``record_logits`` every target row (the all-rows reference path)."""
        if not request.tokens:
            return 0
        return len(request.tokens) if self.record_logits else 1

    @_own_work
    def apply(self, request: LLMRequest, logits: torch.Tensor) -> list[Event]:
        """Take the (n, V) logits of a request's last n rows, n >= ``logit_rows(request)`` (a driver computes
        only those: ``decoder.last_rows``); for target tokens, emit their text."""
        events: list[Event] = self._take_held()
        if not request.tokens:  # a read alone
            return events + self._segment_stop()
        tokens = request.tokens
        if self.record_logits:
            self.logits += list(logits[-len(tokens) :])
        self.target_ids += tokens
        self._tokens_since_read += len(tokens)
        self.stats[self._stats_base + max(self._units_read - 1, 0)].target_tokens += len(tokens)
        if self.joint is not None:
            for token in tokens if request.is_text else []:
                self.joint.add_text(token)
        self._reads_since_prediction = 0
        for token in tokens if request.is_text else []:
            if token != self.model.eoc_id:
                self._recent.append(token)
            if token in self.model.special_ids:
                if token == self.model.eoc_id:
                    events += self._final(self.text.commit_all())
                continue
            self._written_s.append(self._source_s)
            self._text_since_read += 1
            events += self._final(self.text.add(token))
        if self.joint is not None:  # (after the counts above: a beam's plan is bounded by the policy's caps)
            self._pending = self.joint.choose(logits[-1], self._source_done, self._planning)
        else:
            self._pending = self.choose(logits[-1])
        return events + self._segment_stop()

    def _planning(self) -> tuple[DecoderState, Limits] | None:
        """For a beam search (``decoding.beam`` > 1): the stream's LLM state and how far the policy lets a plan run
        (tokens before its cap forces a read, or ends the text after the audio); None when it would not write."""
        if self._source_done:
            room = self.decoding.max_tail_tokens - self._tokens_since_read
        else:
            room = self.decoding.max_tokens_per_chunk - self._text_since_read
        return (self.llm, Limits(self._source_done, room)) if room > 0 and self.llm is not None else None

    def _segment_stop(self) -> list[Event]:
        """After a step: if a VAD segment is fully read and its writing is done, end it now (so the
        segment number changes before the driver's next request, never inside one)."""
        if not (self._segment_read_done and self._segment_cut):
            return []
        if not isinstance(self._decide(), Stop):
            return []
        return self._end_segment()

    def _view(self) -> StreamView:
        return StreamView(
            units_read=self._units_read,
            source_done=self._source_done,
            pending=self._pending,
            reads_since_prediction=self._reads_since_prediction,
            tokens_since_read=self._tokens_since_read,
            text_since_read=self._text_since_read,
            eoc_id=self.model.eoc_id,
            eos_id=self.model.eos_id,
            recent=tuple(self._recent),
        )

    def _advance(self) -> list[Event]:
        """Run the policy loop on this session's own LLM state until it waits or stops."""
        if self.llm is None:  # an outside driver (``batch.BatchDecoder``) runs the LLM
            return self._take_held()
        events: list[Event] = []
        while True:
            segment = self.segment
            request = self.next_request()
            events += self._take_held()
            if request is None:
                if self.segment != segment:  # a segment ended inside next_request: go on with the next
                    continue
                break
            planned = self.joint.planned_scores(request.tokens or []) if self.joint is not None else None
            if planned is not None and not self.record_logits:  # a beam plan's token: its scores are known
                self._deferred.append(request)
                events += self.apply(request, planned[None])
                continue
            embeds, kinds = request.embeds, request.kinds
            if self._deferred:  # the plan's tokens written so far are fed now, in this one step, before the request
                embeds = torch.cat([r.embeds for r in self._deferred] + [embeds])
                kinds = torch.cat([r.kinds for r in self._deferred] + [kinds])
                self._deferred.clear()
            keep = last_rows(kinds[None], [self.logit_rows(request)])  # the output layer runs for these rows only
            logits = self.model.decoder.step(self.llm, embeds[None], kinds[None], keep=keep)
            self._llm_cache_peak = max(self._llm_cache_peak, int(self.llm.kinds.shape[1]))
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
        self._reported += len(text)
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
