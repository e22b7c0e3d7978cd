"""Translation training targets: target words placed proportionally to the source words heard."""

from pathlib import Path

import pytest

from speechstream.targets import TimedWord, translation_chunk_texts
from speechstream.train import Example, TrainConfig, read_examples
from speechstream.train.examples import example_pieces


def _source(ends):
    return [TimedWord(f"w{index}", end) for index, end in enumerate(ends)]


def test_proportional_rule_with_lag():
    # 4 source words ending at 0.5, 1.0, 1.5, 2.0 s; chunks of 0.5 s; 2 target words
    source = _source([0.5, 1.0, 1.5, 2.0])
    # lag 0: target word 1 waits for source word ceil(1 * 4 / 2) = 2 (ends 1.0 s, + 0.1 margin -> segment 2);
    # target word 2 waits for source word 4 (2.0 s + 0.1 -> segment 4, the last)
    pieces = translation_chunk_texts(["Hello", "world."], source, 0.5, 5, margin_s=0.1, lag_words=0)
    assert pieces == ["", "", " Hello", "", " world."]
    # lag 1: target word 1 waits for source word 3 (1.5 s -> segment 3)
    pieces = translation_chunk_texts(["Hello", "world."], source, 0.5, 5, margin_s=0.1, lag_words=1)
    assert pieces == ["", "", "", " Hello", " world."]
    # 3 target words over 4 source words: word i waits for source word ceil(4 i / 3) = 2, 3, 4 (a fraction rounded
    # up: a mutation that rounded it down, so the first word waited for source word 1 only, passed every test)
    pieces = translation_chunk_texts(["x", "y", "z"], source, 0.5, 5, margin_s=0.1, lag_words=0)
    assert pieces == ["", "", " x", " y", " z"]
    # source word times out of order (an alignment error): target word 3 waits for source word 3, which ends before
    # source word 2, yet is not placed before target word 2 (a mutation that dropped this rule passed)
    pieces = translation_chunk_texts(["a", "b", "c", "d"], _source([0.5, 2.0, 1.0, 2.2]), 0.5, 5, lag_words=0)
    assert pieces == ["", " a", "", "", " b c d"]


def test_translation_pieces_keep_order_and_all_words():
    source = _source([0.3, 0.9, 1.4, 2.2, 2.9, 3.3])
    target = "In the beginning God created the heavens and the earth.".split()
    pieces = translation_chunk_texts(target, source, 0.64, 6, lag_words=1)
    assert "".join(pieces).split() == target
    placed = [index for index, piece in enumerate(pieces) for _ in piece.split()]
    assert placed == sorted(placed) and placed[-1] == 5  # the last word waits for the last source word
    # a target word is never written before the source has covered the same fraction of its words
    for position, segment in enumerate(placed, 1):
        covered = sum(1 for word in source if word.end_s + 0.1 <= (segment + 1) * 0.64)
        assert covered / len(source) >= position / len(target) - 1e-9


def test_translation_without_source_times():
    pieces = translation_chunk_texts(["a", "b", "c", "d"], [], 1.0, 4, margin_s=0.0, lag_words=0, speech_end_s=4.0)
    assert pieces == [" a", " b", " c", " d"]
    assert translation_chunk_texts(["a", "b"], [], 1.0, 3) == ["", "", " a b"]
    assert translation_chunk_texts([], _source([1.0]), 1.0, 2) == ["", ""]


def test_example_pieces_by_task():
    example = Example("u1", Path("u1.wav"), "Y dijo Dios", (TimedWord("y", 0.2), TimedWord("dijo", 0.7),
                                                            TimedWord("dios", 1.2)), "God said")
    translate = TrainConfig(model="m", train_manifest="t", task="translate", lag_words=0, word_margin_s=0.0)
    pieces, ctc_text = example_pieces(example, 0.64, 2, translate, 1.5)
    assert ctc_text == " Y dijo Dios"  # CTC aligns the speech to the Spanish transcript
    assert "".join(pieces).split() == ["God", "said"]
    asr = TrainConfig(model="m", train_manifest="t")
    pieces, ctc_text = example_pieces(example, 0.64, 2, asr, 1.5)
    assert pieces == [" Y", " dijo Dios"] and ctc_text == " Y dijo Dios"  # by end time + 0.1 s margin


def test_read_examples_needs_translations_for_translate(tmp_path):
    from speechstream.errors import InputError

    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "audio": "a.wav", "text": "hola", "translation": "hello"}\n'
                        '{"id": "b", "audio": "b.wav", "text": "adiós"}\n')
    import numpy as np
    import soundfile

    for name in ("a.wav", "b.wav"):  # (read_examples reads the audio's header: its length, for max_audio_s)
        soundfile.write(str(tmp_path / name), np.zeros(1600, dtype=np.float32), 16000)
    assert [example.translation for example in read_examples(str(manifest))] == ["hello", None]
    with pytest.raises(InputError, match=":2: bad manifest line"):
        read_examples(str(manifest), task="translate")
