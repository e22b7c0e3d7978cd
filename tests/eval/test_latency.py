"""Latency metrics: hand-computed values, and parity with SimulEval 1.1.4's own scorers to 1e-6.

The parity tests rebuild SimulEval's `LogInstance` objects from the same JSON lines an `instances.log` holds
(that is what SimulEval scores after every run and with --score-only) and call its registered scorers.
They are skipped where the `simuleval` package is not installed.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from argparse import Namespace

import pytest

from speechstream.eval.latency import (
    LATENCY_METRICS,
    SIMULEVAL_METRICS,
    al,
    ap,
    atd,
    atd_ca,
    atd_compute_times,
    corpus_latency,
    dal,
    end_offset,
    instance_latency,
    laal,
    long_form_latency,
    reference_length,
    sentence_delays,
    split_units,
    start_offset,
    yaal,
)

TOLERANCE = 1e-6
# Every key corpus_latency can produce, plain metrics first.
ALL_KEYS = [*LATENCY_METRICS, *(name + "_CA" for name in LATENCY_METRICS)]
# The keys SimulEval 1.1.4 scores too (all but YAAL's).
SIMULEVAL_KEYS = [*SIMULEVAL_METRICS, *(name + "_CA" for name in SIMULEVAL_METRICS)]
# Seeded random instances compared one by one against SimulEval.
RANDOM_INSTANCES = 200


@pytest.fixture(scope="module")
def simuleval_scorers():
    """SimulEval's latency scorer registry and its log-instance class (skips the test without simuleval)."""
    scorers = pytest.importorskip("simuleval.evaluator.scorers.latency_scorer")
    instance = pytest.importorskip("simuleval.evaluator.instance")
    logging.getLogger("simuleval").setLevel(logging.ERROR)  # it warns once per skipped instance
    return scorers.LATENCY_SCORERS_DICT, instance.LogInstance


def simuleval_corpus(
    scorers_and_instance, records: list[dict], unit: str = "word", use_ref_len: bool = True
) -> dict[str, float]:
    """SimulEval's corpus value of every metric, keyed like scores.json (metrics it cannot score are left out)."""
    scorers, log_instance = scorers_and_instance
    instances = {index: log_instance(json.dumps(record), unit) for index, record in enumerate(records)}
    results = {}
    for key in SIMULEVAL_KEYS:
        name, computation_aware = key.removesuffix("_CA"), key.endswith("_CA")
        try:
            results[key] = scorers[name](computation_aware=computation_aware, use_ref_len=use_ref_len)(instances)
        except statistics.StatisticsError:  # SimulEval's mean over no instance at all
            pass
    return results


def assert_same_scores(ours: dict[str, float], theirs: dict[str, float]) -> None:
    """Our scores of SimulEval's metrics: the same keys as its, and every value within TOLERANCE."""
    ours = {key: value for key, value in ours.items() if key in SIMULEVAL_KEYS}
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=TOLERANCE, rel=0), key


def record(delays, source_length, reference="w w w", elapsed=None, **extra) -> dict:
    """One instances.log line; `elapsed` defaults to the delays plus 10 ms of compute per write."""
    if elapsed is None:
        elapsed = [delay + 10 * (index + 1) for index, delay in enumerate(delays)]
    line = {
        "index": 0,
        "prediction": " ".join(f"w{index}" for index in range(len(delays))),
        "reference": reference,
        "delays": list(delays),
        "elapsed": list(elapsed),
        "source_length": source_length,
    }
    line.update(extra)
    return line


def random_record(rng: random.Random, index: int) -> dict:
    """A random instance: chunked monotone delays most of the time, sometimes arbitrary ones.

    Source lengths are whole ms or sample-exact (n / 16 ms); elapsed adds a growing compute time, which
    sometimes shrinks (non-monotone elapsed); references have 0-30 words, sometimes with doubled spaces.
    """
    source_length = rng.choice([rng.randint(200, 20000), rng.randint(3200, 320000) / 16])
    length = rng.randint(1, 40)
    style = rng.random()
    if style < 0.75:
        chunk_ms = rng.choice([10, 40, 320, 640, 1000])
        points = sorted(rng.choice([0.0, rng.uniform(0, source_length), source_length]) for _ in range(length))
        delays = [min(source_length, round(point / chunk_ms) * chunk_ms) for point in points]
    else:
        delays = [rng.uniform(0, 1.3 * source_length) for _ in range(length)]
    compute, elapsed = 0.0, []
    for delay in delays:
        compute += rng.uniform(-80 if style > 0.9 else 0, 300)
        elapsed.append(delay + compute)
    separator = "  " if rng.random() < 0.1 else " "
    reference = separator.join(f"r{word}" for word in range(rng.randint(0, 30)))
    return {
        "index": index,
        "prediction": " ".join(f"p{word}" for word in range(length)),
        "reference": reference,
        "delays": delays,
        "elapsed": elapsed,
        "source_length": source_length,
    }


@pytest.fixture(scope="module")
def random_records() -> list[dict]:
    rng = random.Random(20240501)
    return [random_record(rng, index) for index in range(RANDOM_INSTANCES)]


# ---- hand-computed values (no SimulEval needed) -------------------------------------------------------------

# Four words over 3 s of audio: two at 1 s, one at 2 s, one at the end; the reference has four words too.
HAND_DELAYS = [1000, 1000, 2000, 3000]


def test_al_laal_by_hand():
    # Ideal writer: one word per 750 ms. Lags 1000, 250, 500, 750; the 4th word is the first at |X|.
    assert al(HAND_DELAYS, 3000, 4) == pytest.approx(625)
    assert laal(HAND_DELAYS, 3000, 4) == pytest.approx(625)
    # A 2-word reference: ideal step 1500 ms; AL uses it, LAAL uses max(4, 2) = 4 words.
    assert al(HAND_DELAYS, 3000, 2) == pytest.approx((1000 + (1000 - 1500) + (2000 - 3000) + (3000 - 4500)) / 4)
    assert laal(HAND_DELAYS, 3000, 2) == pytest.approx(625)


def test_al_stops_at_first_word_after_source():
    # tau = 2: the second word already had the whole source; later words do not count.
    assert al([500, 1000, 1000, 1000], 1000, 4) == pytest.approx((500 + 1000 - 250) / 2)


def test_al_first_word_after_source_is_its_delay():
    assert al([1500, 1600], 1000, 2) == 1500
    assert laal([1500, 1600], 1000, 2) == 1500


def test_dal_ap_offsets_by_hand():
    # DAL: step 750 ms, adjusted delays 1000, 1750, 2500, 3250 -> every lag is 1000.
    assert dal(HAND_DELAYS, 3000, 99) == pytest.approx(1000)
    assert ap(HAND_DELAYS, 3000, 4) == pytest.approx(7000 / 12000)
    assert ap(HAND_DELAYS, 3000, None) == pytest.approx(7000 / 12000)
    assert start_offset(HAND_DELAYS, 3000) == 1000
    assert end_offset(HAND_DELAYS, 3000) == 0


def test_atd_by_hand():
    # Source chunks 0-1000, 1000-2000, 2000-3000, each cut into 300+300+300+100 ms tokens ending at
    # 300, 600, 900, 1000, 1300, ... Words pair with source tokens 1, 2, 3, 4: 700, 400, 1100, 2000.
    assert atd(HAND_DELAYS) == pytest.approx((700 + 400 + 1100 + 2000) / 4)


def test_atd_target_chunk_after_a_revisited_delay_sees_the_whole_source():
    # Non-monotone delays: five writes but two distinct delays, so source chunks 0-300 (one token ending at 300)
    # and 300-1000 (tokens ending at 600, 900, 1000). Target chunks 3 to 5 lie past the last source chunk: all
    # 4 source tokens count as read before them, so no surplus shifts their pairing. T = 300, 1000, 1000, 1000,
    # 1000 pair with source tokens 1, 2, 3, 4, 4: delays 0, 400, 100, 0, 0 (SimulEval 1.1.4 gives the same).
    # Kills the mutation that counts only the source chunks before the last one as read there (mean 320).
    assert atd([300, 1000, 300, 1000, 300]) == pytest.approx(100.0)


def test_atd_ca_adds_compute_growth():
    elapsed = [1100, 1100, 2300, 3300]  # 100 ms of compute before the first write, 300 ms from the second on
    assert atd_compute_times(HAND_DELAYS, elapsed) == [100, 0, 200, 0]
    # Target times become 1100, 1100, max(2000, 1100) + 200 = 2200 and max(3000, 2200) + 0 = 3000: only the
    # growth of compute time is added, so a lag built up earlier disappears once the source catches up.
    assert atd_ca(HAND_DELAYS, elapsed) == pytest.approx((800 + 500 + 1300 + 2000) / 4)
    assert atd_ca(HAND_DELAYS, elapsed) < atd(elapsed)
    assert atd_compute_times([5, 6], [0, 0]) == [0, 0]


def test_metrics_need_output():
    for metric in (al, laal, dal, ap, start_offset, end_offset):
        with pytest.raises(ValueError):
            metric([], 1000, 3)
    with pytest.raises(ValueError):
        atd([])
    with pytest.raises(ValueError):
        atd_ca([100, 200], [150])


def test_units_and_reference_length():
    assert split_units("  hello   world ") == ["hello", "world"]
    assert split_units("ab c", "char") == ["a", "b", "c"]
    assert reference_length("a b c") == 3
    assert reference_length("a  b") == 3  # SimulEval splits on single spaces
    assert reference_length("") == 1
    assert reference_length(" abc ", "char") == 3
    with pytest.raises(ValueError):
        reference_length("a", "spm")


def test_corpus_skips_and_reference_fields():
    with_output = record([1000, 2000], 2000, reference="a b")
    assert instance_latency(record([], 2000)) == {}
    assert corpus_latency([with_output, record([], 2000)]) == corpus_latency([with_output])
    assert corpus_latency([record([], 2000)]) == {}
    no_elapsed = record([1000], 2000, elapsed=[])
    assert sorted(corpus_latency([no_elapsed])) == sorted(LATENCY_METRICS)
    # null reference -> hypothesis length; missing reference -> "" -> one word.
    null_reference = record([1000, 2000], 2000, reference=None)
    missing_reference = record([1000, 2000], 2000)
    del missing_reference["reference"]
    assert corpus_latency([null_reference])["AP"] == pytest.approx(3000 / (2000 * 2))
    assert corpus_latency([missing_reference])["AP"] == pytest.approx(3000 / (2000 * 1))
    assert list(corpus_latency([with_output])) == ALL_KEYS


# ---- parity with SimulEval ----------------------------------------------------------------------------------


def test_random_instances_match_simuleval_one_by_one(simuleval_scorers, random_records):
    for line in random_records:
        for use_ref_len in (True, False):
            ours = instance_latency(line, use_reference_length=use_ref_len)
            theirs = simuleval_corpus(simuleval_scorers, [line], use_ref_len=use_ref_len)
            assert_same_scores(ours, theirs)


def test_random_corpus_matches_simuleval(simuleval_scorers, random_records):
    for use_ref_len in (True, False):
        ours = corpus_latency(random_records, use_reference_length=use_ref_len)
        assert_same_scores(ours, simuleval_corpus(simuleval_scorers, random_records, use_ref_len=use_ref_len))


def test_char_unit_matches_simuleval(simuleval_scorers, random_records):
    lines = random_records[:40]
    assert_same_scores(corpus_latency(lines, unit="char"), simuleval_corpus(simuleval_scorers, lines, unit="char"))


EDGE_CASES = {
    "single word": [record([640], 2000)],
    "single word at the end": [record([2000], 2000, reference="one")],
    "output before any source": [record([0, 0, 0], 1500, elapsed=[12, 12, 12])],
    "all output after the end of source": [record([1500] * 5, 1500)],
    "first write after the source (elapsed)": [record([1000, 1000], 1000, elapsed=[1400, 1400])],
    "hypothesis longer than reference": [record([320, 320, 640, 960, 960, 1280], 1300, reference="a b")],
    "hypothesis shorter than reference": [record([960, 1280], 1300, reference="a b c d e f g h")],
    "non-monotone elapsed": [record([320, 640, 960, 1280], 1300, elapsed=[900, 800, 1500, 1400])],
    "elapsed all zero": [record([320, 640, 640], 700, elapsed=[0, 0, 0])],
    "sample-exact source length": [record([320, 640, 1234.5625], 1234.5625)],
    "delays beyond the source": [record([200, 900, 1700], 1000)],
    "repeated non-adjacent delays": [record([600, 300, 600, 300], 900)],
    "delays revisited past the last source chunk": [record([300, 1000, 300, 1000, 300], 2000)],
    "reference with extra spaces": [record([300, 600], 900, reference=" a  b ")],
    "empty reference": [record([300, 600], 900, reference="")],
    "null reference": [record([300, 600], 900, reference=None)],
    "no elapsed": [record([300, 600], 900, elapsed=[])],
    "empty output mixed in": [record([], 900), record([300, 600], 900), record([], 500, elapsed=[])],
}


@pytest.mark.parametrize("lines", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_edge_cases_match_simuleval(simuleval_scorers, lines):
    for use_ref_len in (True, False):
        ours = corpus_latency(lines, use_reference_length=use_ref_len)
        assert_same_scores(ours, simuleval_corpus(simuleval_scorers, lines, use_ref_len=use_ref_len))


def test_no_output_anywhere_fails_in_simuleval_and_is_left_out_here(simuleval_scorers):
    scorers, log_instance = simuleval_scorers
    instances = {0: log_instance(json.dumps(record([], 900)))}
    with pytest.raises(statistics.StatisticsError):
        scorers["AL"]()(instances)
    assert corpus_latency([record([], 900)]) == {}


def simuleval_score_only(directory, computation_aware: bool) -> dict[str, float]:
    """The latency scores SimulEval's own evaluator gives an instances.log, as `simuleval --score-only` does."""
    evaluator_module = pytest.importorskip("simuleval.evaluator.evaluator")
    args = Namespace(
        score_only=True,
        no_scoring=False,
        output=str(directory),
        source_type="speech",
        target_type="text",
        eval_latency_unit="word",
        eval_latency_spm_model=None,
        latency_metrics=list(SIMULEVAL_METRICS),
        quality_metrics=[],
        computation_aware=computation_aware,
        no_use_ref_len=False,
        start_index=0,
        end_index=-1,
        no_progress_bar=True,
    )
    return evaluator_module.SentenceLevelEvaluator.from_args(args).latency


def test_simuleval_score_only_runs_match(simuleval_scorers, random_records, tmp_path):
    """Plain metrics equal a SimulEval run without --computation-aware, _CA ones the _CA columns of a run with it.

    With --computation-aware SimulEval 1.1.4 builds its plain scorers computation-aware too, so there every
    plain column silently equals its _CA twin; the plain values must come from a run without the flag.
    """
    lines = random_records[:50] + [record([], 900, index=50)]
    (tmp_path / "instances.log").write_text("".join(json.dumps(line) + "\n" for line in lines))
    plain_run = simuleval_score_only(tmp_path, computation_aware=False)
    aware_run = simuleval_score_only(tmp_path, computation_aware=True)
    for name in SIMULEVAL_METRICS:
        assert aware_run[name] == aware_run[name + "_CA"]  # SimulEval's quirk, see the docstring
    expected = {**plain_run, **{key: value for key, value in aware_run.items() if key.endswith("_CA")}}
    assert_same_scores(corpus_latency(lines), expected)


# -- YAAL ---------------------------------------------------------------------------------------------------


def test_yaal_by_hand_leaves_out_what_was_written_after_the_source():
    # rate max(4, 3) / 2000: one word per 500 ms; the two words at the end of the source are left out
    assert yaal([500, 1000, 2000, 2000], 2000, 3) == pytest.approx((500 + (1000 - 500)) / 2)
    # LAAL closes its sum with the first of them instead
    assert laal([500, 1000, 2000, 2000], 2000, 3) == pytest.approx((500 + 500 + (2000 - 1000)) / 3)
    assert yaal([2000, 2000], 2000, 2) is None  # nothing before the end (AL's d_1 > |X| rule does not apply)
    assert yaal([2500], 2000, 1) is None and al([2500], 2000, 1) == 2500
    assert yaal([500, 1000, 2000, 2600], 2000, 3, end=2600) == pytest.approx((500 + 500 + 1000) / 3)
    assert yaal([300, 2500, 600], 1000, 3) == pytest.approx((300 + 600 - 1000 / 3) / 2)  # the early ones, in order
    assert yaal([300, 600], 900, None) == pytest.approx((300 + 600 - 450) / 2)  # |Y*| without a reference


def test_yaal_corpus_skips_utterances_that_wrote_only_at_the_end():
    early = record([500, 1000, 2000], 2000, reference="a b c", elapsed=[600, 2100, 2100])
    late = record([1500, 1500], 1500, reference="a b")
    scores = corpus_latency([early, late])
    assert scores["YAAL"] == pytest.approx(yaal([500, 1000, 2000], 2000, 3))  # the late one is skipped
    assert scores["YAAL_CA"] == pytest.approx(600)
    assert scores["AL"] == pytest.approx((al([500, 1000, 2000], 2000, 3) + al([1500, 1500], 1500, 2)) / 2)
    assert "YAAL" not in instance_latency(late) and "AL" in instance_latency(late)
    assert "YAAL" not in corpus_latency([late]) and "LAAL" in corpus_latency([late])


# -- long-form: StreamLAAL and LongYAAL ----------------------------------------------------------------------


def long_form_record(prediction: str, delays: list[float], segments: list[tuple[float, float, str]]) -> dict:
    return {"id": "talk", "prediction": prediction, "delays": delays, "elapsed": [d + 100 for d in delays],
            "source_length": 4000.0,
            "segments": [{"offset": o, "duration": d, "reference": r} for o, d, r in segments]}


def test_stream_laal_and_long_yaal_by_hand():
    record = long_form_record("a b c d", [500, 1500, 2600, 3100], [(0, 2000, "a b"), (2000, 1000, "c d e")])
    sentences = sentence_delays(record)
    assert [s["delays"] for s in sentences] == [[500, 1500], [600, 1100]]  # from each sentence's start
    # sentence 1: |X| 2000, 2 words: lags 500, 1500 - 1000 -> 500; sentence 2: |X| 1000, |Y_ref| 3: lags 600,
    # 1100 - 1000/3, which is past the end and closes the sum
    first, second = 500.0, (600 + 1100 - 1000 / 3) / 2
    scores = long_form_latency([record])
    assert scores["StreamLAAL"] == pytest.approx((first + second) / 2, abs=1e-9)
    assert scores["StreamLAAL_CA"] == pytest.approx((first + 100 + second + 100) / 2, abs=1e-9)
    # each sentence's value is LAAL of its own delays (LAAL itself is checked against simuleval above)
    assert laal([600, 1100], 1000, 3) == pytest.approx(second)
    # LongYAAL: the talk ends at 3000 ms (its last sentence's end); sentence 1 keeps both words (lags 500, 500),
    # sentence 2 only the word before the talk's end, 1000 ms after its start (600); the same + 100 computation-aware
    assert scores["LongYAAL"] == pytest.approx((500 + 600) / 2, abs=1e-9)
    assert scores["LongYAAL_CA"] == pytest.approx((600 + 700) / 2, abs=1e-9)
    assert list(scores) == ["StreamLAAL", "LongYAAL", "StreamLAAL_CA", "LongYAAL_CA"]
    after = long_form_record("a b c d", [500, 1500, 3000, 3100], [(0, 2000, "a b"), (2000, 1000, "c d e")])
    assert long_form_latency([after])["LongYAAL"] == pytest.approx(500)  # sentence 2 said nothing before the end


def test_stream_laal_skips_sentences_without_words_and_needs_segments_everywhere():
    record = long_form_record("alpha beta zeta", [300, 900, 2900],
                              [(0, 1000, "alpha beta"), (1000, 1000, "gamma delta"), (2000, 1000, "epsilon zeta")])
    assert [len(s["delays"]) for s in sentence_delays(record)] == [2, 0, 1]
    expected = (laal([300, 900], 1000, 2) + laal([900], 1000, 2)) / 2
    assert long_form_latency([record])["StreamLAAL"] == pytest.approx(expected)
    plain = {key: value for key, value in record.items() if key != "segments"}
    assert long_form_latency([record, plain]) == {} and long_form_latency([]) == {}
    silent = long_form_record("", [], [(0, 1000, "a")])
    assert long_form_latency([silent]) == {}
    with pytest.raises(ValueError, match="delays"):
        sentence_delays(long_form_record("a b", [1.0], [(0, 1000, "a b")]))


def test_stream_laal_is_laal_of_a_sentence_given_more_words_than_its_reference():
    # the sentence "a b" (2000 ms) is given all three words: LAAL's ideal writer spreads max(3, 2) words over it,
    # one per 2000 / 3 ms, so the lags are 500, 1000 - 2000 / 3 and 1500 - 4000 / 3, 1000 / 3 on average; AL's would
    # spread only the two reference words (lags 500, 0, -500: 0). A mutation that scored sentences with AL passed.
    record = long_form_record("a b c", [500, 1000, 1500], [(0, 2000, "a b")])
    assert [s["delays"] for s in sentence_delays(record)] == [[500, 1000, 1500]]
    assert long_form_latency([record])["StreamLAAL"] == pytest.approx(1000 / 3)
    # the reference is counted as SimulEval counts it: "a b " is three words, so LAAL's writer spreads three again
    spaced = long_form_record("a b", [500, 1000], [(0, 2000, "a b ")])
    assert long_form_latency([spaced])["StreamLAAL"] == pytest.approx((500 + 1000 - 2000 / 3) / 2)


def test_long_form_corpus_values_are_the_mean_over_sentences():
    # three one-word sentences of 1000 ms, each word 100, 200 and 900 ms after its sentence began: a one-word LAAL (and
    # YAAL, every word before the talk's end) is that delay, so both are (100 + 200 + 900) / 3 = 400 (a mutation
    # taking the median, 200, passed: every long-form test had at most two sentences)
    record = long_form_record("a b c", [100, 1200, 2900], [(0, 1000, "a"), (1000, 1000, "b"), (2000, 1000, "c")])
    scores = long_form_latency([record])
    assert scores["StreamLAAL"] == pytest.approx(400) and scores["LongYAAL"] == pytest.approx(400)
