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
                                  ["--minutes", "0.05", "--window-minutes", "10"], ["--window-minutes", "1e-9"],
                                  ["--beam", "17"], ["--ctc-weight", "1.5"], ["--beam", "2"], ["--dtype", "half"]])
def test_bad_options(capsys, argv):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speechstream: error:") and len(err.strip().splitlines()) == 1, err


def test_rss_is_in_megabytes_on_every_system(tmp_path, monkeypatch):
    import resource
    from types import SimpleNamespace

    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  819200 kB\n")
    assert bench.rss_mb(status) == 800.0
    peak = {"darwin": 800 * 2**20, "freebsd": 800 * 2**10}  # ru_maxrss: bytes on macOS, KiB elsewhere
    for platform, maxrss in peak.items():
        monkeypatch.setattr(resource, "getrusage", lambda who, maxrss=maxrss: SimpleNamespace(ru_maxrss=maxrss))
        assert bench.rss_mb(tmp_path / "no-proc", platform) == 800.0


def test_minute_labels_tell_short_windows_apart():
    windows = (30, 5, 1, 0.1, 0.25, 0.05, 0.0107, 1 / 3, 0.00067)
    assert [bench.minute_decimals(w) for w in windows] == [1, 1, 1, 1, 2, 2, 4, 1, 4]
    w = bench.WindowStats(0.25, 0.5, 800.0, 10.0, 12.0, 5, 6, 0)
    assert bench.format_window(w, bench.minute_decimals(0.25)).split()[:2] == ["0.25-", "0.50"]
    w = bench.WindowStats(0.0107, 0.0214, 800.0, 10.0, 12.0, 5, 6, 0)
    assert bench.format_window(w, 2).split()[:2] == ["0.01-", "0.02"]
    assert len(bench.format_window(w, 2)) == len(bench.format_header(2))
    assert len(bench.format_window(w)) == len(bench.format_header())


def feeds_recorded(monkeypatch, interrupt_at: int | None = None) -> list[int]:
    """Record the size of every chunk the benchmark feeds; with ``interrupt_at``, Ctrl-C during that feed."""
    from speechstream.session import StreamingSession

    sizes: list[int] = []
    feed = StreamingSession.feed

    def recording(self, samples):
        if len(sizes) == interrupt_at:
            raise KeyboardInterrupt
        sizes.append(len(samples))
        return feed(self, samples)

    monkeypatch.setattr(StreamingSession, "feed", recording)
    return sizes


def test_every_timed_feed_is_a_whole_chunk(capsys, monkeypatch):
    """3 s is 4.69 chunks of 640 ms: the stream is made 5 whole chunks, not 4 and a piece the session only buffers
    (whose ~0 ms, alone in the last one-chunk window, made the last/first comparison say 0.00x)."""
    sizes = feeds_recorded(monkeypatch)
    assert main(["bench", "--minutes", "0.05", "--window-minutes", "0.0107"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sizes == [10240] * 5
    assert "0.05 min of audio (5 chunks of 640 ms)" in lines[0]
    rows = lines[2:-2]
    assert [r.split()[0] for r in rows] == ["0.0000-", "0.0213-", "0.0320-", "0.0427-"]  # one label each, none repeated
    assert all(float(r.split()[3]) > 0.5 for r in rows)  # ms: each chunk ran the encoder and the LLM


def test_an_interrupted_bench_still_reports_what_it_measured(capsys, monkeypatch):
    feeds_recorded(monkeypatch, interrupt_at=13)  # 9.4 chunks per window: the second window is in progress
    assert main(["bench", "--minutes", "0.2", "--window-minutes", "0.1"]) == 130
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert [r.split()[0] for r in lines[2:4]] == ["0.0-", "0.1-"]
    assert lines[3].split()[1] == "0.1"  # the window in progress ends where the audio fed did (13 chunks, 8.3 s)
    assert lines[4].startswith("last/first window: RSS ")
    assert lines[5] == "interrupted after 8 s of audio (" + lines[5].split("(")[1]
    assert captured.err == "speechstream: error: interrupted\n"


def test_ctrl_c_while_the_stream_is_finished_still_prints_the_comparison(capsys, monkeypatch):
    """Every window was printed, but a Ctrl-C during ``finish`` (the end of the stream, which no window counts) left
    out the last/first comparison the README promises on Ctrl-C."""
    from speechstream.session import StreamingSession

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(StreamingSession, "finish", interrupted)
    assert main(["bench", "--minutes", "0.1", "--window-minutes", "0.05"]) == 130
    lines = capsys.readouterr().out.strip().splitlines()
    assert [r.split()[0] for r in lines[2:4]] == ["0.00-", "0.05-"]
    assert lines[4].startswith("last/first window: RSS ")
    assert lines[5].startswith("interrupted after 6 s of audio (")


def test_device_work_is_waited_for_before_a_chunk_is_timed(monkeypatch):
    import torch

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    bench.device_sync("cpu")()
    assert waited == []
    bench.device_sync("cuda:1")()
    assert waited == ["cuda:1"]


def test_the_largest_llm_cache_counts_a_segments_tail_before_its_reset(capsys, monkeypatch):
    """The "max cache" column took the cache's length between feeds, so it never saw a segment's largest cache: the
    feed that ends a segment writes its tail (tiny-random: max_tail_tokens, 200) and resets the cache. 173 slots was
    reported where the cache held more than 200. Now it is the largest after any LLM step of the window."""
    from speechstream.decoder import GPEDecoder

    step, largest = GPEDecoder.step, []

    def watching_step(self, state, *args, **kwargs):
        logits = step(self, state, *args, **kwargs)
        largest.append(int(state.kinds.shape[1]))
        return logits

    monkeypatch.setattr(GPEDecoder, "step", watching_step)
    assert main(["bench", "--minutes", "0.2", "--window-minutes", "0.2", "--vad"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[2]
    end_cache, max_cache, segment = (int(x) for x in row.split()[-3:])
    assert segment >= 1 and max_cache == max(largest) > 200 > end_cache


def test_bench_runs_the_beam_search_it_is_asked_for(capsys, monkeypatch):
    """``--beam`` (with ``--ctc-weight``: tiny-random's own weight is 0) reaches the session: its plans are made."""
    from speechstream import beam

    plan, plans = beam.plan, []

    def counted(joint, state, logits, limits, width):
        plans.append(width)
        return plan(joint, state, logits, limits, width)

    monkeypatch.setattr(beam, "plan", counted)
    assert main(["bench", "--minutes", "0.05", "--window-minutes", "0.05", "--beam", "3", "--ctc-weight", "0.5"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("1 thread(s), beam 3")
    assert plans and set(plans) == {3}


def test_bench_decodes_with_the_llm_in_the_dtype_it_is_asked_for(capsys, monkeypatch):
    import torch

    from speechstream import session

    dtypes, step = [], session.StreamingSession._advance

    def seen(self):
        dtypes.append(self.model.decoder.dtype)
        return step(self)

    monkeypatch.setattr(session.StreamingSession, "_advance", seen)
    assert main(["bench", "--minutes", "0.05", "--window-minutes", "0.05", "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("1 thread(s), LLM in bfloat16")
    assert dtypes and set(dtypes) == {torch.bfloat16}
