"""The live page in headless Chromium: its fake microphone plays samples/jfk.wav into the real server.

Chromium is driven over the DevTools protocol (a few lines of CDP over aiohttp's WebSocket
client). The page shows exactly the text the server sent for its stream; the audio the server
received is the WAV (cross-correlation, allowing the fake device's start offset and its looping);
a lone session on that received audio writes the same transcript; and at least 30 % of the page's
words (52-68 % measured with the stage-1 English weights, 68 % with stage 1b, 65 % with stage 1c, 69 % with
stage 1d) are words of the clip.
A second recording keeps the first one's text on the page and in the saved text.
The English checkpoint does not transcribe exactly yet, so no more is asked.
"""

import asyncio
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import soundfile
import torch

from speechstream.audio import load_audio

ROOT = Path(__file__).resolve().parent.parent
WAV = ROOT / "samples" / "jfk.wav"
JFK_TEXT = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
MODEL = "smollm2-whisper-base"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system installs it)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


class DevTools:
    """A minimal Chrome DevTools Protocol client: send a command, wait for its reply."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"DevTools connection ended: {msg.type}")
            reply = json.loads(msg.data)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    async def evaluate(self, expression: str, user_gesture: bool = False):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True,
                                 userGesture=user_gesture)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page exception: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait(self, expression: str, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.25)
        state = await self.evaluate("JSON.stringify({s: window.speechstream, e: document.getElementById('error')"
                                    ".textContent})")
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; page state: {state[:500]}")


def best_alignment(received: np.ndarray, wav: np.ndarray) -> tuple[float, int]:
    """Largest normalised correlation of ``received`` with the looped ``wav`` over all start offsets."""
    n = len(wav)
    looped = np.tile(wav, int(np.ceil(len(received) / n)) + 2)
    size = 1 << int(np.ceil(np.log2(len(looped) + len(received))))
    # correlation of received with every window looped[lag : lag + len(received)], lag in [0, n)
    corr = np.fft.irfft(np.fft.rfft(looped, size) * np.conj(np.fft.rfft(received, size)), size)[:n]
    window_energy = np.convolve(looped ** 2, np.ones(len(received)), mode="valid")[:n]
    score = corr / np.sqrt(window_energy * np.sum(received ** 2) + 1e-12)
    lag = int(np.argmax(score))
    return float(score[lag]), lag


def test_the_live_page_streams_the_fake_microphone_and_shows_the_servers_text(tmp_path):
    record = tmp_path / "record"
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        server = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "speechstream"), "serve", "--port", str(port), "--model", MODEL,
             "--record-dir", str(record)],
            stderr=stderr, env=env, cwd=ROOT,
        )
    browser = None
    try:
        wait_for(lambda: "serving http://127.0.0.1" in log.read_text() or server.poll() is not None, 180,
                 "the server to listen")
        assert server.poll() is None, log.read_text()
        profile = tmp_path / "chromium"
        browser = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--use-file-for-fake-audio-capture={WAV}",
             "--remote-debugging-port=0", f"http://127.0.0.1:{port}/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        active = profile / "DevToolsActivePort"
        wait_for(lambda: active.exists() and active.read_text().strip(), 60, "Chromium's DevTools port")
        devtools_port = int(active.read_text().split()[0])
        page_text, page_events = asyncio.run(drive_page(devtools_port, port))
    finally:
        for process in (browser, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT if process is server else signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    # 1. the page shows exactly what the server sent for its stream
    sent = [json.loads(line) for line in (record / "stream-0001.jsonl").read_text().splitlines()]
    assert sent[-1]["type"] == "end" and page_events == sent
    assert page_text == sent[-1]["text"] == "".join(e["text"] for e in sent if e["type"] == "final")

    # 2. the audio the server received is the WAV (the fake device loops it from some offset)
    received, rate = soundfile.read(str(record / "stream-0001.wav"), dtype="float32")
    assert rate == 16000 and len(received) / rate == pytest.approx(sent[-1]["audio_s"], abs=1e-3)
    assert len(received) > 10 * 16000
    wav = load_audio(WAV)
    loudest = int(np.abs(received).argmax())
    voiced = received[max(loudest - 4 * 16000, 0) :][: 6 * 16000]  # six seconds around the loudest part
    # scored in three 2 s windows: where the fake device restarts its loop, or a loaded machine drops a few
    # frames, one window breaks alignment (measured once: 0.581 over the whole six seconds)
    scores = [best_alignment(voiced[i : i + 2 * 16000].astype(np.float64), wav.astype(np.float64))[0]
              for i in range(0, len(voiced) - 16000, 2 * 16000)]
    score = max(scores)
    assert score > 0.9, f"received audio correlates {[round(s, 3) for s in scores]} with the WAV"
    print(f"\nbrowser stream: {len(received) / rate:.2f} s received, correlation with the WAV {score:.3f}, "
          f"server compute {sent[-1]['compute_s']:.1f} s")

    # 3. a lone session on the received audio writes the transcript the server sent (with VAD segmentation, as
    # `serve` decodes by default)
    from speechstream.config import DecodingConfig
    from speechstream.model import load_model
    from speechstream.session import StreamingSession

    with torch.no_grad():
        session = StreamingSession(load_model(MODEL), DecodingConfig(vad=True), partials=False)
        session.feed(received)
        session.finish()
    assert session.transcript == sent[-1]["text"]
    print(f"page text: {page_text!r}")
    # 4. the words are those of the clip, in part: the model is far from exact (its MODEL_CARD.md), and the fake
    # device starts the clip at some offset, so no word order is checked; measured: 16 and 21 of 31 page words
    # (stage-1 weights), 17 of 25 (stage 1b), 15 of 23 (stage 1c), 20 of 29 (stage 1d)
    from speechstream.eval.quality import normalize_english

    spoken = set(normalize_english(JFK_TEXT).split())
    shown = normalize_english(page_text).split()
    heard = sum(word in spoken for word in shown)
    assert shown and heard >= 0.3 * len(shown), f"only {heard} of {len(shown)} page words are in the clip"


async def drive_page(devtools_port: int, server_port: int) -> tuple[str, list[dict]]:
    """Click start, let the fake microphone play the clip once, click stop, return the page's text and events."""
    async with aiohttp.ClientSession() as http:
        pages = []
        for _ in range(100):
            async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
                pages = [p for p in await response.json() if p.get("type") == "page"
                         and f":{server_port}/" in p.get("url", "")]
            if pages:
                break
            await asyncio.sleep(0.2)
        assert pages, "the page did not open"
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            await tools.wait("document.readyState === 'complete' && !!window.speechstream", 60, "the page")
            click = "document.getElementById('toggle').click()"
            await tools.evaluate(click, user_gesture=True)
            await tools.wait("window.speechstream.state === 'recording'", 60, "recording to start")
            await tools.wait(f"window.speechstream.samplesSent >= {int(12.5 * 16000)}", 90, "12.5 s of audio")
            await tools.evaluate(click, user_gesture=True)
            await tools.wait("window.speechstream.state === 'done'", 300, "the end of the transcript")
            text = await tools.evaluate("document.getElementById('committed').textContent")
            tail = await tools.evaluate("document.getElementById('partial').textContent")
            events = await tools.evaluate("window.speechstream.events")
            assert tail == ""
            # a second recording keeps the first one's text on the page, above its own, and in "Save text"
            assert not await tools.evaluate("document.getElementById('save').disabled") or not text.strip()
            await tools.evaluate(click, user_gesture=True)
            await tools.wait("window.speechstream.state === 'recording'", 60, "the second recording to start")
            takes = await tools.evaluate("Array.from(document.getElementById('takes').children, t => t.textContent)")
            assert takes == ([text.strip()] if text.strip() else [])
            await tools.evaluate(click, user_gesture=True)
            await tools.wait("window.speechstream.state === 'done'", 300, "the end of the second transcript")
            second = (await tools.evaluate("document.getElementById('committed').textContent")).strip()
            saved = await tools.evaluate("window.speechstream.text()")
            assert saved == "\n\n".join(part for part in (text.strip(), second) if part)
            return text, events
