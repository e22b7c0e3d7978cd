"""English text for synthetic training speech: real sentences from Debian packages plus generated numbers.

Sources (each a reader below; the Debian package that carries it in brackets):

- ``wordnet-example``: the quoted example sentences of WordNet 3.0 glosses [wordnet-base]
- ``wordnet-gloss``: the glosses (definitions) themselves, sentence-cased [wordnet-base]
- ``fortunes``: fortune-cookie quotations, whole entries or single sentences [fortunes, fortunes-min]
- ``gcide``: block quotations of the GNU Collaborative International Dictionary (Webster 1913) [dict-gcide]
- ``gettext``: English message ids of the gettext catalogs (``*.mo``) installed on the machine
- ``numbers``: generated sentences with cardinals, ordinals, years, dates, times, money, percentages,
  decimals and phone numbers, written out as a speaker says them (see "spoken numbers" below)

**References are written in words, never digits**, exactly as the voices speak them: "The meeting starts at
seven thirty.", "It cost twenty five dollars and fifty cents.", "She was born in nineteen eighty four." A
``Sentence.text`` keeps sentence case and light punctuation (``. , ? ! ; : '``) because the voices use it for
prosody; ``Sentence.norm`` is ``speechstream.eval.quality.normalize_english(text)`` (lowercase, no punctuation),
and the cleaning rules guarantee that every whitespace token of ``text`` normalises to exactly one word of
``norm``, so per-word timings line up with both. Because ``text`` contains no digits, the WER normaliser
(which spells digits out American style, "1990" -> "one thousand nine hundred ninety") leaves it unchanged:
what the model hears, what it is trained to write and what it is scored against are the same words.
Source sentences that contain digits are dropped rather than guessed at ("1990s", "3:30", "No. 5"); numbers
come from the generator, whose meaning is known.

Held-out split: a sentence is held out when the sha256 of its ``norm`` falls in the lowest ``heldout_percent``
of the hash range, so the split is the same on every machine and every run, whatever the seed, the source or
the order, and a held-out sentence can never reach training (duplicates share ``norm``, hence the split).
A held-out sentence can also be part of a longer one: a fortune is kept whole and as its single sentences, and
one WordNet gloss may repeat another inside it. So a training sentence is dropped (counted as ``overlaps``)
when a held-out sentence of at least ``OVERLAP_WORDS`` words lies inside it, or it lies inside a held-out one,
as whole words of ``norm``: no held-out sentence is spoken inside a training utterance, and no training
sentence inside a held-out one. The held-out split itself stays as the hash makes it.
"""

from __future__ import annotations

import gettext
import glob
import gzip
import hashlib
import os
import random
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speechstream.eval.quality import normalize_english, number_to_words, ordinal_to_words

WORDNET_DIR = Path("/usr/share/wordnet")  # wordnet-base: data.noun, data.verb, data.adj, data.adv
FORTUNES_DIR = Path("/usr/share/games/fortunes")  # fortunes-min + fortunes: one file per category
GCIDE_FILE = Path("/usr/share/dictd/gcide.dict.dz")  # dict-gcide: dictzip (gzip-compatible) text
LOCALE_GLOBS = (  # gettext catalogs; msgids are the same in every language of a domain, so one file per domain
    "/usr/share/locale/*/LC_MESSAGES/*.mo",
    "/usr/share/locale-langpack/*/LC_MESSAGES/*.mo",
    "/usr/share/*/lang/*/LC_MESSAGES/*.mo",
    "/usr/share/vim/*/lang/*/LC_MESSAGES/*.mo",
)
# Fortune categories left out: pictures, code, other languages, and the jokes about groups of people.
FORTUNE_EXCLUDED = frozenset({"ascii-art", "perl", "translate-me", "ethnic", "men-women", "drugs"})

SOURCES = ("wordnet-example", "wordnet-gloss", "fortunes", "gcide", "gettext", "numbers")
OVERLAP_WORDS = 3  # a sentence this long or longer inside another one, across the split, is an overlap

# Words that mark archaic text (frequent in the Webster 1913 quotations) or that we do not want voices to say.
_REJECT_WORDS = frozenset(
    "thou thee thy thine hath doth dost hast shalt wilt canst wouldst couldst shouldst art'st ye tis twas "
    "ere nay yea oer een whence thence hither thither whither methinks prithee quoth hadst didst saith "
    "fuck fucking fucked shit bitch cunt nigger faggot retard whore slut".split()
)
_URLISH = re.compile(r"https?:|www\.|\.(com|org|net|edu|gov|html?)\b|@|::|->|=>", re.IGNORECASE)
_FORBIDDEN = re.compile(r"[0-9<>{}\[\]\\|/_=#*^~$%&+`@()\t\n\"]")  # after quote stripping: digits, markup, code
_ALLOWED = re.compile(r"^[A-Za-z ,.?!;:']+$")  # what a cleaned sentence may contain
_ACRONYM = re.compile(r"^[A-Z]{2,}$|[a-z][A-Z]")  # NASA, GTK; camelCase: voices spell or mangle them
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "`": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u2026": "...", "\u00a0": " ",
})


@dataclass(frozen=True)
class Sentence:
    """One sentence of the corpus."""

    text: str  # spoken-form sentence as the voices read it: words only, sentence case, light punctuation
    source: str  # one of SOURCES

    @property
    def norm(self) -> str:
        """The WER-normalised reference: lowercase words separated by single spaces."""
        return normalize_english(self.text)


@dataclass(frozen=True)
class CorpusConfig:
    """What the corpus keeps and how it mixes its sources."""

    min_words: int = 3  # fewest words in a sentence (after normalisation)
    max_words: int = 30  # most words in a sentence
    heldout_percent: float = 2.0  # share of the sentence-hash range held out for testing
    weights: tuple[tuple[str, float], ...] = (  # share of each source in the mixed stream (renormalised)
        ("wordnet-example", 0.26),
        ("fortunes", 0.24),
        ("wordnet-gloss", 0.14),
        ("gettext", 0.12),
        ("gcide", 0.10),
        ("numbers", 0.14),
    )
    number_sentences: int = 20000  # generated number sentences (before the held-out split and deduplication)
    wordnet_dir: Path = WORDNET_DIR  # where wordnet-base's data.* files are
    fortunes_dir: Path = FORTUNES_DIR  # where the fortune files are
    gcide_file: Path = GCIDE_FILE  # dict-gcide's dictzip file
    locale_globs: tuple[str, ...] = LOCALE_GLOBS  # where gettext catalogs are looked for


@dataclass
class Corpus:
    """Cleaned, deduplicated sentences per source and split, each list in a seeded order."""

    train: dict[str, list[Sentence]] = field(default_factory=dict)  # source -> training sentences
    heldout: dict[str, list[Sentence]] = field(default_factory=dict)  # source -> held-out sentences
    rejected: dict[str, int] = field(default_factory=dict)  # source -> raw candidates dropped by cleaning
    duplicates: dict[str, int] = field(default_factory=dict)  # source -> clean candidates already seen
    overlaps: dict[str, int] = field(default_factory=dict)  # source -> training sentences overlapping held-out

    def counts(self) -> dict[str, dict[str, int]]:
        """source -> {"train", "heldout", "rejected", "duplicates", "overlaps"} counts, for stats and the README."""
        return {
            source: {
                "train": len(self.train.get(source, [])),
                "heldout": len(self.heldout.get(source, [])),
                "rejected": self.rejected.get(source, 0),
                "duplicates": self.duplicates.get(source, 0),
                "overlaps": self.overlaps.get(source, 0),
            }
            for source in SOURCES
            if source in self.train or source in self.heldout or source in self.rejected
        }


# --- cleaning ------------------------------------------------------------------------------------------------------

def _strip_accents(text: str) -> str:
    """café -> cafe; characters that do not decompose to ASCII stay (and fail the ASCII check later)."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(character for character in decomposed if not unicodedata.combining(character))


def clean_sentence(raw: str, min_words: int = 3, max_words: int = 30) -> str | None:
    """A sentence the voices can read word for word, or None when ``raw`` is unsuitable.

    Rules, in order: typographic quotes and dashes to ASCII, accents stripped; URLs, e-mail addresses, code and
    markup (``< > { } [ ] \\ | / _ = # * ^ ~ $ % & + ` @ ( )``), digits, tabs and newlines reject the sentence;
    double quotes are removed (the words stay); ``--`` and dashes between spaces become commas, hyphens inside
    words become spaces ("well-known" -> "well known"); only ASCII letters, spaces and ``, . ? ! ; : '`` may
    remain; every token must normalise to exactly one word (no "U.S.", "e.g."), no acronyms or camelCase
    ("NASA", "iPhone"), no single letters but "a", "A", "I"; no archaic or offensive words; ``min_words`` to
    ``max_words`` words; the first letter is capitalised and a final period added when the sentence has no
    closing punctuation.
    """
    text = _strip_accents(raw.translate(_TRANSLATE))
    text = text.replace('"', " ")
    text = " ".join(text.split())
    if not text or _URLISH.search(text) or _FORBIDDEN.search(text):
        return None
    text = re.sub(r"\s*(--+|\s-\s)\s*", ", ", text)  # dashes used as punctuation
    text = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", text)  # hyphenated words: said as separate words
    text = re.sub(r"\s*\.(\s*\.)+\s*", ", ", text)  # ellipses: a pause
    text = re.sub(r"\s+([,.?!;:])", r"\1", text)  # no space before punctuation
    text = text.strip(" ,;:'-")
    if not text or not _ALLOWED.match(text):
        return None
    tokens = text.split()
    for token in tokens:
        core = token.strip(",.?!;:'")
        if not core or not core[0].isalpha() or not core[-1].isalpha():
            return None  # "'tis", "o'", stray punctuation
        if re.search(r"[^A-Za-z']", core) or "''" in core:
            return None  # "U.S.", "and,or"
        if _ACRONYM.search(core) or (len(core) == 1 and core not in ("a", "A", "I")):
            return None
        if len(core) == 1 and token.endswith(":"):
            return None  # "Q: ...", "A: ..." dialogue labels
    words = normalize_english(text).split()
    if len(words) != len(tokens) or not _REJECT_WORDS.isdisjoint(words):
        return None  # every token must be exactly one word of the normalised text
    if not min_words <= len(words) <= max_words:
        return None
    text = text[0].upper() + text[1:]
    if text[-1] not in ".?!":
        text = text.rstrip(",;:") + "."
    return text


def split_sentences(paragraph: str) -> list[str]:
    """Split running text into sentences at ``. ! ?`` followed by a capital letter."""
    paragraph = " ".join(paragraph.split())
    return [part for part in _SENTENCE_END.split(paragraph) if part]


def is_heldout(norm: str, percent: float) -> bool:
    """Whether the sentence with this normalised text belongs to the held-out split (hash of the text)."""
    digest = hashlib.sha256(norm.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 1_000_000 < round(percent * 10_000)


# --- readers: each yields raw candidate strings -----------------------------------------------------------------------

def read_wordnet(wordnet_dir: Path = WORDNET_DIR) -> tuple[list[str], list[str]]:
    """(example sentences, glosses) from WordNet's ``data.{noun,verb,adj,adv}`` files.

    A synset line ends ``| gloss; "example one"; "example two"``: the quoted parts are examples, the rest of
    the gloss (split at semicolons) are definitions.
    """
    examples: list[str] = []
    glosses: list[str] = []
    for part in ("noun", "verb", "adj", "adv"):
        path = Path(wordnet_dir) / f"data.{part}"
        if not path.exists():
            continue
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                gloss = line.split(" | ", 1)[1].strip()
                examples += re.findall(r'"([^"]+)"', gloss)
                definition = re.sub(r'"[^"]*"', "", gloss)
                glosses += [piece.strip() for piece in definition.split(";") if piece.strip()]
    return examples, glosses


def read_fortunes(fortunes_dir: Path = FORTUNES_DIR, excluded: Iterable[str] = FORTUNE_EXCLUDED) -> list[str]:
    """Fortune entries (``%``-separated) without their ``-- Author`` lines: the whole entry, then its sentences.

    Yielding both lets short entries survive as multi-sentence utterances while long ones still give sentences;
    exact duplicates are removed by the corpus later.
    """
    candidates: list[str] = []
    directory = Path(fortunes_dir)
    if not directory.is_dir():
        return candidates
    for path in sorted(directory.iterdir()):
        if path.suffix or path.is_symlink() or path.name in excluded or not path.is_file():
            continue  # *.dat indexes, *.u8 links
        text = path.read_text(encoding="utf-8", errors="replace")
        for entry in re.split(r"^%\s*$", text, flags=re.MULTILINE):
            lines = [line for line in entry.splitlines() if not re.match(r"^\s*--", line)]
            body = " ".join(" ".join(lines).split())
            if not body:
                continue
            candidates.append(body)
            sentences = split_sentences(body)
            if len(sentences) > 1:
                candidates += sentences
    return candidates


def read_gcide(gcide_file: Path = GCIDE_FILE) -> list[str]:
    """Block quotations of GCIDE: runs of lines indented by 9+ spaces, cut before their ``--Author``."""
    candidates: list[str] = []
    if not Path(gcide_file).exists():
        return candidates
    block: list[str] = []
    with gzip.open(gcide_file, "rt", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith(" " * 9) and line.strip():
                block.append(line.strip())
                continue
            if block:
                candidates += _gcide_quotation(block)
                block = []
    if block:
        candidates += _gcide_quotation(block)
    return candidates


def _gcide_quotation(lines: list[str]) -> list[str]:
    """The quotation text of one GCIDE block: everything before the first ``--`` attribution, as sentences."""
    text = " ".join(lines)
    text = re.split(r"\s--\s?[A-Z]|^--", text, maxsplit=1)[0]
    return split_sentences(text) if text.strip() else []


def read_gettext(locale_globs: Sequence[str] = LOCALE_GLOBS) -> list[str]:
    """English message ids of the installed gettext catalogs, one readable catalog per domain (msgctxt dropped)."""
    by_domain: dict[str, list[str]] = defaultdict(list)
    for pattern in locale_globs:
        for path in sorted(glob.glob(pattern)):
            by_domain[os.path.basename(path)].append(path)
    messages: set[str] = set()
    for domain in sorted(by_domain):
        for key in _first_readable_catalog(by_domain[domain]):
            if isinstance(key, str) and key:
                messages.add(key.split("\x04")[-1])  # "context\x04msgid"
    return sorted(messages)


def _first_readable_catalog(paths: Sequence[str]) -> dict:
    """msgid -> msgstr of the first of ``paths`` (one domain's catalogs) that Python's gettext reads, {} if none.

    A broken catalog (a header left as the template's "charset=CHARSET": LookupError; "Plural-Forms" without
    "plural=": IndexError; text not in its charset: UnicodeDecodeError) is skipped for the next language's: the
    msgids are the same in every language of a domain.
    """
    for path in paths:
        try:
            with open(path, "rb") as handle:
                return gettext.GNUTranslations(handle)._catalog  # noqa: SLF001
        except (OSError, ValueError, LookupError, IndexError):
            continue
    return {}


# --- spoken numbers ------------------------------------------------------------------------------------------------

MONTHS = "January February March April May June July August September October November December".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
_DIGIT_WORDS = "zero one two three four five six seven eight nine".split()


def cardinal(number: int) -> str:
    """Cardinal words, American style without "and": 105 -> "one hundred five"."""
    return number_to_words(number)


def ordinal(number: int) -> str:
    """Ordinal words: 21 -> "twenty first"."""
    return ordinal_to_words(number)


def year_words(year: int) -> str:
    """A year as people say it: 1905 -> "nineteen oh five", 1900 -> "nineteen hundred", 2005 -> "two thousand
    five", 2024 -> "twenty twenty four", 1066 -> "ten sixty six"."""
    if not 1000 <= year <= 2099:
        return cardinal(year)
    if 2000 <= year <= 2009:
        return cardinal(year)
    century, rest = divmod(year, 100)
    if rest == 0:
        return f"{cardinal(century)} hundred"
    if rest < 10:
        return f"{cardinal(century)} oh {cardinal(rest)}"
    return f"{cardinal(century)} {cardinal(rest)}"


def time_words(hour: int, minute: int, style: str = "plain") -> str:
    """A clock time (hour 0-23): "seven o'clock", "seven oh five", "seven thirty", "half past seven",
    "a quarter to eight", "ten past seven", "noon", "midnight"; ``style`` "plain" or "past" (past/to)."""
    if minute == 0 and hour in (0, 12) and style == "past":
        return "midnight" if hour == 0 else "noon"
    twelve = hour % 12 or 12
    if style == "past" and minute in (5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55):
        after = twelve % 12 + 1
        if minute == 15:
            return f"a quarter past {cardinal(twelve)}"
        if minute == 30:
            return f"half past {cardinal(twelve)}"
        if minute == 45:
            return f"a quarter to {cardinal(after)}"
        if minute < 30:
            return f"{cardinal(minute)} past {cardinal(twelve)}"
        return f"{cardinal(60 - minute)} to {cardinal(after)}"
    if minute == 0:
        return f"{cardinal(twelve)} o'clock"
    if minute < 10:
        return f"{cardinal(twelve)} oh {cardinal(minute)}"
    return f"{cardinal(twelve)} {cardinal(minute)}"


def money_words(units: int, cents: int = 0, currency: str = "dollar", style: str = "full") -> str:
    """An amount: "one dollar", "five dollars and fifty cents", "ninety nine cents", "twelve pounds";
    ``style`` "short" says "five fifty" for 5.50 (the way prices are read)."""
    plural = {"dollar": ("dollar", "dollars", "cent", "cents"), "pound": ("pound", "pounds", "penny", "pence"),
              "euro": ("euro", "euros", "cent", "cents")}[currency]
    if style == "short" and units and cents:
        return f"{cardinal(units)} {cardinal(cents) if cents >= 10 else 'oh ' + cardinal(cents)}"
    parts = []
    if units:
        parts.append(f"{cardinal(units)} {plural[0] if units == 1 else plural[1]}")
    if cents:
        parts.append(f"{cardinal(cents)} {plural[2] if cents == 1 else plural[3]}")
    return " and ".join(parts) if parts else f"zero {plural[1]}"


def date_words(month: int, day: int, year: int | None = None, style: str = "us") -> str:
    """A date: "March third", "the third of March", with ", nineteen ninety" when ``year`` is given."""
    text = f"{MONTHS[month - 1]} {ordinal(day)}" if style == "us" else f"the {ordinal(day)} of {MONTHS[month - 1]}"
    return f"{text}, {year_words(year)}" if year is not None else text


def digits_words(digits: str, zero: str = "zero") -> str:
    """Digit by digit, as phone numbers are read: "5550123" -> "five five five zero one two three"."""
    return " ".join(zero if digit == "0" else _DIGIT_WORDS[int(digit)] for digit in digits)


def decimal_words(integer: int, fraction: str) -> str:
    """ "three point one four" for 3.14."""
    return f"{cardinal(integer)} point {digits_words(fraction)}"


_NUMBER_TEMPLATES = (
    "The meeting starts at {time}.",
    "The train to the city leaves at {time} on {weekday}.",
    "Please call me back after {time}.",
    "The store closes at {time} tonight.",
    "I woke up at {time} this morning.",
    "Our flight is on {date} at {time}.",
    "She was born on {date_year}.",
    "The deadline for the report is {date}.",
    "The concert was moved to {weekday}, {date}.",
    "He moved to the coast in {year}.",
    "The bridge was finished in {year} and repaired in {year2}.",
    "In {year}, the company had {count} employees.",
    "The tickets cost {money} each.",
    "I paid {money} for the taxi.",
    "The total comes to {money}.",
    "Lunch was {money_short} with the tip.",
    "The rent went up by {money} a month.",
    "About {big} people live in the town.",
    "The library holds more than {big} books.",
    "Turn to page {count} of your notes.",
    "The temperature dropped to {small} degrees overnight.",
    "The road is {count} miles long.",
    "Prices rose by {percent} percent last year.",
    "Only {percent} percent of the votes were counted.",
    "He finished in {ordinal} place.",
    "Her office is on the {ordinal} floor.",
    "This is the {ordinal} time I have asked.",
    "The package weighs {decimal} kilograms.",
    "The average score was {decimal} points.",
    "My number is {phone}.",
    "The code for the gate is {code}.",
    "Add {small} cups of flour and {small2} eggs.",
    "We need {count} chairs for the party.",
    "Flight {flight} to Denver is now boarding.",
    "The bus comes every {small} minutes.",
    "It took us {small} hours and {minutes} minutes.",
    "Room {room} is at the end of the hall.",
    "The account was opened in {month} {year}.",
    "The game ended {small} to {small2}.",
    "Chapter {count} begins on page {big_page}.",
)


def number_sentence(rng: random.Random) -> str:
    """One generated sentence with spoken numbers, dates, times or money (every slot filled by ``rng``)."""
    template = rng.choice(_NUMBER_TEMPLATES)
    hour, minute = rng.randrange(24), rng.choice([0, 0, 5, 10, 15, 20, 30, 30, 40, 45, 50, rng.randrange(60)])
    month, day = rng.randrange(1, 13), rng.randrange(1, 29)
    cents = rng.choice([0, 0, 25, 50, 75, 99, rng.randrange(1, 100)])
    slots = {
        "time": time_words(hour, minute, rng.choice(["plain", "plain", "past"])),
        "weekday": rng.choice(WEEKDAYS),
        "date": date_words(month, day, style=rng.choice(["us", "us", "uk"])),
        "date_year": date_words(month, day, rng.randrange(1930, 2030), style=rng.choice(["us", "uk"])),
        "year": year_words(rng.choice([rng.randrange(1800, 2000), rng.randrange(1950, 2035)])),
        "year2": year_words(rng.randrange(2000, 2035)),
        "count": cardinal(rng.randrange(2, 1000)),
        "big": cardinal(rng.choice([rng.randrange(1000, 100000), rng.randrange(1, 100) * 1000,
                                    rng.randrange(100000, 10000000)])),
        "big_page": cardinal(rng.randrange(100, 900)),
        "small": cardinal(rng.randrange(2, 20)),
        "small2": cardinal(rng.randrange(2, 20)),
        "minutes": cardinal(rng.randrange(2, 60)),
        "money": money_words(rng.choice([rng.randrange(1, 100), rng.randrange(100, 5000)]), cents,
                             rng.choice(["dollar", "dollar", "pound", "euro"])),
        "money_short": money_words(rng.randrange(5, 100), rng.randrange(1, 100), style="short"),
        "percent": cardinal(rng.randrange(1, 100)),
        "ordinal": ordinal(rng.randrange(1, 60)),
        "decimal": decimal_words(rng.randrange(0, 100), str(rng.randrange(1, 100))),
        "phone": f"{digits_words(str(rng.randrange(200, 1000)), rng.choice(['zero', 'oh']))}, "
                 f"{digits_words(f'{rng.randrange(10000):04d}', rng.choice(['zero', 'oh']))}",
        "code": digits_words(f"{rng.randrange(10000):04d}"),
        "flight": cardinal(rng.randrange(10, 2000)),
        "room": cardinal(rng.randrange(100, 500)),
        "month": MONTHS[month - 1],
    }
    return template.format(**slots)


def read_numbers(count: int, seed: int) -> list[str]:
    """``count`` generated number sentences (duplicates possible; the corpus removes them)."""
    rng = random.Random(f"numbers-{seed}")
    return [number_sentence(rng) for _ in range(count)]


# --- the corpus ----------------------------------------------------------------------------------------------------

def raw_sources(config: CorpusConfig, seed: int) -> Iterator[tuple[str, list[str]]]:
    """(source, raw candidates) for every source, in SOURCES order (the order deduplication favours)."""
    examples, glosses = read_wordnet(config.wordnet_dir)
    yield "wordnet-example", examples
    yield "wordnet-gloss", glosses
    yield "fortunes", read_fortunes(config.fortunes_dir)
    yield "gcide", read_gcide(config.gcide_file)
    yield "gettext", read_gettext(config.locale_globs)
    yield "numbers", read_numbers(config.number_sentences, seed)


def overlaps_heldout(norms: Iterable[str], heldout_norms: Iterable[str], words: int = OVERLAP_WORDS) -> list[bool]:
    """For each of ``norms``: whether a held-out norm of at least ``words`` words lies inside it, or it (at least
    ``words`` words) lies inside a held-out norm, as whole words."""
    starts: dict[tuple[str, ...], set[str]] = defaultdict(set)  # first ``words`` words -> held-out norms
    grams: dict[tuple[str, ...], set[str]] = defaultdict(set)  # any ``words`` consecutive words -> held-out norms
    for norm in heldout_norms:
        tokens = tuple(norm.split())
        if len(tokens) < words:
            continue
        starts[tokens[:words]].add(norm)
        for index in range(len(tokens) - words + 1):
            grams[tokens[index:index + words]].add(norm)
    flags = []
    for norm in norms:
        tokens = tuple(norm.split())
        padded = f" {' '.join(tokens)} "
        inside = len(tokens) >= words and any(padded in f" {other} " for other in grams.get(tokens[:words], ()))
        contains = any(f" {other} " in padded for index in range(len(tokens) - words + 1)
                       for other in starts.get(tokens[index:index + words], ()))
        flags.append(inside or contains)
    return flags


def build_corpus(config: CorpusConfig = CorpusConfig(), seed: int = 0,
                 sources: Iterable[tuple[str, list[str]]] | None = None) -> Corpus:
    """Clean, deduplicate (by ``norm``, across sources), split by sentence hash, drop training sentences that
    overlap held-out ones (``overlaps_heldout``) and shuffle by ``seed``.

    ``sources`` replaces the Debian readers (tests pass small lists).
    """
    corpus = Corpus()
    seen: set[str] = set()
    for source, candidates in (raw_sources(config, seed) if sources is None else sources):
        train, heldout = [], []
        rejected = duplicates = 0
        for raw in candidates:
            text = clean_sentence(raw, config.min_words, config.max_words)
            if text is None:
                rejected += 1
                continue
            sentence = Sentence(text, source)
            norm = sentence.norm
            if norm in seen:
                duplicates += 1
                continue
            seen.add(norm)
            (heldout if is_heldout(norm, config.heldout_percent) else train).append(sentence)
        for split, sentences in (("train", train), ("heldout", heldout)):
            random.Random(f"{seed}-{source}-{split}").shuffle(sentences)
        corpus.train[source], corpus.heldout[source] = train, heldout
        corpus.rejected[source], corpus.duplicates[source] = rejected, duplicates
    heldout_norms = {sentence.norm for sentences in corpus.heldout.values() for sentence in sentences}
    for source, sentences in corpus.train.items():
        flags = overlaps_heldout([sentence.norm for sentence in sentences], heldout_norms)
        corpus.train[source] = [sentence for sentence, flag in zip(sentences, flags) if not flag]
        corpus.overlaps[source] = sum(flags)
    return corpus


def mix(pools: dict[str, list[Sentence]], weights: Sequence[tuple[str, float]], seed: int) -> Iterator[Sentence]:
    """An endless stream drawing each sentence's source by ``weights`` and walking that source's list in order.

    A source that runs out starts again from a reshuffled copy (a sentence is repeated only after every other
    sentence of its source was used). Sources with no sentences are skipped.
    """
    rng = random.Random(f"mix-{seed}")
    names = [name for name, weight in weights if weight > 0 and pools.get(name)]
    if not names:
        return
    shares = [dict(weights)[name] for name in names]
    orders = {name: list(pools[name]) for name in names}
    positions = dict.fromkeys(names, 0)
    rounds = dict.fromkeys(names, 0)
    while True:
        name = rng.choices(names, shares)[0]
        if positions[name] == len(orders[name]):
            rounds[name] += 1
            random.Random(f"mix-{seed}-{name}-{rounds[name]}").shuffle(orders[name])
            positions[name] = 0
        yield orders[name][positions[name]]
        positions[name] += 1
