"""Latency metrics for streaming speech-to-text, computed the way SimulEval 1.1.4 computes them.

Every metric is a small pure function of one utterance's timing record; `corpus_latency` averages them over
a list of `instances.log` records the way SimulEval's scorers do. Values are in milliseconds except AP,
which is a ratio.

Notation used in the docstrings (speech input, text output, SimulEval's default "word" unit):

- |X|: source length in ms of audio (`source_length`).
- d_i: ms of source read when target word i (1-based) was emitted (`delays`). Every word of one write shares
  its d. For the computation-aware (`_CA`) variants d_i is replaced by the matching entry of `elapsed`,
  which is d_i plus the wall-clock ms spent since the first source chunk was sent.
- |Y*|: hypothesis length = the number of delays (one per emitted word); the prediction text itself is not
  read.
- |Y_ref|: reference length (see `reference_length`). SimulEval counts it as `len(reference.split(" "))`:
  runs of spaces, leading and trailing spaces each add an (empty) word, and an empty reference counts as one
  word. A reference of `None` (or `use_reference_length=False`, SimulEval's `--no-use-ref-len`) makes every
  metric use |Y*| instead; `reference_length=None` means exactly that in the functions below.

Where SimulEval uses which length:

- AL: |Y_ref|.  LAAL: max(|Y*|, |Y_ref|).  AP: |Y_ref|.  DAL: always |Y*|.  StartOffset, EndOffset, ATD: none.
- YAAL, which SimulEval 1.1.4 does not have (Polák et al. 2025), takes LAAL's max(|Y*|, |Y_ref|).
- ATD ignores |X| as well: it only looks at the delays (and the elapsed times for ATD_CA).

Skipping and averaging (SimulEval's corpus rules, reproduced by `corpus_latency`):

- The corpus value of a metric is the unweighted mean of its per-utterance values.
- A plain metric skips utterances whose `delays` are missing or empty (no output). A `_CA` metric skips
  utterances whose `elapsed` are missing or empty; ATD_CA needs both `delays` and `elapsed`. YAAL (and YAAL_CA)
  also skips an utterance that wrote nothing before the end of its source.
- When every utterance is skipped SimulEval fails (the mean of nothing); here the key is left out instead.
- A reference field that is absent counts as the empty string (|Y_ref| = 1); a JSON `null` reference means
  "use |Y*|". This mirrors how SimulEval rebuilds instances from `instances.log`.
- No rounding is done here (SimulEval rounds only what it prints to `scores.tsv`, to 3 decimals).

Two SimulEval behaviours worth knowing when comparing numbers:

- With `--computation-aware`, SimulEval 1.1.4 builds its plain scorers computation-aware as well, so in such
  a run every plain column equals its `_CA` twin. Here the plain metrics are always the computation-unaware
  ones, i.e. what SimulEval reports without the flag; the `_CA` ones are its `_CA` columns with the flag.
- ATD_CA is not ATD of `elapsed`: it keeps the source chunks of `delays` and adds to each target token only
  the growth of computation time since the previous token (see `atd_compute_times`), so computation lag
  built up earlier vanishes once the source delay overtakes it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate

# SimulEval cuts the speech source into pseudo-tokens of this many ms for ATD.
ATD_SOURCE_TOKEN_MS = 300
# Text target tokens have no duration of their own in ATD (speech input, text output).
ATD_TARGET_TOKEN_MS = 0

# The metrics SimulEval 1.1.4 scores, as they appear in scores.json; each also exists with the suffix "_CA".
SIMULEVAL_METRICS = ("AL", "LAAL", "DAL", "AP", "StartOffset", "EndOffset", "ATD")
# Every latency metric of scores.json (each also with "_CA"): SimulEval's, then YAAL.
LATENCY_METRICS = (*SIMULEVAL_METRICS, "YAAL")
# Suffix that marks the computation-aware variant of a metric.
COMPUTATION_AWARE_SUFFIX = "_CA"


def split_units(text: str, unit: str = "word") -> list[str]:
    """Cut emitted text into the latency units SimulEval assigns one delay each.

    "word": whitespace-separated words of the stripped text; "char": every character except spaces.
    The streaming side must log exactly one delay per unit returned here.
    """
    if unit == "word":
        return text.strip().split()
    if unit == "char":
        return list(text.replace(" ", ""))
    raise ValueError(f"unknown latency unit {unit!r} (expected 'word' or 'char')")


def reference_length(reference: str, unit: str = "word") -> int:
    """|Y_ref| as SimulEval counts it.

    "word": the number of pieces of `reference.split(" ")` -- split on single spaces, so "a  b" has 3
    pieces and "" has 1. "char": the number of characters after stripping surrounding whitespace.
    """
    if unit == "word":
        return len(reference.split(" "))
    if unit == "char":
        return len(reference.strip())
    raise ValueError(f"unknown latency unit {unit!r} (expected 'word' or 'char')")


def _target_length(delays: Sequence[float], reference_length: int | None) -> int:
    """|Y_ref| when given, else |Y*| = the number of delays."""
    return len(delays) if reference_length is None else reference_length


def _check_output(delays: Sequence[float]) -> None:
    """Every per-utterance metric needs at least one emitted unit."""
    if len(delays) == 0:
        raise ValueError("latency of an utterance with no output is undefined (SimulEval skips it)")


def _lagging(delays: Sequence[float], source_length: float, target_length: float) -> float:
    """Average lagging behind an ideal policy that emits `target_length` units evenly over the source.

    If the first unit came after the whole source (d_1 > |X|) the result is d_1. Otherwise, with
    rate = target_length / |X| and tau = the 1-based index of the first unit emitted once the whole
    source had been read (d_i >= |X|), or the number of units when there is none:
        (1 / tau) * sum over i = 1..tau of (d_i - (i - 1) / rate).
    """
    _check_output(delays)
    if delays[0] > source_length:
        return delays[0]
    rate = target_length / source_length  # target units per ms of source for the ideal writer
    lags = []
    for index, delay in enumerate(delays):
        lags.append(delay - index / rate)
        if delay >= source_length:
            break
    return sum(lags) / len(lags)


def al(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """Average Lagging (Ma et al. 2019, STACL), SimulEval's variant.

    The lagging of `_lagging` with target_length = |Y_ref| (|Y*| when `reference_length` is None): how far,
    on average up to the first unit written after the end of the source, the system trails an ideal writer
    that spreads the reference evenly over the source. Computation-aware: pass `elapsed` as `delays`.
    """
    return _lagging(delays, source_length, _target_length(delays, reference_length))


def laal(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """Length-Adaptive Average Lagging (Papi et al. 2022).

    AL with target_length = max(|Y*|, |Y_ref|), so an over-long hypothesis cannot lower its lagging by
    being compared with a slower ideal writer. Computation-aware: pass `elapsed` as `delays`.
    """
    return _lagging(delays, source_length, max(len(delays), _target_length(delays, reference_length)))


def yaal(delays: Sequence[float], source_length: float, reference_length: int | None = None,
         end: float | None = None) -> float | None:
    """Yet Another Average Lagging (Polák et al. 2025, "Better Late Than Never"), the lagging of LAAL over the units
    written before the source ended.

    With rate = max(|Y*|, |Y_ref|) / |X| (as LAAL), and d'_1, d'_2, ... the delays below ``end`` (|X| unless given:
    the long form passes the end of the whole recording) in their order:
        YAAL = (1 / n) * sum over j = 1..n of (d'_j - (j - 1) / rate).
    Units written once the source was over are left out instead of being cut off after the first of them (AL's tau),
    so a system is not scored on what it writes after it has heard everything; unlike AL there is no d_1 > |X| rule.
    None when no unit came before ``end`` (the corpus skips such an utterance). Computation-aware: pass `elapsed`.
    """
    _check_output(delays)
    rate = max(len(delays), _target_length(delays, reference_length)) / source_length
    limit = source_length if end is None else end
    early = [delay for delay in delays if delay < limit]
    if not early:
        return None
    return sum(delay - index / rate for index, delay in enumerate(early)) / len(early)


def dal(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """Differentiable Average Lagging (Arivazhagan et al. 2019), SimulEval's variant.

    Always uses the hypothesis length: step = |X| / |Y*|. Delays are first made to advance by at least one
    step per unit: d'_1 = d_1, d'_i = max(d_i, d'_{i-1} + step). Then
        DAL = (1 / |Y*|) * sum over all i of (d'_i - (i - 1) * step).
    There is no cut-off at the end of the source. `reference_length` is accepted for a uniform signature
    and ignored, as in SimulEval. Computation-aware: pass `elapsed` as `delays`.
    """
    del reference_length  # SimulEval's DAL never uses the reference length.
    _check_output(delays)
    step = 1 / (len(delays) / source_length)  # ms of source per hypothesis unit, computed as SimulEval does
    lags = []
    previous = 0.0
    for index, delay in enumerate(delays):
        adjusted = delay if index == 0 else max(delay, previous + step)
        lags.append(adjusted - index * step)
        previous = adjusted
    return sum(lags) / len(delays)


def ap(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """Average Proportion (Cho and Esipova 2016): the mean fraction of the source read per unit.

        AP = (sum over all i of d_i) / (|X| * |Y_ref|)
    The sum runs over every emitted unit but is divided by the reference length (|Y*| when
    `reference_length` is None), so an over-long hypothesis can exceed 1. Computation-aware: pass `elapsed`.
    """
    _check_output(delays)
    return sum(delays) / (source_length * _target_length(delays, reference_length))


def start_offset(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """StartOffset: d_1, the ms of source read when the first unit was written.

    `source_length` and `reference_length` are accepted for a uniform signature and ignored.
    Computation-aware: pass `elapsed` as `delays`.
    """
    del source_length, reference_length
    _check_output(delays)
    return delays[0]


def end_offset(delays: Sequence[float], source_length: float, reference_length: int | None = None) -> float:
    """EndOffset: d_last - |X|, how long after the end of the source the last unit came (<= 0 without CA).

    `reference_length` is accepted for a uniform signature and ignored. Computation-aware: pass `elapsed`.
    """
    del reference_length
    _check_output(delays)
    return delays[-1] - source_length


def _runs_of_equal(values: Sequence[float]) -> list[int]:
    """Lengths of the maximal runs of consecutive equal values: [5, 5, 7, 5] -> [2, 1, 1]."""
    runs: list[int] = []
    for index, value in enumerate(values):
        if index > 0 and value == values[index - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def _distinct_in_order(values: Sequence[float]) -> list[float]:
    """Distinct values in order of first appearance: [5, 7, 5, 9] -> [5, 7, 9]."""
    seen: set[float] = set()
    distinct = []
    for value in values:
        if value not in seen:
            seen.add(value)
            distinct.append(value)
    return distinct


def _cut_into_source_tokens(duration: float) -> list[float]:
    """Lengths of the 300 ms pseudo-tokens one source chunk is cut into: full tokens, then any remainder.

    Uses Python's floor division and modulo, as SimulEval does (a negative duration, which only non-monotone
    delays produce, yields a single positive remainder token).
    """
    whole, rest = divmod(duration, ATD_SOURCE_TOKEN_MS)
    return [ATD_SOURCE_TOKEN_MS] * int(whole) + ([rest] if rest != 0 else [])


def atd_compute_times(delays: Sequence[float], elapsed: Sequence[float]) -> list[float]:
    """Per-unit computation time that ATD_CA adds, derived from `elapsed` as SimulEval does.

    c_i = (e_i - d_i) - (e_{i-1} - d_{i-1}), with e_0 - d_0 = 0: the growth of the pure computation time
    since the previous unit (0 for the later units of one write). When every elapsed value is exactly 0
    the times are all 0.
    """
    if len(elapsed) != len(delays):
        raise ValueError(f"{len(delays)} delays but {len(elapsed)} elapsed values")
    if all(value == 0 for value in elapsed):
        return [0] * len(elapsed)
    computation = [end - delay for end, delay in zip(elapsed, delays)]
    return [value - before for value, before in zip(computation, [0, *computation[:-1]])]


def atd(delays: Sequence[float], compute_times: Sequence[float] | None = None) -> float:
    """Average Token Delay (Kano et al. 2023) for speech input and text output, as SimulEval computes it.

    Chunks: the target is cut into chunks at every change of delay (consecutive equal delays form one
    write). The source is cut into chunks at the distinct delays u_1, u_2, ... (in order of first
    appearance, u_0 = 0): chunk k covers u_{k-1}..u_k and is split into 300 ms pseudo-tokens plus one
    shorter remainder token. Each source token ends at the running sum of token lengths. Only audio up to
    the last delay is tokenised; the source length plays no part.

    Target times: text tokens have no duration, so token i ends at T_i = max(d_i, T_{i-1}) + c_i (T_0 = 0),
    with c_i the computation time of unit i (0 unless computation-aware, see `atd_compute_times`).

    Matching: for target token i (1-based) in chunk k, let A_x and A_y be the numbers of source and target
    tokens in chunks 1..k-1. It is paired with source token s = min(i - max(0, A_y - A_x), A_x + size of
    source chunk k) -- the i-th source token, shifted back by the target's surplus so far, but never beyond
    what had been read. Its delay is T_i minus the end time of source token s (0 for s = 0).

    ATD is the mean of these delays over all target tokens.
    """
    _check_output(delays)
    if compute_times is None:
        compute_times = [0] * len(delays)

    target_chunk_sizes = _runs_of_equal(delays)
    target_chunk_of_token = [chunk for chunk, size in enumerate(target_chunk_sizes, 1) for _ in range(size)]

    boundaries = _distinct_in_order(delays)
    source_chunk_sizes = []
    source_token_ends = [0.0]  # end time of source token s at index s; index 0 is "before any source"
    for start, end in zip([0, *boundaries[:-1]], boundaries):
        token_lengths = _cut_into_source_tokens(end - start)
        source_chunk_sizes.append(len(token_lengths))
        for token_length in token_lengths:
            source_token_ends.append(source_token_ends[-1] + token_length)

    source_before = [0, *accumulate(source_chunk_sizes)]  # source tokens in chunks 1..k-1, at index k-1
    target_before = [0, *accumulate(target_chunk_sizes)]

    token_delays = []
    target_end = 0.0
    for position, (delay, compute_time) in enumerate(zip(delays, compute_times), 1):
        target_end = max(delay, target_end) + ATD_TARGET_TOKEN_MS + compute_time
        chunk = target_chunk_of_token[position - 1]
        # A target chunk past the last source chunk (only with non-monotone delays) sees the whole source.
        read_before = source_before[min(chunk - 1, len(source_chunk_sizes))]
        read_through = source_before[min(chunk, len(source_chunk_sizes))]
        surplus = max(0, target_before[chunk - 1] - read_before)
        source_token = min(position - surplus, read_through)
        token_delays.append(target_end - source_token_ends[source_token])
    return float(statistics.mean(token_delays))


def atd_ca(delays: Sequence[float], elapsed: Sequence[float]) -> float:
    """Computation-aware ATD: `atd` with the computation times that `atd_compute_times` derives from `elapsed`.

    Unlike the other `_CA` metrics this is not `atd(elapsed)`: source chunks still come from `delays`.
    """
    return atd(delays, atd_compute_times(delays, elapsed))


# The metrics that take (delays, source_length, reference_length); their _CA variant takes elapsed instead.
_LENGTH_METRICS = {
    "AL": al,
    "LAAL": laal,
    "DAL": dal,
    "AP": ap,
    "StartOffset": start_offset,
    "EndOffset": end_offset,
    "YAAL": yaal,
}


def instance_latency(
    record: Mapping, unit: str = "word", use_reference_length: bool = True
) -> dict[str, float]:
    """Every latency metric that applies to one `instances.log` record.

    `record` needs `source_length` (ms) and, for the metrics to apply, non-empty `delays` (plain metrics)
    and/or `elapsed` (`_CA` metrics; ATD_CA needs both). `reference` is read as SimulEval reads it from the
    log: absent -> "", null -> use the hypothesis length. Metrics that do not apply are left out.
    """
    delays = record.get("delays") or []
    elapsed = record.get("elapsed") or []
    if not delays and not elapsed:
        return {}
    reference = record.get("reference", "")
    ref_length = reference_length(reference, unit) if use_reference_length and reference is not None else None
    source_length = record["source_length"]

    scores: dict[str, float] = {}
    for name, metric in _LENGTH_METRICS.items():
        for key, times in ((name, delays), (name + COMPUTATION_AWARE_SUFFIX, elapsed)):
            value = metric(times, source_length, ref_length) if times else None
            if value is not None:  # (YAAL of an utterance that wrote nothing before the source ended)
                scores[key] = value
    if delays:
        scores["ATD"] = atd(delays)
        if elapsed:
            scores["ATD" + COMPUTATION_AWARE_SUFFIX] = atd_ca(delays, elapsed)
    return scores


def corpus_latency(
    records: Iterable[Mapping], unit: str = "word", use_reference_length: bool = True
) -> dict[str, float]:
    """Corpus latency scores: for each metric, the unweighted mean over the records it applies to.

    Keys are `LATENCY_METRICS` and the same with "_CA", in that order; a metric that applies to no record
    is left out. `unit` is SimulEval's `--eval-latency-unit` ("word" or "char"); `use_reference_length`
    False is its `--no-use-ref-len`.
    """
    per_metric: dict[str, list[float]] = {}
    for record in records:
        for name, value in instance_latency(record, unit, use_reference_length).items():
            per_metric.setdefault(name, []).append(value)
    names = [*LATENCY_METRICS, *(name + COMPUTATION_AWARE_SUFFIX for name in LATENCY_METRICS)]
    return {name: float(statistics.mean(per_metric[name])) for name in names if name in per_metric}


# Long-form latency: the keys in scores.json (each also with "_CA").
STREAM_LAAL = "StreamLAAL"
LONG_YAAL = "LongYAAL"
LONG_FORM_METRICS = (STREAM_LAAL, LONG_YAAL)


def sentence_delays(record: Mapping) -> list[dict]:
    """One long-form record's hypothesis shared out among its reference sentences (`speechstream.eval.resegment`).

    ``record["segments"]``: the reference sentences, each ``{"offset", "duration"}`` (ms from the start of the
    record's audio) and ``"reference"``. Returns, per sentence, ``delays`` and ``elapsed`` of the words it was
    given, measured from the sentence's offset (a word emitted before its sentence began has a negative delay),
    with the sentence's ``duration`` and ``reference``.
    """
    from speechstream.eval.resegment import assign_words

    segments = record["segments"]
    shares = assign_words([segment["reference"] for segment in segments], record["prediction"])
    delays, elapsed = record.get("delays") or [], record.get("elapsed") or []
    if sum(map(len, shares)) != len(delays):
        raise ValueError(f"{record.get('id')}: {len(delays)} delays for {sum(map(len, shares))} words")
    sentences, start = [], 0
    for segment, words in zip(segments, shares):
        end = start + len(words)
        offset = segment["offset"]
        sentences.append({
            "delays": [delay - offset for delay in delays[start:end]],
            "elapsed": [value - offset for value in elapsed[start:end]],
            "duration": segment["duration"],
            "reference": segment["reference"],
        })
        start = end
    return sentences


def long_form_latency(records: Iterable[Mapping]) -> dict[str, float]:
    """StreamLAAL (Papi et al. 2024, StreamAtt) and LongYAAL (Polák et al. 2025), each with its ``_CA`` twin, over
    long-form records.

    Each record's hypothesis is resegmented into its reference sentences (`sentence_delays`), and each sentence is
    scored with the delays measured from its start, |X| = its duration and |Y_ref| its reference (in words, as
    SimulEval counts them). StreamLAAL is LAAL per sentence. LongYAAL is YAAL per sentence with the cut-off at the
    end of the recording (the end of its last reference sentence) instead of the sentence's: a word of the sentence
    written after the sentence but while the talk goes on still counts, one written after the talk is over does not.
    The corpus value of each is the mean over every sentence of every record that was given at least one word (and,
    for LongYAAL, one before that end); a sentence given none is skipped, as SimulEval skips an utterance with no
    output. Empty when a record has no ``segments`` or no sentence got a word.

    The resegmentation is `speechstream.eval.resegment`'s (the same for both); the authors' LongYAAL aligns with
    their SoftSegmenter instead, so a sentence's words, and then the figures, may differ from theirs.
    """
    records = list(records)
    if not records or any(not record.get("segments") for record in records):
        return {}
    per_metric: dict[str, list[float]] = {}
    for record in records:
        talk_end = max(segment["offset"] + segment["duration"] for segment in record["segments"])
        for sentence, segment in zip(sentence_delays(record), record["segments"]):
            length = reference_length(sentence["reference"])
            for suffix, times in (("", sentence["delays"]), (COMPUTATION_AWARE_SUFFIX, sentence["elapsed"])):
                if not times:
                    continue
                per_metric.setdefault(STREAM_LAAL + suffix, []).append(laal(times, sentence["duration"], length))
                lagging = yaal(times, sentence["duration"], length, end=talk_end - segment["offset"])
                if lagging is not None:
                    per_metric.setdefault(LONG_YAAL + suffix, []).append(lagging)
    names = [name + suffix for suffix in ("", COMPUTATION_AWARE_SUFFIX) for name in LONG_FORM_METRICS]
    return {name: float(statistics.mean(per_metric[name])) for name in names if name in per_metric}
