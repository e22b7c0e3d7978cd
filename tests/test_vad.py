"""Voice activity endpointing and VAD segment resets in the streaming session."""

import numpy as np
import pytest
import torch

from speechstream.audio import SAMPLE_RATE, load_audio
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.session import StreamingSession
from speechstream.vad import Endpoint, Endpointer, SpeechStart, VADConfig
from tests.conftest import text_favouring_chooser
from tests.helpers import ScriptedVAD


def find_endpoints(samples: np.ndarray, config: VADConfig = VADConfig(), feed_size: int = 16_000) -> list[Endpoint]:
    """Run an endpointer over a whole signal in ``feed_size`` buffers: its segment ends, in order."""
    endpointer = Endpointer(config)
    found = []
    for start in range(0, len(samples), feed_size):
        found += endpointer.push(samples[start : start + feed_size])
    return [e for e in found if isinstance(e, Endpoint)]


CLIPS = ["samples/austen-0870.wav", "samples/austen-0880.wav", "samples/austen-0890.wav", "samples/austen-0920.wav"]
DECODING = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=40, vad=True)


@pytest.fixture(scope="module")
def speech_with_pauses():
    """Real clips (no inner pause of 600 ms) each followed by 1 s of silence; returns audio and clip ends."""
    parts, ends, n = [], [], 0
    for path in CLIPS:
        clip = load_audio(path)
        parts += [clip, np.zeros(SAMPLE_RATE, np.float32)]
        n += clip.size
        ends.append(n)
        n += SAMPLE_RATE
    return np.concatenate(parts), ends


def test_endpoints_at_the_inserted_pauses(speech_with_pauses):
    audio, ends = speech_with_pauses
    endpoints = find_endpoints(audio, VADConfig(), feed_size=4000)
    assert len(endpoints) == len(ends)
    for endpoint, end in zip(endpoints, ends):
        assert end - 0.4 * SAMPLE_RATE <= endpoint.speech_end <= end + 0.1 * SAMPLE_RATE
        assert end < endpoint.cut <= end + SAMPLE_RATE  # inside the pause, after min_silence_ms
        assert endpoint.cut - endpoint.speech_end >= 0.6 * SAMPLE_RATE


def test_endpoints_do_not_depend_on_buffer_sizes(speech_with_pauses):
    audio, _ = speech_with_pauses
    results = {size: find_endpoints(audio, VADConfig(), feed_size=size) for size in (100, 4097, audio.size)}
    assert results[100] and results[100] == results[4097] == results[audio.size]


def test_no_endpoint_without_speech_or_in_a_short_pause():
    assert find_endpoints(np.zeros(3 * SAMPLE_RATE, np.float32)) == []
    clip = load_audio("samples/austen-0880.wav")
    gap = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)  # shorter than min_silence_ms
    middle = clip.size // 2  # inside a word: the 300 ms gap is the only pause
    assert find_endpoints(np.concatenate([clip[:middle], gap, clip[middle:]])) == []


class _AlwaysSpeech:
    """A stand-in for the Silero model: every window is speech."""

    def reset_states(self):
        pass

    def __call__(self, window, rate):
        return torch.tensor([[1.0]])


def test_speech_without_a_pause_is_cut_at_twice_the_segment_limit():
    endpointer = Endpointer(VADConfig(), model=_AlwaysSpeech())
    found = endpointer.push(np.zeros(50 * SAMPLE_RATE, np.float32))
    cuts = [e.cut for e in found if isinstance(e, Endpoint)]
    limit = 2 * VADConfig().max_segment_s * SAMPLE_RATE  # 24 s: the hard cut, at a window boundary
    assert cuts and all(0 <= cut - (i + 1) * limit < 512 * (i + 1) for i, cut in enumerate(cuts))
    # each segment starts where the last ended (speech from its first window) and is confirmed 250 ms later
    starts = [e for e in found if isinstance(e, SpeechStart)]
    assert [s.start for s in starts] == [0] + cuts
    assert all(s.confirmed - s.start == 8 * 512 for s in starts)
    assert [type(e) for e in found] == [SpeechStart, Endpoint] * len(cuts) + [SpeechStart]


def test_a_segment_starts_a_pad_before_its_confirmed_speech():
    """Silence, a blip (forgotten after 600 ms of silence), silence, then speech: the segment starts 512 ms (16 windows)
    before the speech's first window, once 250 ms (8 windows) of it have been heard; nothing cuts before it."""
    script = [0.0] * 40 + [0.9] * 3 + [0.0] * 30 + [0.9] * 20 + [0.0] * 5
    endpointer = Endpointer(VADConfig(), model=ScriptedVAD(script))
    assert endpointer.push(np.zeros(42 * 512, np.float32)) == []
    assert endpointer.pending_onset == 40 * 512 and endpointer.keep_from() == 24 * 512  # the blip might be speech
    found = endpointer.push(np.zeros((len(script) - 42) * 512, np.float32))
    assert found == [SpeechStart(start=(73 - 16) * 512, confirmed=(73 + 8) * 512)]
    assert endpointer.speaking and endpointer.keep_from() == (73 - 16) * 512
    early = Endpointer(VADConfig(), model=ScriptedVAD([0.0] * 3 + [0.9] * 8))
    assert early.push(np.zeros(11 * 512, np.float32)) == [SpeechStart(start=0, confirmed=11 * 512)]  # not before 0


def test_long_speech_is_cut_at_its_first_pause_after_the_segment_limit():
    """Real clips run together without pauses, twice (43 s): no pause reaches min_silence_ms, so only the segment
    limit cuts, each time at a short pause after 12 s of segment (the shipped models' longest training utterance
    is 11.9 s)."""
    audio = np.concatenate([load_audio(p) for p in CLIPS * 2])
    assert find_endpoints(audio, VADConfig(max_segment_s=1000.0)) == []
    config = VADConfig()
    endpoints = find_endpoints(audio, config)
    assert len(endpoints) >= 2
    starts = [0] + [e.cut for e in endpoints]
    for start, endpoint in zip(starts, endpoints):
        assert config.max_segment_s * SAMPLE_RATE <= endpoint.cut - start < 2 * config.max_segment_s * SAMPLE_RATE


def feed_all(model, audio, size, decoding=DECODING):
    session = StreamingSession(model, decoding, choose=text_favouring_chooser(model))
    events, trace = [], []
    for start in range(0, audio.size, size):
        before = (session.segment, session.llm_cache_length, session.front.encoder.frames_done)
        events += session.feed(audio[start : start + size])
        trace.append((before, (session.segment, session.llm_cache_length, session.front.encoder.frames_done)))
    events += session.finish()
    return session, events, trace


def test_session_resets_at_pauses(tiny_model, speech_with_pauses):
    audio, ends = speech_with_pauses
    session, events, trace = feed_all(tiny_model, audio, 1600)
    cuts = [e.cut for e in session.endpoints]
    assert len(cuts) == len(ends)
    # each segment starts just before its speech (the pause before it is dropped); after the last cut only silence
    assert session.segment == len(cuts) == len(session.segment_starts)
    assert all(c < s < c + SAMPLE_RATE for c, s in zip(cuts, session.segment_starts[1:]))
    assert session.segment_starts[0] < 0.2 * SAMPLE_RATE
    resets = [(b, a) for b, a in trace if a[0] != b[0]]
    assert len(resets) == len(cuts)
    for before, after in resets:
        assert after[0] == before[0] + 1
        assert after[1] < before[1]  # the LLM cache restarted
        assert after[2] < before[2]  # the encoder restarted (positions from 0)
    # largest LLM cache: one segment's worth, not the whole stream's
    longest_segment = max(np.diff([0] + cuts)) / SAMPLE_RATE
    chunks = int(np.ceil(longest_segment / 0.64)) + 1
    assert max(a[1] for _, a in trace) <= chunks * (8 + 8 + 1) + 40 + 40
    # times are absolute: each segment's text is committed when its last unit (at the cut) was read
    finals = [e for e in events if e.type == "final"]
    assert [e.source_s for e in finals] == sorted(e.source_s for e in finals)
    # each segment's chunk grid starts at its speech start: a final's time is its segment's start + whole chunks
    # (or a cut / the end, for text committed when a segment ends)
    starts, chunk = session.segment_starts, 10240
    anchors = []
    for event in finals:
        at = round(event.source_s * SAMPLE_RATE)
        on_grid = [a for a in starts if a <= at and abs((at - a) - chunk * round((at - a) / chunk)) <= 16]
        assert on_grid or any(abs(at - c) <= 16 for c in cuts + [audio.size]), event
        anchors += on_grid[-1:]
    assert any(a > 0 for a in anchors)  # text of later segments, at absolute times past their cut
    end = events[-1]
    assert end.type == "end" and end.audio_s == pytest.approx(audio.size / SAMPLE_RATE)
    assert "".join(e.text for e in finals) == end.text == session.transcript
    assert end.source_s == pytest.approx(audio.size / SAMPLE_RATE, abs=1e-3)


def test_session_with_vad_does_not_depend_on_feed_size(tiny_model, speech_with_pauses):
    audio, _ = speech_with_pauses
    audio = audio[: 3 * SAMPLE_RATE + audio.size // 2]
    results = [feed_all(tiny_model, audio, size)[:2] for size in (999, 16000, audio.size)]
    finals = [[(e.text, e.source_s) for e in events if e.type == "final"] for _, events in results]
    assert finals[0] == finals[1] == finals[2]
    assert results[0][0].target_ids == results[1][0].target_ids == results[2][0].target_ids
    assert results[0][0].segment >= 2


def test_vad_without_a_pause_is_the_plain_session(tiny_model):
    """No endpoint: the VAD session reads and writes exactly what the session without VAD does."""
    audio = load_audio("samples/austen-0880.wav")
    plain = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=40)
    with_vad, events_vad, _ = feed_all(tiny_model, audio, 3000)
    without, events_plain, _ = feed_all(tiny_model, audio, 3000, plain)
    assert with_vad.endpoints == [] and with_vad.segment == 0
    assert with_vad.target_ids == without.target_ids
    strip = lambda events: [(e.type, e.text, e.source_s) for e in events]  # noqa: E731
    assert strip(events_vad) == strip(events_plain)


def test_outside_driver_contract(tiny_model, speech_with_pauses):
    """own_llm=False: a driver that gives the stream a fresh row whenever ``segment`` changes gets the same text."""
    audio, _ = speech_with_pauses
    audio = audio[: 2 * SAMPLE_RATE + audio.size // 2]
    own, _, _ = feed_all(tiny_model, audio, 4000)
    session = StreamingSession(tiny_model, DECODING, choose=text_favouring_chooser(tiny_model), own_llm=False)
    state, row_segment, resets = tiny_model.decoder.new_state(1), 0, 0

    def drive():
        nonlocal state, row_segment, resets
        while True:
            if session.segment != row_segment:  # the contract: a fresh row before the next request
                state, row_segment, resets = tiny_model.decoder.new_state(1), session.segment, resets + 1
            request = session.next_request()
            if request is None:
                if session.segment != row_segment:
                    continue
                return
            session.apply(request, tiny_model.decoder.step(state, request.embeds[None], request.kinds[None])[0])

    with torch.no_grad():
        for start in range(0, audio.size, 4000):
            session.feed(audio[start : start + 4000])
            drive()
        session.end_audio()
        drive()
    session.close()
    assert resets == own.segment >= 2
    assert session.target_ids == own.target_ids and session.transcript == own.transcript


@pytest.mark.parametrize("n", [3, 400])
def test_context_tokens_are_fed_not_emitted(tiny_model, speech_with_pauses, n):
    """The last ``n`` tokens of the text committed so far (400: all of it, across segments), tokenized again."""
    audio, _ = speech_with_pauses
    audio = audio[: 2 * SAMPLE_RATE + audio.size // 2]
    decoding = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=40, vad=True,
                              context_tokens=n)
    session, events, _ = feed_all(tiny_model, audio, 4000, decoding)
    header = list(tiny_model.header_ids)
    starts = [i for i in range(len(session.target_ids)) if session.target_ids[i : i + len(header)] == header]
    assert len(starts) == session.segment + 1 >= 2
    text_so_far: list[int] = []
    committed = ""  # the text committed before the segment: a space between segments' texts
    for start, stop in zip(starts, starts[1:] + [len(session.target_ids)]):
        fed = session.target_ids[start + len(header) : stop]
        # the previous text as committed, tokenized again, right after the header
        context = tiny_model.tokenizer.encode(committed, add_special_tokens=False)[-n:] if committed else []
        assert fed[: len(context)] == context
        ids = [t for t in fed[len(context) :] if t not in tiny_model.special_ids]
        text_so_far += ids
        piece = tiny_model.tokenizer.decode(ids).strip()
        committed = f"{committed} {piece}" if committed and piece else committed or piece
    assert committed == session.transcript
    assert text_so_far == session.text.ids  # context tokens were not emitted again
    finals = [e.text for e in events if e.type == "final"]
    assert "".join(finals) == session.transcript


def test_silence_before_speech_is_not_decoded(tiny_model):
    """8 s of silence, then a clip: the session drops the silence up to 512 ms before the speech, so it reads and
    writes exactly what a session started at that sample does, at times shifted by the dropped audio."""
    clip = load_audio("samples/austen-0880.wav")
    lead = 8 * SAMPLE_RATE
    with_lead, events_lead, _ = feed_all(tiny_model, np.concatenate([np.zeros(lead, np.float32), clip]), 3000)
    start = with_lead.segment_starts[0]
    assert lead - 0.52 * SAMPLE_RATE <= start <= lead and start % 512 == 0 and with_lead.endpoints == []
    plain = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=40)
    alone, events_alone, _ = feed_all(tiny_model, clip[start - lead :] if start >= lead else
                                      np.concatenate([np.zeros(lead - start, np.float32), clip]), 3000, plain)
    assert with_lead.target_ids == alone.target_ids and with_lead.stats == alone.stats
    shift = start / SAMPLE_RATE
    strip = lambda events, dt: [(e.type, e.text, round(e.source_s + dt, 3)) for e in events]  # noqa: E731
    assert strip(events_lead, 0) == strip(events_alone, shift)


def test_silence_alone_writes_nothing(tiny_model):
    """No speech at all: nothing is encoded or written, and the end event still accounts for all the audio."""
    session, events, _ = feed_all(tiny_model, np.zeros(5 * SAMPLE_RATE, np.float32), 4000)
    assert session.target_ids == [] and session.stats == [] and session.segment_starts == []
    assert [e.type for e in events] == ["end"] and events[-1].text == ""
    assert events[-1].source_s == events[-1].audio_s == 5.0


def test_a_short_word_at_the_end_is_still_read(tiny_model):
    """Speech heard but shorter than min_speech_ms when the audio ends is decoded (not dropped as a blip)."""
    clip = load_audio("samples/austen-0880.wav")
    audio = np.concatenate([np.zeros(SAMPLE_RATE, np.float32), clip[: int(0.45 * SAMPLE_RATE)]])
    session, events, _ = feed_all(tiny_model, audio, 4000)
    assert len(session.segment_starts) == 1 and session.stats


def _scripted_session(model, script, own_llm=True):
    decoding = DecodingConfig(chunk_ms=160, k=1, max_tokens_per_chunk=4, max_tail_tokens=10, vad=True)
    session = StreamingSession(model, decoding, choose=text_favouring_chooser(model), own_llm=own_llm)
    session.router.vad.model = ScriptedVAD(script)
    return session


def test_speech_still_unconfirmed_at_the_end_comes_out_as_final_events(tiny_model):
    """The words of a last sound shorter than min_speech_ms are read by finish(), and its final events are returned
    (end_audio only queues the audio; it used to run the LLM and drop those events)."""
    session = _scripted_session(tiny_model, [0.0] * 10 + [0.9] * 6)
    audio = (np.random.default_rng(0).standard_normal(16 * 512) * 0.1).astype(np.float32)
    events = session.feed(audio) + session.finish()
    finals = "".join(e.text for e in events if e.type == "final")
    assert events[-1].text and finals == events[-1].text == session.transcript


def test_a_batched_stream_ending_in_silence_ends_at_the_end_of_its_audio(tiny_model):
    """Speech, a cut, 1.9 s of silence, all fed before the driver runs: the end event's time is the end of the
    audio (all of it has been passed), not the last cut."""
    from speechstream.batch import DynamicBatch

    script = [0.0] * 5 + [0.9] * 30 + [0.0] * 90
    audio = (np.random.default_rng(1).standard_normal(len(script) * 512) * 0.1).astype(np.float32)
    session = _scripted_session(tiny_model, script, own_llm=False)
    batch = DynamicBatch(tiny_model)
    batch.join(session)
    with torch.no_grad():
        events = session.feed(audio)
        session.end_audio()
        while (served := batch.step()) is not None:
            for more in served.values():
                events += more
        events += session.pending_events() + session.close()
    assert len(session.endpoints) == 1
    assert events[-1].source_s == events[-1].audio_s == audio.size / SAMPLE_RATE
    assert "".join(e.text for e in events if e.type == "final") == events[-1].text



def test_speech_never_confirmed_is_forgotten_after_the_segment_limit(tiny_model):
    """One speech window, then a minute of audio between the thresholds (neither speech nor silence, so it neither
    confirms the speech nor forgets it as a blip): after max_segment_s the onset is forgotten, so the audio the session
    holds for it stays bounded. It used to hold (and copy at every feed) all the audio since that window."""
    session = _scripted_session(tiny_model, [0.0] * 4 + [0.9] + [0.4] * (60 * SAMPLE_RATE // 512))
    config = session.router.vad.config
    held = []
    for _ in range(60):
        session.feed(np.zeros(SAMPLE_RATE, np.float32))
        held.append(session.router.waiting)
    assert max(held) <= (config.max_segment_s + config.speech_pad_ms / 1000) * SAMPLE_RATE + 512
    assert session.router.vad.pending_onset is None and held[-1] <= config.speech_pad_ms * SAMPLE_RATE // 1000 + 512
    events = session.finish()
    assert session.segment_starts == [] and session.stats == [] and [e.type for e in events] == ["end"]
    assert events[-1].source_s == 60.0


class _Loudness:
    """A stand-in for the Silero model whose speech probability follows each window's loudness (10 x RMS), so that
    random noise gives random segments that depend on the audio alone, not on the call order."""

    def reset_states(self):
        pass

    def __call__(self, window, rate):
        return torch.tensor([[min(1.0, 10 * float(window.pow(2).mean().sqrt()))]])


def _random_case(rng):
    """A decoding config (VAD on or off), VAD options, and audio of stretches of silence and noise at loudness
    below, between and above the VAD thresholds (0, 0.3, 0.4, 1), some of them shorter than a window."""
    chunk_ms, k = int(rng.choice([40, 160, 320, 640])), int(rng.integers(1, 3))
    vad, silence_ms = bool(rng.random() < 0.75), int(rng.choice([64, 300]))
    decoding = DecodingConfig(chunk_ms=chunk_ms, k=k, max_tokens_per_chunk=4, max_tail_tokens=10, vad=vad,
                              vad_min_silence_ms=silence_ms if vad else DecodingConfig.vad_min_silence_ms)
    config = VADConfig(min_silence_ms=silence_ms, min_speech_ms=int(rng.choice([32, 250])),
                       max_segment_s=float(rng.choice([0.5, 12.0])), speech_pad_ms=int(rng.choice([0, 512])))
    parts = [float(rng.choice([0.0, 0.03, 0.04, 0.2, 0.2])) * rng.standard_normal(int(rng.integers(1, 12000)))
             for _ in range(int(rng.integers(1, 12)))]
    audio = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    return decoding, config, audio


def _random_slices(rng, n):
    """Feed sizes adding up to n: empty feeds, single samples, and buffers of up to 1.25 s."""
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(n - sum(sizes), int(rng.choice([0, 1, rng.integers(2, 2000), rng.integers(2000, 20000)]))))
    return sizes + [0]


def _check_events(events, session, audio):
    end = events[-1]
    assert [e.type for e in events].count("end") == 1 and end.type == "end"
    assert all(a.source_s <= b.source_s and a.wall_s <= b.wall_s for a, b in zip(events, events[1:]))
    assert "".join(e.text for e in events if e.type == "final") == end.text == session.transcript
    assert end.audio_s == round(audio.size / SAMPLE_RATE, 6) and end.source_s == round(audio.size / SAMPLE_RATE, 3)
    starts = session.segment_starts
    assert starts == sorted(set(starts)) and all(0 <= s < audio.size for s in starts)
    assert all(c <= s for c, s in zip([e.cut for e in session.endpoints], starts[1:]))


def test_random_streams_alone_sliced_and_batched_give_the_same_events(tiny_model, monkeypatch):
    """A seeded mini-fuzz of the streaming invariants, VAD on and off: a stream fed whole, fed in random slices
    (empty, single samples, long), and fed in those slices inside a dynamic batch that streams join and leave at
    different times, gives the same events (the batch: the same final and end events), in order of time."""
    from speechstream.batch import DynamicBatch

    monkeypatch.setattr("speechstream.vad.load_vad_model", _Loudness)
    choose = text_favouring_chooser(tiny_model)
    cases = [_random_case(np.random.default_rng(seed)) for seed in range(20)]
    slices = [_random_slices(np.random.default_rng(100 + seed), audio.size) for seed, (_, _, audio) in
              enumerate(cases)]

    def session(decoding, config, own_llm=True):
        made = StreamingSession(tiny_model, decoding, choose=choose, own_llm=own_llm)
        if made.router.vad is not None:
            made.router.vad.config = config
        return made

    expected = []
    for (decoding, config, audio), sizes in zip(cases, slices):
        whole = session(decoding, config)
        events = whole.feed(audio) + whole.finish()
        _check_events(events, whole, audio)
        sliced = session(decoding, config)
        pieces = [sliced.feed(piece) for piece in np.split(audio, np.cumsum(sizes)[:-1])]
        sliced_events = sum(pieces, []) + sliced.finish()
        strip = lambda events: [(e.type, e.text, e.source_s) for e in events]  # noqa: E731
        assert strip(sliced_events) == strip(events)
        assert (sliced.target_ids, sliced.segment_starts) == (whole.target_ids, whole.segment_starts)
        expected.append((strip(e for e in events if e.type != "partial"), whole.segment_starts))
    assert sum(bool(e[0][-1][1]) for e in expected) >= 5 and sum(len(e[1]) > 1 for e in expected) >= 3

    batch, batched = DynamicBatch(tiny_model), [session(d, c, own_llm=False) for d, c, _ in cases]
    got = [[] for _ in cases]
    with torch.no_grad():
        for t in range(max(len(s) for s in slices) + 3 * len(cases)):
            for i, (stream, (_, _, audio), sizes) in enumerate(zip(batched, cases, slices)):
                j = t - 3 * i  # stream i joins at round 3 i, then gets a slice a round
                if j == 0:
                    batch.join(stream)
                if 0 <= j < len(sizes):
                    got[i] += stream.feed(audio[sum(sizes[:j]) : sum(sizes[: j + 1])])
                elif j == len(sizes):
                    stream.end_audio()
            for stream, events in zip(list(batch.sessions), batch.run()):
                i = batched.index(stream)
                got[i] += events + stream.pending_events()
                if stream._audio_done and not stream.waiting_for_llm:
                    got[i] += stream.close()
                    batch.leave(stream)
    assert len(batch) == 0
    for (_, _, audio), stream, events, (want, starts) in zip(cases, batched, got, expected):
        _check_events(events, stream, audio)
        assert [(e.type, e.text, e.source_s) for e in events if e.type != "partial"] == want
        assert stream.segment_starts == starts


@pytest.mark.parametrize("vad", [True, False])
def test_a_gap_ends_the_segment_and_keeps_the_timeline(tiny_model, monkeypatch, vad):
    """Audio lost before it reached the session (``live``: the capture queue was full) is a gap: the speech before it
    is read and committed as at a VAD cut, what follows is decoded as a fresh stream would be, and every time after it
    (events, segment starts, the end's audio_s) counts the lost samples."""
    monkeypatch.setattr("speechstream.vad.load_vad_model", _Loudness)
    choose = text_favouring_chooser(tiny_model)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=4, max_tail_tokens=10, vad=vad)
    rng = np.random.default_rng(7)
    before, after = [(0.2 * rng.standard_normal(n)).astype(np.float32) for n in (32_000, 24_000)]
    lost = 59_233  # 3.7 s, not a whole number of VAD windows

    def run(*parts):
        session = StreamingSession(tiny_model, decoding, choose=choose)
        events = []
        for part in parts:
            if isinstance(part, int):
                events += session.gap(part)
            else:
                for start in range(0, max(part.size, 1), 1600):  # (an empty part: one empty feed)
                    events += session.feed(part[start : start + 1600])
        return session, events + session.finish()

    gapped, events = run(before, lost, after)
    (first, first_events), (second, second_events) = run(before), run(after)
    offset = (before.size + lost) / SAMPLE_RATE
    finals = [(e.text, e.source_s) for e in events if e.type == "final"]
    expected = [(e.text, e.source_s) for e in first_events if e.type == "final"]
    expected += [(e.text, e.source_s + offset) for e in second_events if e.type == "final"]
    assert first.transcript and second.transcript and gapped.transcript == first.transcript + " " + second.transcript
    assert [t.strip() for t, _ in finals] == [t.strip() for t, _ in expected]
    assert [s for _, s in finals] == pytest.approx([s for _, s in expected], abs=1e-3)
    after_gap = sum(e.type == "final" for e in second_events)
    assert after_gap and all(s > offset for _, s in finals[-after_gap:])  # the text after the gap is timed after it
    total = (before.size + lost + after.size) / SAMPLE_RATE
    assert events[-1].audio_s == pytest.approx(total) and events[-1].source_s == pytest.approx(total, abs=1e-3)
    assert gapped.lost_samples == lost and gapped.segment == 1  # one segment end: at the gap
    shifted = [s + before.size + lost for s in second.segment_starts]
    assert gapped.segment_starts == first.segment_starts + (shifted if vad else [before.size + lost])
    # a gap at the end (an empty feed after it too): nothing more is read, the end is where the stream ends
    ended, events = run(before, lost, np.zeros(0, np.float32))
    assert ended.transcript == first.transcript and ended.segment_starts == first.segment_starts
    end = (before.size + lost) / SAMPLE_RATE
    assert events[-1].audio_s == pytest.approx(end) and events[-1].source_s == pytest.approx(end, abs=1e-3)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InputError, match="gap"):
            StreamingSession(tiny_model, decoding, choose=choose).gap(bad)
    with pytest.raises(InputError, match="finished"):
        ended.gap(1)


def test_loading_the_vad_keeps_torchs_threads():
    """silero_vad sets torch's CPU threads to 1 at import: every command with the VAD on (transcribe, live, serve)
    ran on one thread whatever it asked for. A fresh process, as the import happens once."""
    import pathlib
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(2); from speechstream.vad import load_vad_model; "
            "load_vad_model(); print(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr


def test_streams_share_one_onnx_session_with_states_of_their_own(tiny_model, monkeypatch):
    """Every stream with the VAD on (each utterance of ``eval --vad``, each ``serve`` stream) built a new ONNX
    session, 130 ms each; they now share one, and interleaved streams still get the probabilities each gets alone."""
    import silero_vad

    from speechstream import vad
    from speechstream.transcribe import transcribe_file

    loads = []
    real = silero_vad.load_silero_vad
    monkeypatch.setattr(silero_vad, "load_silero_vad", lambda *a, **k: loads.append(1) or real(*a, **k))
    for _ in range(3):
        transcribe_file(tiny_model, DECODING, CLIPS[1], lambda event: None, offset_s=0.5, duration_s=1.0)
    assert len(loads) <= 1  # (none where an earlier test loaded it already)

    first, second = vad.load_vad_model(), vad.load_vad_model()
    assert first.session is second.session and first is not second
    clips = [torch.from_numpy(load_audio(path)[: 40 * 512]) for path in CLIPS[:2]]
    alone = []
    for clip in clips:
        model = vad.load_vad_model()
        alone.append([float(model(window, SAMPLE_RATE)) for window in clip.split(512)])
    interleaved = [[], []]
    for windows in zip(*(clip.split(512) for clip in clips)):
        for model, window, out in zip((first, second), windows, interleaved):
            out.append(float(model(window, SAMPLE_RATE)))
    assert interleaved == alone
    assert max(alone[0]) > 0.5  # (speech: the recurrent state matters)
