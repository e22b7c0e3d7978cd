"""Text for synthetic speech: cleaning rules, readers, spoken numbers, the held-out split and the mix."""

import gzip
import itertools
import random
import struct

import pytest

from speechstream.data.text_corpus import (
    CorpusConfig,
    Sentence,
    build_corpus,
    clean_sentence,
    date_words,
    digits_words,
    is_heldout,
    mix,
    money_words,
    number_sentence,
    overlaps_heldout,
    read_fortunes,
    read_gcide,
    read_gettext,
    read_wordnet,
    split_sentences,
    time_words,
    year_words,
)
from speechstream.eval.quality import normalize_english


@pytest.mark.parametrize("raw, expected", [
    ("the pilot reported two kills during the mission", "The pilot reported two kills during the mission."),
    ("A well-known  \u201cbest\u201d caf\u00e9 -- in town", "A well known best cafe, in town."),
    ("Is it true?", "Is it true?"),
    ("I don't know what you mean", "I don't know what you mean."),
    ("We must have a care that we do not . . . sham fallacies", "We must have a care that we do not, sham fallacies."),
])
def test_clean_sentence_keeps_and_normalises(raw, expected):
    assert clean_sentence(raw) == expected


@pytest.mark.parametrize("raw", [
    "See https://example.org for the details",  # URL
    "Write to me at someone at example dot com@",  # e-mail sign
    "It cost 5 dollars in 1990",  # digits: numbers come from the generator
    "Use <b>bold</b> text here",  # markup
    "Call foo_bar() to start it",  # code
    "The NASA mission was a success",  # acronym: voices spell it
    "Buy the new iPhone today please",  # camelCase
    "Press x to continue the game",  # single letter
    "Q: What is the answer",  # dialogue label
    "The U.S. economy grew fast",  # a token that is two normalised words
    "Thou shalt not pass this way",  # archaic
    "Too short",  # fewer than three words
    " ".join(["word"] * 31),  # more than thirty
    "He said (twice) no way",  # parentheses
    "Caf\u00e9 \u4e2d\u6587 text here",  # not ASCII after stripping accents
])
def test_clean_sentence_rejects(raw):
    assert clean_sentence(raw) is None


def test_every_token_is_one_normalised_word():
    for raw in ["Mr. Smith's dogs' bowls, they said, were well-known!", "It's o'clock time; really."]:
        text = clean_sentence(raw)
        assert text is not None
        assert len(text.split()) == len(normalize_english(text).split())


def test_split_sentences():
    assert split_sentences("One two three. Four five six! Seven? eight") == ["One two three.", "Four five six!",
                                                                             "Seven? eight"]


@pytest.mark.parametrize("year, words", [
    (1905, "nineteen oh five"), (1900, "nineteen hundred"), (1984, "nineteen eighty four"),
    (2005, "two thousand five"), (2024, "twenty twenty four"), (1066, "ten sixty six"), (2000, "two thousand"),
])
def test_year_words(year, words):
    assert year_words(year) == words


@pytest.mark.parametrize("hour, minute, style, words", [
    (7, 0, "plain", "seven o'clock"), (7, 5, "plain", "seven oh five"), (19, 30, "plain", "seven thirty"),
    (0, 0, "past", "midnight"), (12, 0, "past", "noon"), (7, 30, "past", "half past seven"),
    (8, 45, "past", "a quarter to nine"), (9, 15, "past", "a quarter past nine"), (11, 50, "past", "ten to twelve"),
    (12, 20, "past", "twenty past twelve"), (13, 7, "past", "one oh seven"),
])
def test_time_words(hour, minute, style, words):
    assert time_words(hour, minute, style) == words


def test_money_date_and_digit_words():
    assert money_words(1) == "one dollar"
    assert money_words(5, 50) == "five dollars and fifty cents"
    assert money_words(0, 99) == "ninety nine cents"
    assert money_words(0, 1, "pound") == "one penny"
    assert money_words(12, 0, "euro") == "twelve euros"
    assert money_words(5, 5, style="short") == "five oh five"
    assert money_words(105, 0) == "one hundred five dollars"  # American, no "and", as the WER normaliser writes
    assert date_words(3, 3) == "March third"
    assert date_words(6, 21, 1999, style="uk") == "the twenty first of June, nineteen ninety nine"
    assert digits_words("5550102", zero="oh") == "five five five oh one oh two"


def test_generated_number_sentences_are_clean_and_digit_free():
    rng = random.Random(0)
    for _ in range(300):
        sentence = number_sentence(rng)
        assert clean_sentence(sentence) == sentence
        assert not any(character.isdigit() for character in sentence)
        assert normalize_english(sentence) == normalize_english(normalize_english(sentence))


def test_heldout_split_is_deterministic_and_about_the_share():
    sentences = [f"sentence number {index} of the list" for index in range(20000)]
    first = [is_heldout(sentence, 2.0) for sentence in sentences]
    assert first == [is_heldout(sentence, 2.0) for sentence in sentences]
    assert 0.015 < sum(first) / len(first) < 0.025
    assert not any(is_heldout(sentence, 0.0) for sentence in sentences[:500])


def _sources():
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()
    rng = random.Random(1)
    pool = [" ".join(rng.sample(words, 5)) for _ in range(3000)]
    return [("wordnet-example", pool[:1500] + ["Press x to continue", "Duplicate line of text here"]),
            ("fortunes", pool[1000:3000] + ["duplicate line of text, here!"])]


def test_corpus_split_is_disjoint_deduplicated_and_seed_independent():
    config = CorpusConfig(heldout_percent=10.0)
    corpus = build_corpus(config, seed=0, sources=_sources())
    again = build_corpus(config, seed=0, sources=_sources())
    other_seed = build_corpus(config, seed=7, sources=_sources())
    train = {sentence.norm for pool in corpus.train.values() for sentence in pool}
    heldout = {sentence.norm for pool in corpus.heldout.values() for sentence in pool}
    assert train and heldout and not train & heldout
    assert all(is_heldout(norm, 10.0) for norm in heldout)
    assert corpus.train == again.train and corpus.heldout == again.heldout  # deterministic
    assert {s.norm for pool in other_seed.heldout.values() for s in pool} == heldout  # the seed only reorders
    assert corpus.train["fortunes"] != other_seed.train["fortunes"]
    assert corpus.rejected["wordnet-example"] == 1 and corpus.duplicates["fortunes"] >= 501  # overlap + copy
    all_norms = [s.norm for pools in (corpus.train, corpus.heldout) for pool in pools.values() for s in pool]
    assert len(all_norms) == len(set(all_norms))


def test_no_heldout_sentence_is_spoken_inside_a_training_one():
    # Fortunes are kept whole and as their sentences: a held-out sentence of a training entry (or a training
    # sentence of a held-out entry) would put held-out text into training audio.
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()
    rng = random.Random(2)
    sentences = [" ".join(rng.sample(words, 4)).capitalize() + "." for _ in range(600)]
    entries = [f"{first} {second}" for first, second in zip(sentences[::2], sentences[1::2])]
    config = CorpusConfig(heldout_percent=10.0)
    corpus = build_corpus(config, seed=0, sources=[("fortunes", entries + sentences)])
    train = [f" {sentence.norm} " for sentence in corpus.train["fortunes"]]
    heldout = [f" {sentence.norm} " for sentence in corpus.heldout["fortunes"]]
    assert heldout and len(train) > 500 and corpus.overlaps["fortunes"] > 0
    assert corpus.counts()["fortunes"]["overlaps"] == corpus.overlaps["fortunes"]
    assert not [(h, t) for h in heldout for t in train if h in t or t in h]
    every = {normalize_english(text) for text in entries + sentences}
    assert {h.strip() for h in heldout} == {norm for norm in every if is_heldout(norm, 10.0)}  # split unchanged


def test_overlaps_heldout_matches_whole_words_of_long_enough_sentences():
    heldout = ["a warm room", "the cat sat on the mat", "an open door"]
    norms = ["it was a warm room indeed", "a warm roomy house", "the cat sat", "on the mat", "sat on the mat",
             "an open", "xan open door", "an open door it was", "the cat sat on the mat today"]
    assert overlaps_heldout(norms, heldout) == [True, False, True, True, True, False, False, True, True]
    assert overlaps_heldout(["an open door"], ["open door"]) == [False]  # held-out sentences under 3 words


def test_mix_follows_weights_and_cycles():
    pools = {"a": [Sentence(f"a {i} x", "a") for i in range(10)], "b": [Sentence(f"b {i} x", "b") for i in range(3)]}
    drawn = list(itertools.islice(mix(pools, (("a", 0.75), ("b", 0.25)), seed=3), 400))
    assert drawn == list(itertools.islice(mix(pools, (("a", 0.75), ("b", 0.25)), seed=3), 400))
    share_a = sum(sentence.source == "a" for sentence in drawn) / len(drawn)
    assert 0.65 < share_a < 0.85
    first_b = [sentence for sentence in drawn if sentence.source == "b"][:3]
    assert len(set(first_b)) == 3  # every sentence once before any repeats
    assert list(mix({}, (("a", 1.0),), seed=0)) == []


def test_readers_on_small_fixtures(tmp_path):
    wordnet = tmp_path / "wordnet"
    wordnet.mkdir()
    (wordnet / "data.noun").write_text(
        "  1 This software and database is being provided\n"
        "00217593 04 n 01 kill 1 002 @ 00217014 n 0000 | the destruction of an enemy plane; "
        '"the pilot reported two kills during the mission"  \n', encoding="utf-8")
    examples, glosses = read_wordnet(wordnet)
    assert examples == ["the pilot reported two kills during the mission"]
    assert glosses == ["the destruction of an enemy plane"]

    fortunes = tmp_path / "fortunes"
    fortunes.mkdir()
    (fortunes / "wisdom").write_text("A dream will always triumph over reality.  It is given the chance.\n"
                                     "\t\t-- Stanislaw Lem\n%\nShort one here.\n%\n", encoding="utf-8")
    (fortunes / "wisdom.dat").write_bytes(b"\0\1")
    (fortunes / "perl").write_text("print 'hello';\n%\n", encoding="utf-8")
    assert read_fortunes(fortunes) == ["A dream will always triumph over reality. It is given the chance.",
                                       "A dream will always triumph over reality.", "It is given the chance.",
                                       "Short one here."]

    gcide = tmp_path / "gcide.dict.dz"
    with gzip.open(gcide, "wt", encoding="utf-8") as handle:
        handle.write("All-hail \\All`-hail\"\\, v. t.\n   To salute; to greet. [Poet.]\n   [1913 Webster]\n\n"
                     "         Whiles I stood rapt in the wonder of it, came missives\n"
                     "         from the king.\n"
                     "                                                  --Shak.\n   [1913 Webster]\n")
    assert read_gcide(gcide) == ["Whiles I stood rapt in the wonder of it, came missives from the king."]

    catalog = tmp_path / "de" / "LC_MESSAGES" / "demo.mo"
    catalog.parent.mkdir(parents=True)
    catalog.write_bytes(_mo_file({"": "Content-Type: text/plain; charset=UTF-8\n",
                                  "All conflicts fixed but you are still merging.": "Alle Konflikte behoben.",
                                  "menu\x04Open the file": "Datei öffnen"}))
    assert read_gettext([str(tmp_path / "*" / "LC_MESSAGES" / "*.mo")]) == [
        "All conflicts fixed but you are still merging.", "Open the file"]


def _mo_file(messages: dict[str, str]) -> bytes:
    """A GNU .mo catalog (little-endian, no hash table) holding ``messages``."""
    keys = sorted(messages)
    originals = [key.encode() for key in keys]
    translations = [messages[key].encode() for key in keys]
    header_size = 7 * 4
    table = header_size
    data = table + 2 * 8 * len(keys)
    blob, original_entries, translation_entries = b"", [], []
    for text in originals:
        original_entries.append((len(text), data + len(blob)))
        blob += text + b"\0"
    for text in translations:
        translation_entries.append((len(text), data + len(blob)))
        blob += text + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), table, table + 8 * len(keys), 0, 0)
    entries = b"".join(struct.pack("<2I", *entry) for entry in original_entries + translation_entries)
    return header + entries + blob


@pytest.mark.parametrize("header", [
    "Content-Type: text/plain; charset=CHARSET\n",  # an unfilled template header: an unknown encoding
    "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=INTEGER;\n",  # no plural= expression
    "Content-Type: text/plain; charset=ASCII\n",  # says ASCII but holds UTF-8
])
def test_read_gettext_reads_the_domain_from_another_catalog_when_one_is_broken(tmp_path, header):
    # One catalog a domain per machine is read; a broken first one must neither crash the corpus nor lose the domain.
    for language, messages in (("ab", {"": header, "Open the file": "\u00d6ffnen"}),
                               ("de", {"": "Content-Type: text/plain; charset=UTF-8\n", "Open the file": "Offnen"})):
        catalog = tmp_path / language / "LC_MESSAGES" / "demo.mo"
        catalog.parent.mkdir(parents=True)
        catalog.write_bytes(_mo_file(messages))
    assert read_gettext([str(tmp_path / "*" / "LC_MESSAGES" / "*.mo")]) == ["Open the file"]
