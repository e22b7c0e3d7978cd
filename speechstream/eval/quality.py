"""Quality metrics: WER and CER (jiwer), BLEU and chrF (sacrebleu corpus scoring).

All scores are corpus-level percentages (0-100; WER and CER can exceed 100):

- WER: word edit operations summed over the corpus / reference words summed over the corpus, on the words of
  the raw text cut at any whitespace (``str.split``: a line break or a tab separates two words as a space does) --
  the same quantity SimulEval 1.1.4 reports as WER (it uses no normalisation either). CER: the same over
  characters, jiwer's default: leading and trailing whitespace is stripped, every other character counts, each
  space of a run of spaces included.
- WER_normalized / CER_normalized: the same after `normalize_english` on both sides.
- BLEU: sacrebleu's corpus BLEU with its defaults (tokenizer "13a", exponential smoothing, one reference),
  as SimulEval's BLEU. chrF: sacrebleu's corpus chrF with its defaults (character 6-grams, no word n-grams,
  beta 2), i.e. chrF rather than chrF++.

The English normaliser `normalize_english`, step by step (each step sees the previous one's output):

0. Unicode NFKC normalisation (`unicodedata.normalize("NFKC", ...)`): a letter and its combining accent become
   the one precomposed letter ("cafe\u0301" -> "café"), ligatures and compatibility forms their plain letters
   ("ﬁne" -> "fine", full-width "ＡＢＣ" -> "abc", "²" -> "2").
1. Lowercase (`str.lower`); the typographic apostrophes ’ and ‘ become '.
2. Money: a currency sign before a number becomes the number in words then the currency name:
   "$5" -> "five dollars", "$1" -> "one dollar", "£2" -> "two pounds", "€3" -> "three euros". Exactly two
   decimals are read as cents/pence: "$5.50" -> "five dollars fifty cents"; other decimals are read as a
   decimal number ("$2.5" -> "two point five dollars"); ".00" adds nothing ("$1.00" -> "one dollar").
3. Percent: a number followed by "%" -> the number in words then "percent" ("5%" -> "five percent"), thousands
   separators and decimals included ("1,000.5%" -> "one thousand point five percent").
4. Decades: a two-digit multiple of ten or a four-digit year ending in 0, followed by "s" or "'s" and not part
   of a longer number, is read as the plural of its spoken form: the last number word takes "ies" for a final
   "y", else "s" ("80s" -> "eighties", "1990s" -> "nineteen nineties", "1900s" -> "nineteen hundreds",
   "2000s" -> "two thousands", "2010s" -> "twenty tens").
5. Thousands separators: digit groups written as 1-3 digits then groups of exactly three digits joined by
   commas lose the commas ("1,000,000" -> "1000000"), also before a letter ("1,000th" -> "1000th"); "1,2" is
   left alone (the comma is punctuation), and so is a number glued to a letter, a comma or a point before it.
6. Ordinals: digits followed by st/nd/rd/th -> ordinal words ("3rd" -> "third", "21st" -> "twenty first",
   "100th" -> "one hundredth", "1,000th" -> "one thousandth"); the suffix need not be the grammatical one
   ("3th" -> "third"). Digits right after a digit, comma or point are not an ordinal ("1.5th" is the decimal
   1.5 then "th").
7. Decimals: digits "." digits -> the integer part in words, "point", then each fractional digit
   ("3.05" -> "three point zero five").
8. Remaining digit runs -> cardinal words, American style without "and" ("105" -> "one hundred five",
   "1990" -> "one thousand nine hundred ninety"; years other than decades are not read as "nineteen ninety"). A
   run with a leading zero or longer than 18 digits is read digit by digit ("007" -> "zero zero seven"). Digits
   glued to letters are split off ("mp3" -> "mp three"). Signs are not read ("-5" -> "five").
9. Punctuation: apostrophes are deleted ("don't" -> "dont"); every other character whose Unicode category is
   punctuation (P*) or symbol (S*) becomes a space ("well-known" -> "well known", "u.s." -> "u s").
10. Titles: the whole words "mr", "mrs" and "dr" become "mister", "missus" and "doctor".
11. Whitespace: runs of whitespace become one space; leading and trailing whitespace is removed.

Example: "Mr. Smith paid $5, on the 3rd!" -> "mister smith paid five dollars on the third".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import jiwer
import sacrebleu

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# Scale words for successive groups of three digits.
_SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion")
# Cardinal words whose ordinal is not just "+th".
_IRREGULAR_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
# Largest number of digits read as one cardinal; longer runs are read digit by digit.
_MAX_CARDINAL_DIGITS = 18
# Currency sign -> (singular, plural, singular of the hundredth part, plural of the hundredth part).
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
}
# Whole-word abbreviations spelled out after punctuation removal.
_TITLES = {"mr": "mister", "mrs": "missus", "dr": "doctor"}

_MONEY = re.compile(r"([$£€])\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?")
# A grouped number may have decimals too: "1,000.5%" is one number, not "1," then "000.5%".
_PERCENT = re.compile(r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s?%")
# A decade: "80s", "1990s", "1990's" (not "180s", not "1,990s").
_DECADE = re.compile(r"(?<![\w,.])([1-9]0|[1-9]\d{2}0)'?s\b")
# Not after a word character, comma or point: "1,000th" is grouped first, "1.5th" is no ordinal.
_ORDINAL = re.compile(r"(?<![\w,.])(\d{1,18})(?:st|nd|rd|th)\b")
_GROUPED = re.compile(r"(?<![\w,.])\d{1,3}(?:,\d{3})+(?!\d)")
_DECIMAL = re.compile(r"(\d+)\.(\d+)")
_DIGITS = re.compile(r"\d+")


def _below_thousand(number: int) -> list[str]:
    """Words for 0 < number < 1000, American style: 342 -> three hundred forty two."""
    words = []
    hundreds, rest = divmod(number, 100)
    if hundreds:
        words += [_ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens])
        if ones:
            words.append(_ONES[ones])
    elif rest:
        words.append(_ONES[rest])
    return words


def number_to_words(number: int) -> str:
    """English cardinal words for 0 <= number < 10**18, without "and" or hyphens.

    1234567 -> "one million two hundred thirty four thousand five hundred sixty seven".
    """
    if not 0 <= number < 10**_MAX_CARDINAL_DIGITS:
        raise ValueError(f"number_to_words supports 0 <= number < 10**18, got {number}")
    if number == 0:
        return "zero"
    words: list[str] = []
    scale = 0
    while number:
        number, group = divmod(number, 1000)
        if group:
            words = _below_thousand(group) + ([_SCALES[scale]] if _SCALES[scale] else []) + words
        scale += 1
    return " ".join(words)


def ordinal_to_words(number: int) -> str:
    """English ordinal words: 1 -> "first", 22 -> "twenty second", 40 -> "fortieth", 100 -> "one hundredth"."""
    *head, last = number_to_words(number).split()
    if last in _IRREGULAR_ORDINALS:
        last = _IRREGULAR_ORDINALS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return " ".join([*head, last])


def digits_to_words(digits: str) -> str:
    """Each digit as a word: "007" -> "zero zero seven"."""
    return " ".join(_ONES[int(digit)] for digit in digits)


def _integer_to_words(digits: str) -> str:
    """A digit string as a cardinal, or digit by digit when it has a leading zero or is too long."""
    if (len(digits) > 1 and digits[0] == "0") or len(digits) > _MAX_CARDINAL_DIGITS:
        return digits_to_words(digits)
    return number_to_words(int(digits))


def _decimal_to_words(integer: str, fraction: str) -> str:
    """ "3", "05" -> "three point zero five"."""
    return f"{_integer_to_words(integer)} point {digits_to_words(fraction)}"


def _money_to_words(match: re.Match) -> str:
    """Step 2 of the normaliser: "$5.50" -> "five dollars fifty cents"."""
    sign, integer, fraction = match.group(1), match.group(2).replace(",", ""), match.group(3)
    one, many, one_part, many_part = _CURRENCIES[sign]
    if fraction is not None and len(fraction) != 2:
        return f" {_decimal_to_words(integer, fraction)} {many} "
    words = f"{_integer_to_words(integer)} {one if integer == '1' else many}"
    if fraction is not None and int(fraction):
        words += f" {_integer_to_words(fraction.lstrip('0'))} {one_part if fraction == '01' else many_part}"
    return f" {words} "


def _percent_to_words(match: re.Match) -> str:
    """Step 3 of the normaliser: "5%" -> "five percent"; a decimal is read here as step 7 reads one ("12.5%" ->
    "twelve point five percent")."""
    number = match.group(1).replace(",", "")
    if "." in number:
        number = _decimal_to_words(*number.split("."))
    return f" {number} percent "


def _plural(words: str) -> str:
    """The last word pluralised: "ninety" -> "nineties", "ten" -> "tens"."""
    *head, last = words.split()
    return " ".join([*head, last[:-1] + "ies" if last.endswith("y") else last + "s"])


def _decade_to_words(match: re.Match) -> str:
    """Step 4 of the normaliser: "80s" -> "eighties", "1990s" -> "nineteen nineties", "2000s" -> "two thousands"."""
    digits = match.group(1)
    if len(digits) == 2:
        return f" {_plural(number_to_words(int(digits)))} "
    century, rest = int(digits[:2]), int(digits[2:])
    if rest:  # 1990 -> nineteen ninety
        spoken = f"{number_to_words(century)} {number_to_words(rest)}"
    elif century % 10:  # 1900 -> nineteen hundred
        spoken = f"{number_to_words(century)} hundred"
    else:  # 2000 -> two thousand
        spoken = number_to_words(int(digits))
    return f" {_plural(spoken)} "


def _is_punctuation_or_symbol(character: str) -> bool:
    """True for Unicode categories P* (punctuation) and S* (symbols)."""
    return unicodedata.category(character)[0] in "PS"


def normalize_english(text: str) -> str:
    """Normalise English text for WER/CER as the module docstring describes, step by step."""
    text = unicodedata.normalize("NFKC", text)
    text = text.lower().replace("’", "'").replace("‘", "'")
    text = _MONEY.sub(_money_to_words, text)
    text = _PERCENT.sub(_percent_to_words, text)
    text = _DECADE.sub(_decade_to_words, text)
    text = _GROUPED.sub(lambda match: match.group(0).replace(",", ""), text)
    text = _ORDINAL.sub(lambda match: f" {ordinal_to_words(int(match.group(1)))} ", text)
    text = _DECIMAL.sub(lambda match: f" {_decimal_to_words(match.group(1), match.group(2))} ", text)
    text = _DIGITS.sub(lambda match: f" {_integer_to_words(match.group(0))} ", text)
    text = text.replace("'", "")
    text = "".join(" " if _is_punctuation_or_symbol(character) else character for character in text)
    words = [_TITLES.get(word, word) for word in text.split()]
    return " ".join(words)


def spaced_words(texts: Sequence[str]) -> list[str]:
    """Each text's words (``str.split``: cut at any whitespace) joined by single spaces, as jiwer's word transform
    needs them: it cuts at spaces alone, so "one\\ntwo" (a line break the LLM wrote) was one word to it."""
    return [" ".join(text.split()) for text in texts]


def _check_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Both sides must be lists of strings of the same non-zero length."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("pass lists of sentences, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("cannot score an empty corpus")


def _error_rate(hypotheses: Sequence[str], references: Sequence[str], characters: bool) -> float:
    """Corpus edit operations / corpus reference units, in percent, via jiwer's default transforms.

    An empty reference is allowed (its pair adds only insertions); a corpus whose references are all empty
    raises ValueError.
    """
    _check_corpus(hypotheses, references)
    if characters:
        output = jiwer.process_characters(list(references), list(hypotheses))
    else:
        output = jiwer.process_words(spaced_words(references), spaced_words(hypotheses))
    reference_units = output.substitutions + output.deletions + output.hits
    if reference_units == 0:
        raise ValueError("every reference is empty: the error rate is undefined")
    return 100.0 * (output.substitutions + output.deletions + output.insertions) / reference_units


def wer(hypotheses: Sequence[str], references: Sequence[str], normalize: bool = False) -> float:
    """Corpus word error rate in percent: word edits over reference words, summed over the corpus.

    With `normalize`, both sides go through `normalize_english` first.
    """
    if normalize:
        hypotheses, references = _normalize_all(hypotheses), _normalize_all(references)
    return _error_rate(hypotheses, references, characters=False)


def cer(hypotheses: Sequence[str], references: Sequence[str], normalize: bool = False) -> float:
    """Corpus character error rate in percent: character edits over reference characters (spaces included).

    With `normalize`, both sides go through `normalize_english` first.
    """
    if normalize:
        hypotheses, references = _normalize_all(hypotheses), _normalize_all(references)
    return _error_rate(hypotheses, references, characters=True)


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    """sacrebleu corpus BLEU (one reference per hypothesis), as SimulEval's BLEU scorer computes it."""
    _check_corpus(hypotheses, references)
    return sacrebleu.metrics.BLEU(tokenize=tokenize).corpus_score(list(hypotheses), [list(references)]).score


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu corpus chrF with its default settings (one reference per hypothesis)."""
    _check_corpus(hypotheses, references)
    return sacrebleu.metrics.CHRF().corpus_score(list(hypotheses), [list(references)]).score


def _normalize_all(texts: Sequence[str]) -> list[str]:
    """`normalize_english` on every text."""
    return [normalize_english(text) for text in texts]


def transcription_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """scores.json entries for transcription: WER, CER, WER_normalized, CER_normalized.

    A pair of rates whose references are all empty (the rate is undefined) is left out rather than raising:
    raw WER/CER when every reference is empty or whitespace, the normalised ones when every reference
    normalises to nothing (e.g. "..." alone). Scoring never fails on the references of a decoded run.
    """
    scores: dict[str, float] = {}
    if any(reference.strip() for reference in references):
        scores |= {"WER": wer(hypotheses, references), "CER": cer(hypotheses, references)}
    normalized_hypotheses, normalized_references = _normalize_all(hypotheses), _normalize_all(references)
    if any(normalized_references):
        scores |= {"WER_normalized": wer(normalized_hypotheses, normalized_references),
                   "CER_normalized": cer(normalized_hypotheses, normalized_references)}
    return scores


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """scores.json entries for translation: BLEU and chrF."""
    return {"BLEU": bleu(hypotheses, references), "chrF": chrf(hypotheses, references)}
