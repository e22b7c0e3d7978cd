"""Long-session benchmark (``speechstream bench``): is memory and per-chunk latency flat over time?

A long synthetic stream is built deterministically from the real clips in ``samples/``:
the clips in name order, each followed by a pause of low seeded noise (lengths cycling
through ``PAUSES_S``), repeated to the requested length. It is fed to one session in
``chunk_ms`` chunks as fast as possible. Per window of audio the benchmark reports the
resident memory (VmRSS), the median and 95th percentile compute time of one chunk's
``feed`` (every chunk of the window counts, the first ones of the stream included: nothing is
excluded as warm-up), the LLM cache length and the VAD segment index; then the last window is
compared with the first. Interrupted (Ctrl-C), it still reports the window in progress and
the comparison before it stops.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from speechstream import shipped_dir
from speechstream.audio import SAMPLE_RATE
from speechstream.errors import InputError

SAMPLES_DIR = shipped_dir(Path(__file__).resolve().parent, "samples")  # the real clips
PAUSES_S = (0.8, 1.5, 3.0)  # pauses between clips, cycled (each is long enough to end a VAD segment)
NOISE = 1e-3  # amplitude of the pauses' noise (a quiet room, not digital silence)


@dataclass(frozen=True)
class BenchConfig:
    """Options of ``speechstream bench``."""

    minutes: float = 30.0  # length of the synthetic stream
    window_minutes: float = 5.0  # one report line per window of audio
    chunk_ms: int = 640  # audio per feed
    vad: bool = False  # VAD segments with cache resets
    model: str = "tiny-random"  # model name or directory
    device: str = "cpu"  # torch device
    threads: int = 1  # torch CPU threads (1: steady figures on a shared machine)
    ctc_weight: float | None = None  # joint CTC decoding's weight (None: the model's own)
    beam: int = 1  # joint CTC beam search's width (1: greedy)
    dtype: str = "float32"  # the LLM's precision (config.DTYPES)
    seed: int = 0  # seed of the pauses' noise

    def validate(self) -> "BenchConfig":
        from speechstream.chunker import chunk_samples
        from speechstream.config import check_device

        chunk_samples(self.chunk_ms)
        check_device(self.device)
        self.decoding()  # (its own checks: the weight's range, the beam's width)
        chunk_minutes = self.chunk_ms / 60_000
        if not (np.isfinite(self.minutes) and chunk_minutes <= self.minutes <= MAX_MINUTES):
            raise InputError(f"--minutes must be from one chunk ({chunk_minutes:g}) to {MAX_MINUTES:g}, "
                             f"got {self.minutes}")
        if not (np.isfinite(self.window_minutes) and chunk_minutes <= self.window_minutes <= self.minutes):
            raise InputError(f"--window-minutes must be from one chunk ({chunk_minutes:g}) to --minutes "
                             f"({self.minutes:g}), got {self.window_minutes}")
        return self

    def decoding(self):
        """The session's decoding options: the commands' defaults but for these."""
        from speechstream.config import DecodingConfig

        return DecodingConfig(chunk_ms=self.chunk_ms, vad=self.vad, device=self.device, ctc_weight=self.ctc_weight,
                              beam=self.beam, dtype=self.dtype)


MAX_MINUTES = 100_000.0  # --minutes: about ten weeks of audio


@dataclass(frozen=True)
class WindowStats:
    """Figures of one window of audio."""

    start_min: float  # window start (minutes of audio)
    end_min: float  # window end
    rss_mb: float  # resident memory at the window's end
    median_ms: float  # median compute time of one chunk
    p95_ms: float  # 95th percentile
    llm_cache: int  # LLM cache slots at the window's end
    max_llm_cache: int  # largest LLM cache in the window (after any LLM step, a segment's tail before its reset too)
    segment: int  # VAD segment index at the window's end


def load_clips(directory: Path = SAMPLES_DIR) -> list[np.ndarray]:
    """The real clips (``*.wav``) in name order, as 16 kHz float32."""
    from speechstream.audio import load_audio

    paths = sorted(directory.glob("*.wav"))
    if not paths:
        raise InputError(f"{directory}: no .wav clips to build the stream from")
    return [load_audio(str(path)) for path in paths]


def synthetic_pieces(clips: list[np.ndarray], seed: int = 0) -> Iterator[np.ndarray]:
    """Clip, pause, clip, pause, ... for ever (pauses: seeded low noise, lengths cycling through PAUSES_S)."""
    rng = np.random.default_rng(seed)
    i = 0
    while True:
        yield clips[i % len(clips)]
        pause = int(PAUSES_S[i % len(PAUSES_S)] * SAMPLE_RATE)
        yield (NOISE * rng.standard_normal(pause)).astype(np.float32)
        i += 1


def synthetic_chunks(clips: list[np.ndarray], total: int, size: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The first ``total`` samples of the synthetic stream in chunks of ``size`` (the last may be shorter)."""
    buffer, made = np.zeros(0, np.float32), 0
    for piece in synthetic_pieces(clips, seed):
        buffer = np.concatenate([buffer, piece])
        while buffer.size >= size and made < total:
            take = min(size, total - made)
            yield buffer[:take]
            buffer, made = buffer[take:], made + take
        if made >= total:
            return


def rss_mb(status: Path = Path("/proc/self/status"), platform: str = sys.platform) -> float:
    """Resident memory of this process in MB: VmRSS from ``status`` (Linux); elsewhere the peak so far, ru_maxrss
    (bytes on macOS, KiB on the other systems)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if platform == "darwin" else 1024)


def window_stats(start_min: float, end_min: float, latencies_s: list[float], caches: list[tuple[int, int]],
                 segment: int) -> WindowStats:
    """Summarise one window (pure, apart from reading the memory); ``caches``: per chunk, the LLM cache's length after
    its feed and the most it held during it."""
    ms = np.asarray(latencies_s) * 1000
    return WindowStats(start_min, end_min, rss_mb(), float(np.median(ms)), float(np.percentile(ms, 95)),
                       caches[-1][0], max(peak for _, peak in caches), segment)


def minute_decimals(window_minutes: float) -> int:
    """Decimals of the minutes column: the fewest (at least 1, at most 4) that write the window length exactly, so
    that every window bound prints as it is (0.25 -> 2: 0.25-0.50, not 0.2-0.5); a length no 4 decimals write
    exactly gets enough for its first significant digit (1/3 -> 1, 0.00067 -> 4)."""
    for decimals in range(1, 5):
        if abs(round(window_minutes, decimals) - window_minutes) <= 1e-9 * window_minutes:
            return decimals
    return max(1, -math.floor(math.log10(window_minutes)))


def format_header(decimals: int = 1) -> str:
    return (f"{'minutes':>{2 * decimals + 9}} {'RSS MB':>8} {'median ms':>10} {'p95 ms':>8} {'LLM cache':>10} "
            f"{'max cache':>10} {'segment':>8}")


def format_window(w: WindowStats, decimals: int = 1) -> str:
    width = decimals + 4
    return (f"{w.start_min:{width}.{decimals}f}-{w.end_min:{width}.{decimals}f} {w.rss_mb:8.1f} {w.median_ms:10.1f} "
            f"{w.p95_ms:8.1f} {w.llm_cache:10d} {w.max_llm_cache:10d} {w.segment:8d}")


def format_ratios(windows: list[WindowStats]) -> str:
    first, last = windows[0], windows[-1]
    return (f"last/first window: RSS {last.rss_mb / first.rss_mb:.2f}x, "
            f"median latency {last.median_ms / first.median_ms:.2f}x")


def device_sync(device: str) -> Callable[[], None]:
    """What waits until the work queued on ``device`` is done, so that a chunk's time is its whole compute (CUDA and
    MPS run asynchronously: a chunk that only reads would otherwise be timed by what the next one waits for)."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if kind == "mps":
        return torch.mps.synchronize
    return lambda: None


def run(config: BenchConfig, emit: Callable[[str], None]) -> list[WindowStats]:
    """Run the benchmark, emitting the report line by line; return the window figures.

    On KeyboardInterrupt (while the stream is finished too) the window in progress and the last/first comparison are
    still emitted, then the interrupt is raised again."""
    import torch

    from speechstream.chunker import chunk_samples
    from speechstream.model import load_decoding_model
    from speechstream.session import StreamingSession

    clips = load_clips()
    torch.set_num_threads(config.threads)
    decoding = config.decoding()
    model = load_decoding_model(config.model, decoding)
    session = StreamingSession(model, decoding, partials=False)
    sync = device_sync(config.device)
    size = chunk_samples(config.chunk_ms)
    # whole chunks: a shorter last piece would only be buffered by the session, and its near-zero time would count
    # as a chunk's (alone in its window, it made the last/first comparison about nothing)
    total = size * math.ceil(round(config.minutes * 60 * SAMPLE_RATE) / size)
    window = max(size, int(round(config.window_minutes * 60 * SAMPLE_RATE)))  # samples per window
    decimals = minute_decimals(config.window_minutes)
    extras = [f"beam {config.beam}"] * (config.beam > 1) + [f"LLM in {config.dtype}"] * (config.dtype != "float32")
    emit(f"speechstream bench: model {config.model}, {config.minutes:g} min of audio ({total // size} chunks of "
         f"{config.chunk_ms} ms), VAD {'on' if config.vad else 'off'}, {config.threads} thread(s)"
         + "".join(f", {extra}" for extra in extras))
    emit(format_header(decimals))
    windows: list[WindowStats] = []
    latencies: list[float] = []
    caches: list[tuple[int, int]] = []  # per chunk: the LLM cache after its feed, and the most during it
    fed = 0

    def close_window() -> None:
        n = min(len(latencies), len(caches))  # an interrupt may fall between the two appends
        start_min = windows[-1].end_min if windows else 0.0
        windows.append(window_stats(start_min, fed / SAMPLE_RATE / 60, latencies[:n], caches[:n], session.segment))
        emit(format_window(windows[-1], decimals))
        latencies.clear()
        caches.clear()

    started = time.perf_counter()
    try:
        for chunk in synthetic_chunks(clips, total, size, config.seed):
            start = time.perf_counter()
            session.feed(chunk)
            sync()
            elapsed = time.perf_counter() - start
            latencies.append(elapsed)
            caches.append((session.llm_cache_length or 0, session.take_llm_cache_peak() or 0))
            fed += chunk.size
            if fed >= (len(windows) + 1) * window or fed >= total:
                close_window()
        session.finish()  # (a Ctrl-C here, every window printed, still gets the comparison)
    except KeyboardInterrupt:
        if latencies and caches:
            close_window()
        if windows:
            emit(format_ratios(windows))
        emit(f"interrupted after {fed / SAMPLE_RATE:.0f} s of audio ({time.perf_counter() - started:.0f} s of "
             "compute)")
        raise
    wall = time.perf_counter() - started
    emit(format_ratios(windows))
    emit(f"compute {wall:.0f} s for {total / SAMPLE_RATE:.0f} s of audio (RTF {wall / (total / SAMPLE_RATE):.3f}); "
         f"{session.segment + 1} segment(s); transcript {len(session.transcript)} characters")
    return windows
