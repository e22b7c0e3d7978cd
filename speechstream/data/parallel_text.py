"""Real parallel text for speech translation: the Bible in English and Spanish, aligned by verse reference.

Sources (Debian packages, public domain): ``sword-text-web`` (World English Bible, SWORD module
``engWEB2015eb``, NRSVA versification) and ``sword-text-sparv`` (Reina-Valera 1909, ``spaRV1909eb``, KJV
versification), exported with ``mod2imp`` from ``libsword-utils``. ``mod2imp`` writes one block per key::

    $$$Genesis 1:1
    <w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w> ...

How a verse becomes text (``clean_verse``): footnotes (``<note>``) and editorial headings (``<title>`` without
``canonical="true"``) are dropped with their content; canonical titles (psalm superscriptions, which the
Spanish text carries inline in verse 1) are kept; every other tag is removed and its text kept; entities are
unescaped; double quotes, brackets and parentheses go; curly apostrophes between letters become ``'`` and other
single quotes go; dashes become commas; a word written all in capitals (the old typographic convention for a
chapter's first word, "EN el principio", "Y DAVID huyó") is capitalised at a sentence start or after a one-letter
first word, lowercased elsewhere; spaces before punctuation and after
``¡ ¿`` are removed. On the Spanish (spoken) side hyphens become spaces and tokens without a letter are
dropped, so every whitespace token is exactly one word of ``normalize_spanish``.

Alignment (``align``): keys ``Book C:V`` with C, V >= 1 present in both modules (the two versifications agree
on nearly all of the protocanon; WEB's deuterocanon has no Spanish counterpart). A pair is kept when both sides
are non-empty, have no digits, the Spanish side has ``min_words``..``max_words`` words and at most
``max_chars`` characters (about 10 s of espeak speech at 175 words/min), and the character-length ratio
English / Spanish lies in [``min_ratio``, ``max_ratio``] (a guard against versification shifts). A verse over
the Spanish limits is split only when both sides split cleanly: into the same number (> 1) of sentences (at
``. ? !`` before a capital), every sentence pair within all the limits, or failing that the same with clauses (cut
at every ``;`` too); otherwise it is dropped. Colons never cut (Spanish has one before direct speech where
English has a comma, so cutting there pairs the wrong halves). Pieces get ids ``Ref/1``,
``Ref/2``, ... Pairs whose normalised Spanish text was seen before are dropped as duplicates.

Held-out split (``is_heldout``): a pair is held out when the sha256 of its normalised Spanish text falls in the
lowest ``heldout_percent`` of the hash range: the same on every machine and seed, and a repeated sentence can
never be on both sides. A training pair is then dropped when its Spanish or its English (normalised) contains a
held-out pair's, lies inside it, or equals it (``text_corpus.overlaps_heldout``): verses often differ in one
Spanish word ("Y habló Jehová á Moisés" / "Habló Jehová á Moisés") with the same English, and a held-out
translation must not be a training target.
"""

from __future__ import annotations

import hashlib
import html
import re
import shutil
import subprocess
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from speechstream.data.text_corpus import overlaps_heldout
from speechstream.errors import SpeechstreamError
from speechstream.eval.quality import normalize_english

ENGLISH_MODULE = "engWEB2015eb"  # Debian sword-text-web: World English Bible
SPANISH_MODULE = "spaRV1909eb"  # Debian sword-text-sparv: Reina-Valera 1909
PACKAGES = ("sword-text-web", "sword-text-sparv", "libsword-utils")

_KEY = re.compile(r"^(?P<book>\S(?:.*\S)?) (?P<chapter>\d+):(?P<verse>\d+)$")
_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.DOTALL)
_TITLE = re.compile(r"<title\b(?P<attributes>[^>]*)>(?P<body>.*?)</title>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_BREAK = re.compile(r"[.?!;]\s+")
_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class Pair:
    """One aligned sentence pair."""

    id: str  # verse reference, "Genesis 1:1", with "/n" for the n-th piece of a split verse
    es: str  # Spanish (spoken) text
    en: str  # English (target) text

    @property
    def norm(self) -> str:
        """The normalised Spanish text (duplicate detection and the held-out hash)."""
        return normalize_spanish(self.es)


@dataclass(frozen=True)
class AlignConfig:
    """Limits of a kept pair (see the module docstring)."""

    min_words: int = 2  # Spanish words
    max_words: int = 32  # Spanish words
    max_chars: int = 190  # Spanish characters
    max_en_words: int = 60  # English words
    min_ratio: float = 0.5  # English / Spanish characters
    max_ratio: float = 2.0
    heldout_percent: float = 3.0  # share of the hash range held out


@dataclass
class ParallelCorpus:
    """The aligned pairs, split, with what was dropped and why."""

    train: list[Pair] = field(default_factory=list)
    heldout: list[Pair] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # verses/pieces kept, split, dropped per reason


# --- mod2imp output ------------------------------------------------------------------------------------------------

def parse_imp(text: str) -> dict[str, str]:
    """``mod2imp`` output -> {key: raw entry} for the verse keys ``Book C:V`` (C, V >= 1), in module order."""
    entries: dict[str, str] = {}
    key, body = None, []
    for line in text.splitlines():
        if line.startswith("$$$"):
            if key is not None:
                entries[key] = "\n".join(body)
            key, body = line[3:].strip(), []
        elif key is not None:
            body.append(line)
    if key is not None:
        entries[key] = "\n".join(body)
    verses = {}
    for key, raw in entries.items():
        match = _KEY.match(key)
        if match and int(match["chapter"]) >= 1 and int(match["verse"]) >= 1:
            verses[key] = raw
    return verses


def export_module(module: str) -> str:
    """The ``mod2imp`` export of an installed SWORD module (raw OSIS entries)."""
    binary = shutil.which("mod2imp")
    if binary is None:
        raise SpeechstreamError("mod2imp is missing: install the Debian packages " + " ".join(PACKAGES))
    result = subprocess.run([binary, module], capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0 or "$$$" not in result.stdout:
        raise SpeechstreamError(f"mod2imp could not export {module} (Debian packages {' '.join(PACKAGES)}): "
                                f"{result.stderr.strip().splitlines()[0] if result.stderr.strip() else 'no output'}")
    return result.stdout


# --- cleaning ------------------------------------------------------------------------------------------------------

def normalize_spanish(text: str) -> str:
    """Lowercase words without punctuation or symbols (accents kept): the words of a Spanish reference."""
    text = text.lower().replace("’", "'")
    text = "".join(" " if unicodedata.category(character)[0] in "PS" else character for character in text)
    return " ".join(text.split())


def _strip_markup(raw: str) -> str:
    text = _NOTE.sub(" ", raw)
    text = _TITLE.sub(lambda match: f" {match['body']} " if 'canonical="true"' in match["attributes"] else " ", text)
    opening_space = ("<l ", "<lg", "<div", "<p", "<lb", "<transChange")  # these tags separate words
    text = _TAG.sub(lambda match: " " if match.group(0).startswith(opening_space) else "", text)
    return html.unescape(text)


def _unshout(words: list[str]) -> list[str]:
    """Words written all in capitals (2+ letters): capitalised at a sentence start (also after a one-letter
    word there: "Y DAVID huyó" -> "Y David huyó"), else lowercase."""
    fixed = []
    for index, word in enumerate(words):
        letters = [character for character in word if character.isalpha()]
        if len(letters) >= 2 and all(character.isupper() for character in letters):
            start = index == 0 or fixed[-1].endswith((".", "?", "!"))
            after_initial = index >= 1 and len(fixed[-1].strip("¡¿")) == 1 and (
                index == 1 or fixed[-2].endswith((".", "?", "!")))
            if start or after_initial:
                first = next(position for position, character in enumerate(word) if character.isalpha())
                word = word[: first + 1] + word[first + 1:].lower()
            else:
                word = word.lower()
        fixed.append(word)
    return fixed


def clean_verse(raw: str, language: str) -> str:
    """One verse's raw OSIS entry -> plain text (``language``: "en" target side, "es" spoken side)."""
    text = _strip_markup(raw)
    text = re.sub(r"(?<=\w)[’'](?=\w)", "\0", text)  # apostrophes inside words survive the quote removal
    text = re.sub(r"[\"“”„«»‘’'()\[\]{}¶*]", " ", text).replace("\0", "'")
    text = re.sub(r"\s*[—–]+\s*|\s+-{2,}\s+", ", ", text)
    if language != "en":
        text = text.replace("-", " ")
    words = _unshout(text.split())
    if language != "en":  # spoken side: every token must carry a letter (one normalised word per token)
        words = [word for word in words if _LETTER.search(word)] if any(_LETTER.search(w) for w in words) else []
    text = " ".join(words)
    text = re.sub(r"([¡¿])\s+", r"\1", text)
    text = re.sub(r"\s+([.,;:?!])", r"\1", text)
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)  # ", ," left by removed quotes and dashes
    text = re.sub(r"^[\s,;:.]+", "", text)
    if language != "en":  # a lone "¡" or "¿" before removed text, or one left glued to punctuation
        text = re.sub(r"[¡¿](?=[\s.,;:!?]|$)", "", text).strip()
    return text.strip()


# --- alignment -----------------------------------------------------------------------------------------------------

def _fits(es: str, en: str, config: AlignConfig) -> str | None:
    """None when the pair is within the limits, else the reason it is not."""
    if not es or not en:
        return "empty"
    if any(character.isdigit() for character in es + en):
        return "digits"
    words = len(es.split())
    if words < config.min_words:
        return "short"
    if words > config.max_words or len(es) > config.max_chars or len(en.split()) > config.max_en_words:
        return "long"
    if not config.min_ratio <= len(en) / len(es) <= config.max_ratio:
        return "length_ratio"
    return None


def split_sentences(text: str, clauses: bool = False) -> list[str]:
    """Sentences of a verse: cut after ``. ? !`` followed by a space and a capital letter (Spanish "¿Qué he
    hecho yo? ¿cuál es mi maldad?" is one sentence); with ``clauses`` also after every ``;``. Colons never cut:
    Spanish puts one before direct speech where English has a comma."""
    pieces, start = [], 0
    for match in _BREAK.finditer(text):
        following = text[match.end():].lstrip("¡¿")[:1]
        if (clauses if match.group(0)[0] == ";" else following.isupper()):
            pieces.append(text[start:match.end()].strip())
            start = match.end()
    pieces.append(text[start:].strip())
    return [piece for piece in pieces if piece]


def split_cleanly(es: str, en: str, config: AlignConfig) -> list[tuple[str, str]] | None:
    """The verse as sentence pairs when both sides have the same number (> 1) of sentences and every pair is
    within the limits; failing that, the same with clauses (cut at ``;`` too); else None."""
    for clauses in (False, True):
        pieces_es, pieces_en = split_sentences(es, clauses), split_sentences(en, clauses)
        if (len(pieces_es) > 1 and len(pieces_es) == len(pieces_en)
                and all(_fits(piece_es, piece_en, config) is None for piece_es, piece_en in zip(pieces_es, pieces_en))):
            return list(zip(pieces_es, pieces_en))
    return None


def align(english: dict[str, str], spanish: dict[str, str], config: AlignConfig = AlignConfig(),
          counts: Counter | None = None) -> Iterator[Pair]:
    """Pairs of the verse keys both modules have, in Spanish module order, cleaned and within the limits.

    ``counts`` (if given) receives what happened: ``verses_common``, ``kept``, ``split_verses``,
    ``split_pieces`` and one ``dropped_<reason>`` per verse dropped.
    """
    counts = Counter() if counts is None else counts
    counts["verses_en"] += len(english)
    counts["verses_es"] += len(spanish)
    for key, raw_es in spanish.items():
        if key not in english:
            counts["dropped_no_english_verse"] += 1
            continue
        counts["verses_common"] += 1
        es, en = clean_verse(raw_es, "es"), clean_verse(english[key], "en")
        reason = _fits(es, en, config)
        if reason is None:
            counts["kept"] += 1
            yield Pair(key, es, en)
            continue
        if reason == "long":
            pieces = split_cleanly(es, en, config)
            if pieces is not None:
                counts["split_verses"] += 1
                counts["split_pieces"] += len(pieces)
                for number, (piece_es, piece_en) in enumerate(pieces, 1):
                    yield Pair(f"{key}/{number}", piece_es, piece_en)
                continue
            reason = "long_unsplittable"
        counts[f"dropped_{reason}"] += 1


def is_heldout(norm: str, percent: float) -> bool:
    """Whether the pair with this normalised Spanish text is held out (sha256 of the text)."""
    digest = hashlib.sha256(norm.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < percent / 100 * 2**64


def split_pairs(pairs: Iterable[Pair], config: AlignConfig = AlignConfig(),
                counts: Counter | None = None) -> ParallelCorpus:
    """Deduplicate by normalised Spanish text, split by its hash and drop training pairs that overlap held-out
    ones (order kept)."""
    corpus = ParallelCorpus(counts=Counter() if counts is None else counts)
    seen: set[str] = set()
    for pair in pairs:
        norm = pair.norm
        if norm in seen:
            corpus.counts["dropped_duplicate"] += 1
            continue
        seen.add(norm)
        (corpus.heldout if is_heldout(norm, config.heldout_percent) else corpus.train).append(pair)
    spanish = overlaps_heldout([pair.norm for pair in corpus.train], {pair.norm for pair in corpus.heldout})
    heldout_english = {normalize_english(pair.en) for pair in corpus.heldout}
    train_english = [normalize_english(pair.en) for pair in corpus.train]
    english = overlaps_heldout(train_english, heldout_english)
    # overlaps_heldout looks at texts of OVERLAP_WORDS words or more; an equal English is a held-out target at any
    # length ("Jesus wept."), and equal Spanish cannot be there (deduplicated above)
    same_english = [text in heldout_english for text in train_english]
    kept = [pair for pair, *flags in zip(corpus.train, spanish, english, same_english) if not any(flags)]
    corpus.counts["dropped_overlaps_heldout"] = len(corpus.train) - len(kept)
    corpus.train = kept
    corpus.counts["pairs_train"] = len(corpus.train)
    corpus.counts["pairs_heldout"] = len(corpus.heldout)
    return corpus


def build_parallel_corpus(config: AlignConfig = AlignConfig(), english_module: str = ENGLISH_MODULE,
                          spanish_module: str = SPANISH_MODULE) -> ParallelCorpus:
    """Export both installed modules, align, deduplicate and split."""
    english = parse_imp(export_module(english_module))
    spanish = parse_imp(export_module(spanish_module))
    counts: Counter = Counter()
    return split_pairs(align(english, spanish, config, counts), config, counts)
