"""The live page's logic (speechstream/web/app.js) in Node, with stand-ins for the DOM, the microphone, Web Audio and
the WebSocket (tests/live_page_harness.js): what the page shows and sends as the server's events, closes and errors
arrive, one take after another. tests/test_browser.py runs the real page in Chromium, slowly."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "speechstream" / "web" / "app.js"
HARNESS = Path(__file__).resolve().parent / "live_page_harness.js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

# the first take: recording, stopped, its transcript ended by the server (which has not closed the socket yet)
FIRST_TAKE = """
const one = await record();
one.socket.receive({type: "final", text: " first take"});
await click("toggle");
one.node.port.onmessage({data: {type: "flushed"}});
one.socket.receive({type: "end", text: " first take", audio_s: 1.0});
"""


def run_page(scenario: str, secure: bool = True):
    script = subprocess.run([NODE, str(HARNESS), str(APP), scenario, "secure" if secure else "insecure"],
                            capture_output=True, text=True, timeout=60)
    assert script.returncode == 0, script.stderr
    return json.loads(script.stdout)


def test_partials_are_replaced_finals_appended_and_each_take_kept():
    shown = run_page("""
        const shown = [];
        const one = await record();
        one.socket.receive({type: "partial", text: " hel"});
        shown.push(page());
        one.socket.receive({type: "partial", text: " hello wor"});
        shown.push(page());
        one.socket.receive({type: "final", text: " Hello"});
        shown.push(page());
        one.socket.receive({type: "partial", text: " world"});
        await click("toggle");
        shown.push(page());
        one.node.port.onmessage({data: {type: "flushed"}});
        one.socket.receive({type: "end", text: " Hello world.", audio_s: 2.0});
        one.socket.closed();
        shown.push(page());
        const two = await record();
        two.socket.receive({type: "final", text: " Again."});
        shown.push(page());
        return shown;
    """)
    assert [(p["committed"], p["partial"]) for p in shown] == [
        ("", " hel"), ("", " hello wor"), (" Hello", ""), (" Hello", " world"), (" Hello world.", ""),
        (" Again.", ""),
    ]
    assert [p["state"] for p in shown] == ["recording", "recording", "recording", "stopping", "done", "recording"]
    assert shown[0]["saveDisabled"] and not shown[2]["saveDisabled"]
    assert shown[4]["status"] == "done: 2.0 s of audio" and shown[4]["error"] == ""
    assert shown[5]["takes"] == ["Hello world."] and shown[5]["text"] == "Hello world.\n\nAgain."


def test_save_text_downloads_every_takes_committed_text_but_not_the_uncommitted_tail():
    saved = run_page(FIRST_TAKE + """
        one.socket.closed();
        const two = await record();
        two.socket.receive({type: "final", text: " second"});
        two.socket.receive({type: "partial", text: " not yet"});
        await click("save");
        return {name: downloads[0].name, text: await downloads[0].blob.text()};
    """)
    assert saved["text"] == "first take\n\nsecond\n"
    assert saved["name"].startswith("transcript-") and saved["name"].endswith(".txt")


def test_a_finished_takes_late_close_does_not_end_the_next_take():
    # the server closes the first socket after its end event; Start was pressed in between
    result = run_page(FIRST_TAKE + """
        const two = await record();
        one.socket.closed();
        await settle();
        two.node.frame();
        return {page: page(), contexts: contexts.map((c) => c.state), sent: two.socket.sent};
    """)
    assert result["page"]["state"] == "recording" and result["page"]["error"] == ""
    assert result["contexts"] == ["closed", "running"]
    assert result["sent"] == [{"type": "start", "sample_rate": 16000, "task": "asr"}, 640]


def test_a_failed_takes_late_events_do_not_reach_the_next_take():
    page = run_page("""
        const one = await record();
        one.socket.receive({type: "error", message: "too many sessions"});
        const two = await record();
        one.socket.receive({type: "partial", text: " stale"});
        one.socket.receive({type: "final", text: " stale"});
        one.socket.closed(1006);
        await settle();
        return page();
    """)
    assert page["state"] == "recording" and page["error"] == ""
    assert page["committed"] == page["partial"] == "" and page["text"] == ""


def test_a_timed_out_takes_close_does_not_end_the_next_take():
    result = run_page("""
        const one = await record();
        await click("toggle");
        one.node.port.onmessage({data: {type: "flushed"}});
        await advance(31000);  // the server never sends its end event
        const timedOut = page();
        const two = await record();
        one.socket.closed(1006);
        await settle();
        return {timedOut, page: page(), contexts: contexts.map((c) => c.state), closes: one.socket.closeCalls};
    """)
    assert result["timedOut"]["state"] == "error" and "did not finish the transcript" in result["timedOut"]["error"]
    assert result["closes"] >= 1
    assert result["page"]["state"] == "recording" and result["page"]["error"] == ""
    assert result["contexts"] == ["closed", "running"]


def test_a_timed_out_take_drops_its_uncommitted_tail():
    # the page gives up on the end event and closes the socket: the grey tail will never be committed or replaced (it
    # stayed on the page, looking like text still to come, and "Save text" left it out), as after a server's error
    result = run_page("""
        const one = await record();
        one.socket.receive({type: "final", text: " kept"});
        one.socket.receive({type: "partial", text: " tail"});
        await click("toggle");
        one.node.port.onmessage({data: {type: "flushed"}});
        await advance(31000);  // the server never sends its end event
        const timedOut = page();
        one.socket.closed(1006);
        await settle();
        return {timedOut, closed: page()};
    """)
    for page in result.values():
        assert page["state"] == "error" and "did not finish the transcript" in page["error"]
        assert page["committed"] == " kept" and page["partial"] == "" and page["text"] == "kept"


def test_after_stop_a_server_behind_the_microphone_gets_the_time_its_unread_audio_takes():
    # the wait for the end event was 30 s plus twice the audio in bufferedAmount; measured in Chromium against a server
    # decoding at half real time, 20 of 40 s sat unread in TCP buffers with bufferedAmount at 0, and the page gave up
    # after 30 s while the server was still at work. The wait now counts the audio past the last event's source_s
    result = run_page("""
        const one = await record();
        one.node.frame(40 * 16000);  // 40 s sent
        one.socket.receive({type: "partial", text: " so far", source_s: 20.0});  // the server has read 20 s
        await click("toggle");
        one.node.port.onmessage({data: {type: "flushed"}});
        await advance(60000);  // 30 s + twice the 20 s unread: still waiting
        const waiting = page();
        one.socket.receive({type: "partial", text: " later", source_s: 38.0});  // progress: the wait restarts
        await advance(33000);
        const stillWaiting = page();
        one.socket.receive({type: "end", text: " so far later", source_s: 40.0, audio_s: 40.0});
        const done = page();
        const two = await record();
        two.node.frame(10 * 16000);
        await click("toggle");
        two.node.port.onmessage({data: {type: "flushed"}});
        await advance(50000 + 1);  // a server that never answers is still given up on: 30 s + twice 10 s unread
        return {waiting, stillWaiting, done, gaveUp: page()};
    """)
    assert result["waiting"]["state"] == result["stillWaiting"]["state"] == "stopping"
    assert result["done"]["state"] == "done" and result["done"]["error"] == ""
    assert result["gaveUp"]["state"] == "error" and "did not finish the transcript" in result["gaveUp"]["error"]


def test_a_server_error_turns_the_microphone_off_and_drops_the_uncommitted_tail():
    result = run_page("""
        const one = await record();
        one.socket.receive({type: "final", text: " kept"});
        one.socket.receive({type: "partial", text: " tail"});
        one.socket.receive({type: "error", message: "decoder failure: RuntimeError: boom"});
        return {page: page(), tracks: tracks.map((t) => t.stopped), contexts: contexts.map((c) => c.state)};
    """)
    page = result["page"]
    assert page["state"] == "error" and page["error"] == "decoder failure: RuntimeError: boom"
    assert page["committed"] == " kept" and page["partial"] == "" and page["text"] == "kept"
    assert result["tracks"] == [True] and result["contexts"] == ["closed"]


def test_a_connection_closed_mid_recording_is_reported():
    page = run_page("""
        const one = await record();
        one.socket.receive({type: "partial", text: " tail"});
        one.socket.closed(1009, "message too big");
        return page();
    """)
    assert page["state"] == "error" and page["status"] == "connection closed" and page["partial"] == ""
    assert page["error"] == "The connection closed before the transcript ended (code 1009: message too big)."


def test_a_lost_microphone_finishes_the_transcript_of_what_it_heard():
    result = run_page("""
        const one = await record();
        tracks[0].end();  // unplugged
        const stopping = page();
        one.node.port.onmessage({data: {type: "flushed"}});
        return {stopping, posted: one.node.posted, sent: one.socket.sent};
    """)
    assert result["stopping"]["state"] == "stopping" and "microphone stopped" in result["stopping"]["error"]
    assert result["posted"] == ["flush"] and result["sent"][-1] == {"type": "end"}


@pytest.mark.parametrize(("name", "words"), [("NotAllowedError", "not allowed"), ("NotFoundError", "No microphone")])
def test_a_refused_microphone_says_what_to_do(name, words):
    result = run_page(f"""
        setMicrophone(async () => {{ const e = new Error("Permission denied"); e.name = "{name}"; throw e; }});
        await click("toggle");
        return {{page: page(), sockets: sockets.length}};
    """)
    assert result["page"]["state"] == "error" and words in result["page"]["error"]
    assert not result["page"]["toggleDisabled"] and result["sockets"] == 0


def test_a_stopped_server_is_named_before_the_microphone_is_asked_for():
    # the server was asked only after the microphone and the worklet module: a stopped server showed Chromium's
    # "Failed to load worklet module script: ... (Network error)", after a microphone prompt for nothing
    result = run_page("""
        setServer(false);
        await click("toggle");
        const down = {page: page(), tracks: tracks.length, contexts: contexts.length, sockets: sockets.length};
        setServer(true);
        const one = await record();
        return {down, again: page()};
    """)
    down = result["down"]
    assert down["page"]["state"] == "error" and not down["page"]["toggleDisabled"]
    assert down["page"]["error"] == "Cannot reach the server: is speechstream serve still running?"
    assert down["tracks"] == down["contexts"] == down["sockets"] == 0
    assert result["again"]["state"] == "recording" and result["again"]["error"] == ""


def test_a_server_stopped_behind_a_proxy_is_named_too():
    # the proxy answers /health with its own HTML error page: the page showed the JSON parser's "Unexpected token '<'"
    result = run_page("""
        setServer(502);
        await click("toggle");
        return {page: page(), tracks: tracks.length};
    """)
    assert result["page"]["state"] == "error" and result["tracks"] == 0
    assert result["page"]["error"] == ("Cannot reach the server (/health answered HTTP 502): is speechstream serve "
                                       "still running?")


def test_a_server_whose_decoder_failed_is_named_before_the_microphone_is_asked_for():
    # /health answers 503 {"status": "error"} once the decode thread has died: the page took its task from it, asked
    # for the microphone, opened the audio graph and the socket, and only then heard the server's refusal
    result = run_page("""
        setServer(503);
        await click("toggle");
        return {page: page(), tracks: tracks.length, contexts: contexts.length, sockets: sockets.length};
    """)
    assert result["page"]["state"] == "error" and not result["page"]["toggleDisabled"]
    assert result["page"]["error"] == "The server cannot transcribe: its decoder has failed (see the server's log)."
    assert result["tracks"] == result["contexts"] == result["sockets"] == 0


def test_lag_is_shown_and_a_server_far_behind_stops_the_recording():
    shown = run_page("""
        const shown = [];
        const one = await record();
        one.socket.bufferedAmount = 3 * 32000;
        one.node.frame();
        shown.push(page());
        one.socket.bufferedAmount = 0;
        one.node.frame();
        shown.push(page());
        one.socket.bufferedAmount = 61 * 32000;
        one.node.frame();
        shown.push(page());
        shown.push(one.node.posted);
        return shown;
    """)
    assert shown[0]["status"] == "recording: the server is 3.0 s behind"
    assert shown[1]["status"] == "recording (48000 Hz in, 16000 Hz sent)"
    assert shown[2]["state"] == "stopping" and "61 s behind" in shown[2]["error"]
    assert shown[3] == ["flush"]


def test_a_page_that_is_not_secure_names_its_own_port():
    page = run_page("return page();", secure=False)
    assert page["toggleDisabled"]
    assert "http://localhost:8765/" in page["error"] and "ssh -L 8765:localhost:8765" in page["error"]


def test_the_live_region_is_given_each_final_once_not_the_whole_text_again():
    # #committed is aria-live: a screen reader reads what is put in it, so each final goes in as its own text (the
    # whole transcript rewritten on every final was read again from the start each time)
    page = run_page(FIRST_TAKE + """
        one.socket.closed();
        const two = await record();
        two.socket.receive({type: "final", text: " second"});
        two.socket.receive({type: "final", text: " take"});
        return page();
    """)
    assert page["announced"] == [" first take", " second", " take"]
    assert page["committed"] == " second take" and page["takes"] == ["first take"]


def test_the_page_has_named_controls_and_a_keyboard_scrollable_transcript():
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.open, self.text = {}, None, {}

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if "id" in attrs:
                self.tags[attrs["id"]] = (tag, attrs)
                self.open = attrs["id"]

        def handle_data(self, data):
            if self.open and data.strip():
                self.text[self.open] = self.text.get(self.open, "") + data.strip()

    page = Page()
    page.feed(APP.with_name("index.html").read_text())
    assert page.text["toggle"] == "Start" and page.text["save"] == "Save text"
    assert page.tags["toggle"][1]["type"] == page.tags["save"][1]["type"] == "button"
    assert "disabled" in page.tags["save"][1]  # nothing to save yet
    transcript = page.tags["transcript"][1]
    assert transcript["aria-label"] and transcript["tabindex"] == "0"  # it scrolls: a keyboard must reach it
    assert page.tags["status"][1]["role"] == "status" and page.tags["error"][1]["role"] == "alert"
    assert page.tags["committed"][1]["aria-live"] == "polite"
