"""The streaming session: slicing-invariant output, flat per-chunk work, event invariants."""

import io
import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from speechstream import gpe
from speechstream.audio import SAMPLE_RATE, load_audio
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.batch import BatchDecoder
from speechstream.model import load_model
from speechstream.session import Event, StreamingSession
from tests.conftest import text_favouring_chooser

DECODING = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=40)


def run(model, audio, feed_size, decoding=DECODING):
    session = StreamingSession(model, decoding, choose=text_favouring_chooser(model))
    events = []
    for start in range(0, len(audio), feed_size):
        events += session.feed(audio[start : start + feed_size])
    events += session.finish()
    return session, events


def test_transcript_does_not_depend_on_feed_size(tiny_model):
    audio = load_audio("samples/austen-0880.wav")  # real speech, 3 s
    results = {size: run(tiny_model, audio, size) for size in (1, 1000, len(audio))}
    transcripts = {size: session.transcript for size, (session, _) in results.items()}
    assert transcripts[1] and len(set(transcripts.values())) == 1, transcripts
    finals = {
        size: [(e.text, e.source_s) for e in events if e.type == "final"] for size, (_, events) in results.items()
    }
    assert finals[1] == finals[1000] == finals[len(audio)]
    target_ids = {size: session.target_ids for size, (session, _) in results.items()}
    assert target_ids[1] == target_ids[1000] == target_ids[len(audio)]


def test_event_invariants(tiny_model):
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(4.5 * SAMPLE_RATE))).astype(np.float32)
    _, events = run(tiny_model, audio, 3000)
    end = events[-1]
    assert end.type == "end" and [e.type for e in events].count("end") == 1
    finals = [e for e in events if e.type == "final"]
    assert finals and "".join(e.text for e in finals) == end.text
    assert [e.source_s for e in finals] == sorted(e.source_s for e in finals)
    assert end.audio_s == pytest.approx(4.5) and end.compute_s > 0
    assert all(e.source_s <= end.audio_s for e in events)
    assert any(e.type == "partial" for e in events)


def test_work_per_chunk_is_flat_over_five_minutes(tiny_model):
    """Encoder frames, LLM tokens and every per-stream buffer stay bounded as the stream grows."""
    seconds, chunk_s = 300, 0.64
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    rng = np.random.default_rng(1)
    tone = 0.05 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 0.3 * t))
    audio = tone + 0.02 * rng.standard_normal(t.size)
    audio = audio.astype(np.float32)
    decoding = DecodingConfig(chunk_ms=640, k=1, max_tokens_per_chunk=3, max_tail_tokens=10)
    session = StreamingSession(tiny_model, decoding, choose=text_favouring_chooser(tiny_model), partials=False)
    buffer_sizes = []
    step = int(chunk_s * SAMPLE_RATE)
    for start in range(0, audio.size, step):
        session.feed(audio[start : start + step])
        cache = session.front.encoder._cache[0][0]
        buffer_sizes.append((cache.shape[2], session.front.encoder._mel.shape[0], session.front.mel._padded.size))
    session.finish()
    stats = session.stats[:-1]  # the last unit is the end-of-audio flush
    assert len(stats) == int(seconds / chunk_s)
    frames = [s.encoder_frames for s in stats[1:]]
    tokens = [s.source_tokens + s.target_tokens for s in stats[1:]]
    assert set(frames) == {32}  # 640 ms = 32 encoder frames, from the first chunk to the last
    assert max(tokens) <= 8 + 3 + 1  # 8 source tokens + at most max_tokens_per_chunk written (+1 marker)
    first, last = np.mean(tokens[:50]), np.mean(tokens[-50:])
    assert abs(first - last) <= 0.25 * first
    left = tiny_model.config.encoder.left_frames
    assert max(b[0] for b in buffer_sizes) <= left
    assert max(b[1] for b in buffer_sizes) <= 4 and max(b[2] for b in buffer_sizes) <= step + 1000


def test_bad_feeds_are_rejected(tiny_model):
    session = StreamingSession(tiny_model, DECODING)
    with pytest.raises(InputError):
        session.feed(np.array([0.0, np.nan], dtype=np.float32))
    session.feed(np.zeros(5000, dtype=np.float32))
    events = session.finish()
    assert events[-1].type == "end"
    with pytest.raises(InputError):
        session.feed(np.zeros(10, dtype=np.float32))
    assert session.finish() == []


def test_context_manager_and_empty_stream(tiny_model):
    with StreamingSession(tiny_model, DECODING) as session:
        pass
    assert session.finished and session.transcript == ""
    short = StreamingSession(tiny_model, DECODING)
    short.feed(np.zeros(100, dtype=np.float32))
    assert short.finish()[-1].audio_s == pytest.approx(100 / SAMPLE_RATE)


def test_pending_events_for_outside_drivers(tiny_model):
    """A waiting batched session gives its held events once, then its tail as a partial only when it changed."""
    session = StreamingSession(tiny_model, DECODING, choose=text_favouring_chooser(tiny_model), own_llm=False)
    driver = BatchDecoder(tiny_model, [session])
    audio = (0.1 * np.random.default_rng(3).standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
    session.feed(audio)
    driver.run()  # now it waits for audio
    tail = session.text.tail()
    assert [(e.type, e.text) for e in session.pending_events()] == ([("partial", tail)] if tail else [])
    assert session.pending_events() == []  # the tail did not change
    held = Event("final", "held", 1.0, 1.0)
    session._held.append(held)  # as next_request leaves a VAD segment's final text
    assert session.pending_events() == [held] and session.pending_events() == []
    session.close()
    assert session.pending_events() == []


@pytest.mark.parametrize("ablation", ["none", "reencode"])
def test_a_read_and_the_write_after_it_share_one_llm_step(tiny_model, monkeypatch, ablation):
    """After the first k reads, each read step also feeds the write the policy asks for next (source rows
    first, then the end-of-chunk token); ablation reencode keeps them apart. Every read and write is fed once."""
    steps = []
    step = tiny_model.decoder.step

    def recording(state, embeds, kinds, keep=None):
        steps.append(kinds[0].tolist())
        return step(state, embeds, kinds, keep=keep)

    monkeypatch.setattr(tiny_model.decoder, "step", recording)
    audio = (0.1 * np.random.default_rng(4).standard_normal(int(4.1 * SAMPLE_RATE))).astype(np.float32)
    session, _ = run(tiny_model, audio, 4000, replace(DECODING, ablation=ablation))
    reads = [kinds for kinds in steps if gpe.SOURCE in kinds]
    shared = [kinds for kinds in reads if gpe.TARGET in kinds]
    assert len(reads) == len(session.stats) >= 4  # one step per chunk read (and the final flush)
    if ablation == "reencode":
        assert shared == []
    else:
        assert len(shared) == len(reads) - (DECODING.k - 1)  # all but the reads before the first write
        for kinds in shared:  # source rows, then the write's rows
            n_source = kinds.count(gpe.SOURCE)
            assert kinds[:n_source] == [gpe.SOURCE] * n_source and set(kinds[n_source:]) == {gpe.TARGET}
    assert sum(kinds.count(gpe.TARGET) for kinds in steps) == len(session.target_ids)


def test_default_greedy_decoding_is_deterministic(tiny_model):
    audio = load_audio("samples/austen-0930.wav")
    texts = set()
    for _ in range(2):
        session = StreamingSession(tiny_model, DECODING)
        session.feed(audio)
        session.finish()
        texts.add(tuple(session.target_ids))
    assert len(texts) == 1


def test_the_greedy_choice_copies_its_mask_once_not_at_every_token(tiny_model, monkeypatch):
    """The mask of the tokens a session may not write was copied to the logits' device at every token: on an
    accelerator a host-to-device copy per token and stream, each waiting for the device's queue."""
    from speechstream.session import greedy_chooser

    choose = greedy_chooser(tiny_model)
    logits = torch.randn(6, tiny_model.decoder.llm.get_input_embeddings().weight.shape[0],
                         generator=torch.Generator().manual_seed(0))
    banned = ~tiny_model.writable()
    expected = [int(torch.argmax(row.masked_fill(banned, float("-inf")))) for row in logits]
    copies, to = [], torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(a) or to(self, *a, **k))
    assert [choose(row) for row in logits] == expected
    assert len(copies) <= 1


def test_real_clip_end_to_end_with_the_cli_loop(tiny_model):
    from speechstream.transcribe import transcribe_file

    seen = []
    events = transcribe_file(tiny_model, DECODING, "samples/jfk.wav", seen.append)
    assert events == seen and events[-1].type == "end"
    assert events[-1].audio_s == pytest.approx(11.0, abs=0.01)
    assert events[-1].source_s == pytest.approx(11.0, abs=0.01)


def test_a_long_file_is_transcribed_in_the_memory_of_a_block(tiny_model, tmp_path, monkeypatch):
    """``transcribe_file`` read the whole file (float32, every channel) before the first chunk: 10 minutes of 48 kHz
    stereo took 0.9 GB more at its peak, hours of audio did not fit. It reads a block at a time now, and feeds the
    same chunks, so the events are those of the whole file fed chunk by chunk."""
    import tracemalloc

    import soundfile

    import speechstream.audio
    from speechstream.chunker import chunk_samples
    from speechstream.transcribe import transcribe_file

    rate, seconds = 48000, 60
    path = tmp_path / "long.wav"
    rng = np.random.default_rng(0)
    soundfile.write(path, (0.1 * rng.standard_normal((rate * seconds, 2))).astype(np.float32), rate, "PCM_16")
    whole_bytes = rate * seconds * 2 * 4  # the file as float32 samples
    decoding = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=2, max_tail_tokens=4)
    audio, step = load_audio(path), chunk_samples(640)  # (also loads what the first read loads lazily)
    session = StreamingSession(tiny_model, decoding)
    expected = [e for i in range(0, len(audio), step) for e in session.feed(audio[i : i + step])] + session.finish()
    del audio
    monkeypatch.setattr(speechstream.audio, "FILE_BLOCK_S", 2)
    tracemalloc.start()  # numpy's allocations (the samples); torch's are not counted
    try:
        events = transcribe_file(tiny_model, decoding, str(path), lambda event: None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < whole_bytes / 5  # 2.9 MB of 23 MB (reading it whole: more than all of it)
    strip = lambda evs: [(e.type, e.text, e.source_s, e.audio_s) for e in evs]  # noqa: E731 (wall times differ)
    assert strip(events) == strip(expected) and events[-1].audio_s == seconds


# -- misuse: a clear error, never a wrong transcript ------------------------------------------------------------


@pytest.mark.parametrize("samples, match", [
    (np.zeros(1600, np.int16), "not: int16 array"),
    (np.zeros((1600, 2), np.float32), r"shape \(1600, 2\)"),
    (b"\x00\x00" * 800, "not: bytes"),
    (None, "not: NoneType"),
    (np.array([0.0, np.nan], np.float32), "NaN"),
])
def test_feed_refuses_what_is_not_mono_float_audio(tiny_model, samples, match):
    session = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, k=1))
    with pytest.raises(InputError, match=match):
        session.feed(samples)


def test_loud_samples_are_clipped_as_load_audio_clips_them(tiny_model):
    rng = np.random.default_rng(0)
    audio = (0.5 * rng.standard_normal(16000)).astype(np.float32)
    texts = []
    # (float64 past float32's range too: loud, not infinite, where it was cast to float32 before the check)
    for samples in (audio * 1e6, audio.astype(np.float64) * 1e300, np.clip(audio * 1e6, -1, 1)):
        choose = text_favouring_chooser(tiny_model)
        session = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, k=1), choose=choose)
        session.feed(samples)
        session.finish()
        texts.append(session.target_ids)
    assert texts[0] == texts[1] == texts[2]


def test_no_feed_after_the_audio_has_ended(tiny_model):
    session = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, k=1))
    session.feed(np.zeros(8000, np.float32))
    session.end_audio()
    with pytest.raises(InputError, match="the audio has ended"):
        session.feed(np.zeros(8000, np.float32))


@pytest.mark.parametrize("field, value, match", [
    ("chunk_ms", 0, "chunk_ms must be between"),
    ("k", 0, "--k must be at least 1"),
    ("k", 1.5, "--k must be a whole number"),
    ("max_tokens_per_chunk", 0, "--max-tokens-per-chunk must be at least 1"),
    ("max_tail_tokens", -5, "--max-tail-tokens must be at least 1"),
    ("max_repeats", -1, "--max-repeats must be at least 0"),
    ("max_repeats", 1, "--max-repeats must be 0 \\(off\\) or at least 2"),
    ("vad_min_silence_ms", 0, "--vad-min-silence-ms must be at least 32"),
    ("vad_min_silence_ms", 300, "--vad-min-silence-ms is the pause that ends a VAD segment: it needs --vad"),
    ("context_tokens", -5, "--context-tokens must be at least 0"),
    ("ctc_weight", 1.5, "--ctc-weight must be at least 0 and below 1"),
    ("ctc_weight", -0.5, "--ctc-weight must be at least 0 and below 1"),
    ("ctc_candidates", 0, "--ctc-candidates must be at least 1"),
    ("ablation", "bogus", "unknown ablation"),
    ("int8", "yes", "int8 must be True or False"),
    ("device", "nonsense", "not a torch device"),
    ("policy", "local-agreement", "unknown policy 'local-agreement' \\(known: wait-k\\)"),
])
def test_decoding_configs_no_stream_could_use_are_refused(field, value, match):
    with pytest.raises(InputError, match=match):
        DecodingConfig(**{field: value})


@pytest.mark.parametrize("chunk_ms", [640.0, np.int64(640), np.float32(640)])
def test_a_whole_chunk_ms_of_any_number_type_is_stored_as_an_int(chunk_ms):
    """(numpy's int64 reached config.json as it was: ``eval`` stopped on json.dumps)"""
    decoding = DecodingConfig(chunk_ms=chunk_ms)
    assert type(decoding.chunk_ms) is int and decoding.chunk_ms == 640
    assert json.loads(json.dumps(asdict(decoding)))["chunk_ms"] == 640


@pytest.mark.parametrize("weight", [np.float32(0.25), np.float64(0.25), 0.25])
def test_a_ctc_weight_of_any_real_type_is_taken_as_a_float(weight):
    """(numpy's floats were refused as "must be at least 0 and below 1, got np.float32(0.25)")"""
    decoding = DecodingConfig(ctc_weight=weight)
    assert type(decoding.ctc_weight) is float and decoding.ctc_weight == 0.25


def test_numpy_bools_are_taken_for_vad_and_int8():
    """(np.True_, as a pandas row or a numpy mask gives it, was refused: "vad must be True or False, got np.True_")"""
    decoding = DecodingConfig(vad=np.bool_(True), int8=np.bool_(False))
    assert (decoding.vad, decoding.int8) == (True, False) and type(decoding.vad) is bool is type(decoding.int8)


def test_a_batched_session_is_not_finished_alone(tiny_model):
    session = StreamingSession(tiny_model, DecodingConfig(chunk_ms=320, k=1), own_llm=False)
    with pytest.raises(ValueError, match="finished by its driver"):
        session.finish()
    with pytest.raises(TypeError, match="must be a DecodingConfig"):
        StreamingSession(tiny_model, {"chunk_ms": 640})


# -- Ctrl-C while transcribing a pipe -------------------------------------------------------------------------------


def _pipe_with(samples: int):
    """A pipe holding ``samples`` int16 samples of seeded noise; the write end stays open (a live source)."""
    import os

    read_fd, write_fd = os.pipe()
    pcm = np.random.default_rng(0).integers(-3000, 3000, samples).astype("<i2").tobytes()
    os.write(write_fd, pcm)
    return os.fdopen(read_fd, "rb", buffering=0), write_fd


def test_ctrl_c_during_a_feed_lets_that_buffer_finish(tiny_model, monkeypatch):
    """SIGINT while the session works on a buffer takes effect after it (an interrupted step would leave the caches
    half-updated); the stream then ends with what was read."""
    import os
    import signal
    import time

    from speechstream.transcribe import transcribe_pcm

    fed, original = [], StreamingSession.feed

    def feed(self, samples):
        if len(fed) == 1:  # the second buffer
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        events = original(self, samples)
        fed.append(samples.size)
        return events

    monkeypatch.setattr(StreamingSession, "feed", feed)
    stream, write_fd = _pipe_with(16000)
    try:
        events = transcribe_pcm(tiny_model, DecodingConfig(), stream, SAMPLE_RATE, lambda e: None, block_bytes=6400)
    finally:
        os.close(write_fd)
        stream.close()
    assert fed[:2] == [3200, 3200] and sum(fed) == 6400  # (then the resampler's flush: nothing at 16 kHz)
    assert events[-1].type == "end" and events[-1].audio_s == pytest.approx(0.4)
    assert signal.getsignal(signal.SIGINT) is not None


def test_ctrl_c_while_waiting_for_the_pipe_ends_at_once(tiny_model):
    import os
    import signal
    import threading

    from speechstream.transcribe import transcribe_pcm

    stream, write_fd = _pipe_with(4800)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))  # while the read waits for more
    timer.start()
    try:
        events = transcribe_pcm(tiny_model, DecodingConfig(), stream, SAMPLE_RATE, lambda e: None, block_bytes=6400)
    finally:
        timer.cancel()
        os.close(write_fd)
        stream.close()
    assert events[-1].type == "end" and events[-1].audio_s == pytest.approx(0.3)


def test_a_session_whose_call_failed_mid_way_refuses_more_work(tiny_model, monkeypatch):
    """An exception inside ``feed`` (a device error in an LLM step) left the chunk it was reading half done: the
    unit had been taken from the queue and the samples were never counted, and the next feeds went on silently
    without them. Now every later call says so in one line; ``close`` still gives the text committed before."""
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(6 * SAMPLE_RATE)).astype(np.float32)
    session = StreamingSession(tiny_model, DECODING, choose=text_favouring_chooser(tiny_model))
    step, calls = tiny_model.decoder.step, []

    def failing_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("CUDA out of memory")
        return step(*args, **kwargs)

    monkeypatch.setattr(tiny_model.decoder, "step", failing_step)
    events, feeds = [], iter(range(0, audio.size, 4000))
    with pytest.raises(RuntimeError, match="out of memory"):
        for start in feeds:
            events += session.feed(audio[start : start + 4000])
    for call in (lambda: session.feed(audio[:4000]), lambda: session.gap(100), session.finish, session.end_audio):
        with pytest.raises(InputError, match=r"failed in an earlier call \(RuntimeError: CUDA out of memory\)"):
            call()
    events += session.close()
    end = events[-1]
    assert end.type == "end" and end.text == "".join(e.text for e in events if e.type == "final") != ""
    assert session.close() == [] and session.finish() == []


def test_max_segment_samples_is_the_most_whole_chunks_that_fit():
    from speechstream.schedule import encoder_frames_total, max_segment_samples, tokens_from_frames

    for budget, chunk_ms, stack in [(8171, 640, 8), (38, 640, 4), (7, 320, 4), (100, 1000, 2), (3, 640, 8)]:
        chunk = chunk_ms * SAMPLE_RATE // 1000
        n = max_segment_samples(budget, chunk, stack)
        tokens = lambda samples: tokens_from_frames(encoder_frames_total(samples), stack, final=True)  # noqa: E731
        assert n % chunk == 0 and tokens(n + chunk) > budget
        assert n == 0 or tokens(n) <= budget
    assert max_segment_samples(8171, 10240, 8) // SAMPLE_RATE // 60 == 21  # the shipped models: ~21 min


def test_without_vad_a_segment_ends_before_the_source_passes_the_llms_positions(tiny_model, monkeypatch):
    """Without VAD one stream's source group grew past ``max_position_embeddings`` (SmolLM2: 8192, ~21 minutes of
    6.25 tokens a second) and the LLM went on, silently, at positions it never learned. Now the segment ends there as
    at a VAD cut (its audio tail and end marker read, its text committed) and the next starts afresh."""
    limit = 64
    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", limit)
    step, highest = tiny_model.decoder.step, []

    def watching_step(state, embeds, kinds, keep=None):
        logits = step(state, embeds, kinds, keep=keep)
        highest.append(int(state.next_source_pos.max()) - 1)
        return logits

    monkeypatch.setattr(tiny_model.decoder, "step", watching_step)
    rng = np.random.default_rng(4)
    audio = (0.1 * rng.standard_normal(10 * SAMPLE_RATE)).astype(np.float32)
    few = replace(DECODING, max_tokens_per_chunk=2, max_tail_tokens=4)  # (the target group never fills first)
    session, events = run(tiny_model, audio, 3000, few)
    segment = 4 * 10240  # 4 chunks of 640 ms: 32 speech tokens + the prompt's 30 source tokens (a 5th: 40)
    assert session._segment_samples == segment
    assert max(highest) == len(tiny_model.prefix_ids) + 32 + len(tiny_model.suffix_ids) - 1 < limit
    assert session.segment == 3 and session.segment_starts == [segment, 2 * segment, 3 * segment]
    finals = [e for e in events if e.type == "final"]
    assert "".join(e.text for e in finals) == events[-1].text != ""
    assert [e.source_s for e in events] == sorted(e.source_s for e in events) and events[-1].source_s == 10.0


def _watch_positions(model, monkeypatch, limit: int) -> list[tuple[int, int]]:
    """Give the LLM ``limit`` positions; return the list that gets each step's highest (source, target) position."""
    monkeypatch.setattr(model.decoder.llm.config, "max_position_embeddings", limit)
    step, highest = model.decoder.step, []

    def watching_step(state, embeds, kinds, keep=None):
        logits = step(state, embeds, kinds, keep=keep)
        highest.append((int(state.next_source_pos.max()) - 1, int(state.next_target_pos.max()) - 1))
        return logits

    monkeypatch.setattr(model.decoder, "step", watching_step)
    return highest


def _chatty(model):
    """A chooser that writes text and never asks for the next chunk nor ends (nor loops on a short block)."""
    written = []

    def choose(_logits) -> int:
        written.append(ord("a") + len(written) % 26)
        return written[-1]

    return choose


def test_a_segment_ends_before_its_target_group_passes_the_llms_positions(tiny_model, monkeypatch):
    """Only the source group was watched: a segment that wrote more text tokens than it read speech tokens (a
    chatty or untrained model: up to max_tokens_per_chunk a chunk, against 6.25 source tokens a second in the shipped
    models) took target positions past ``max_position_embeddings`` (here 128: up to 206 with 16 text tokens a chunk, the
    source cut after 12 chunks). Now the segment ends after the chunk where one more could pass them, as at a VAD
    cut (its tail read and written within the caps), whatever the feed sizes."""
    limit = 128
    highest = _watch_positions(tiny_model, monkeypatch, limit)
    audio = (0.1 * np.random.default_rng(4).standard_normal(10 * SAMPLE_RATE)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=16, max_tail_tokens=20, max_repeats=0)
    runs = {}
    for size in (3000, audio.size):
        session = StreamingSession(tiny_model, decoding, choose=_chatty(tiny_model))
        events = [e for start in range(0, audio.size, size) for e in session.feed(audio[start : start + size])]
        runs[size] = (session, events + session.finish())
    (session, events), (whole, _) = runs[3000], runs[audio.size]
    assert limit // 2 < max(target for _, target in highest) < limit
    assert max(source for source, _ in highest) < limit
    assert session.segment >= 2 and all(b - a < 12 * 10240 for a, b in zip([0] + session.segment_starts,
                                                                            session.segment_starts))
    assert (whole.target_ids, whole.segment_starts) == (session.target_ids, session.segment_starts)
    assert "".join(e.text for e in events if e.type == "final") == events[-1].text != ""
    assert [e.source_s for e in events] == sorted(e.source_s for e in events) and events[-1].source_s == 10.0
    with pytest.raises(InputError, match=r"target positions \(128, from phi on\) are too few .*-chunk 100\) and"):
        StreamingSession(tiny_model, replace(decoding, max_tokens_per_chunk=100))


def test_a_phi_at_or_past_the_llms_positions_is_named_as_such(tiny_model, monkeypatch):
    """llm.phi past the LLM's positions left a negative count of target positions in the message ("(-72, from phi
    on) are too few"); it now says what is wrong."""
    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", 128)
    for phi in (128, 200):
        monkeypatch.setattr(tiny_model.decoder, "phi", phi)
        with pytest.raises(InputError, match=rf"llm.phi \({phi}\) leaves none of its LLM's 128 positions to the "
                                             r"target group$"):
            StreamingSession(tiny_model, DecodingConfig(chunk_ms=640, k=2))


def test_the_interleaved_ablation_cuts_its_segments_within_the_llms_positions(tiny_model, monkeypatch):
    """Ablation "interleaved" numbers every token of a segment in arrival order (source and target in one
    sequence), so a segment of source and target groups that each fit took positions up to their sum past
    ``max_position_embeddings``. Now its segments end where one more chunk could carry that sum past them."""
    limit = 128
    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", limit)
    step, highest = tiny_model.decoder.step, []

    def watching_step(state, embeds, kinds, keep=None):
        positions = gpe.arrival_positions(state.kinds, kinds.to(state.kinds.device))
        highest.append(int(positions.max()))
        return step(state, embeds, kinds, keep=keep)

    monkeypatch.setattr(tiny_model.decoder, "step", watching_step)
    audio = (0.1 * np.random.default_rng(4).standard_normal(10 * SAMPLE_RATE)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=20, max_repeats=0,
                              ablation="interleaved")
    session = StreamingSession(tiny_model, decoding, choose=_chatty(tiny_model))
    events = session.feed(audio) + session.finish()
    assert limit // 2 < max(highest) < limit
    assert session.segment >= 2
    assert "".join(e.text for e in events if e.type == "final") == events[-1].text != ""
    assert events[-1].source_s == 10.0
    with pytest.raises(InputError, match="interleaved"):
        StreamingSession(tiny_model, replace(decoding, max_tokens_per_chunk=80))


def test_a_policy_past_the_caps_is_never_given_a_target_position_past_the_llms(tiny_model, monkeypatch):
    """A policy of one's own that writes more than --max-tokens-per-chunk after a read: its writes that would pass
    the target group's positions are not made; the segment reads on to its end and stops, and the next one writes."""
    from speechstream.policy import Policy, Read, Stop, Write

    class Chatty(Policy):
        def decide(self, view):
            if view.units_read < 1 and not view.source_done:
                return Read()
            if view.source_done and view.tokens_since_read >= 300:
                return Stop()
            if not view.source_done and view.tokens_since_read >= 50:
                return Read()
            return Write()

    limit = 128
    highest = _watch_positions(tiny_model, monkeypatch, limit)
    decoding = DecodingConfig(chunk_ms=640, max_tail_tokens=20, max_tokens_per_chunk=16)
    session = StreamingSession(tiny_model, decoding, policy=Chatty(), choose=_chatty(tiny_model))
    events = session.feed((0.1 * np.random.default_rng(5).standard_normal(10 * SAMPLE_RATE)).astype(np.float32))
    events += session.finish()
    assert max(target for _, target in highest) == limit - 1 and session.segment >= 1  # filled, never passed
    assert events[-1].type == "end" and len(events[-1].text) > limit


def test_a_closed_session_asks_for_no_more_llm_work(tiny_model):
    """close() before the audio ended left the policy loop running: an outside driver still got requests from
    ``next_request`` (``waiting_for_llm`` stayed True) whose text would come after the "end" event, and end_audio()
    queued a last unit on the closed session. Now a closed session asks for nothing and end_audio() does nothing."""
    audio = (0.1 * np.random.default_rng(6).standard_normal(3 * SAMPLE_RATE)).astype(np.float32)
    for own_llm in (True, False):
        session = StreamingSession(tiny_model, DECODING, choose=text_favouring_chooser(tiny_model), own_llm=own_llm)
        session.feed(audio)
        end, queued = session.close()[-1], len(session.units)
        session.end_audio()
        assert end.type == "end" and len(session.units) == queued and session.next_request() is None
        assert not session.waiting_for_llm and session.transcript == end.text
        with pytest.raises(InputError, match="already finished"):
            session.feed(audio)


@pytest.mark.parametrize("stream, rate, block, match", [
    (io.StringIO("RIFF"), SAMPLE_RATE, 6400, "binary file object .* not from StringIO"),  # sys.stdin, not .buffer
    (b"\0\0" * 100, SAMPLE_RATE, 6400, "binary file object .* not from bytes"),
    (io.BytesIO(b"\0\0" * 100), SAMPLE_RATE, 64.5, "block_bytes a whole number, at least 2"),
    (io.BytesIO(b"\0\0" * 100), 16000.0, 6400, "sample_rate must be a whole number of Hz"),
])
def test_transcribe_pcm_refuses_what_is_not_a_binary_stream_with_one_line(tiny_model, stream, rate, block, match):
    """(a text stream ended in "TypeError: can't concat str to bytes", a float block_bytes in the read)"""
    from speechstream.transcribe import transcribe_pcm

    with pytest.raises(InputError, match=match):
        transcribe_pcm(tiny_model, DecodingConfig(), stream, rate, lambda e: None, block_bytes=block)


def test_sessions_sharing_a_model_interleaved_or_in_threads_give_what_each_gives_alone(tiny_model):
    """The README's promise: sessions on one model are independent (one after another, interleaved, a thread each):
    each gets the events and the very logits it gets alone."""
    import threading

    audios = [load_audio(f"samples/austen-{n}.wav")[: 2 * SAMPLE_RATE] for n in ("0880", "0890")]

    def new_session():
        session = StreamingSession(tiny_model, DECODING, choose=text_favouring_chooser(tiny_model))
        session.record_logits = True
        return session

    def outcome(session, events):
        return [(e.type, e.text, e.source_s) for e in events], torch.stack(session.logits)

    def alone(audio):
        session = new_session()
        events = [event for start in range(0, audio.size, 4000) for event in session.feed(audio[start : start + 4000])]
        return outcome(session, events + session.finish())

    def same(got, expected):
        return got[0] == expected[0] and torch.equal(got[1], expected[1])

    expected = [alone(audio) for audio in audios]
    assert expected[0][1].shape == expected[1][1].shape and not same(expected[0], expected[1])
    sessions, interleaved = [new_session(), new_session()], [[], []]
    for start in range(0, 2 * SAMPLE_RATE, 4000):
        for i, session in enumerate(sessions):
            interleaved[i] += session.feed(audios[i][start : start + 4000])
    assert all(same(outcome(session, events + session.finish()), expected[i])
               for i, (session, events) in enumerate(zip(sessions, interleaved)))
    threaded = {}
    threads = [threading.Thread(target=lambda i=i: threaded.__setitem__(i, alone(audios[i % 2]))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(same(threaded[i], expected[i % 2]) for i in range(4))


def test_a_session_refuses_an_int8_dtype_or_device_its_model_was_not_loaded_with(tiny_model, monkeypatch):
    """(both were ignored: DecodingConfig(int8=True) on a float model decoded in float, timed as int8)"""
    from speechstream.model import load_model

    with pytest.raises(InputError, match=r"int8=True\), but the model's LLM is not int8: .*load_model\(name, int8"):
        StreamingSession(tiny_model, DecodingConfig(int8=True))
    StreamingSession(load_model("tiny-random", int8=True), DecodingConfig(int8=True)).finish()
    with pytest.raises(InputError, match=r"dtype='bfloat16'\), but the model's LLM is torch.float32: .*load_model\("
                       r"name, dtype='bfloat16'\)$"):
        StreamingSession(tiny_model, DecodingConfig(dtype="bfloat16"))
    StreamingSession(load_model("tiny-random", dtype="bfloat16"), DecodingConfig(dtype="bfloat16")).finish()
    StreamingSession(load_model("tiny-random", dtype="bfloat16"), DecodingConfig()).finish()  # float32 takes any
    monkeypatch.setattr("speechstream.config.check_device", lambda device: None)  # meta: an accelerator's stand-in
    with pytest.raises(InputError, match=r"device='meta'\), but the model is on cpu: .*load_model\(name, device="):
        StreamingSession(tiny_model, DecodingConfig(device="meta"))


@pytest.mark.parametrize("call, error, match", [
    # an AttributeError deep in the session ('NoneType' object has no attribute 'decoder')
    (lambda: StreamingSession(None), TypeError, "model must be a SpeechLLM .*load_model.*, not NoneType"),
    (lambda: StreamingSession("tiny-random"), TypeError, "model must be a SpeechLLM .*, not str"),
    # torch's TypeError over several lines ("device() received an invalid combination of arguments ...")
    (lambda: load_model("tiny-random", None), InputError, "^--device must be a name .*, got None$"),
    (lambda: load_model("tiny-random", 0), InputError, "^--device must be a name .*, got 0$"),  # (cuda:0 to torch)
    (lambda: load_model("tiny-random", int8="no"), InputError, "int8 must be True or False, got 'no'"),  # quantized
])
def test_bad_arguments_of_the_python_api_are_clear_errors(call, error, match):
    with pytest.raises(error, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_session_decoding_fills_the_models_defaults_and_refuses_what_the_driver_cannot_run(tiny_model):
    """The decoding a session runs: ctc_weight left unset is the model's default, or off when the caller chooses the
    tokens itself; joint CTC with the caller's chooser, or a beam in a batched stream, is refused."""
    from speechstream.config import with_model_defaults
    from speechstream.session import session_decoding

    unset = DecodingConfig()
    assert unset.ctc_weight is None
    assert session_decoding(tiny_model, unset, False, True) == with_model_defaults(unset, tiny_model.config)
    assert session_decoding(tiny_model, unset, True, True).ctc_weight == 0.0
    with pytest.raises(ValueError, match="chooses the tokens itself: pass no choose"):
        session_decoding(tiny_model, DecodingConfig(ctc_weight=0.5), True, True)
    with pytest.raises(InputError, match="--beam above 1 needs a stream that runs its own LLM"):
        session_decoding(tiny_model, DecodingConfig(beam=2, ctc_weight=0.5), False, False)
    assert session_decoding(tiny_model, DecodingConfig(beam=2, ctc_weight=0.5), False, True).beam == 2
    with pytest.raises(TypeError, match="decoding must be a DecodingConfig, not dict"):
        session_decoding(tiny_model, {}, False, True)


@pytest.mark.parametrize("field, value, named", [
    ("context_tokens", 10**6, "header and its 1000000 context tokens"),
    ("max_tail_tokens", 10**6, "tail \\(max_tail_tokens 1000000\\)"),
    ("max_tokens_per_chunk", 10**6, "--max-tokens-per-chunk 1000000"),
])
def test_decoding_caps_past_the_llms_positions_are_named_in_the_error(tiny_model, field, value, named):
    """(context tokens past them were blamed on --max-tokens-per-chunk 24 and the tail)"""
    with pytest.raises(InputError, match=f"target positions .* too few for the .*{named}"):
        StreamingSession(tiny_model, DecodingConfig(vad=True, **{field: value}))


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "Terminated"])
def test_a_stop_inside_a_step_keeps_the_streams_text(tiny_model, monkeypatch, stop):
    """Ctrl-C inside a file's step, or SIGTERM inside a pipe's (Ctrl-C is held there until the buffer is done, SIGTERM
    is not), left a half-updated session: the file's events were lost, and the pipe went on to finish the stream,
    which the session refused (an InputError). Now the session is closed and `StreamInterrupted` carries every event,
    the text committed before the stop and the "end" event included."""
    from speechstream.interrupts import Terminated
    from speechstream.transcribe import StreamInterrupted, transcribe_file, transcribe_pcm

    audio = load_audio("samples/jfk.wav")[: 8 * SAMPLE_RATE]
    pcm = (audio * 32767).astype("<i2").tobytes()
    step, calls = tiny_model.decoder.step, []

    def stopping_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 12:
            raise {"KeyboardInterrupt": KeyboardInterrupt, "Terminated": Terminated}[stop]
        return step(*args, **kwargs)

    monkeypatch.setattr(tiny_model.decoder, "step", stopping_step)
    decoding = DecodingConfig(ctc_weight=0.0, max_tokens_per_chunk=4)
    for source in ("file", "pipe"):
        calls.clear()
        seen = []
        with pytest.raises(StreamInterrupted) as raised:
            if source == "file":
                transcribe_file(tiny_model, decoding, "samples/jfk.wav", seen.append, duration_s=8.0)
            else:
                transcribe_pcm(tiny_model, decoding, io.BytesIO(pcm), SAMPLE_RATE, seen.append)
        events = raised.value.events
        assert raised.value.terminated == isinstance(raised.value, Terminated) == (stop == "Terminated")
        assert events == seen and events[-1].type == "end" and [e.type for e in events].count("end") == 1
        assert "".join(e.text for e in events if e.type == "final") == events[-1].text
        assert 0 < events[-1].audio_s < 8.0
        # the samples of the feed the stop came in were read in part: audio_s counted none of them (2.56 s of audio,
        # 2.848 s read)
        assert max(e.source_s for e in events) <= events[-1].audio_s


def test_a_stop_inside_a_call_loses_none_of_its_final_text(tiny_model, monkeypatch):
    """Ctrl-C (or SIGTERM) inside a feed or finish that had already committed words: that call's "final" events never
    reached the caller, and close() gave only the uncommitted tail, so the finals printed (jsonl) and the cues made
    of them missed words the "end" event's text holds (on a real clip, a Ctrl-C in finish lost the whole tail but its
    last word). Now close() gives every committed word not yet given in a final event."""
    step, calls = tiny_model.decoder.step, []

    def stopping_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 40:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    def words(_logits) -> int:  # "ab ab ab ...": each space commits a word
        return b"ab "[len(calls) % 3]

    monkeypatch.setattr(tiny_model.decoder, "step", stopping_step)
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=8, max_tail_tokens=10, max_repeats=0)
    session = StreamingSession(tiny_model, decoding, choose=words)
    audio = (0.1 * np.random.default_rng(8).standard_normal(4 * SAMPLE_RATE)).astype(np.float32)
    events = session.feed(audio[:SAMPLE_RATE])
    with pytest.raises(KeyboardInterrupt):
        session.feed(audio[SAMPLE_RATE:])
    given = "".join(e.text for e in events if e.type == "final")
    assert given and len(session.transcript) > len(given) + 3  # words committed inside the stopped feed
    events += session.close()
    assert "".join(e.text for e in events if e.type == "final") == events[-1].text == session.transcript


def test_a_stop_inside_the_last_alignment_loses_no_final_text(tiny_model, monkeypatch):
    """Ctrl-C inside the word alignment that finish() runs as it closes the stream: the alignment is done again by the
    close() that follows (its words are kept), but the "final" events of the tail finish() had written, and of the
    text close() had just committed, were lost: the second close() found that text given. Now it gives it."""
    from speechstream import session as session_module
    from tests.helpers import fine_head_model

    model = fine_head_model(tiny_model)
    real, stops = session_module.segment_words, []

    def stopped_once(*args, **kwargs):
        if not stops:
            stops.append(1)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(session_module, "segment_words", stopped_once)
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=4, max_tail_tokens=10, ctc_weight=0.5)
    audio = (0.1 * np.random.default_rng(2).standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
    alone = StreamingSession(model, decoding, partials=False)
    alone.feed(audio)
    session = StreamingSession(model, decoding, partials=False)
    events = session.feed(audio)
    given = "".join(e.text for e in events if e.type == "final")
    with pytest.raises(KeyboardInterrupt):
        session.finish()
    events += session.close()
    monkeypatch.setattr(session_module, "segment_words", real)
    expected = alone.finish()[-1].text
    assert len(expected) > len(given)  # text written in finish
    assert "".join(e.text for e in events if e.type == "final") == events[-1].text == expected
    assert session.words == alone.words != []
