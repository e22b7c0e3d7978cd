"""The wait-k policy's decisions."""

import pytest

from speechstream.policy import Read, Stop, StreamView, WaitK, Write

EOC, EOS, WORD = 100, 101, 7


def view(**changes):
    base = dict(units_read=2, source_done=False, pending=WORD, reads_since_prediction=0, tokens_since_read=1,
                eoc_id=EOC, eos_id=EOS)
    base.update(changes)
    return StreamView(**base)


def test_reads_k_units_before_the_header():
    policy = WaitK(3)
    assert policy.decide(view(units_read=0, pending=None)) == Read()
    assert policy.decide(view(units_read=2, pending=None)) == Read()
    assert policy.decide(view(units_read=3, pending=None)) == Write()
    assert policy.decide(view(units_read=1, pending=None, source_done=True)) == Write()


def test_wait_k_needs_k_of_at_least_one():
    with pytest.raises(ValueError, match="k >= 1"):
        WaitK(0)
    assert WaitK(1).k == 1


def test_wait_k_refuses_caps_that_would_stop_its_writing():
    """``DecodingConfig`` refuses these; a ``WaitK`` made by hand (``StreamingSession(policy=...)``) took them and
    wrote nothing: with ``max_repeats=1`` every token is a block repeated once, so no text token was ever written."""
    for caps, name in (({"max_repeats": 1}, "max_repeats"), ({"max_repeats": -1}, "max_repeats"),
                       ({"max_tokens": 0}, "max_tokens"), ({"max_tail_tokens": 0}, "max_tail_tokens")):
        with pytest.raises(ValueError, match=name):
            WaitK(1, **caps)
    assert WaitK(1, max_tokens=1, max_tail_tokens=1, max_repeats=0).max_repeats == 0
    assert WaitK(1, max_repeats=2).max_repeats == 2


def test_end_of_chunk_reads_then_feeds_the_marker():
    policy = WaitK(1)
    assert policy.decide(view(pending=EOC)) == Read()
    assert policy.decide(view(pending=EOC, reads_since_prediction=1)) == Write(EOC)


def test_words_are_written_until_the_cap():
    policy = WaitK(1, max_tokens=4)
    assert policy.decide(view(text_since_read=3)) == Write()
    assert policy.decide(view(text_since_read=4)) == Read()
    assert policy.decide(view(text_since_read=4, reads_since_prediction=1)) == Write(EOC)
    assert policy.decide(view(text_since_read=3, tokens_since_read=15)) == Write()  # header and markers: not counted


def test_max_tokens_per_chunk_counts_the_text_tokens_written_after_each_read(tiny_model):
    """The cap counted every target token since the read: the assistant header (11 tokens in the tiny model) and the
    end-of-chunk marker fed after a read. With --max-tokens-per-chunk 12 the header's chunk got 1 text token and a
    chunk that began with its marker 11. Now each read is followed by exactly 12 text tokens when the model never
    asks for the next chunk."""
    import numpy as np

    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    letters = [ord(c) for c in "abcdefgh"]
    said = []

    def chatty(_logits) -> int:  # an LLM that asks for the next chunk once (after its first word), then never
        said.append(tiny_model.eoc_id if len(said) == 1 else letters[len(said) % len(letters)])
        return said[-1]

    decoding = DecodingConfig(chunk_ms=640, k=1, max_tokens_per_chunk=12, max_tail_tokens=5, max_repeats=0)
    session = StreamingSession(tiny_model, decoding, choose=chatty, partials=False)
    runs, step = [], session.next_request

    def counting_step():  # the text tokens that follow each read
        request = step()
        if request is not None and bool((request.kinds == 1).any()):
            runs.append(0)
        if request is not None and request.is_text:
            runs[-1] += sum(token not in tiny_model.special_ids for token in request.tokens)
        return request

    session.next_request = counting_step
    session.feed((0.1 * np.random.default_rng(0).standard_normal(16000 * 4)).astype(np.float32))
    session.finish()
    header = len(tiny_model.header_ids)
    assert session.target_ids[header : header + 3] == [letters[0], tiny_model.eoc_id, letters[2]]  # marker, text
    # the tail: max_tail_tokens target tokens, the marker that follows the last read (the cap's) and 4 text tokens
    assert runs[:-1] == [1, 12, 12, 12, 12, 12] and runs[-1] == 4


def test_early_end_is_taken_as_end_of_chunk_and_real_end_stops():
    policy = WaitK(1, max_tail_tokens=5)
    assert policy.decide(view(pending=EOS)) == Read()
    assert policy.decide(view(pending=EOS, reads_since_prediction=1)) == Write(EOC)
    assert policy.decide(view(pending=EOS, source_done=True)) == Stop()
    assert policy.decide(view(pending=EOC, source_done=True)) == Write()
    assert policy.decide(view(source_done=True, tokens_since_read=5)) == Stop()


def test_a_read_for_the_pending_prediction_is_followed_by_the_end_of_chunk_marker():
    """Whatever asked for the read (the model's marker, an early end, the cap, a loop), the marker is fed after it in
    place of the pending prediction, the last read too: text row r then sees k + #markers chunks, as in training. The
    session's view after a read has text_since_read 0, so the cap's read was followed by the pending word with no
    marker (every later row saw one chunk more than its training mask), and an end predicted before the last chunk
    stopped the stream once that chunk was read, before any text row saw it."""
    policy = WaitK(1, max_tokens=4, max_repeats=3)
    after_read = dict(reads_since_prediction=1, tokens_since_read=0, text_since_read=0)
    assert policy.decide(view(text_since_read=4)) == Read()
    assert policy.decide(view(**after_read)) == Write(EOC)  # the cap's read, as the session shows it
    assert policy.decide(view(pending=EOS, source_done=True, **after_read)) == Write(EOC)  # the last chunk: on
    assert policy.decide(view(recent=(WORD, WORD), source_done=True, **after_read)) == Write(EOC)
    assert policy.decide(view(pending=EOS, source_done=True)) == Stop()  # an end predicted after the last read


def test_an_end_predicted_before_the_last_chunk_is_read_writes_that_chunks_words(tiny_model):
    import numpy as np

    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    said = [ord("a"), tiny_model.eos_id, ord("b"), tiny_model.eos_id]
    choices = iter(said + [tiny_model.eos_id] * 10)
    decoding = DecodingConfig(chunk_ms=640, k=1, max_repeats=0)
    session = StreamingSession(tiny_model, decoding, choose=lambda _logits: next(choices), partials=False)
    session.feed(np.zeros(10240 + 800, np.float32))  # one chunk, then a tail: the last unit
    events = session.finish()
    header = len(tiny_model.header_ids)
    assert session.target_ids[header:] == [ord("a"), tiny_model.eoc_id, ord("b")]
    assert events[-1].text == "ab"


def test_repeats_at_end():
    from speechstream.policy import repeats_at_end

    assert repeats_at_end((1, 2, 3, 3, 3, 3), 4)
    assert repeats_at_end((9, 5, 6, 5, 6, 5, 6, 5, 6), 4)
    assert not repeats_at_end((5, 6, 5, 6, 5, 6), 4)
    assert not repeats_at_end((1, 2, 3, 4, 5, 6, 7, 8), 2)
    assert not repeats_at_end((), 3)


def test_repetition_guard_reads_on_or_stops():
    policy = WaitK(1, max_repeats=3)
    looping = (WORD, WORD)
    assert policy.decide(view(recent=looping)) == Read()
    assert policy.decide(view(recent=looping, reads_since_prediction=1)) == Write(EOC)
    assert policy.decide(view(recent=looping, source_done=True)) == Stop()
    assert policy.decide(view(recent=(WORD, 3))) == Write()
    assert WaitK(1, max_repeats=0).decide(view(recent=looping)) == Write()


def test_the_repetition_guard_sees_loops_across_chunk_ends_up_to_twelve_tokens():
    from speechstream.policy import repeats_at_end

    block = tuple(range(1, 13))  # twelve distinct tokens
    assert repeats_at_end(block * 3 + block[:-1] + (12,), 4)
    assert not repeats_at_end((0,) + tuple(range(1, 14)) * 4, 4)  # period 13: beyond the guard
    # "but you can <eoc> do everything <eoc> your country . <eoc>" three times, then the fourth "but you can ... ."
    said = (20, 21, 22, EOC, 23, 24, EOC, 25, 26, 27, EOC)
    recent = said * 3 + said[:-2]
    policy = WaitK(1, max_repeats=4)
    assert policy.decide(view(recent=recent, pending=27, source_done=True)) == Stop()
    assert policy.decide(view(recent=recent, pending=26, source_done=True)) == Write()


def _longest_repeat_run(tokens: list[int], period: int) -> int:
    """The most times in a row any block of ``period`` tokens occurs in ``tokens``."""
    best = 0
    for start in range(len(tokens) - period + 1):
        block, runs = tokens[start : start + period], 1
        while tokens[start + runs * period : start + (runs + 1) * period] == block:
            runs += 1
        best = max(best, runs)
    return best


@pytest.mark.parametrize("max_repeats, period, eoc_every", [(4, 12, 2), (4, 12, 1), (6, 12, 0), (8, 10, 0)])
def test_a_session_stops_a_loop_however_many_chunk_ends_it_spans_and_at_any_max_repeats(tiny_model, max_repeats,
                                                                                        period, eoc_every):
    """The session showed the policy its last 64 target tokens, end-of-chunk markers included: a loop of 12 tokens
    with a chunk end every two (72 tokens for 4 repeats) or --max-repeats 6 (72 tokens) was never caught."""
    import numpy as np

    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    block = [ord(c) for c in "abcdefghijkl"[:period]]  # the tiny model's byte tokens
    script = [t for i, t in enumerate(block) for t in ([t, tiny_model.eoc_id] if eoc_every and (i + 1) % eoc_every
                                                        == 0 else [t])]
    written = []

    def looping(_logits) -> int:  # an LLM stuck in a loop: the script again and again, whatever it hears
        written.append(script[len(written) % len(script)])
        return written[-1]

    decoding = DecodingConfig(chunk_ms=640, k=1, max_repeats=max_repeats)
    session = StreamingSession(tiny_model, decoding, choose=looping, partials=False)
    session.feed((0.1 * np.random.default_rng(0).standard_normal(16000 * 8)).astype(np.float32))
    session.finish()
    text = [t for t in session.target_ids[len(tiny_model.header_ids) :] if t != tiny_model.eoc_id]
    assert len(text) >= max_repeats * period - 1  # it wrote the loop until the guard had to act ...
    assert _longest_repeat_run(text, period) == max_repeats - 1  # ... and never a block max_repeats times in a row


def test_the_guard_catches_exact_blocks_only_a_near_loop_and_rhetorical_repeats_are_written():
    """What the guard sees, in words standing for tokens: a block that varies ("A question. A question. A country.",
    the jfk.wav run-on of MODEL_CARD.md) is a loop only once that whole pattern repeats; no rule on fewer repeats
    would spare speech that repeats itself (the run-on is the end-of-audio rule's to stop: TAIL_MARGIN)."""
    from speechstream.policy import repeats_at_end

    ids: dict[str, int] = {}

    def tokens(text: str) -> tuple[int, ...]:
        return tuple(ids.setdefault(word, len(ids)) for word in text.split())

    near = "A question . A question . A country ."
    assert not repeats_at_end(tokens(near), 4)
    assert not repeats_at_end(tokens(f"{near} {near} {near}"), 4)
    assert repeats_at_end(tokens(f"{near} {near} {near} {near}"), 4)  # a block of nine, four times
    speech = "we shall fight on the beaches we shall fight on the landing grounds we shall fight in the fields"
    assert not any(repeats_at_end(tokens(speech)[:end], 4) for end in range(1, len(speech.split()) + 1))
    assert not repeats_at_end(tokens("no no no"), 4) and repeats_at_end(tokens("no no no no"), 4)
