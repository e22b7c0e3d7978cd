"""Parallel text for translation: mod2imp parsing, verse cleaning, alignment, clean splitting, held-out split."""

import shutil
import subprocess
from collections import Counter

import pytest

from speechstream.data.parallel_text import (
    ENGLISH_MODULE,
    SPANISH_MODULE,
    AlignConfig,
    Pair,
    align,
    build_parallel_corpus,
    clean_verse,
    is_heldout,
    normalize_spanish,
    parse_imp,
    split_pairs,
    split_sentences,
)
from speechstream.eval.quality import normalize_english

# A tiny export in mod2imp's format (raw OSIS entries, as the Debian modules have them).
ENGLISH_IMP = """$$$[ Module Heading ]

$$$[ Testament 1 Heading ]
<milestone type="x-importer" subType="x-osis2mod" n="$Rev: 3769 $"/>
$$$Genesis 0:0
<title level="1" type="main">Preface</title> Some preface text.
$$$Genesis 1:0
<chapter n="1"/>
$$$Genesis 1:1
<w lemma="strong:H0430">In</w> <w lemma="strong:H0853">the</w> <w lemma="strong:H7225">beginning</w>, <w lemma="strong:H0430">God</w><note placement="foot"><reference type="annotateRef">1:1 </reference>The Hebrew word rendered “God” is “Elohim”.</note><w lemma="strong:H1254">created</w> <w>the</w> <w>heavens</w> <w>and</w> <w>the</w> <w>earth</w>.
$$$Genesis 1:2
<title type="x-heading">A heading the editors added</title>The earth was formless and empty. Darkness was on the surface of the deep and God’s Spirit was hovering over the surface of the waters.
$$$Genesis 1:3
God said, “Let there be light,” and there was light.
$$$Genesis 1:4

$$$Genesis 1:5
God called the light “day”, and the darkness he called “night”. There was evening and there was morning, the first day. And this second sentence runs on at some length so that the verse as a whole is far too long for one clip of speech, which forces the aligner to try splitting it.
$$$Genesis 1:6
God said, Let there be an expanse in the middle of the waters, and let it divide the waters from the waters, and this goes on for long enough with no sentence break at all anywhere in it so it cannot split.
$$$Genesis 1:7
God made 2 lights.
$$$Genesis 1:8
God called the expanse sky.
$$$Psalms 3:1
<title canonical="true" type="psalm">A Psalm by David.</title> <l level="1"/>Yahweh, how my adversaries have increased!
$$$Tobit 1:1
The book of the words of Tobit.
"""

SPANISH_IMP = """$$$[ Module Heading ]

$$$Genesis 0:0
<title level="1" type="main">Génesis</title>
$$$Genesis 1:1
<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w> <w>Dios</w> <w>los cielos</w> <w>y la tierra</w>.
$$$Genesis 1:2
<w>Y la tierra</w> <w>estaba</w> desordenada y vacía, y las tinieblas estaban sobre la haz del abismo. Y el Espíritu de Dios se movía sobre la haz de las aguas.
$$$Genesis 1:3
<w>Y dijo</w> <w>Dios</w>: <w>Sea</w> la luz: y fué la luz.
$$$Genesis 1:4
<w>Y vió</w> <w>Dios</w> que la luz era buena.
$$$Genesis 1:5
Y llamó Dios á la luz Día, y á las tinieblas llamó Noche; y fué la tarde y la mañana un día. Y esta segunda oración sigue y sigue con bastante extensión para que el versículo entero sea demasiado largo para un solo fragmento de voz.
$$$Genesis 1:6
Y dijo Dios: Haya expansión en medio de las aguas, y separe las aguas de las aguas, y esto continúa durante bastante tiempo sin ningún punto en ninguna parte de modo que no se puede partir.
$$$Genesis 1:7
E hizo Dios 2 lumbreras.
$$$Genesis 1:8
Y llamó Dios á la expansión Cielos, y fué la tarde y la mañana el día segundo, un texto mucho más largo que el inglés.
$$$Psalms 3:1
Salmo de David. ¡<w>OH</w> <w>Jehová</w>, cuánto se han multiplicado mis enemigos!
$$$Luke 19:1
<w>Y</w> <w>HABIENDO entrado</w><transChange type="added">Jesús</transChange>, iba pasando por Jericó;
"""

SMALL = AlignConfig(max_words=25, max_chars=140)


def test_parse_imp_keeps_verse_keys_only():
    verses = parse_imp(ENGLISH_IMP)
    assert list(verses)[:2] == ["Genesis 1:1", "Genesis 1:2"]
    assert "Genesis 0:0" not in verses and "Genesis 1:0" not in verses and "[ Module Heading ]" not in verses
    assert verses["Genesis 1:4"].strip() == ""
    assert "Tobit 1:1" in verses


def test_clean_verse_removes_markup_notes_and_headings():
    english, spanish = parse_imp(ENGLISH_IMP), parse_imp(SPANISH_IMP)
    assert clean_verse(english["Genesis 1:1"], "en") == "In the beginning, God created the heavens and the earth."
    assert clean_verse(english["Genesis 1:2"], "en").startswith("The earth was formless")  # heading dropped
    assert "God's Spirit" in clean_verse(english["Genesis 1:2"], "en")  # apostrophe kept, quotes gone
    assert clean_verse(english["Genesis 1:3"], "en") == "God said, Let there be light, and there was light."
    assert clean_verse(english["Psalms 3:1"], "en") == "A Psalm by David. Yahweh, how my adversaries have increased!"
    assert clean_verse(spanish["Genesis 1:1"], "es") == "En el principio crió Dios los cielos y la tierra."
    assert clean_verse(spanish["Psalms 3:1"], "es") == (
        "Salmo de David. ¡Oh Jehová, cuánto se han multiplicado mis enemigos!")
    # "Y HABIENDO": a capitalised word after a one-letter first word keeps its capital ("Y DAVID" -> "Y David")
    assert clean_verse(spanish["Luke 19:1"], "es") == "Y Habiendo entrado Jesús, iba pasando por Jericó;"


def test_every_spanish_token_is_one_normalised_word():
    for raw in parse_imp(SPANISH_IMP).values():
        text = clean_verse(raw, "es")
        assert len(text.split()) == len(normalize_spanish(text).split())
    assert normalize_spanish("¡Oh Jehová, cuánto!") == "oh jehová cuánto"


def test_align_by_reference_with_clean_splits_and_drops():
    counts = Counter()
    pairs = list(align(parse_imp(ENGLISH_IMP), parse_imp(SPANISH_IMP), SMALL, counts))
    ids = [pair.id for pair in pairs]
    assert ids == ["Genesis 1:1", "Genesis 1:3", "Genesis 1:5/1", "Genesis 1:5/2", "Genesis 1:5/3", "Psalms 3:1"]
    assert pairs[0] == Pair("Genesis 1:1", "En el principio crió Dios los cielos y la tierra.",
                            "In the beginning, God created the heavens and the earth.")
    # Genesis 1:5: 2 Spanish and 3 English sentences, but 3 clauses each (the Spanish ";" ends one)
    assert pairs[2].es.startswith("Y llamó Dios") and pairs[2].en.startswith("God called the light")
    assert pairs[3].es == "y fué la tarde y la mañana un día." and pairs[3].en.startswith("There was evening")
    assert pairs[4].es.startswith("Y esta segunda") and pairs[4].en.startswith("And this second")
    assert counts["dropped_empty"] == 1  # Genesis 1:4: no English text
    # Genesis 1:6 has no sentence break; Genesis 1:2 has two sentences a side, but they do not correspond
    # ("The earth was formless and empty." against a whole Spanish clause pair): the length ratio refuses them
    assert counts["dropped_long_unsplittable"] == 2
    assert counts["dropped_digits"] == 1  # Genesis 1:7
    assert counts["dropped_length_ratio"] == 1  # Genesis 1:8: Spanish far longer than the English
    assert counts["dropped_no_english_verse"] == 1  # Luke 19:1 (Tobit has no Spanish: not counted as a pair)
    assert counts["split_verses"] == 1 and counts["split_pieces"] == 3


def test_a_semicolon_cuts_clauses_only():
    """Sentences end at ". ? !" before a capital; ";" cuts only in the clause pass (module docstring, README). A ";"
    before a capital ("; Jehová") cut in the sentence pass too, so a verse could be paired by other pieces than the
    rule says."""
    text = "Oíd esto, pueblos todos; Jehová es grande. ¿Quién como él? Alabad su nombre."
    assert split_sentences(text) == ["Oíd esto, pueblos todos; Jehová es grande.", "¿Quién como él?",
                                     "Alabad su nombre."]
    assert split_sentences(text, clauses=True) == ["Oíd esto, pueblos todos;", "Jehová es grande.",
                                                   "¿Quién como él?", "Alabad su nombre."]
    assert split_sentences("Y dijo; y fué así.", clauses=True) == ["Y dijo;", "y fué así."]
    assert split_sentences("Y dijo: Sea la luz.") == ["Y dijo: Sea la luz."]  # colons never cut

def test_heldout_split_is_a_deterministic_function_of_the_text():
    pairs = [Pair(f"Book 1:{index}", f"Frase número {word} de prueba", f"Test sentence {word}")
             for index, word in enumerate("uno dos tres cuatro cinco seis siete ocho nueve diez once doce".split())]
    pairs += [Pair("Book 2:1", "Frase número uno de prueba", "Duplicate")]
    first = split_pairs(pairs, AlignConfig(heldout_percent=30))
    again = split_pairs(list(reversed(pairs[:-1])), AlignConfig(heldout_percent=30))
    assert {pair.norm for pair in first.heldout} == {pair.norm for pair in again.heldout}
    assert first.counts["dropped_duplicate"] == 1
    assert len(first.train) + len(first.heldout) == 12 and first.heldout and first.train
    assert all(is_heldout(pair.norm, 30) for pair in first.heldout)
    assert not any(is_heldout(pair.norm, 30) for pair in first.train)
    # the hash split does not depend on the process: fixed values
    assert is_heldout("frase número uno de prueba", 100) and not is_heldout("frase número uno de prueba", 0)
    share = sum(is_heldout(f"frase {index}", 3.0) for index in range(20000)) / 20000
    assert 0.025 < share < 0.035


def test_training_pairs_share_no_text_with_heldout_pairs():
    words = "uno dos tres cuatro cinco seis siete ocho nueve diez once doce trece catorce quince".split()
    base = [Pair(f"Book 1:{index}", f"Frase número {word} de prueba", f"Test sentence {word} here")
            for index, word in enumerate(words)]
    same_english = [Pair(f"Book 2:{index}", f"Y frase número {word} de prueba", pair.en)
                    for index, (word, pair) in enumerate(zip(words, base))]
    longer = [Pair(f"Book 3:{index}", f"{pair.es} otra vez", f"{pair.en} once more") for index, pair in enumerate(base)]
    corpus = split_pairs(base + same_english + longer, AlignConfig(heldout_percent=30))
    assert corpus.heldout and corpus.train and corpus.counts["dropped_overlaps_heldout"] > 0
    assert corpus.counts["pairs_train"] == len(corpus.train)
    for kept in corpus.train:
        for held in corpus.heldout:
            for train_text, heldout_text in ((kept.norm, held.norm),
                                             (normalize_english(kept.en), normalize_english(held.en))):
                assert f" {heldout_text} " not in f" {train_text} " and f" {train_text} " not in f" {heldout_text} "
    assert all(is_heldout(pair.norm, 30) for pair in corpus.heldout)  # the split itself is still the hash's


def _module_installed(name: str) -> bool:
    if shutil.which("mod2imp") is None:
        return False
    result = subprocess.run(["mod2imp", name], capture_output=True, text=True, check=False)
    return "$$$" in result.stdout[:2000]


@pytest.mark.skipif(not (_module_installed(ENGLISH_MODULE) and _module_installed(SPANISH_MODULE)),
                    reason="Debian sword-text-web, sword-text-sparv and libsword-utils are not installed")
def test_real_bibles_align():
    corpus = build_parallel_corpus()
    assert corpus.counts["verses_common"] > 30000
    assert len(corpus.train) + len(corpus.heldout) > 28000
    assert 0.02 < len(corpus.heldout) / (len(corpus.train) + len(corpus.heldout)) < 0.04
    pairs = {pair.id: pair for pair in corpus.train + corpus.heldout}
    assert pairs["John 3:16"].es.startswith("Porque de tal manera amó Dios al mundo")
    assert pairs["John 3:16"].en.startswith("For God so loved the world")


def test_a_short_heldout_translation_is_no_training_target():
    # a held-out English of fewer than OVERLAP_WORDS words is still a held-out target: a training pair with the same
    # English (another Spanish wording of the verse) is dropped, as the module's docstring promises ("or equals it")
    words = "uno dos tres cuatro cinco seis siete ocho nueve diez once doce trece catorce quince".split()
    pairs = []
    for index, word in enumerate(words):
        pairs += [Pair(f"Book 1:{index}", f"Lloró {word} Jesús", f"{word.capitalize()} wept."),
                  Pair(f"Book 2:{index}", f"Jesús {word} lloró", f"{word.capitalize()} wept.")]
    corpus = split_pairs(pairs, AlignConfig(heldout_percent=30))
    assert corpus.heldout and corpus.train
    heldout_english = {normalize_english(pair.en) for pair in corpus.heldout}
    assert [pair.id for pair in corpus.train if normalize_english(pair.en) in heldout_english] == []
    assert corpus.counts["dropped_overlaps_heldout"] > 0
    assert all(is_heldout(pair.norm, 30) for pair in corpus.heldout)
