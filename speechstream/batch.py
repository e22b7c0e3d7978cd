"""Several streams decoded in one batch.

Each stream keeps its own ``StreamingSession`` (front end, policy state, text), made
with ``own_llm=False``; ``BatchDecoder`` holds one batched ``DecoderState`` and steps
every session's next LLM request together. Requests of different lengths are padded
with slots no row attends to, so each stream gets exactly the logits it would get
alone.
"""

from __future__ import annotations

import numpy as np
import torch

from speechstream import gpe
from speechstream.chunker import chunk_samples
from speechstream.config import DecodingConfig
from speechstream.model import SpeechLLM
from speechstream.session import Event, StreamingSession, TokenChooser


class BatchDecoder:
    def __init__(self, model: SpeechLLM, sessions: list[StreamingSession]):
        if any(session.llm is not None for session in sessions):
            raise ValueError("batched sessions must be created with own_llm=False")
        self.model = model
        self.sessions = sessions
        self.state = model.decoder.new_state(len(sessions))
        self.steps = 0  # batched LLM calls made

    @torch.no_grad()
    def run(self) -> list[list[Event]]:
        """Step all sessions until each waits for audio or has stopped; return new events per session."""
        events: list[list[Event]] = [[] for _ in self.sessions]
        while True:
            requests = [None if s.finished else s.next_request() for s in self.sessions]
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
                    kinds[b, : request.embeds.shape[0]] = request.kind
            logits = self.model.decoder.step(self.state, embeds, kinds)
            self.steps += 1
            for b, request in enumerate(requests):
                if request is not None:
                    events[b] += self.sessions[b].apply(request, logits[b, : request.embeds.shape[0]])
        return events


def transcribe_batch(
    model: SpeechLLM,
    audios: list[np.ndarray],
    decoding: DecodingConfig = DecodingConfig(),
    choose: TokenChooser | None = None,
    record_logits: bool = False,
) -> list[StreamingSession]:
    """Stream several signals together chunk by chunk; returns their finished sessions."""
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
                else:
                    session.feed(audio[j * size :])
                    session.end_audio()
            driver.run()
        for session in sessions:
            session.end_audio()
        driver.run()
    for session in sessions:
        session.close()
    return sessions
