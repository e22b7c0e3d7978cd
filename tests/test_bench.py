"""``speechstream bench``: the synthetic long stream and the report (a short run, not a timing test)."""

import numpy as np
import pytest

from speechstream import bench
from speechstream.cli import main


def test_synthetic_stream_is_deterministic_and_exact():
    clips = [np.ones(1000, np.float32), 2 * np.ones(700, np.float32)]
    chunks = list(bench.synthetic_chunks(clips, total=50_000, size=3000))
    again = np.concatenate(list(bench.synthetic_chunks(clips, total=50_000, size=3000)))
    stream = np.concatenate(chunks)
    assert stream.size == 50_000 and [c.size for c in chunks[:-1]] == [3000] * (len(chunks) - 1)
    assert np.array_equal(stream, again)
    assert np.array_equal(stream[:1000], clips[0])  # clip, then a quiet pause, then the next clip
    pause = stream[1000 : 1000 + int(bench.PAUSES_S[0] * 16000)]
    assert 0 < np.abs(pause).max() < 0.01
    assert np.array_equal(stream[1000 + pause.size : 1000 + pause.size + 700], clips[1])


def test_bench_prints_the_table(capsys):
    assert main(["bench", "--minutes", "0.2", "--window-minutes", "0.1", "--vad"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "VAD on" in lines[0] and "RSS MB" in lines[1] and "median ms" in lines[1]
    rows = lines[2:4]
    assert [r.split()[0] for r in rows] == ["0.0-", "0.1-"]
    for row in rows:
        rss, median, p95 = (float(x) for x in row.split()[2:5])
        assert rss > 0 and 0 < median <= p95
    assert lines[4].startswith("last/first window: RSS ") and "median latency" in lines[4]
    assert lines[5].startswith("compute ")


@pytest.mark.parametrize("argv", [["--minutes", "0"], ["--minutes", "nan"], ["--window-minutes", "-1"],
                                  ["--chunk-ms", "7"], ["--minutes", "1e308"], ["--minutes", "1e-9"],
                                  ["--minutes", "0.05", "--window-minutes", "10"], ["--window-minutes", "1e-9"]])
def test_bad_options(capsys, argv):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speechstream: error:") and len(err.strip().splitlines()) == 1, err
