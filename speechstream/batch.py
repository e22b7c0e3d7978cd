"""Several streams decoded in one batch.

Each stream keeps its own ``StreamingSession`` (front end, policy state, text), made
with ``own_llm=False``; ``BatchDecoder`` holds one batched ``DecoderState`` and steps
every session's next LLM request together. Requests of different lengths are padded
with slots no row attends to, so each stream gets exactly the logits it would get
alone (computed only for the rows its session reads: ``logit_rows``). ``DynamicBatch``
does the same for streams that join and leave at any time (the server's driver).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from speechstream import gpe
from speechstream.chunker import chunk_samples
from speechstream.config import DecodingConfig
from speechstream.decoder import drop_slots, last_rows
from speechstream.model import SpeechLLM
from speechstream.session import Event, LLMRequest, StreamingSession, TokenChooser


def check_unstarted(session) -> None:
    """A session joins a batch before its first LLM step (of its current segment): a new row cannot hold the
    LLM state of an earlier row (a batch it left), and the stream would go on from an empty context."""
    if getattr(session, "segment_started", False):
        raise ValueError("the session has already been decoded in another batch (its LLM state cannot move to a "
                         "new row): a session joins before its first LLM step")


def check_float(model: SpeechLLM) -> None:
    """A batch steps its streams' rows in one LLM call: an int8 LLM (``model.quantize_int8``) takes its activation
    scale over all of them, so each stream's logits would move with the others' (ValueError)."""
    if getattr(model, "int8", False):
        raise ValueError("a batch cannot decode an int8 LLM: its activation scale, taken per LLM call over every "
                         "stream's rows, would make each stream's logits depend on the others'")


def check_model(model: SpeechLLM, session) -> None:
    """A batch steps its model's LLM: a session made on a model with another LLM (another checkpoint, or the same
    one loaded twice) would have its embeddings read by weights they were not made for, silently."""
    own = getattr(session, "model", None)
    if own is not None and own.decoder.llm is not model.decoder.llm:
        raise ValueError("the session was made on another model than the batch's (its LLM would run on the batch's "
                         "weights): make the batch's sessions on the model the batch was made with")


def row_fields(state) -> list[str]:
    """Names of a ``DecoderState``'s per-row fields other than ``kinds``: tensors whose first dimension is the
    batch (positions, counters) and per-row lists (whatever a decoder mode keeps per row)."""
    names = []
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if f.name == "kinds":
            continue
        if isinstance(value, torch.Tensor) and value.dim() >= 1 or isinstance(value, list):
            names.append(f.name)
    return names


def reset_row(model: SpeechLLM, state, b: int) -> None:
    """Row ``b`` of ``state`` starts afresh: its slots become padding (no row attends to them) and its positions,
    counters and per-row lists take the values of a new state of the same mode."""
    fresh = model.decoder.new_state(1, mode=state.mode)
    state.kinds[b] = gpe.PAD
    for name in row_fields(state):
        getattr(state, name)[b] = getattr(fresh, name)[0]


def request_on_fresh_rows(session, b: int, segments: list[int], reset: Callable[[int], None]
                          ) -> LLMRequest | None:
    """The session's next request, its row ``b`` reset first (``reset(b)``) whenever its segment has changed
    since ``segments[b]`` (also when a segment ends inside a ``next_request`` that returns None: then the next
    segment is asked at once). None when it waits for audio or has finished."""
    while not session.finished:
        segment = getattr(session, "segment", 0)
        if segment != segments[b]:
            reset(b)
            segments[b] = segment
        request = session.next_request()
        if request is not None or getattr(session, "segment", 0) == segment:
            return request
    return None


class TrimmedRows:
    """The cache upkeep both drivers share: ``self.state`` (one batched ``DecoderState``) keeps no column that is
    padding in every row, and its rows are packed to the left when even the fullest one is mostly padding
    (``compact_below``). Padding comes from rows that wait while others step, and from rows reset to padding (a
    stream's new segment: ``gap``, VAD; a stream that left). Dropping or reordering cached slots changes no logits:
    positions are explicit, padding is attended by no row, and every cached slot is earlier than every new token."""

    model = None  # the SpeechLLM whose decoder steps the batch (and makes the fresh rows of a reset)
    state = None
    compact_below = 0.5

    def _layers(self) -> list:
        """The cache layers that hold keys/values (B, heads, L, d)."""
        layers = []
        for layer in self.state.cache.layers:
            if type(layer) is not DynamicLayer:  # (``GPEDecoder.new_state``: full layers, every slot held)
                raise TypeError(f"{type(self).__name__} cannot edit cache layers of type {type(layer).__name__}")
            if layer.is_initialized and layer.keys is not None and layer.keys.dim() == 4:
                layers.append(layer)
        return layers

    def _set_columns(self, layer, keys: torch.Tensor, values: torch.Tensor) -> None:
        layer.keys, layer.values = keys, values

    def trim(self) -> None:
        """Drop cache columns that are padding in every row; pack rows when that would cut the width below
        ``compact_below`` of what it is (never a copy of the whole cache that changes nothing: beside one long
        stream, short ones keep most of the cache padding however it is packed)."""
        kinds = self.state.kinds
        if kinds.numel() == 0:
            return
        real = kinds != gpe.PAD
        used = real.any(dim=0)
        drop_slots(self.state, used)
        fullest = int((self.state.kinds != gpe.PAD).sum(dim=1).max()) if self.state.kinds.numel() else 0
        if fullest < self.width and fullest < self.compact_below * self.width:  # packing cuts the width to fullest
            self.compact()

    def compact(self) -> None:
        """Move each row's real slots to the left, in their order, and cut the columns left over."""
        real = self.state.kinds != gpe.PAD
        width = int(real.sum(dim=1).max())
        order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)[:, :width]  # real slots first
        self._take_columns(order)

    def _take_columns(self, index: torch.Tensor) -> None:
        """Keep, per row, the cache columns ``index`` (B, L') in that order."""
        self.state.kinds = torch.gather(self.state.kinds, 1, index)
        for layer in self._layers():
            heads, dim = layer.keys.shape[1], layer.keys.shape[3]
            at = index.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)
            at_v = index.to(layer.values.device)[:, None, :, None].expand(-1, layer.values.shape[1], -1,
                                                                           layer.values.shape[3])
            self._set_columns(layer, torch.gather(layer.keys, 2, at), torch.gather(layer.values, 2, at_v))

    @property
    def width(self) -> int:
        """Cache columns held per row."""
        return self.state.kinds.shape[1]

    def _reset_at(self, b: int) -> None:
        """Row ``b`` starts afresh (``reset_row``); its old slots, padding now, are trimmed."""
        reset_row(self.model, self.state, b)
        self.trim()


class BatchDecoder(TrimmedRows):
    def __init__(self, model: SpeechLLM, sessions: list[StreamingSession]):
        """A fixed batch of whole streams, one LLM row each, reset when a stream's ``segment`` changes (``gap``)
        (``DynamicBatch`` takes streams that come and go, and VAD segments). Its cache is trimmed as
        ``DynamicBatch``'s is (`TrimmedRows`): a reset row's old slots and the padding of rows that waited go."""
        check_float(model)
        if any(session.llm is not None for session in sessions):
            raise ValueError("batched sessions must be created with own_llm=False")
        if len({id(session) for session in sessions}) < len(sessions):
            raise ValueError("a session appears twice in the batch")
        for session in sessions:
            check_unstarted(session)
            check_model(model, session)
        if len({session.decoding.ablation for session in sessions}) > 1:
            raise ValueError("the sessions of one batch must share their ablation (it is the LLM state's mode)")
        if any(session.decoding.vad for session in sessions):
            raise ValueError("BatchDecoder keeps one LLM row per stream; VAD segments need fresh rows: "
                             "use DynamicBatch")
        self.model = model
        self.sessions = sessions
        self.state = model.decoder.new_state(len(sessions), mode=sessions[0].decoding.ablation if sessions else "none")
        self._segments = [session.segment for session in sessions]
        self.steps = 0  # batched LLM calls made

    @torch.no_grad()
    def run(self) -> list[list[Event]]:
        """Step all sessions until each waits for audio or has stopped; return new events per session. A session
        whose ``segment`` changed (``gap``) gets its row reset first, as a session alone gets a fresh state."""
        events: list[list[Event]] = [[] for _ in self.sessions]
        while True:
            requests = [request_on_fresh_rows(s, b, self._segments, self._reset_at)
                        for b, s in enumerate(self.sessions)]
            live = [r for r in requests if r is not None]
            if not live:
                break
            width = max(r.embeds.shape[0] for r in live)
            hidden = live[0].embeds.shape[1]
            embeds = live[0].embeds.new_zeros(len(self.sessions), width, hidden)
            kinds = torch.full((len(self.sessions), width), gpe.PAD, dtype=torch.long)
            for b, request in enumerate(requests):
                if request is not None:
                    embeds[b, : request.embeds.shape[0]] = request.embeds
                    kinds[b, : request.embeds.shape[0]] = request.kinds
            counts = [0 if r is None else s.logit_rows(r) for s, r in zip(self.sessions, requests)]
            logits = self.model.decoder.step(self.state, embeds, kinds, keep=last_rows(kinds, counts)).split(counts)
            self.steps += 1
            self.trim()  # rows that waited this step got padding
            for b, request in enumerate(requests):
                if request is not None:
                    events[b] += self.sessions[b].apply(request, logits[b])
        return events


def transcribe_batch(
    model: SpeechLLM,
    audios: list[np.ndarray],
    decoding: DecodingConfig = DecodingConfig(),
    choose: TokenChooser | None = None,
    record_logits: bool = False,
) -> list[StreamingSession]:
    """Stream several signals together chunk by chunk; returns their finished sessions."""
    if not audios:
        return []
    sessions = [StreamingSession(model, decoding, choose=choose, partials=False, own_llm=False) for _ in audios]
    for session in sessions:
        session.record_logits = record_logits
    driver = BatchDecoder(model, sessions)
    size = chunk_samples(decoding.chunk_ms)
    n_steps = max(len(a) // size for a in audios) + 1
    with torch.no_grad():
        for j in range(n_steps):
            for session, audio in zip(sessions, audios):
                if (j + 1) * size <= len(audio):
                    session.feed(audio[j * size : (j + 1) * size])
                elif j * size <= len(audio):  # the last piece (a shorter signal has ended earlier)
                    session.feed(audio[j * size :])
                    session.end_audio()
            driver.run()
        for session in sessions:
            session.end_audio()
        driver.run()
    for session in sessions:
        session.close()
    return sessions


class DynamicBatch(TrimmedRows):
    """A batch whose streams join and leave while it runs (the server's decode driver).

    Every session is made with ``own_llm=False``; row ``b`` of the one batched
    ``DecoderState`` belongs to ``sessions[b]``. Joining appends a row whose slots are
    all padding (``gpe.PAD``: no row ever attends to them) and whose positions are the
    start values of a new state; leaving drops the row. The cache is trimmed (`TrimmedRows`),
    so memory follows the live streams, not the streams that have come and gone.

    Voice-activity resets: when a session's ``segment`` (0 for sessions without one)
    changes, its row is reset to padding and start positions before its next request.
    Each stream gets the logits it would get alone, up to float rounding.
    """

    def __init__(self, model: SpeechLLM, compact_below: float = 0.5):
        """``compact_below``: pack rows when the fullest row's real slots are under this share of the columns
        (packing cuts the width to them, no further)."""
        check_float(model)
        self.model = model
        self.compact_below = compact_below
        self.sessions: list[StreamingSession] = []
        self.state = model.decoder.new_state(0)
        self._segments: list[int] = []
        self.steps = 0  # batched LLM calls made
        self.requests = 0  # stream requests served by them (steps < requests: streams shared calls)
        self.step_s = 0.0  # seconds spent in batched LLM calls

    # -- rows ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.sessions)

    def __contains__(self, session: StreamingSession) -> bool:
        return any(s is session for s in self.sessions)

    def _row(self, session: StreamingSession) -> int:
        for b, s in enumerate(self.sessions):
            if s is session:
                return b
        raise KeyError("the session is not in this batch")

    def _fresh_row(self, name: str):
        value = getattr(self.model.decoder.new_state(1), name)
        return value if isinstance(value, torch.Tensor) else value[:1]

    def join(self, session: StreamingSession) -> None:
        """Add a stream: a new row of padding slots with start positions."""
        if session.llm is not None:
            raise ValueError("batched sessions must be created with own_llm=False")
        if session in self:
            raise ValueError("the session is already in this batch")
        check_unstarted(session)
        check_model(self.model, session)
        if getattr(getattr(session, "decoding", None), "ablation", "none") != "none":
            raise ValueError("DynamicBatch decodes with GPE itself (ablation none)")
        state = self.state
        width = state.kinds.shape[1]
        kinds = torch.cat([state.kinds, state.kinds.new_full((1, width), gpe.PAD)])
        rows = {}
        for name in row_fields(state):
            value, fresh = getattr(state, name), self._fresh_row(name)
            rows[name] = torch.cat([value, fresh]) if isinstance(value, torch.Tensor) else value + fresh
        columns = [(layer, torch.cat([layer.keys, layer.keys.new_zeros((1, *layer.keys.shape[1:]))]),
                    torch.cat([layer.values, layer.values.new_zeros((1, *layer.values.shape[1:]))]))
                   for layer in self._layers()]
        # (nothing above changed the batch: a join that fails leaves it as it was, for the streams in it)
        state.kinds = kinds
        for name, value in rows.items():
            setattr(state, name, value)
        for layer, keys, values in columns:
            self._set_columns(layer, keys, values)
        self.sessions.append(session)
        self._segments.append(getattr(session, "segment", 0))

    def leave(self, session: StreamingSession) -> None:
        """Drop a stream's row (finished, cancelled or disconnected); trim what no row needs."""
        b = self._row(session)
        if len(self.sessions) == 1:  # start over: nothing to keep (the state first, so that a reader on
            self.state = self.model.decoder.new_state(0)  # another thread that sees no stream sees no columns)
            self.sessions.clear()
            self._segments.clear()
            return
        del self.sessions[b]
        del self._segments[b]
        keep = torch.tensor([i for i in range(self.state.batch_size) if i != b], dtype=torch.long)
        self.state.kinds = self.state.kinds[keep]
        for name in row_fields(self.state):
            value = getattr(self.state, name)
            setattr(self.state, name, value[keep] if isinstance(value, torch.Tensor) else value[:b] + value[b + 1 :])
        for layer in self._layers():
            self._set_columns(layer, layer.keys[keep.to(layer.keys.device)], layer.values[keep.to(layer.keys.device)])
        self.trim()

    # -- stepping ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, on_error: Callable[[int, Exception], None] | None = None) -> dict[int, list[Event]] | None:
        """One batched LLM call over every stream with a request; None when every stream waits.

        Returns the new events per row index of the streams served (indices are valid until
        the next ``join``/``leave``). A stream whose ``segment`` changed gets a fresh row first.
        ``on_error(b, error)``: a failure in one stream's own part of the step (its request, or taking its
        logits) is handed to it, and that row is left out of the step's results (the caller ends the stream:
        ``leave``); the other streams go on. Without it, such a failure is raised.
        """
        requests = [self._guarded(on_error, b, self._request, s, b) for b, s in enumerate(self.sessions)]
        live = [r for r in requests if r is not None]
        if not live:
            return None
        start = time.perf_counter()
        width = max(r[0].embeds.shape[0] for r in live)
        embeds = live[0][0].embeds.new_zeros(len(requests), width, live[0][0].embeds.shape[1])
        kinds = torch.full((len(requests), width), gpe.PAD, dtype=torch.long)
        for b, asked in enumerate(requests):
            if asked is not None:
                embeds[b, : asked[0].embeds.shape[0]] = asked[0].embeds
                kinds[b, : asked[0].embeds.shape[0]] = asked[0].kinds
        counts = [0 if r is None else r[1] for r in requests]
        kinds = kinds.to(self.state.kinds.device)
        logits = self.model.decoder.step(self.state, embeds, kinds, keep=last_rows(kinds, counts)).split(counts)
        self.steps += 1
        self.requests += len(live)
        self.trim()  # rows that waited this step got padding
        self.step_s += time.perf_counter() - start
        served = {b: self._guarded(on_error, b, self.sessions[b].apply, r[0], logits[b])
                  for b, r in enumerate(requests) if r is not None}
        return {b: events for b, events in served.items() if events is not None}

    def _request(self, session: StreamingSession, b: int) -> tuple[LLMRequest, int] | None:
        """Row ``b``'s next request and the number of its last rows that need logits (None: it waits)."""
        request = request_on_fresh_rows(session, b, self._segments, self._reset_at)
        return None if request is None else (request, session.logit_rows(request))

    @staticmethod
    def _guarded(on_error: Callable[[int, Exception], None] | None, b: int, work: Callable, *args):
        """``work(*args)`` for row ``b``; with ``on_error``, a failure goes to it and gives None."""
        if on_error is None:
            return work(*args)
        try:
            return work(*args)
        except Exception as error:  # noqa: BLE001 - one stream's failure, for the caller to end that stream
            on_error(b, error)
            return None

    def run(self) -> list[list[Event]]:
        """Step until every stream waits for audio or has stopped; new events per row."""
        events: list[list[Event]] = [[] for _ in self.sessions]
        while (served := self.step()) is not None:
            for b, new in served.items():
                events[b] += new
        return events
