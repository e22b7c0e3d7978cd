"""``speechstream serve``: concurrent WebSocket streams decoded in one dynamic batch, each equal to its solo run."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch

from speechstream.audio import int16_to_float, load_audio, resample
from speechstream.cli import main
from speechstream.config import DecodingConfig
from speechstream.server import Server, ServerConfig, listen_socket, serve_forever
from speechstream.session import StreamingSession
from speechstream.verify import TOLERANCE
from tests.conftest import text_favouring_chooser

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
FAST = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20)


def to_pcm(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1 - 1 / 32768) * 32768).round().astype("<i2").tobytes()


def clips(seconds: float) -> list[np.ndarray]:
    """Eight distinct signals from the shipped clips (crops of at most ``seconds``)."""
    n = int(seconds * 16000)
    jfk = load_audio(SAMPLES / "jfk.wav")
    austen = {name: load_audio(SAMPLES / f"austen-{name}.wav") for name in ("0870", "0880", "0890", "0920", "0930")}
    return [
        jfk[:n], jfk[4 * 16000 : 4 * 16000 + n], austen["0870"][:n], austen["0880"][:n], austen["0890"][:n],
        austen["0920"][:n], austen["0930"][:n], austen["0870"][int(3.5 * 16000) : int(3.5 * 16000) + n],
    ]


def solo(model, decoding, audio, choose=None) -> str:
    """What a lone session writes for these 16 kHz samples."""
    with torch.no_grad():
        session = StreamingSession(model, decoding, choose=choose, partials=False)
        session.feed(audio)
        session.finish()
    return session.transcript


@contextlib.asynccontextmanager
async def running(server: Server):
    """Serve on a free localhost port for the duration of the block; yields the base URL."""
    sock = listen_socket("127.0.0.1", 0)
    urls = []
    ready = asyncio.Event()
    task = asyncio.create_task(serve_forever(server, sock, lambda url: (urls.append(url), ready.set())))
    await ready.wait()
    try:
        yield urls[0]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sock.close()


async def stream(http, url, pcm: bytes, rate=16000, frame_bytes=3200, start=None) -> list[dict]:
    """One client: start, the PCM in frames, end; returns every event received."""
    async with http.ws_connect(url + "ws") as ws:
        await ws.send_str(json.dumps({"type": "start", "sample_rate": rate, "task": "asr", **(start or {})}))
        for i in range(0, len(pcm), frame_bytes):
            await ws.send_bytes(pcm[i : i + frame_bytes])
            await asyncio.sleep(0)
        await ws.send_str(json.dumps({"type": "end"}))
        return await receive_all(ws)


async def open_stream(http, url, pcm: bytes):
    """A client that has sent its start message and ``pcm`` in one frame, and nothing more yet."""
    ws = await http.ws_connect(url + "ws")
    await ws.send_str(START)
    await ws.send_bytes(pcm)
    return ws


@contextlib.asynccontextmanager
async def pinging(ws, every_s: float = 0.1):
    """A client that pings every ``every_s`` while the block runs (pings are answered inside the server's reads)."""

    async def ping():
        while True:
            await ws.ping()
            await asyncio.sleep(every_s)

    pinger = asyncio.create_task(ping())
    try:
        yield
    finally:
        pinger.cancel()
        await asyncio.gather(pinger, return_exceptions=True)


async def receive_all(ws) -> list[dict]:
    events = []
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        events.append(json.loads(msg.data))
        if events[-1]["type"] in ("end", "error"):
            break
    return events


def check_events(events: list[dict], audio_s: float) -> str:
    """The jsonl contract: finals concatenate to the end text; returns that text."""
    assert events and events[-1]["type"] == "end", events[-3:]
    assert "".join(e["text"] for e in events if e["type"] == "final") == events[-1]["text"]
    assert {e["type"] for e in events} <= {"final", "partial", "end"}
    assert events[-1]["audio_s"] == pytest.approx(audio_s, abs=2e-3)
    return events[-1]["text"]


async def health(http, url) -> dict:
    async with http.get(url + "health") as response:
        assert response.status == 200
        return await response.json()


async def settled_health(http, url, tries: int = 50) -> dict:
    """/health once the worker has dropped every finished stream (it does so on its own thread, a moment
    after the connections close), or the last reading after ``tries`` polls 0.1 s apart."""
    for _ in range(tries):
        state = await health(http, url)
        if state["sessions"] == 0 and state["batch"] == 0:
            return state
        await asyncio.sleep(0.1)
    return state


# -- fast: the tiny model -----------------------------------------------------------------------------


class Recording:
    """A chooser factory (``Server(choose=...)``): text-favouring greedy that records each stream's logits."""

    def __init__(self):
        self.streams: list[list[torch.Tensor]] = []

    def __call__(self, model):
        greedy, seen = text_favouring_chooser(model), []
        self.streams.append(seen)

        def choose(logits):
            seen.append(logits.clone())
            return greedy(logits)

        return choose


def test_eight_concurrent_streams_each_get_their_solo_transcript(tiny_model):
    audios = clips(2.5)
    rates = [16000, 44100, 16000, 8000, 16000, 48000, 8001, 22050]  # some clients send other rates
    pcms = [to_pcm(resample(a, 16000, r)) for a, r in zip(audios, rates)]
    alone = Recording()
    expected = [solo(tiny_model, FAST, resample(int16_to_float(p), r, 16000), alone(tiny_model))
                for p, r in zip(pcms, rates)]
    together = Recording()
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_sessions=8), choose=together)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            results = await asyncio.gather(*[
                stream(http, url, p, r, frame_bytes=640 * (i + 1)) for i, (p, r) in enumerate(zip(pcms, rates))
            ])
            return results, await settled_health(http, url)

    results, after = asyncio.run(scenario())
    for events, pcm, rate, text in zip(results, pcms, rates, expected):
        assert check_events(events, len(pcm) / 2 / rate) == text
    assert any(expected), "the chooser should write some text"
    # the tiny model writes much the same text for every clip, so compare what it computed: every stream's
    # logits match exactly one solo run's (the server joins streams in arrival order, hence the matching)
    solo_logits = [torch.stack(seq) for seq in alone.streams]
    for i, a in enumerate(solo_logits):  # the eight signals do give eight different logit sequences
        for b in solo_logits[i + 1 :]:
            assert a.shape != b.shape or (a - b).abs().max() > 1e-3
    unmatched = list(range(len(solo_logits)))
    for seq in together.streams:
        seq = torch.stack(seq)
        match = [j for j in unmatched if solo_logits[j].shape == seq.shape
                 and (solo_logits[j] - seq).abs().max() < TOLERANCE]
        assert len(match) == 1, "a stream's logits should equal those of exactly one solo run"
        unmatched.remove(match[0])
    assert after["status"] == "ok" and after["sessions"] == 0 and after["batch"] == 0
    batch = server.worker.batch
    assert batch.steps < batch.requests / 2  # streams really shared LLM calls


def test_a_server_with_the_llm_in_bfloat16_serves_concurrent_streams():
    """``serve --dtype bfloat16``: the batched streams step a bfloat16 LLM and each gets its events and end."""
    import dataclasses

    from speechstream.model import load_decoding_model

    decoding = dataclasses.replace(FAST, dtype="bfloat16")
    model = load_decoding_model("tiny-random", decoding)
    audios = clips(2.0)[:3]
    server = Server(model, "tiny-random", decoding, ServerConfig(max_sessions=3), choose=text_favouring_chooser)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            return await asyncio.gather(*[stream(http, url, to_pcm(audio)) for audio in audios])

    texts = [check_events(events, 2.0) for events in asyncio.run(scenario())]
    assert any(texts) and model.decoder.dtype == torch.bfloat16


KILLED_CLIENT = """
import asyncio, json, sys, aiohttp
async def main():
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(sys.argv[1] + "ws")
        await ws.send_str(json.dumps({"type": "start", "sample_rate": 16000, "task": "asr"}))
        for _ in range(40):
            await ws.send_bytes(bytes(range(256)) * 25)
        print("sent", flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


async def start_killed_client(url: str) -> subprocess.Popen:
    """A client in its own process, killed with SIGKILL mid-stream: no close frame, no end message."""
    process = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url], stdout=subprocess.PIPE)
    line = await asyncio.get_running_loop().run_in_executor(None, process.stdout.readline)
    assert line.strip() == b"sent"
    return process


def test_a_client_killed_mid_stream_leaves_the_server_and_other_streams_intact(tiny_model):
    choose = text_favouring_chooser
    audios = clips(3.0)[:3]
    pcms = [to_pcm(a) for a in audios]
    expected = [solo(tiny_model, FAST, int16_to_float(p), choose(tiny_model)) for p in pcms]
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_sessions=4), choose=choose)

    async def slow_stream(http, url, pcm, killed):
        async with http.ws_connect(url + "ws") as ws:
            await ws.send_str(json.dumps({"type": "start", "sample_rate": 16000, "task": "asr"}))
            half = len(pcm) // 2 // 2 * 2
            await ws.send_bytes(pcm[:half])
            await killed.wait()  # the other client dies while this stream is in the batch
            await ws.send_bytes(pcm[half:])
            await ws.send_str(json.dumps({"type": "end"}))
            return await receive_all(ws)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            killed = asyncio.Event()
            tasks = [asyncio.create_task(slow_stream(http, url, p, killed)) for p in pcms]
            client = await start_killed_client(url)
            during = await health(http, url)
            client.send_signal(signal.SIGKILL)
            client.wait()
            killed.set()
            results = await asyncio.gather(*tasks)
            return during, results, await settled_health(http, url, tries=100)  # once it notices the reset

    during, results, after = asyncio.run(scenario())
    assert during["sessions"] == 4
    for events, pcm, text in zip(results, pcms, expected):
        assert check_events(events, len(pcm) / 2 / 16000) == text
    assert after["status"] == "ok" and after["sessions"] == 0 and after["batch"] == 0
    assert after["batch_width"] == 0  # the dead stream's cache columns are gone
    assert server.worker.error is None


# -- protocol errors ------------------------------------------------------------------------------------


async def expect_error(ws, contains: str) -> None:
    msg = await ws.receive(timeout=30)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    event = json.loads(msg.data)
    assert event["type"] == "error" and contains in event["message"], event
    closing = await ws.receive(timeout=30)
    assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


START = json.dumps({"type": "start", "sample_rate": 16000, "task": "asr"})


@pytest.mark.parametrize(
    "frames, contains",
    [
        (["hello"], "JSON start message"),
        ([json.dumps({"type": "audio"})], '"type": "start"'),
        ([json.dumps({"type": "start", "sample_rate": 1000})], "sample_rate"),
        ([json.dumps({"type": "start", "sample_rate": "16000"})], "sample_rate"),
        ([json.dumps({"type": "start", "sample_rate": 16000, "task": "translate"})], "serves task"),
        ([json.dumps({"type": "start", "sample_rate": 16000, "model": "other"})], "serves model"),
        ([json.dumps({"type": "start", "sample_rate": 16000, "chunk_ms": 5})], "chunk"),
        ([json.dumps({"type": "start", "sample_rate": 16000, "volume": 3})], "unknown start field"),
        (["[" * 5000], "JSON start message"),  # deeper than the JSON parser recurses
        ([START, "[" * 5000], '{"type": "end"}'),
        ([b"\x00\x00" * 100], "audio before the start"),
        ([START, b"\x00\x00\x00"], "even number of bytes"),
        ([START, b"\x00\x00" * 5000], "exceeds the limit of 8000"),
        ([START, json.dumps({"type": "pause"})], '{"type": "end"}'),
        ([START, b"\x00\x00" * 2000, b"\x00\x00" * 2000, b"\x00\x00" * 2000], "limit of 0.3 s of audio"),
    ],
)
def test_protocol_errors_get_an_error_event_and_a_close(tiny_model, frames, contains):
    config = ServerConfig(max_frame_bytes=8000, max_session_s=0.3)
    server = Server(tiny_model, "tiny-random", FAST, config, choose=text_favouring_chooser)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            async with http.ws_connect(url + "ws") as ws:
                for frame in frames:
                    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
                await expect_error(ws, contains)
            return await settled_health(http, url)

    state = asyncio.run(scenario())
    assert state["status"] == "ok" and state["sessions"] == 0 and state["batch"] == 0


def test_frames_after_the_end_message_are_ignored_and_the_end_event_still_comes(tiny_model, capsys):
    """A frame after {"type": "end"} cancelled the stream and its error event took the place of the end event (the
    whole transcript, being computed): now late frames of every kind are dropped, noted once on the server's log."""
    config = ServerConfig(max_frame_bytes=8000)
    server = Server(tiny_model, "tiny-random", FAST, config, choose=text_favouring_chooser)
    pcm = to_pcm(clips(2.0)[2])
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))
    late = [b"\x00\x00" * 100, b"\x00", b"\x00" * 8002, "hello", START, json.dumps({"type": "end"})]

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            async with http.ws_connect(url + "ws") as ws:
                await ws.send_str(START)
                for i in range(0, len(pcm), 3200):
                    await ws.send_bytes(pcm[i : i + 3200])
                await ws.send_str(json.dumps({"type": "end"}))
                for frame in late:
                    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
                events = await receive_all(ws)
            return events, await settled_health(http, url)

    events, state = asyncio.run(scenario())
    assert check_events(events, len(pcm) / 2 / 16000) == expected and expected
    assert state["sessions"] == 0 and state["batch"] == 0
    log = capsys.readouterr().err
    assert log.count("ignoring frames sent after the end message") == 1, log


def test_start_timeout_and_the_frames_the_websocket_layer_refuses_get_an_error_event(tiny_model):
    """No start within --start-timeout: an error event and a close. A frame of twice --max-frame-bytes plus 4 KiB or
    more, or a text frame that is not UTF-8, is refused by the WebSocket layer, which closed the socket (1009, 1007)
    without an event: now the client gets the events already computed, the error event, and that close; a frame the
    layer refuses after the end message is ignored as any other and the end event still comes (docs/websocket.md)."""
    config = ServerConfig(max_frame_bytes=8000, start_timeout_s=0.5)
    server = Server(tiny_model, "tiny-random", FAST, config, choose=text_favouring_chooser)
    too_big, not_utf8, end = b"\0" * (2 * 8000 + 4096), ("raw", b"\xff\xfe"), json.dumps({"type": "end"})
    pcm = to_pcm(clips(2.0)[3])
    audio = [pcm[i : i + 3200] for i in range(0, len(pcm), 3200)]
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))

    async def events_and_code(http, url, frames):
        async with http.ws_connect(url + "ws") as ws:
            for frame in frames:
                if isinstance(frame, tuple):  # aiohttp's client encodes every str it sends: write the frame itself
                    await ws._writer.send_frame(frame[1], aiohttp.WSMsgType.TEXT)
                else:
                    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
            return [json.loads(m.data) async for m in ws if m.type == aiohttp.WSMsgType.TEXT], ws.close_code

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            cases = ([], [START, too_big], [too_big], [START, b"\0" * (2 * 8000 + 4094)], [START, not_utf8],
                     [not_utf8], [START, *audio, too_big], [START, *audio, end, too_big])
            return [await events_and_code(http, url, frames) for frames in cases], await settled_health(http, url)

    results, state = asyncio.run(scenario())
    timeout, too_big_after_start, too_big_first, big, not_utf8_after_start, not_utf8_first, mid, late = results
    assert timeout == ([{"type": "error", "message": "no start message within 0.5 s"}], 1000)
    too_big_error = {"type": "error", "message": "a frame of 20096 bytes or more exceeds the limit of 8000"}
    assert too_big_after_start == too_big_first == ([too_big_error], 1009)
    assert big[0] == [{"type": "error", "message": "audio frame of 20094 bytes exceeds the limit of 8000"}]
    assert not_utf8_after_start == not_utf8_first == ([{"type": "error", "message": "text frames must be UTF-8"}], 1007)
    assert mid[0][-1] == too_big_error and mid[1] == 1009
    assert {e["type"] for e in mid[0][:-1]} <= {"final", "partial"}  # the events computed before it, then the error
    assert check_events(late[0], len(pcm) / 2 / 16000) == expected and expected
    assert state["sessions"] == 0 and state["batch"] == 0


def test_pings_do_not_hold_off_the_start_timeout(tiny_model):
    """The start timeout timed each socket read, and every ping (answered inside the read) started it again: a client
    pinging without a start message held a session slot for ever. It is one deadline now."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(start_timeout_s=0.5))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            async with http.ws_connect(url + "ws") as ws, pinging(ws):
                begin = time.perf_counter()
                msg = await asyncio.wait_for(ws.receive(), 5)  # (not receive(timeout=...): pongs restart it)
                waited = time.perf_counter() - begin
            return msg, waited, await settled_health(http, url)

    msg, waited, state = asyncio.run(scenario())
    assert msg.type == aiohttp.WSMsgType.TEXT and waited < 3, (msg, waited)
    assert json.loads(msg.data) == {"type": "error", "message": "no start message within 0.5 s"}
    assert state["sessions"] == 0


@pytest.mark.parametrize("limits, why", [({"max_unread_events": 5}, "5 events wait"),
                                         ({"send_timeout_s": 0.5}, "an event has waited 0.5 s")])
def test_a_client_that_reads_no_events_has_its_stream_ended(tiny_model, monkeypatch, capsys, limits, why):
    """A client that sends audio and reads nothing: the sender waited on its full socket for ever, the stream's outbox
    grew with every event, and the stream held its session slot after its end. Now more than ``max_unread_events``
    waiting, or one event waiting ``send_timeout_s``, ends the stream: the error event and the close frame get a few
    seconds (``UNREAD_CLOSE_S``) to reach the client, then the connection is dropped; the other streams go on."""
    from speechstream.server import app
    from speechstream.session import Event

    monkeypatch.setattr(app, "UNREAD_CLOSE_S", 0.5)
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(**limits), choose=text_favouring_chooser)
    socket_class, feed = app.error_event_socket(), server.worker._feed
    send_str = socket_class.send_str

    async def full_socket(self, data, *args, **kwargs):  # stream 1's client reads nothing: its socket stays full
        if getattr(server._open.get(self), "id", None) == 1:
            await asyncio.Event().wait()
        return await send_str(self, data, *args, **kwargs)

    def feed_and_partial(live, samples):  # stream 1: an event per frame, as a stream that keeps up with real time
        feed(live, samples)
        if live.stream.id == 1:
            live.stream.deliver(Event("partial", "a tail", 0.0, 0.0))

    monkeypatch.setattr(socket_class, "send_str", full_socket)
    server.worker._feed = feed_and_partial
    pcm = to_pcm(clips(2.5)[3])
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))

    async def client(ws):
        with contextlib.suppress(ConnectionError):  # (the stream of the client that reads nothing may be gone)
            for i in range(0, len(pcm), 3200):
                await ws.send_bytes(pcm[i : i + 3200])
                await asyncio.sleep(0)
            await ws.send_str(json.dumps({"type": "end"}))
        return [msg async for msg in ws]

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            sockets = await start_in_order(http, url, 2)
            begin = time.perf_counter()
            unread, reading = await asyncio.wait_for(asyncio.gather(*[client(ws) for ws in sockets]), 30)
            return unread, time.perf_counter() - begin, reading, await settled_health(http, url)

    unread, took, reading, state = asyncio.run(scenario())
    assert unread == [] and took < 15  # (its events never reached it: a close, and the connection is gone)
    events = [json.loads(msg.data) for msg in reading if msg.type == aiohttp.WSMsgType.TEXT]
    assert check_events(events, len(pcm) / 2 / 16000) == expected
    assert state["status"] == "ok" and state["sessions"] == 0 and state["batch"] == 0 and server.worker.error is None
    log = capsys.readouterr().err
    assert f"stream 1: the client has stopped reading its events ({why}); the stream is ended" in log, log


IDLE_ERROR = "no frame within 1 s: a stream sends audio continuously (silence too) until its end message"


def test_a_stream_that_sends_nothing_is_ended_after_the_idle_timeout(tiny_model):
    """A client that sent its start and then nothing (pings aside) held a session slot for ever. Now, after
    --idle-timeout-s without a frame, it gets its events so far, an error event and a close; a client that keeps
    sending (however slowly) is not ended, and the time does not run after the end message (the wait for the end
    event is the server's)."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(idle_timeout_s=1.0), choose=text_favouring_chooser)
    pcm = to_pcm(clips(2.5)[4])
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))

    async def idle(http, url):
        async with http.ws_connect(url + "ws") as ws:
            await ws.send_str(START)
            await ws.send_bytes(pcm[: len(pcm) // 4 * 2])
            async with pinging(ws):
                begin = time.perf_counter()
                events = await asyncio.wait_for(receive_all(ws), 10)
                return events, time.perf_counter() - begin, (await ws.receive(timeout=10)).type

    async def slow(http, url):  # 0.1 s frames 0.25 s apart: 2.5 s of audio over 6 s
        async with http.ws_connect(url + "ws") as ws:
            await ws.send_str(START)
            for i in range(0, len(pcm), 3200):
                await ws.send_bytes(pcm[i : i + 3200])
                await asyncio.sleep(0.25)
            await ws.send_str(json.dumps({"type": "end"}))
            return await receive_all(ws)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            (events, waited, closing), slowly = await asyncio.gather(idle(http, url), slow(http, url))
            take_inputs, stall = server.worker._take_inputs, threading.Event()
            server.worker._take_inputs = lambda: stall.wait() and take_inputs()
            ended = asyncio.create_task(stream(http, url, pcm))  # its end event waits for the stalled worker
            await asyncio.sleep(2.5)
            stall.set()
            return events, waited, closing, slowly, await ended, await settled_health(http, url)

    events, waited, closing, slowly, ended, state = asyncio.run(scenario())
    assert events[-1] == {"type": "error", "message": IDLE_ERROR} and 1.0 <= waited < 5, (events[-1], waited)
    assert {e["type"] for e in events[:-1]} <= {"final", "partial"}
    assert closing in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    assert check_events(slowly, len(pcm) / 2 / 16000) == expected == check_events(ended, len(pcm) / 2 / 16000)
    assert state["status"] == "ok" and state["sessions"] == 0 and state["batch"] == 0


def test_the_idle_timeout_zero_or_inf_is_no_limit():
    assert ServerConfig().idle_limit_s == 60 and ServerConfig(idle_timeout_s=2.5).idle_limit_s == 2.5
    assert ServerConfig(idle_timeout_s=0).idle_limit_s is None is ServerConfig(idle_timeout_s=float("inf")).idle_limit_s


def test_a_decoding_no_stream_could_run_is_refused_before_serving(tiny_model, capsys, monkeypatch, tmp_path):
    """--max-tokens-per-chunk past what the LLM's positions hold: the server started and refused every stream. The
    refusal makes no --record-dir (it was made first, an empty folder left behind)."""
    import dataclasses

    from speechstream.server import app
    from speechstream.errors import InputError

    too_many = dataclasses.replace(FAST, max_tokens_per_chunk=9000)  # tiny-random: 8192 target positions
    record = tmp_path / "recordings"
    with pytest.raises(InputError, match="too few for the header, one chunk's text \\(--max-tokens-per-chunk 9000"):
        Server(tiny_model, "tiny-random", too_many, ServerConfig(record_dir=str(record)))
    assert not record.exists()

    def serve_forever(*_):
        raise AssertionError("serve started")

    monkeypatch.setattr(app, "serve_forever", serve_forever)
    code = main(["serve", "--port", "0", "--model", "tiny-random", "--max-tokens-per-chunk", "9000"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("speechstream: error: model tiny-random: its LLM") and err.count("\n") == 1


def test_null_optional_start_fields_are_left_out():
    from speechstream.server import parse_start

    message = {"type": "start", "sample_rate": 16000, "task": None, "model": None, "source_lang": None,
               "target_lang": None, "chunk_ms": None}
    start = parse_start(json.dumps(message), "tiny-random", "asr")
    assert (start.task, start.chunk_ms, start.source_lang) == ("asr", None, None)
    # the task left out is the server's: a translation server takes a client that names none
    assert parse_start(json.dumps(message), "tiny-random", "translate").task == "translate"


def test_a_stream_naming_languages_the_model_does_not_take_is_refused(tiny_model):
    """An English model refuses "source_lang": "fr" (it would transcribe French as English); case and spaces do not
    count; a model that declares no languages (tiny-random) takes any."""
    from speechstream.server import ProtocolError, parse_start

    def start(**fields) -> str:
        return json.dumps({"type": "start", "sample_rate": 16000} | fields)

    english = ("en", "en")
    assert parse_start(start(source_lang="EN ", target_lang="en"), "m", "asr", english).source_lang == "EN "
    for name in ("source_lang", "target_lang"):
        with pytest.raises(ProtocolError, match=f"takes en speech to en text: {name} en, not 'fr'"):
            parse_start(start(**{name: "fr"}), "m", "asr", english)
    with pytest.raises(ProtocolError, match="target_lang en, not 'es'"):
        parse_start(start(task="translate", source_lang="es", target_lang="es"), "m", "translate", ("es", "en"))
    assert Server(tiny_model, "tiny-random", FAST).languages == (None, None)
    assert parse_start(start(source_lang="fr"), "tiny-random", "asr", (None, None)).source_lang == "fr"


def test_max_session_s_inf_is_no_limit(tiny_model):
    """``--max-session-s inf`` (or 1e308) passes the option checks, but every stream's reader failed on
    int(inf * sample_rate): each client got 'the server failed to read this stream'."""
    pcm = to_pcm(clips(1.0)[4])
    for seconds in (float("inf"), 1e308):
        server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_session_s=seconds),
                        choose=text_favouring_chooser)

        async def scenario():
            async with running(server) as url, aiohttp.ClientSession() as http:
                return await stream(http, url, pcm)

        check_events(asyncio.run(scenario()), len(pcm) / 2 / 16000)


def test_a_record_dir_that_cannot_be_written_costs_no_stream(tiny_model, tmp_path, capsys):
    """--record-dir writes each stream's audio and events. A folder that could not be written took the stream's
    connection down with a logged traceback and no event (the event log) and then killed the decode thread for every
    stream (the WAV, written on it): now the stream goes on and the server's log says what was not recorded."""
    record = tmp_path / "record"
    config = ServerConfig(record_dir=str(record))
    server = Server(tiny_model, "tiny-random", FAST, config, choose=text_favouring_chooser)
    assert record.is_dir()  # made before serving
    pcm = to_pcm(clips(1.0)[5])

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            recorded = await stream(http, url, pcm)
            for _ in range(100):  # (the worker writes the WAV as it drops the stream, a moment after its end)
                if sorted(p.name for p in record.iterdir()) == ["stream-0001.jsonl", "stream-0001.wav"]:
                    break
                await asyncio.sleep(0.05)
            assert sorted(p.name for p in record.iterdir()) == ["stream-0001.jsonl", "stream-0001.wav"]
            for path in record.iterdir():
                path.unlink()
            record.rmdir()
            record.write_text("")  # the folder is gone: a file in its place
            unrecorded = await stream(http, url, pcm)
            return recorded, unrecorded, await settled_health(http, url)

    recorded, unrecorded, state = asyncio.run(scenario())
    assert check_events(unrecorded, len(pcm) / 2 / 16000) == check_events(recorded, len(pcm) / 2 / 16000)
    assert state["status"] == "ok" and server.worker.error is None
    log = capsys.readouterr().err
    assert "stream 2: --record-dir: could not write its events" in log, log
    assert "stream 2: --record-dir: could not write its audio" in log, log


def test_a_server_started_again_over_a_record_dir_keeps_the_last_runs_recordings(tiny_model, tmp_path):
    """Stream ids started at 1 in every run: a server started again with the same --record-dir overwrote the last
    run's stream-0001.wav and .jsonl with its first stream's. Its streams are now numbered on from the highest
    recording in the folder."""
    record = tmp_path / "record"
    record.mkdir()
    (record / "stream-0001.wav").write_bytes(b"last run")
    (record / "stream-0007.jsonl").write_text("last run\n")
    (record / "stream-notes.txt").write_text("")
    config = ServerConfig(record_dir=str(record))
    server = Server(tiny_model, "tiny-random", FAST, config, choose=text_favouring_chooser)
    pcm = to_pcm(clips(1.0)[1])

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            events = await stream(http, url, pcm)
            for _ in range(100):  # (the worker writes the WAV as it drops the stream, a moment after its end)
                if (record / "stream-0008.wav").exists():
                    break
                await asyncio.sleep(0.05)
            return events

    check_events(asyncio.run(scenario()), len(pcm) / 2 / 16000)
    assert (record / "stream-0001.wav").read_bytes() == b"last run"
    assert (record / "stream-0007.jsonl").read_text() == "last run\n"
    assert (record / "stream-0008.wav").stat().st_size > 0 and (record / "stream-0008.jsonl").stat().st_size > 0


def test_a_stream_open_when_the_server_stops_is_recorded(tiny_model, tmp_path):
    """--record-dir writes a stream's audio as the worker drops the stream. A server stopped (Ctrl-C) while the worker
    was inside an LLM step left its loop once the step was done, without dropping the stream: its events were
    recorded, its audio was not. (The step here waits for the stop, as a slow one on a real model does.)"""
    record = tmp_path / "record"
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(record_dir=str(record)),
                    choose=text_favouring_chooser)
    worker, step = server.worker, server.worker.batch.step

    def step_until_stopped(*args, **kwargs):
        while worker._live and worker._live[0].recorded and not worker._stop:  # (fed: the stop comes mid-step)
            time.sleep(0.01)
        return step(*args, **kwargs)

    worker.batch.step = step_until_stopped
    pcm = to_pcm(clips(1.0)[4])

    async def scenario():
        async with aiohttp.ClientSession() as http:
            async with running(server) as url:
                ws = await open_stream(http, url, pcm)
                for _ in range(100):
                    if worker._live and worker._live[0].recorded:
                        break
                    await asyncio.sleep(0.02)
                reader = asyncio.create_task(receive_all(ws))
            events = await reader
            await ws.close()
            return events

    events = asyncio.run(scenario())
    assert events[-1] == {"type": "error", "message": "the server is shutting down"}
    assert not worker.thread.is_alive()
    assert sorted(path.name for path in record.iterdir()) == ["stream-0001.jsonl", "stream-0001.wav"]
    audio = load_audio(record / "stream-0001.wav")
    assert 0 < len(audio) <= len(pcm) // 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stream_open_when_the_decoder_dies_is_recorded(tiny_model, tmp_path):
    """--record-dir writes a stream's audio as the worker drops the stream. When the batched LLM step failed, the
    decode thread died without dropping its streams: each got the decoder's error and its events were recorded, but
    not its audio, the one recording that would reproduce the failure. Now their audio is written as the thread dies."""
    record = tmp_path / "record"
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(record_dir=str(record)),
                    choose=text_favouring_chooser)
    worker, step = server.worker, server.worker.batch.step

    def step_then_fail(*args, **kwargs):  # the first step after the stream's audio was fed fails
        if worker._live and worker._live[0].recorded:
            raise RuntimeError("boom")
        return step(*args, **kwargs)

    worker.batch.step = step_then_fail
    pcm = to_pcm(clips(1.0)[4])

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            ws = await open_stream(http, url, pcm)
            events = await asyncio.wait_for(receive_all(ws), 10)
            await ws.close()
            return events

    events = asyncio.run(scenario())
    assert events[-1] == {"type": "error", "message": "decoder failure: RuntimeError: boom"}
    assert sorted(path.name for path in record.iterdir()) == ["stream-0001.jsonl", "stream-0001.wav"]
    assert 0 < len(load_audio(record / "stream-0001.wav")) <= len(pcm) // 2


def test_one_session_too_many_gets_an_error_and_the_others_go_on(tiny_model):
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_sessions=2), choose=text_favouring_chooser)
    pcm = to_pcm(clips(1.0)[0])

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            held = [await http.ws_connect(url + "ws") for _ in range(2)]
            for ws in held:
                await ws.send_str(START)
            assert (await health(http, url))["sessions"] == 2
            async with http.ws_connect(url + "ws") as extra:
                await expect_error(extra, "too many sessions")
            results = []
            for ws in held:
                await ws.send_bytes(pcm)
                await ws.send_str(json.dumps({"type": "end"}))
                results.append(await receive_all(ws))
                await ws.close()
            return results

    for events in asyncio.run(scenario()):
        check_events(events, len(pcm) / 2 / 16000)


def test_a_full_queue_stops_reading_the_socket(tiny_model):
    """Backpressure: while the decoder is stalled, a stream queues at most ``queue_frames`` frames."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(queue_frames=3), choose=text_favouring_chooser)
    stall = threading.Event()
    take_inputs = server.worker._take_inputs

    def stalled_take_inputs():
        stall.wait()
        return take_inputs()

    server.worker._take_inputs = stalled_take_inputs
    pcm = to_pcm(clips(2.0)[1])
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            task = asyncio.create_task(stream(http, url, pcm, frame_bytes=640))
            await asyncio.sleep(2.0)
            queued = [len(live.inbox) for live in server.worker._joining]
            stall.set()
            return queued, await task

    queued, events = asyncio.run(scenario())
    assert queued == [3]  # the reader stopped after 3 frames; the rest waited in the socket
    assert check_events(events, len(pcm) / 2 / 16000) == expected


def test_a_fast_client_is_decoded_while_it_sends_and_its_llm_holds_it_back(tiny_model):
    """A client that sends much faster than real time: its frames go to the front end only while few of its chunks
    wait for the LLM, so text comes while it sends, the encoded chunks waiting stay few (they piled up, every one of
    them, and no LLM step ran until the client stopped), and the rest waits in the queue and the socket."""
    from speechstream.server import MAX_UNITS_AHEAD

    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(queue_frames=4), choose=text_favouring_chooser)
    worker, seen = server.worker, {"units": 0, "steps_at_end": None}
    take_inputs = worker._take_inputs

    def watched_take_inputs():
        busy = take_inputs()
        seen["units"] = max([seen["units"]] + [live.session.chunks_waiting for live in worker._live])
        if seen["steps_at_end"] is None and any(live.ending for live in worker._live):
            seen["steps_at_end"] = worker.batch.steps
        return busy

    worker._take_inputs = watched_take_inputs
    pcm = to_pcm(np.concatenate(clips(3.0)[:6]))  # 18 s, sent in 0.1 s frames as fast as the socket takes them
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            return await stream(http, url, pcm, frame_bytes=3200)

    events = asyncio.run(scenario())
    assert check_events(events, len(pcm) / 2 / 16000) == expected
    assert seen["units"] <= MAX_UNITS_AHEAD + 1  # (a 0.1 s frame makes at most one 320 ms chunk)
    assert seen["steps_at_end"] > worker.batch.steps / 2  # most LLM steps ran before the end message was taken


async def start_in_order(http, url, count: int) -> list:
    """``count`` connections whose start messages reach the server one after another (stream ids 1, 2, ...)."""
    sockets = []
    for i in range(count):
        sockets.append(await http.ws_connect(url + "ws"))
        await sockets[-1].send_str(START)
        while (await health(http, url))["streams_started"] <= i:
            await asyncio.sleep(0.02)
    return sockets


def failing_on_call(method, call: int, stream_id: int):
    """``method``, except that its ``call``-th call raises (a failure injected into one stream)."""
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise RuntimeError(f"injected into stream {stream_id}")
        return method(*args, **kwargs)

    return wrapped


def test_a_failure_in_one_stream_ends_that_stream_alone(tiny_model, capsys):
    """A failure in one stream's own decoding (its join, its LLM request, taking its logits, its pending events, its
    close) killed the decode thread, and with it every stream. Now that stream gets its events so far and an error
    event, the traceback goes to the server's log, and the other streams go on (the batch stays whole)."""
    joins = [0]

    def choose(model):  # stream 1's join fails (the factory is called as each stream joins, in order)
        joins[0] += 1
        if joins[0] == 1:
            raise RuntimeError("injected into stream 1")
        return text_favouring_chooser(model)

    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(), choose=choose)
    worker, injected = server.worker, set()
    inject = {2: ("next_request", 3), 3: ("apply", 3), 4: ("pending_events", 1), 5: ("close", 1)}
    take_inputs = worker._take_inputs

    def injecting_take_inputs():
        busy = take_inputs()
        for live in worker._live:
            if live.stream.id in inject and live.stream.id not in injected:
                name, call = inject[live.stream.id]
                setattr(live.session, name, failing_on_call(getattr(live.session, name), call, live.stream.id))
                injected.add(live.stream.id)
        return busy

    worker._take_inputs = injecting_take_inputs
    pcm = to_pcm(clips(2.5)[2])
    expected = solo(tiny_model, FAST, int16_to_float(pcm), text_favouring_chooser(tiny_model))
    half = len(pcm) // 4 * 2

    async def client(ws, stream_id):
        with contextlib.suppress(ConnectionError):  # (a stream that failed early may be closed by now)
            await ws.send_bytes(pcm[:half])
            if stream_id != 4:  # (stream 4 waits for audio, so that its pending events are asked for)
                await ws.send_bytes(pcm[half:])
                await ws.send_str(json.dumps({"type": "end"}))
        return await asyncio.wait_for(receive_all(ws), 60)

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            sockets = await start_in_order(http, url, 6)
            results = await asyncio.gather(*[client(ws, i + 1) for i, ws in enumerate(sockets)])
            for ws in sockets:
                await ws.close()
            return results, await settled_health(http, url)

    results, state = asyncio.run(scenario())
    error = {"type": "error", "message": "the server failed to decode this stream; see its log"}
    for stream_id, events in enumerate(results[:5], 1):
        assert events[-1] == error, (stream_id, events[-3:])
        assert {e["type"] for e in events[:-1]} <= {"final", "partial"}, stream_id
    assert results[0] == [error]  # its join failed: nothing computed
    assert any(e["type"] == "final" for e in results[4])  # its events came before its close failed
    assert check_events(results[5], len(pcm) / 2 / 16000) == expected and expected
    assert injected == set(inject)
    assert state["status"] == "ok" and state["sessions"] == 0 and state["batch"] == 0 and state["batch_width"] == 0
    assert server.worker.error is None
    log = capsys.readouterr().err
    for stream_id in range(1, 6):
        assert f"stream {stream_id}: decoding failed" in log, log
        assert f"RuntimeError: injected into stream {stream_id}" in log, log
    assert log.count("Traceback (most recent call last)") == 5


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stream_that_starts_after_the_decoder_died_gets_an_error_event(tiny_model):
    """A client connected while the decode thread was alive and sent its start after it died: its stream went to a
    thread that no longer read its queue, and the client waited for events for ever. Now it gets the decoder's error;
    /health says 503 and a new connection is refused."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(), choose=text_favouring_chooser)

    def broken():
        raise RuntimeError("boom")

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            async with http.ws_connect(url + "ws") as ws:
                server.worker._take_inputs = broken
                server.worker.wake()
                server.worker.thread.join(timeout=10)
                await ws.send_str(START)
                await ws.send_bytes(b"\0\0" * 1600)
                await ws.send_str(json.dumps({"type": "end"}))
                events = await asyncio.wait_for(receive_all(ws), 10)
            async with http.get(url + "health") as response:
                status = response.status
            async with http.ws_connect(url + "ws") as late:
                await expect_error(late, "the decoder has failed")
            return events, status

    events, status = asyncio.run(scenario())
    assert events == [{"type": "error", "message": "decoder failure: RuntimeError: boom"}] and status == 503


def test_sigterm_stops_the_server_as_ctrl_c_does(tiny_model):
    """SIGTERM (a service manager's stop) ended `serve` at once: open streams got no word. Now serve_forever returns,
    each open connection gets the shutdown error, and the handler it found is put back."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(), choose=text_favouring_chooser)
    pcm = to_pcm(clips(1.0)[6])

    def default_action(signum, frame):
        raise AssertionError("SIGTERM reached the process's own handler: the server would have died at once")

    async def scenario():
        sock = listen_socket("127.0.0.1", 0)
        urls, ready = [], asyncio.Event()
        serving = asyncio.create_task(serve_forever(server, sock, lambda url: (urls.append(url), ready.set())))
        await ready.wait()
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(urls[0] + "ws")
            await ws.send_str(START)
            await ws.send_bytes(pcm)
            await asyncio.sleep(0.5)
            reader = asyncio.create_task(receive_all(ws))
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(serving, 10)  # returns: not cancelled, no exception
            events = await reader
            await ws.close()
        sock.close()
        return events

    previous = signal.signal(signal.SIGTERM, default_action)
    try:
        events = asyncio.run(scenario())
        assert signal.getsignal(signal.SIGTERM) is default_action
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert events[-1] == {"type": "error", "message": "the server is shutting down"}
    assert {e["type"] for e in events[:-1]} <= {"final", "partial"}


def test_a_stopping_server_tells_its_open_connections_and_does_not_wait_for_them(tiny_model):
    """Ctrl-C with a stream open: aiohttp waited up to 60 s for the connection's handler, and the client got no event.
    Now every open connection, started or not, gets the events already computed, an error event and a close."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(), choose=text_favouring_chooser)
    pcm = to_pcm(clips(1.0)[6])

    async def scenario():
        async with aiohttp.ClientSession() as http:
            async with running(server) as url:
                started = await open_stream(http, url, pcm)
                idle = await http.ws_connect(url + "ws")
                await asyncio.sleep(0.5)
                readers = [asyncio.create_task(receive_all(ws)) for ws in (started, idle)]
                begin = time.perf_counter()
            stopped_s = time.perf_counter() - begin
            results = [await reader for reader in readers]
            for ws in (started, idle):
                await ws.close()
            return results, stopped_s

    (streamed, idle), stopped_s = asyncio.run(scenario())
    error = {"type": "error", "message": "the server is shutting down"}
    assert idle == [error] and streamed[-1] == error and stopped_s < 5
    assert {e["type"] for e in streamed[:-1]} <= {"final", "partial"}


def test_a_stopping_server_does_not_wait_for_a_client_that_has_stopped_reading(tiny_model, monkeypatch, capsys):
    """Ctrl-C with a stream open whose client had stopped reading (a suspended client, a dead network: its socket is
    full and the server's sends wait): the shutdown error queued behind a send that waited --send-timeout-s (60 s),
    and aiohttp waited as long for the connection's handler, so the server took over a minute to stop. Now such a
    client gets ``UNREAD_CLOSE_S`` to take its events, then its stream is ended as any that has stopped reading."""
    from speechstream.server import app

    monkeypatch.setattr(app, "UNREAD_CLOSE_S", 0.5)
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(), choose=text_favouring_chooser)
    socket_class = app.error_event_socket()
    send_str = socket_class.send_str

    async def full_socket(self, data, *args, **kwargs):  # stream 1's client reads nothing: its socket stays full
        if getattr(server._open.get(self), "id", None) == 1:
            await asyncio.Event().wait()
        return await send_str(self, data, *args, **kwargs)

    monkeypatch.setattr(socket_class, "send_str", full_socket)
    pcm = to_pcm(clips(1.0)[6])

    async def scenario():
        async with aiohttp.ClientSession() as http:
            async with running(server) as url:
                stalled = await open_stream(http, url, pcm)
                reading = await open_stream(http, url, pcm)
                await asyncio.sleep(0.5)
                reader = asyncio.create_task(receive_all(reading))
                begin = time.perf_counter()
            stopped_s = time.perf_counter() - begin
            events = await reader
            for ws in (stalled, reading):
                await ws.close()
            return events, stopped_s

    events, stopped_s = asyncio.run(scenario())
    assert stopped_s < 5, stopped_s
    assert events[-1] == {"type": "error", "message": "the server is shutting down"}
    assert not server.worker.thread.is_alive()
    log = capsys.readouterr().err
    assert "stream 1: the client has stopped reading its events" in log, log
    assert "stream 2: the client has stopped reading" not in log, log


def test_health_and_the_page(tiny_model):
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_sessions=3))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            state = await health(http, url)
            async with http.get(url) as page:
                html = await page.text()
                page_type = page.headers["Content-Type"]
            async with http.get(url + "capture-worklet.js") as worklet:
                js = await worklet.text()
            async with http.get(url + "app.js") as app:
                app_js = await app.text()
            return state, html, page_type, js, app_js

    state, html, page_type, js, app_js = asyncio.run(scenario())
    assert state == {**state, "status": "ok", "sessions": 0, "max_sessions": 3, "model": "tiny-random"}
    assert page_type.startswith("text/html") and 'id="toggle"' in html and "app.js" in html
    assert "registerProcessor" in js and "new WebSocket" in app_js and "capture-worklet.js" in app_js


def test_a_refused_origin_is_named_on_the_log_once(tiny_model, capsys):
    """The browser tells a refused page only that it could not connect, and the server said nothing: behind a proxy
    that rewrites ``Host`` (nginx's default) the server's own page failed without a word anywhere."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig())

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(2):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(url + "ws", headers={"Origin": "https://speech.example"})
                statuses.append(refused.value.status)
            return statuses, url.split("//")[1].rstrip("/")

    statuses, host = asyncio.run(scenario())
    lines = [line for line in capsys.readouterr().err.splitlines() if "refused" in line]
    assert statuses == [403, 403]
    assert lines == [f"speechstream: refused a WebSocket from a page of https://speech.example: this request's Host is "
                     f"{host}; behind a proxy, pass the Host header on (nginx: proxy_set_header Host $host)"]


def test_the_page_and_its_scripts_are_revalidated_so_an_upgrade_reaches_the_browser(tiny_model):
    """Without ``Cache-Control`` a browser's reload ran a cached app.js for days after an upgrade (heuristic freshness,
    a tenth of the file's age; seen in Chromium): each load now asks, and an unchanged file costs a 304."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig())

    async def scenario():
        answers = {}
        async with running(server) as url, aiohttp.ClientSession() as http:
            for name in ("", "app.js", "capture-worklet.js"):
                async with http.get(url + name) as first:
                    etag = first.headers["ETag"]
                    control = first.headers.get("Cache-Control")
                async with http.get(url + name, headers={"If-None-Match": etag}) as again:
                    answers[name] = (control, again.status)
        return answers

    assert asyncio.run(scenario()) == {name: ("no-cache", 304) for name in ("", "app.js", "capture-worklet.js")}


def test_the_announced_url_is_one_a_browser_can_open_and_record_on():
    """`serve` prints the page's URL: an IPv6 address goes in brackets (``http://:::8765/`` was printed), a wildcard
    address is named localhost (``http://0.0.0.0:8765/`` opened a page without the microphone: no secure context)."""
    from speechstream.server import page_url

    assert page_url("127.0.0.1", 8765) == "http://127.0.0.1:8765/"
    assert page_url("::1", 8765) == "http://[::1]:8765/"
    assert page_url("fd00::2", 80) == "http://[fd00::2]:80/"
    assert page_url("0.0.0.0", 8765) == page_url("::", 8765) == "http://localhost:8765/"
    assert page_url("speech.example", 8765) == "http://speech.example:8765/"


def test_a_server_on_every_interface_announces_a_localhost_url_that_answers(tiny_model):
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig())

    async def scenario():
        sock = listen_socket("0.0.0.0", 0)
        urls, ready = [], asyncio.Event()
        task = asyncio.create_task(serve_forever(server, sock, lambda url: (urls.append(url), ready.set())))
        await ready.wait()
        try:
            async with aiohttp.ClientSession() as http:
                return urls[0], sock.getsockname()[1], await health(http, urls[0])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            sock.close()

    url, port, state = asyncio.run(scenario())
    assert url == f"http://localhost:{port}/" and state["status"] == "ok"


def test_another_sites_page_cannot_open_a_stream(tiny_model):
    """A browser sends its page's origin: the server's own page (and clients outside browsers, which send none) may
    stream; a page of another site in the user's browser may not."""
    from speechstream.server import same_origin

    assert same_origin("http://127.0.0.1:8765", "127.0.0.1:8765") and same_origin("https://Host:1", "host:1")
    assert not same_origin("http://evil.example", "127.0.0.1:8765") and not same_origin("null", "127.0.0.1:8765")
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_sessions=3))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            ws_url = url.replace("http", "ws") + "ws"
            host = url.split("//")[1].rstrip("/")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(ws_url, headers={"Origin": "http://evil.example"})
            async with http.ws_connect(ws_url, headers={"Origin": f"http://{host}"}) as ws:
                await ws.send_str(json.dumps({"type": "start", "sample_rate": 16000}))
                await ws.send_str(json.dumps({"type": "end"}))
                events = [json.loads(m.data) async for m in ws if m.type == aiohttp.WSMsgType.TEXT]
            return refused.value.status, events

    status, events = asyncio.run(scenario())
    assert status == 403 and events[-1]["type"] == "end"


def test_a_page_of_another_name_for_this_machine_reaches_nothing(tiny_model, capsys):
    """DNS rebinding: a page of evil.example whose name its owner points at 127.0.0.1 is same-origin with the server
    in the browser's eyes (its Origin matches its Host), and it read the page and /health and opened a stream. Every
    request is now held to the server's names: loopback ones on a loopback --host, plus --allowed-host."""
    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(allowed_hosts=("Speech.Example",)))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            port = url.rstrip("/").rsplit(":", 1)[1]
            statuses = {}
            for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}", f"localhost:{port}",
                         "localhost", f"127.0.0.1:{port}", f"[::1]:{port}", f"LOCALHOST.:{port}", "speech.example"):
                for path in ("", "health", "app.js"):
                    async with http.get(url + path, headers={"Host": host}) as response:
                        statuses[host, path] = response.status
            rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url + "ws", headers=rebound)
            proxied = {"Host": "speech.example", "Origin": "https://speech.example"}
            async with http.ws_connect(url + "ws", headers=proxied) as ws:
                await ws.send_str(json.dumps({"type": "start", "sample_rate": 16000}))
                await ws.send_str(json.dumps({"type": "end"}))
                events = await receive_all(ws)
            return statuses, refused.value.status, events, port

    statuses, ws_status, events, port = asyncio.run(scenario())
    refused = {host for (host, _), status in statuses.items() if status == 403}
    assert refused == {f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}"}
    assert {status for (host, _), status in statuses.items() if host not in refused} == {200}
    assert ws_status == 403 and events[-1]["type"] == "end"
    lines = [line for line in capsys.readouterr().err.splitlines() if "refused" in line]
    assert lines[0] == (f"speechstream: refused a request for Host evil.example:{port}: not a name of this server "
                        "(another site's page can point its own name at this machine); to serve under that name (a "
                        "proxy's), pass --allowed-host evil.example")
    assert len(lines) == 3  # once per refused Host, however often it comes


def test_a_server_on_another_address_answers_to_addresses_localhost_and_its_own_name():
    from speechstream.server import host_allowed

    for listen in ("0.0.0.0", "::", "192.168.1.5", "speech.lan"):
        for host in ("192.168.1.5:8765", "10.0.0.2", "[fd00::2]:80", "localhost:8765", "127.0.0.1"):
            assert host_allowed(host, listen), (host, listen)
        assert not host_allowed("evil.example:8765", listen)
        assert host_allowed("evil.example:8765", listen, frozenset({"evil.example"}))
    assert host_allowed("Speech.LAN:8765", "speech.lan") and not host_allowed("speech.lan", "0.0.0.0")
    for listen in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert host_allowed("127.0.0.9:1", listen) and host_allowed("[::1]", listen)
        assert not host_allowed("192.168.1.5", listen) and not host_allowed("speech.lan", listen)
    assert host_allowed(None, "127.0.0.1")  # no Host header: not a browser
    for broken in ("", "localhost:port", "localhost/x", "user@localhost", "[::1"):
        assert not host_allowed(broken, "127.0.0.1"), broken


# -- command line ---------------------------------------------------------------------------------------


def test_the_largest_max_frame_bytes_serves_a_stream(tiny_model):
    """--max-frame-bytes 2147483648 or more passed the checks, and aiohttp raised OverflowError on every connection
    (its limit, twice this plus 4 KiB, is an unsigned 32-bit count): the client's connection was reset, the server's
    log had a traceback per stream. The largest value taken serves."""
    from speechstream.server.config import MAX_FRAME_BYTES

    server = Server(tiny_model, "tiny-random", FAST, ServerConfig(max_frame_bytes=MAX_FRAME_BYTES),
                    choose=text_favouring_chooser)
    pcm = to_pcm(clips(0.5)[2])

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            return await stream(http, url, pcm)

    check_events(asyncio.run(scenario()), len(pcm) / 2 / 16000)


def test_bad_serve_options_give_one_error_line_and_exit_2(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        for argv, contains in (
            (["serve", "--port", str(port)], "cannot listen on 127.0.0.1"),
            (["serve", "--max-sessions", "0"], "--max-sessions must be at least 1"),
            (["serve", "--max-sessions", "many"], "invalid int value"),
            (["serve", "--port", "70000"], "--port must be between 0 and 65535"),
            # names IDNA cannot encode (an empty label, one over 63 characters): a UnicodeError, exit 1
            (["serve", "--host", "speech..example", "--port", "0"], "cannot resolve --host 'speech..example'"),
            (["serve", "--host", "a" * 64 + ".example", "--port", "0"], "cannot resolve --host 'aaaa"),
            (["serve", "--max-frame-bytes", "3"], "even"),
            # the WebSocket layer's limit (twice this plus 4 KiB) is a 32-bit count: every stream's connection failed
            (["serve", "--max-frame-bytes", "2147483648", "--port", str(port)], "--max-frame-bytes must be at most"),
            (["serve", "--chunk-ms", "3"], "chunk"),
            (["serve", "--port", "0", "--record-dir", f"{__file__}/record"], "cannot create --record-dir"),
            (["serve", "--idle-timeout-s", "-1"], "--idle-timeout-s must be 0 or more"),
            (["serve", "--idle-timeout-s", "nan"], "--idle-timeout-s must be 0 or more"),
            (["serve", "--start-timeout-s", "0"], "--start-timeout-s must be positive"),
            (["serve", "--send-timeout-s", "nan"], "--send-timeout-s must be positive"),
            (["serve", "--max-unread-events", "0"], "--max-unread-events must be at least 1"),
            (["serve", "--allowed-host", "https://speech.example"], "--allowed-host takes a host name"),
            (["serve", "--allowed-host", "speech.example:443"], "--allowed-host takes a host name"),
            (["serve", "--allowed-host", "bücher.example", "--port", str(port)],  # (browsers send xn--bcher-kva...)
             "--allowed-host takes a name in the ASCII form browsers send"),
        ):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("speechstream: error:") and contains in err[0], (argv, err)
    finally:
        busy.close()


# -- the real model ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def english_model():
    from speechstream.model import load_model

    try:
        return load_model("smollm2-whisper-base")
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"smollm2-whisper-base cannot be loaded here ({error}); run `make weights`")


@pytest.mark.slow
def test_eight_clients_with_the_english_model_get_their_solo_transcripts_despite_a_killed_one(english_model):
    decoding = DecodingConfig()
    audios = clips(2.5)
    pcms = [to_pcm(a) for a in audios]
    started = time.perf_counter()
    expected = [solo(english_model, decoding, int16_to_float(p)) for p in pcms]
    solo_s = time.perf_counter() - started
    server = Server(english_model, "smollm2-whisper-base", decoding, ServerConfig(max_sessions=9))

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            begin = time.perf_counter()
            tasks = [asyncio.create_task(stream(http, url, p, frame_bytes=3200)) for p in pcms]
            client = await start_killed_client(url)
            await asyncio.sleep(1.0)
            client.send_signal(signal.SIGKILL)
            client.wait()
            results = await asyncio.gather(*tasks)
            wall = time.perf_counter() - begin
            return results, wall, await settled_health(http, url, tries=100)

    results, wall, state = asyncio.run(scenario())
    audio_s = sum(len(a) for a in audios) / 16000
    print(f"\n8 clients, {audio_s:.1f} s of audio: batched wall {wall:.1f} s (RTF {wall / audio_s:.2f}), "
          f"solo sessions one after another {solo_s:.1f} s (RTF {solo_s / audio_s:.2f}), "
          f"{server.worker.batch.steps} batched LLM steps for {server.worker.batch.requests} stream requests")
    for events, pcm, text in zip(results, pcms, expected):
        assert check_events(events, len(pcm) / 2 / 16000) == text
    assert len(set(expected)) == len(expected) and all(expected)
    assert state["status"] == "ok" and state["sessions"] == 0 and state["batch"] == 0


def test_a_streams_compute_s_is_its_own_front_end_and_a_share_of_the_llm_steps(tiny_model, monkeypatch):
    """A stream's front end runs inside the batched step (when the LLM asks for its audio): its time is that stream's
    ``compute_s`` alone; the rest of a step is shared by the streams it served. A slow front end in one stream (a
    deliberately slowed unit, in the stream of 640 ms chunks) is all in that stream's figure, none in the other's,
    and together they count no more than the time that passed."""
    pause, made = 0.25, []
    add_unit = StreamingSession._add_unit

    def add_unit_slowly(session, *args, **kwargs):
        if session.decoding.chunk_ms == 640:
            time.sleep(pause)
            made.append(1)
        return add_unit(session, *args, **kwargs)

    monkeypatch.setattr(StreamingSession, "_add_unit", add_unit_slowly)
    server = Server(tiny_model, "tiny-random", FAST, choose=text_favouring_chooser)
    pcms = [to_pcm(audio) for audio in clips(4.0)[:2]]

    async def scenario():
        async with running(server) as url, aiohttp.ClientSession() as http:
            started = time.perf_counter()
            results = await asyncio.gather(stream(http, url, pcms[0], frame_bytes=640, start={"chunk_ms": 640}),
                                           stream(http, url, pcms[1], frame_bytes=640))
            return results, time.perf_counter() - started

    (slow_events, fast_events), elapsed = asyncio.run(scenario())
    slow, fast = slow_events[-1]["compute_s"], fast_events[-1]["compute_s"]
    slept = pause * len(made)
    assert len(made) >= 6
    assert slow >= slept  # its front end, all of it (a share of it, before)
    assert fast < slept / 2  # none of the other stream's front end
    assert slow + fast <= elapsed
