"""The wait-k policy's decisions."""

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


def test_end_of_chunk_reads_then_feeds_the_marker():
    policy = WaitK(1)
    assert policy.decide(view(pending=EOC)) == Read()
    assert policy.decide(view(pending=EOC, reads_since_prediction=1)) == Write(EOC)


def test_words_are_written_until_the_cap():
    policy = WaitK(1, max_tokens=4)
    assert policy.decide(view(tokens_since_read=3)) == Write()
    assert policy.decide(view(tokens_since_read=4)) == Read()
    assert policy.decide(view(tokens_since_read=4, reads_since_prediction=1)) == Write(EOC)


def test_early_end_is_taken_as_end_of_chunk_and_real_end_stops():
    policy = WaitK(1, max_tail_tokens=5)
    assert policy.decide(view(pending=EOS)) == Read()
    assert policy.decide(view(pending=EOS, reads_since_prediction=1)) == Write(EOC)
    assert policy.decide(view(pending=EOS, source_done=True)) == Stop()
    assert policy.decide(view(pending=EOC, source_done=True)) == Write()
    assert policy.decide(view(source_done=True, tokens_since_read=5)) == Stop()


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
