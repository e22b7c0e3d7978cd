"""Quality metrics: WER/CER on handcrafted pairs, the English normaliser, BLEU/chrF against sacrebleu."""

from __future__ import annotations

import json

import pytest
import sacrebleu

from speechstream.eval.quality import (
    bleu,
    cer,
    chrf,
    normalize_english,
    number_to_words,
    ordinal_to_words,
    transcription_scores,
    translation_scores,
    wer,
)


def test_wer_substitution_and_deletion():
    # "sat" -> "sit" (substitution), second "the" deleted: 2 errors over 6 reference words.
    assert wer(["the cat sit on mat"], ["the cat sat on the mat"]) == pytest.approx(100 * 2 / 6)


def test_wer_pools_errors_over_the_corpus():
    # 0 errors over 3 words and 1 deletion over 2 words: 1/5, not the mean of 0 and 1/2.
    assert wer(["a b c", "x"], ["a b c", "x y"]) == pytest.approx(20.0)


def test_wer_insertions_can_exceed_100():
    assert wer(["a b c d"], ["z"]) == pytest.approx(400.0)


def test_wer_raw_is_case_and_punctuation_sensitive():
    assert wer(["Hello, world."], ["hello world"]) == pytest.approx(100.0)
    assert wer(["Hello, world."], ["hello world"], normalize=True) == 0.0


def test_wer_empty_reference_and_errors():
    assert wer(["a b", "c"], ["", "c"]) == pytest.approx(200.0)  # two insertions over one word
    assert wer([""], ["a b"]) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        wer(["a"], [""])
    with pytest.raises(ValueError):
        wer(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        wer([], [])
    for hypotheses, references in (("a", "a"), (["a"], "a"), ("ab", ["a", "b"])):  # a string on either side
        with pytest.raises(TypeError):
            wer(hypotheses, references)


def test_wer_cuts_words_at_any_whitespace():
    # a line break or tab between words (an LLM may write one) separates them as a space does, as str.split does
    assert wer(["one\ntwo three"], ["one two three"]) == 0.0
    assert wer(["one two\tthree"], ["one\u2003two three"]) == 0.0
    assert transcription_scores(["a\nb"], ["a b"])["WER"] == 0.0


def test_cer():
    assert cer(["abd"], ["abc"]) == pytest.approx(100 / 3)
    assert cer(["ab"], ["a b"]) == pytest.approx(100 / 3)  # the space is a character
    assert cer([" abc "], ["abc"]) == 0.0  # surrounding whitespace is stripped
    assert cer(["Twenty-one"], ["twenty one"]) == pytest.approx(20.0)  # "T" and "-" substituted
    assert cer(["Twenty-one"], ["twenty one"], normalize=True) == 0.0


NORMALIZER_CASES = {
    "Mr. Smith paid $5, on the 3rd!": "mister smith paid five dollars on the third",
    "Hello,   World!!": "hello world",
    "It costs $1,250.50.": "it costs one thousand two hundred fifty dollars fifty cents",
    "$1 and $1.00 and $0.01 and $2.5": "one dollar and one dollar and zero dollars one cent and two point five dollars",
    "£3 or €1": "three pounds or one euro",
    "12.5% of 1,000,000": "twelve point five percent of one million",
    "50 % off": "fifty percent off",
    "the 21st, 12th, 40th and 100th": "the twenty first twelfth fortieth and one hundredth",
    "In 1990 there were 105 cats": "in one thousand nine hundred ninety there were one hundred five cats",
    "pi is 3.14159": "pi is three point one four one five nine",
    "agent 007 on mp3": "agent zero zero seven on mp three",
    "-5 degrees": "five degrees",
    "1,2,3": "one two three",
    "Don’t stop; it's well-known.": "dont stop its well known",
    "Mrs. Brown and Dr. Lee in the U.S.": "missus brown and doctor lee in the u s",
    "Café naïve ÉCOLE": "café naïve école",
    # ordinals with thousands separators: grouped first, and digits after a comma or point are no ordinal
    "the 1,000th, 2,500th, 1,001st and 1,000,000th": "the one thousandth two thousand five hundredth "
                                                     "one thousand first and one millionth",
    "1.5th": "one point five th",
    # NFKC first: combining accents, ligatures and full-width forms
    "cafe\u0301 ﬁne ＡＢＣ": "café fine abc",
    # decades: the plural of the spoken number
    "the 1990s, the '80s and 1960's": "the nineteen nineties the eighties and nineteen sixties",
    "1900s 2000s 2010s 10s": "nineteen hundreds two thousands twenty tens tens",
    "180s 1,990s": "one hundred eighty s one thousand nine hundred ninety s",
    "it took 2.80s": "it took two point eight zero s",  # digits after a point are no decade
    "  \t\n ": "",
    # the left single quote is an apostrophe too: it is deleted inside a word and ends a decade ("1990‘s")
    "the 1990‘s, rock‘n‘roll": "the nineteen nineties rocknroll",
    # 18 digits are still one cardinal; 19 are read digit by digit
    "123456789012345678": "one hundred twenty three quadrillion four hundred fifty six trillion seven hundred eighty "
                          "nine billion twelve million three hundred forty five thousand six hundred seventy eight",
    "1234567890123456789": "one two three four five six seven eight nine zero one two three four five six seven eight "
                           "nine",
    # ... also before an ordinal suffix (19 digits are no ordinal: number_to_words would fail on them)
    "1234567890123456789th": "one two three four five six seven eight nine zero one two three four five six seven "
                             "eight nine th",
    # a grouped number right after a comma is no grouped number (the comma before it is punctuation)
    "1,2,000": "one two zero zero zero",
    # a space may follow the currency sign
    "$ 5 and £ 2.50": "five dollars and two pounds fifty pence",
    # a grouped number with decimals before "%" is one number (its digits after the comma were read as "000.5")
    "up 1,000.5% or 12,345.25 %": "up one thousand point five percent or twelve thousand three hundred forty five "
                                  "point two five percent",
    # symbols (Unicode S*) become spaces as punctuation does: a mutation that kept them passed every test
    "x + y = z at 90°": "x y z at ninety",
    # an "s", an ordinal suffix or a "%" glued to the word after it is no decade, no ordinal, no lone percent
    # (mutations dropping the word boundary of the decade and the ordinal, and the space after "percent", passed)
    "60sec 5thousand 5%off": "sixty sec five thousand five percent off",
    # a comma then four digits is no thousands separator (groups of exactly three): a mutation that grouped
    # "1,000" out of "1,0000" and read "ten thousand" passed
    "1,0000": "one zero zero zero zero",
    # one hundredth of a pound is a penny (a mutation reading "one pence" passed)
    "£1.01": "one pound one penny",
}


@pytest.mark.parametrize("text, expected", NORMALIZER_CASES.items(), ids=range(len(NORMALIZER_CASES)))
def test_normalize_english(text, expected):
    assert normalize_english(text) == expected


def test_normalize_english_is_idempotent():
    for text in NORMALIZER_CASES:
        once = normalize_english(text)
        assert normalize_english(once) == once


@pytest.mark.parametrize(
    "number, words",
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (99, "ninety nine"),
        (101, "one hundred one"),
        (1010, "one thousand ten"),
        (20000, "twenty thousand"),
        (1234567, "one million two hundred thirty four thousand five hundred sixty seven"),
        (10**15, "one quadrillion"),
    ],
)
def test_number_to_words(number, words):
    assert number_to_words(number) == words


def test_number_to_words_range():
    with pytest.raises(ValueError):
        number_to_words(-1)
    with pytest.raises(ValueError):
        number_to_words(10**18)
    assert normalize_english("1" * 19) == " ".join(["one"] * 19)


@pytest.mark.parametrize(
    "number, words",
    [(1, "first"), (2, "second"), (3, "third"), (5, "fifth"), (8, "eighth"), (9, "ninth"), (12, "twelfth"),
     (20, "twentieth"), (23, "twenty third"), (111, "one hundred eleventh"), (1000, "one thousandth")],
)
def test_ordinal_to_words(number, words):
    assert ordinal_to_words(number) == words


HYPOTHESES = ["The cat sat on the mat.", "It is raining today", "A quick brown fox jumps"]
REFERENCES = ["The cat sat on the mat.", "It rains today", "The quick brown fox jumped over"]


def test_bleu_and_chrf_match_sacrebleu():
    assert bleu(HYPOTHESES, REFERENCES) == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)
    assert chrf(HYPOTHESES, REFERENCES) == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    assert bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
    assert 0 < bleu(HYPOTHESES, REFERENCES) < 100


def test_bleu_and_chrf_need_two_lists_of_the_same_non_zero_length():
    # as WER does (a mutation that let chrF score a string, unequal lists or nothing passed)
    for metric in (bleu, chrf):
        with pytest.raises(ValueError):
            metric(["a"], ["a", "b"])
        with pytest.raises(ValueError):
            metric([], [])
        with pytest.raises(TypeError):
            metric("a b", ["a b"])


def test_bleu_uses_the_tokenizer_it_is_given():
    # 13a splits the final point off; "none" keeps "mat." one token, so the last words no longer match
    hypothesis, reference = ["the cat sat on the mat."], ["the cat sat on the mat ."]
    assert bleu(hypothesis, reference) == pytest.approx(100.0)
    assert bleu(hypothesis, reference, tokenize="none") == pytest.approx(
        sacrebleu.corpus_bleu(hypothesis, [reference], tokenize="none").score)
    assert bleu(hypothesis, reference, tokenize="none") < 100


def test_bleu_matches_simuleval():
    quality_scorer = pytest.importorskip("simuleval.evaluator.scorers.quality_scorer")
    instance = pytest.importorskip("simuleval.evaluator.instance")
    instances = {
        index: instance.LogInstance(json.dumps({"index": index, "prediction": hypothesis, "reference": reference}))
        for index, (hypothesis, reference) in enumerate(zip(HYPOTHESES, REFERENCES))
    }
    assert bleu(HYPOTHESES, REFERENCES) == pytest.approx(quality_scorer.SacreBLEUScorer()(instances), abs=1e-9)


def test_score_dicts():
    assert set(transcription_scores(HYPOTHESES, REFERENCES)) == {"WER", "CER", "WER_normalized", "CER_normalized"}
    assert set(translation_scores(HYPOTHESES, REFERENCES)) == {"BLEU", "chrF"}
    scores = transcription_scores(["mister smith paid five dollars"], ["Mr. Smith paid $5."])
    assert scores["WER"] > 0 and scores["WER_normalized"] == 0.0
    assert scores["CER"] > 0 and scores["CER_normalized"] == 0.0  # (a mutation scoring it on the raw text passed)
    # each key holds its own metric (a mutation that wrote BLEU under "chrF" passed)
    translation = translation_scores(HYPOTHESES, REFERENCES)
    assert translation["BLEU"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)
    assert translation["chrF"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)


def test_references_that_normalise_to_nothing_leave_the_normalised_rates_out():
    scores = transcription_scores(["hello", ""], ["...", "!"])  # raw references exist, normalised ones do not
    assert set(scores) == {"WER", "CER"} and scores["WER"] == 100.0
    assert transcription_scores(["a"], [""]) == {}  # no reference at all: nothing to score
    assert transcription_scores(["a"], ["  "]) == {}  # a reference of spaces only is no reference either
    assert set(transcription_scores(["a b"], ["...", ])) == {"WER", "CER"}
