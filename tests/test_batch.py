"""Dynamic batches: streams join, leave and reset rows at any time and still get their solo logits."""

import time

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.batch import DynamicBatch
from speechstream.config import DecodingConfig
from speechstream.session import LLMRequest, StreamingSession
from speechstream.verify import TOLERANCE
from tests.conftest import text_favouring_chooser
from tests.helpers import noise


class ScriptedStream:
    """A stand-in session: feeds a fixed list of requests, records logits; ``segment`` bumps on cue.

    It asks for the logits of every row, or with ``last_only`` those a session reads (a write's last row).
    """

    llm = None

    def __init__(self, requests, resets_before=(), last_only=False):
        self.requests = list(requests)
        self.resets_before = set(resets_before)  # request indices that start a new segment
        self.last_only = last_only
        self.served = 0
        self.segment = 0
        self.logits = []
        self.finished = False

    def next_request(self):
        if self.served >= len(self.requests):
            return None
        return self.requests[self.served]

    def logit_rows(self, request):
        if self.last_only:
            return 1 if bool((request.kinds == gpe.TARGET).any()) else 0
        return request.embeds.shape[0]

    def apply(self, request, logits):
        self.logits.append(logits.clone())
        self.served += 1
        if self.served in self.resets_before:  # a speech pause: the next request starts a new segment
            self.segment += 1
        return []


def _script(model, rng, n, segments=0):
    hidden = model.decoder.llm.get_input_embeddings().weight.shape[1]
    out = []
    for i in range(n):  # reads, reads with the write that follows them (source rows first), writes
        n_source = int(rng.integers(1, 6)) if i % 4 in (0, 1) else 0
        kinds = torch.tensor([gpe.SOURCE] * n_source + [gpe.TARGET] * (i % 4 != 0), dtype=torch.long)
        embeds = torch.tensor(rng.standard_normal((kinds.shape[0], hidden)), dtype=torch.float32)
        out.append(LLMRequest(embeds, kinds))
    return out


def _solo_logits(model, stream):
    """The same requests on a lone state, a new state at each segment start: all rows' logits."""
    state, out = model.decoder.new_state(1), []
    for i, request in enumerate(stream.requests):
        if i in stream.resets_before:
            state = model.decoder.new_state(1)
        out.append(model.decoder.step(state, request.embeds[None], request.kinds[None])[0])
    return out


def _max_delta_from_solo(model, stream):
    """Max |delta| between the logits a batched stream got and the same rows of its solo all-rows logits."""
    alone = _solo_logits(model, stream)[: len(stream.logits)]
    assert len(alone) == len(stream.logits)
    delta = 0.0
    for request, got, want in zip(stream.requests, stream.logits, alone):
        n = stream.logit_rows(request)
        assert got.shape == (n, want.shape[-1])
        delta = max([delta] + ([(got - want[want.shape[0] - n :]).abs().max().item()] if n else []))
    return delta


@pytest.mark.parametrize("compact_below", [0.5, 1.01])  # 1.01: pack rows whenever any padding is left
def test_joining_leaving_and_row_resets_keep_each_streams_logits(tiny_model, compact_below):
    rng = np.random.default_rng(0)
    streams = [ScriptedStream(_script(tiny_model, rng, n), resets, last_only) for n, resets, last_only in
               ((30, (), False), (12, (5,), True), (25, (8, 16), True), (7, (), False))]
    batch = DynamicBatch(tiny_model, compact_below=compact_below)
    joins = {0: [0, 1], 4: [2], 9: [3]}  # step -> streams joining before it
    widths = []
    with torch.no_grad():
        for t in range(200):
            for i in joins.get(t, []):
                batch.join(streams[i])
            served = batch.step()
            for s in [s for s in batch.sessions if s.served >= len(s.requests)]:
                batch.leave(s)
            per_row = (batch.state.kinds != gpe.PAD).sum(dim=1).tolist()
            widths.append((batch.width, max(per_row, default=0)))
            if served is None and t > max(joins):
                break
        assert len(batch) == 0 and batch.width == 0
        if compact_below > 1:  # packed: never more columns than the fullest row holds
            assert all(width == fullest for width, fullest in widths)
        for stream in streams:
            assert stream.served == len(stream.requests)
            assert _max_delta_from_solo(tiny_model, stream) < TOLERANCE


def test_columns_no_row_needs_are_trimmed(tiny_model):
    rng = np.random.default_rng(1)
    long = ScriptedStream(_script(tiny_model, rng, 60))
    batch = DynamicBatch(tiny_model)
    batch.join(long)
    with torch.no_grad():
        for _ in range(40):  # short streams come and go beside a long one
            short = ScriptedStream(_script(tiny_model, rng, 4))
            batch.join(short)
            while short.served < len(short.requests):
                batch.step()
            batch.leave(short)
            if long.served >= 50:
                break
    real = int((batch.state.kinds != gpe.PAD).sum())
    assert batch.width <= 2 * real  # padding of departed streams does not pile up
    assert batch.state.cache.layers[0].keys.shape[2] == batch.width
    assert _max_delta_from_solo(tiny_model, long) < TOLERANCE


class FailingStream(ScriptedStream):
    """A scripted stream whose ``fail_in`` method ("next_request" or "apply") raises once ``served`` reaches ``at``."""

    def __init__(self, requests, fail_in: str, at: int):
        super().__init__(requests)
        self.fail_in, self.at = fail_in, at

    def next_request(self):
        if self.fail_in == "next_request" and self.served == self.at:
            raise RuntimeError("its request failed")
        return super().next_request()

    def apply(self, request, logits):
        if self.fail_in == "apply" and self.served == self.at:
            raise RuntimeError("taking its logits failed")
        return super().apply(request, logits)


def test_one_streams_failure_is_handed_over_and_the_others_keep_their_logits(tiny_model, monkeypatch):
    """The server's decode thread runs every stream in one batch: a failure in one stream's request, in taking its
    logits, or in its join must not cost the others (``step(on_error=...)``; a failed join leaves the batch as it
    was: it grew the row tensors before it failed, and the next step broke on rows without a session)."""
    rng = np.random.default_rng(3)
    fine = ScriptedStream(_script(tiny_model, rng, 20))
    asking = FailingStream(_script(tiny_model, rng, 20), "next_request", 4)
    taking = FailingStream(_script(tiny_model, rng, 20), "apply", 6)
    batch, failed = DynamicBatch(tiny_model), []
    with torch.no_grad():
        for stream in (fine, asking, taking):
            batch.join(stream)
        for t in range(60):
            if t == 2:  # a join that fails half-way (the new row's start values)
                monkeypatch.setattr(batch, "_fresh_row", lambda name: (_ for _ in ()).throw(MemoryError(name)))
                with pytest.raises(MemoryError):
                    batch.join(ScriptedStream(_script(tiny_model, rng, 5)))
                monkeypatch.undo()
                assert batch.state.kinds.shape[0] == len(batch) == 3 == batch.state.batch_size
            rows = list(batch.sessions)
            served = batch.step(on_error=lambda b, error: failed.append((rows[b], str(error))))
            for stream, _ in failed:
                if stream in batch:
                    batch.leave(stream)
            if served is None:
                break
            assert all(rows[b] not in (s for s, _ in failed) for b in served)
    assert failed == [(asking, "its request failed"), (taking, "taking its logits failed")]
    assert (asking.served, taking.served) == (4, 6)
    assert fine.served == len(fine.requests) and _max_delta_from_solo(tiny_model, fine) < TOLERANCE
    assert _max_delta_from_solo(tiny_model, taking) < TOLERANCE  # (its logits before it failed)
    with pytest.raises(RuntimeError, match="its request failed"):  # without on_error: raised, as before
        lone = DynamicBatch(tiny_model)
        lone.join(FailingStream(_script(tiny_model, rng, 3), "next_request", 0))
        lone.step()


def _batched_sessions(model, decoding, choose, n):
    """``n`` sessions for an outside driver that record their logits."""
    sessions = [StreamingSession(model, decoding, choose=choose, partials=False, own_llm=False) for _ in range(n)]
    for session in sessions:
        session.record_logits = True
    return sessions


def _feed_round(batch, sessions, audios, starts, t, step):
    """Feeding round ``t``: stream i joins at round ``starts[i]``, then gets ``step`` samples a round, and
    ``end_audio`` once its audio is spent."""
    for session, audio, start in zip(sessions, audios, starts):
        j = t - start
        if j == 0:
            batch.join(session)
        if session in batch and not session.finished:
            if j * step < len(audio):
                session.feed(audio[j * step : (j + 1) * step])
            else:
                session.end_audio()


def test_sessions_joining_at_different_times_get_their_solo_transcripts(tiny_model):
    rng = np.random.default_rng(2)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 31000, 17777, 12000)]
    starts = [0, 2, 3, 7]  # feeding round at which each stream connects
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20)
    choose = text_favouring_chooser(tiny_model)
    step = 5120
    sessions = _batched_sessions(tiny_model, decoding, choose, len(audios))
    batch = DynamicBatch(tiny_model)
    with torch.no_grad():
        for t in range(40):
            _feed_round(batch, sessions, audios, starts, t, step)
            batch.run()
            for session in list(batch.sessions):
                if not session.units and not session.waiting_for_llm:
                    session.close()
                    batch.leave(session)
    assert len(batch) == 0
    for audio, together in zip(audios, sessions):
        alone = StreamingSession(tiny_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        alone.feed(audio)
        alone.finish()
        assert together.finished
        assert together.target_ids == alone.target_ids
        assert together.transcript == alone.transcript
        assert (torch.stack(together.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE
    assert any(s.transcript for s in sessions)


def test_a_session_with_its_own_llm_cannot_join(tiny_model):
    with pytest.raises(ValueError):
        DynamicBatch(tiny_model).join(StreamingSession(tiny_model))


def test_vad_segments_get_fresh_rows_in_a_dynamic_batch(tiny_model):
    """With the session's VAD resets (``segment``), a batched stream still equals its solo run."""
    pytest.importorskip("silero_vad")
    from pathlib import Path

    from speechstream.audio import load_audio

    samples = Path(__file__).resolve().parent.parent / "samples"
    silence = np.zeros(16000, dtype=np.float32)
    speech = [load_audio(samples / "jfk.wav")[:40000], load_audio(samples / "austen-0880.wav")[:30000]]
    audios = [np.concatenate([speech[0], silence, speech[1], silence, speech[0][:20000]]),
              np.concatenate([speech[1], silence, speech[0]]), speech[0][:30000]]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, vad=True)
    choose = text_favouring_chooser(tiny_model)
    sessions = _batched_sessions(tiny_model, decoding, choose, len(audios))
    batch = DynamicBatch(tiny_model)
    step = 4000
    with torch.no_grad():
        for t in range(100):
            _feed_round(batch, sessions, audios, range(len(audios)), t, step)  # staggered starts
            batch.run()
            for session in list(batch.sessions):
                if session.finished or (not session.units and not session.waiting_for_llm and session._audio_done):
                    session.close()
                    batch.leave(session)
            if not batch.sessions and t > len(audios):
                break
    for audio, together in zip(audios, sessions):
        alone = StreamingSession(tiny_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        for start in range(0, len(audio), step):
            alone.feed(audio[start : start + step])
        alone.finish()
        assert together.finished and together.segment == alone.segment
        assert together.target_ids == alone.target_ids
        assert (torch.stack(together.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE
    assert sessions[0].segment >= 2 and sessions[1].segment >= 1  # the pauses did cut segments


def test_a_fixed_batch_refuses_what_it_cannot_decode_as_alone(tiny_model):
    from speechstream.batch import BatchDecoder, transcribe_batch

    plain = DecodingConfig(chunk_ms=320, k=1)
    session = StreamingSession(tiny_model, plain, own_llm=False)
    with pytest.raises(ValueError, match="appears twice"):
        BatchDecoder(tiny_model, [session, session])
    other = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, k=1, ablation="interleaved"), own_llm=False)
    with pytest.raises(ValueError, match="share their ablation"):
        BatchDecoder(tiny_model, [session, other])
    with pytest.raises(ValueError, match="use DynamicBatch"):
        BatchDecoder(tiny_model, [StreamingSession(tiny_model, DecodingConfig(vad=True), own_llm=False)])
    assert transcribe_batch(tiny_model, []) == []


def test_a_batch_refuses_an_int8_llm_whose_streams_would_move_each_other():
    """int8's activation scale is taken per LLM call over all its rows (``model.quantize_int8``): batched, a stream's
    logits moved with the other streams' rows (1e-2 here beside a loud one, a hundred times the float bound), so the
    drivers' promise, each stream's logits as alone, did not hold; they refuse such a model."""
    from speechstream.batch import BatchDecoder
    from speechstream.model import load_model

    model = load_model("tiny-random", int8=True)
    with pytest.raises(ValueError, match="int8"):
        DynamicBatch(model)
    with pytest.raises(ValueError, match="int8"):
        BatchDecoder(model, [StreamingSession(model, DecodingConfig(int8=True), own_llm=False)])


@pytest.mark.parametrize("ablation", ["none", "reencode"])
def test_a_gap_gives_a_stream_of_a_fixed_batch_a_fresh_row(tiny_model, ablation):
    """``gap`` ends a segment (a solo session starts a fresh LLM state): ``BatchDecoder`` resets that stream's row
    (it kept the old one, and the stream's logits after the gap were not its solo ones)."""
    from speechstream.batch import BatchDecoder

    rng = np.random.default_rng(5)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (24000, 20000)]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ablation=ablation)
    choose = text_favouring_chooser(tiny_model)
    step, gap_round = 4000, 3  # stream 0 loses 3000 samples after its first three pieces

    def feed_round(session, audio, t, lossy):
        if t * step < len(audio):
            session.feed(audio[t * step : (t + 1) * step])
        if lossy and t + 1 == gap_round:
            session.gap(3000)

    together = _batched_sessions(tiny_model, decoding, choose, len(audios))
    driver = BatchDecoder(tiny_model, together)
    with torch.no_grad():
        for t in range(len(audios[0]) // step + 1):
            for i, (audio, session) in enumerate(zip(audios, together)):
                feed_round(session, audio, t, i == 0)
            driver.run()
        for session in together:
            session.end_audio()
        driver.run()
    for i, (audio, batched) in enumerate(zip(audios, together)):
        alone = StreamingSession(tiny_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        for t in range(len(audios[0]) // step + 1):
            feed_round(alone, audio, t, i == 0)
        alone.finish()
        assert batched.segment == alone.segment == (1 if i == 0 else 0)
        assert batched.target_ids == alone.target_ids
        assert (torch.stack(batched.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE


def test_a_session_already_decoded_elsewhere_cannot_join_a_batch(tiny_model):
    """A new row cannot hold the LLM state a stream built in a batch it left: joining again is refused (the
    stream went on from an empty context, silently), while audio fed before the first LLM step is no obstacle."""
    from speechstream.batch import BatchDecoder

    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=4, max_tail_tokens=8)
    audio = (0.1 * np.random.default_rng(6).standard_normal(12000)).astype(np.float32)
    session = StreamingSession(tiny_model, decoding, partials=False, own_llm=False)
    session.feed(audio)
    assert not session.segment_started
    first = DynamicBatch(tiny_model)
    first.join(session)  # fed, never stepped: it may join
    with torch.no_grad():
        first.run()
    assert session.segment_started
    first.leave(session)
    with pytest.raises(ValueError, match="already been decoded"):
        DynamicBatch(tiny_model).join(session)
    with pytest.raises(ValueError, match="already been decoded"):
        first.join(session)
    with pytest.raises(ValueError, match="already been decoded"):
        BatchDecoder(tiny_model, [session])


def test_rows_are_packed_only_when_that_cuts_the_width(tiny_model, monkeypatch):
    """Beside one long stream, short ones leave most of the cache padding however it is packed: packing then
    copied the whole cache at nearly every step and cut nothing. It runs only when it cuts the width, which stays
    within twice the fullest row's slots."""
    rng = np.random.default_rng(7)
    batch = DynamicBatch(tiny_model)
    long = ScriptedStream(_script(tiny_model, rng, 120), last_only=True)
    shorts = [ScriptedStream(_script(tiny_model, rng, 5), last_only=True) for _ in range(3)]
    packs = []  # (width before, width after) of each packing
    compact = DynamicBatch.compact

    def recording(self):
        before = self.width
        compact(self)
        packs.append((before, self.width))

    monkeypatch.setattr(DynamicBatch, "compact", recording)
    for stream in [long] + shorts:
        batch.join(stream)
    with torch.no_grad():
        while batch.step() is not None:
            fullest = int((batch.state.kinds != gpe.PAD).sum(dim=1).max())
            assert batch.width <= 2 * fullest
    assert all(after < before for before, after in packs)
    for stream in [long] + shorts:
        assert stream.served == len(stream.requests)
        assert _max_delta_from_solo(tiny_model, stream) < TOLERANCE


@pytest.mark.parametrize("ablation", ["none", "interleaved", "reencode"])
def test_a_fixed_batch_drops_what_a_gap_left_of_a_streams_row(tiny_model, ablation):
    """After a gap a stream's row is reset to padding: ``BatchDecoder`` kept the old columns (and the padding of
    rows that waited), so its cache grew with every gap (one stream, six gaps: 552 columns holding nothing; beside
    a stream without gaps, 592 for its 223 slots). It trims as ``DynamicBatch`` does: never more than twice the
    fullest row's slots, and each stream still gets its solo tokens and logits."""
    from speechstream.batch import BatchDecoder

    rng = np.random.default_rng(5)
    audios = [(0.1 * rng.standard_normal(16000 * 6)).astype(np.float32) for _ in range(2)]
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ablation=ablation)
    choose = text_favouring_chooser(tiny_model)
    step = 4000

    def feed_round(session, audio, t, lossy):
        session.feed(audio[t * step : (t + 1) * step])
        if lossy and t % 6 == 5:
            session.gap(3000)

    together = _batched_sessions(tiny_model, decoding, choose, len(audios))
    driver = BatchDecoder(tiny_model, together)
    with torch.no_grad():
        for t in range(len(audios[0]) // step):
            for i, (audio, session) in enumerate(zip(audios, together)):
                feed_round(session, audio, t, i == 0)
            driver.run()
            width = driver.state.kinds.shape[1]
            fullest = int((driver.state.kinds != gpe.PAD).sum(dim=1).max())
            keys = driver.state.cache.layers[0].keys if driver.state.cache.layers else None  # (none before a step)
            assert width <= 2 * fullest and (0 if keys is None else keys.shape[2]) == width
        for session in together:
            session.end_audio()
        driver.run()
    assert together[0].segment == 4
    for i, (audio, batched) in enumerate(zip(audios, together)):
        alone = StreamingSession(tiny_model, decoding, choose=choose, partials=False)
        alone.record_logits = True
        for t in range(len(audios[0]) // step):
            feed_round(alone, audio, t, i == 0)
        alone.finish()
        assert batched.target_ids == alone.target_ids
        assert (torch.stack(batched.logits) - torch.stack(alone.logits)).abs().max() < TOLERANCE


def test_a_batch_refuses_a_session_made_on_another_model(tiny_model):
    """(its embeddings went through the batch's LLM: other logits than alone, and no error)"""
    import dataclasses

    from speechstream.batch import BatchDecoder
    from speechstream.model import build_model
    from tests.helpers import fine_head_model

    other = build_model(dataclasses.replace(tiny_model.config, seed=1)).eval()
    for make in (lambda s: BatchDecoder(tiny_model, [s]), DynamicBatch(tiny_model).join):
        with pytest.raises(ValueError, match="made on another model than the batch's"):
            make(StreamingSession(other, DecodingConfig(), own_llm=False))
    BatchDecoder(tiny_model, [StreamingSession(fine_head_model(tiny_model), DecodingConfig(), own_llm=False)])


def _chatty():
    """A chooser that writes text at every step (never the end-of-chunk marker): each chunk's writing meets its cap."""
    written = []

    def choose(_logits) -> int:
        written.append(ord("a") + len(written) % 26)
        return written[-1]

    return choose


@pytest.mark.parametrize("driver", ["dynamic", "fixed"])
def test_a_batched_stream_is_cut_at_the_llms_positions_where_it_is_cut_alone(tiny_model, monkeypatch, driver):
    """A segment ends after the chunk where one more could carry its text past the LLM's positions (``_cut_due``),
    judged by what the LLM has written by then. A batched session ran its front end at ``feed``, ahead of the
    driver's LLM, and judged the chunks fed in one go by the worst case of every chunk its LLM had not read: its
    segments were cut earlier than alone (here at 76800 samples against 87040) and its text differed. Its front end
    now runs when the LLM asks for audio (``chunks_waiting`` counts what waits)."""
    from speechstream.batch import BatchDecoder

    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", 128)
    audio = (0.1 * np.random.default_rng(3).standard_normal(6 * 16000)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=6, max_tail_tokens=10, max_repeats=0)
    alone = StreamingSession(tiny_model, decoding, choose=_chatty(), partials=False)
    alone.feed(audio)
    alone.finish()
    together = StreamingSession(tiny_model, decoding, choose=_chatty(), partials=False, own_llm=False)
    if driver == "dynamic":
        batch = DynamicBatch(tiny_model)
        batch.join(together)
    else:
        batch = BatchDecoder(tiny_model, [together])
    with torch.no_grad():
        together.feed(audio)  # every chunk at once: the LLM has read none of them
        waiting = len(together.units), together.chunks_waiting if hasattr(together, "chunks_waiting") else None
        batch.run()
        together.end_audio()
        batch.run()
    together.close()
    assert alone.segment_starts  # (a cut at the positions: what this test is about; 87040 at 3833ac7)
    assert together.segment_starts == alone.segment_starts
    assert together.target_ids == alone.target_ids and together.transcript == alone.transcript
    assert waiting == (0, audio.size // 5120)  # (the server holds a stream's frames back by this count)


def test_speech_heard_at_the_end_is_cut_at_the_llms_positions_where_it_is_alone(tiny_model, monkeypatch):
    """With VAD, speech heard but not yet confirmed when the audio ends is read (``end_audio``), and alone its chunks
    are all queued before the LLM reads any, each cut judged by that worst case. A batched session's front end, run
    when the LLM asks for audio, judged them after the LLM had read each: its last segment (from 39424, 41 chunks of
    40 ms) was not cut where it is alone (at 49024)."""
    pytest.importorskip("silero_vad")
    from pathlib import Path

    from speechstream.audio import load_audio

    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", 96)
    jfk = load_audio(Path(__file__).resolve().parent.parent / "samples" / "jfk.wav")
    audio = np.concatenate([jfk[15027 : 15027 + 34591], np.zeros(12709, np.float32), jfk[65333 : 65333 + 2676]])
    decoding = DecodingConfig(chunk_ms=40, k=2, max_tokens_per_chunk=4, max_tail_tokens=8, max_repeats=0, vad=True,
                              vad_min_silence_ms=300)
    alone = StreamingSession(tiny_model, decoding, choose=_chatty(), partials=False)
    alone.feed(audio)
    alone.finish()
    together = StreamingSession(tiny_model, decoding, choose=_chatty(), partials=False, own_llm=False)
    batch = DynamicBatch(tiny_model)
    batch.join(together)
    with torch.no_grad():
        together.feed(audio)
        batch.run()
        together.end_audio()
        batch.run()
    together.close()
    assert alone.segment_starts[-2:] == [39424, 49024]  # (the cut this test is about)
    assert together.segment_starts == alone.segment_starts
    assert together.target_ids == alone.target_ids and together.transcript == alone.transcript


@pytest.mark.parametrize("vad", [False, True])
def test_a_cut_at_the_llms_positions_alone_does_not_depend_on_the_feed_sizes(tiny_model, monkeypatch, vad):
    """A session alone, its segments cut at the LLM's positions (``_cut_due``), fed the same audio whole and in
    pieces of several sizes (single samples, less than a chunk, pieces across chunks and VAD windows), gives the same
    events, target ids and segment starts: without VAD cuts inside noise, with VAD one inside a short word heard at
    the end and read by ``end_audio`` (its chunks queued whole, each cut judged by that worst case)."""
    from pathlib import Path

    from speechstream.audio import load_audio

    if vad:
        pytest.importorskip("silero_vad")
        monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", 96)
        jfk = load_audio(Path(__file__).resolve().parent.parent / "samples" / "jfk.wav")
        audio = np.concatenate([jfk[15027 : 15027 + 34591], np.zeros(12709, np.float32), jfk[65333 : 65333 + 2676]])
        decoding = DecodingConfig(chunk_ms=40, k=2, max_tokens_per_chunk=4, max_tail_tokens=8, max_repeats=0,
                                  vad=True, vad_min_silence_ms=300)
    else:
        monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", 128)
        audio = noise(3, 6 * 16000)
        decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=6, max_tail_tokens=10, max_repeats=0)
    runs = []
    for size in (audio.size, 7, 333, 5120 + 1):
        session = StreamingSession(tiny_model, decoding, choose=_chatty(), partials=False)
        with torch.no_grad():
            events = sum((session.feed(audio[at : at + size]) for at in range(0, audio.size, size)), [])
            events += session.finish()
        runs.append(([(e.type, e.text, e.source_s) for e in events], session.target_ids, session.segment_starts))
    assert all(run == runs[0] for run in runs[1:])
    starts = runs[0][2]
    assert starts[-2:] == [39424, 49024] if vad else starts == [76800]  # (the cuts at the positions this is about)


@pytest.mark.parametrize("seed", [20, 30, 34])
def test_campaign_cases_that_cut_batched_streams_elsewhere_than_alone_now_agree(tiny_model, seed):
    """Cases of the random campaign (``tests/fuzz_batch.py``) that failed before the batched front end waited for the
    LLM (8ecef6b): streams stepped as the server steps them, near the LLM's position limit, were cut at other places
    than alone (seed 20: segment starts [0, 15360, 45568, 51328] against [0, 45568, 51328]). The campaign's own
    check: every stream's ids, events, segment starts and words equal its solo run."""
    from speechstream.audio import load_audio
    from tests import fuzz_batch

    clips = [load_audio(fuzz_batch.SAMPLES / name) for name in fuzz_batch.CLIPS]
    case = fuzz_batch.draw_case(seed, clips)
    assert case.limit is not None and case.driver == "server"  # (the draw these seeds make)
    assert fuzz_batch.run_case(case, tiny_model, seed) == []


def test_a_batched_streams_own_work_is_in_its_own_compute_s(tiny_model):
    """A batched session runs its front end when the LLM asks for audio (``_pump``, inside the driver's step) and
    chooses its tokens when the driver hands it its logits (``apply``): that time is the stream's own ``compute_s``,
    not the step's (which ``serve`` shares among the streams served). Here one stream's encoder and chooser are slow."""
    pause, slowed = 0.01, []

    def slowly(work):
        def slow(*args, **kwargs):
            time.sleep(pause)
            slowed.append(work.__name__)
            return work(*args, **kwargs)

        return slow

    sessions = [StreamingSession(tiny_model, DecodingConfig(chunk_ms=320), choose=text_favouring_chooser(tiny_model),
                                 partials=False, own_llm=False) for _ in range(2)]
    sessions[0].choose, sessions[0]._add_unit = slowly(sessions[0].choose), slowly(sessions[0]._add_unit)
    batch = DynamicBatch(tiny_model)
    for session in sessions:
        batch.join(session)
    audio = noise(7, 16000 * 2)
    for start in range(0, audio.size, 5120):
        for session in sessions:
            session.feed(audio[start : start + 5120])
        batch.run()
    for session in sessions:
        session.end_audio()
    batch.run()
    slow, fast = (session.close()[-1].compute_s for session in sessions)
    assert slowed.count("_add_unit") == len(sessions[0].stats) >= 6 and slowed.count("choose") >= 6
    assert slow >= pause * len(slowed) and slow == pytest.approx(sessions[0].compute_s, abs=1e-6)
    assert fast < pause * len(slowed) / 2  # the other stream's compute holds none of it
