// speechstream live page: microphone -> capture worklet (16 kHz int16 frames) -> /ws -> transcript.
"use strict";

const ui = {
  toggle: document.getElementById("toggle"),
  status: document.getElementById("status"),
  committed: document.getElementById("committed"),
  partial: document.getElementById("partial"),
  takes: document.getElementById("takes"),
  save: document.getElementById("save"),
  error: document.getElementById("error"),
};
// what the page did, for people debugging it (and for tests): the last events received, frames sent
window.speechstream = { events: [], framesSent: 0, samplesSent: 0, state: "idle" };
const KEEP_EVENTS = 2000; // events kept in window.speechstream.events (a long session sends many partials)
const BYTES_PER_SECOND = 32000; // 16 kHz int16
const LAG_SHOWN_S = 2; // audio waiting in the socket's send buffer before the page says the server is behind
const LAG_LIMIT_S = 60; // ... and before it stops recording (the server cannot keep up)
// after Stop, how long to wait for the server's end event: this, plus twice the audio the server has not shown it has
// read (the take's audio sent past the last event's source_s: 20 s of it sat in TCP buffers over loopback, which
// bufferedAmount does not count), counted again from each event
const STOP_TIMEOUT_S = 30;

// the recording in progress (or the last one): its socket, audio graph and stop timer. Every handler a take installs
// checks that its take is still this one, so a finished take's late events, close or frames never reach the next
let take = null;

if (!window.isSecureContext) {
  // browsers give pages the microphone only over https or on localhost
  const port = location.port || (location.protocol === "https:" ? "443" : "80");
  ui.toggle.disabled = true;
  ui.error.textContent = `The microphone needs a secure page: open it as http://localhost:${port}/ on the server's ` +
    `machine (or through an SSH tunnel: ssh -L ${port}:localhost:${port} HOST), or serve it over https.`;
} else if (!navigator.mediaDevices || !window.AudioWorkletNode) {
  ui.toggle.disabled = true;
  ui.error.textContent = "This browser cannot record from the microphone here (no getUserMedia or AudioWorklet).";
}

function setState(state, text) {
  window.speechstream.state = state;
  ui.status.textContent = text || state;
  ui.toggle.textContent = state === "recording" ? "Stop" : "Start";
  ui.toggle.disabled = state === "stopping" || state === "connecting";
}

function onEvent(current, event) {
  if (current !== take) return; // a finished take's socket: its text is not this take's
  if (event.source_s > current.heard) current.heard = event.source_s;
  if (window.speechstream.state === "stopping" && (event.type === "final" || event.type === "partial")) {
    armStopTimer(current); // the server is still at work on the take's audio
  }
  const events = window.speechstream.events;
  events.push(event);
  if (events.length > KEEP_EVENTS) events.splice(0, events.length - KEEP_EVENTS);
  if (event.type === "final") {
    ui.committed.append(event.text); // a text node of its own: the live region announces only this final
    ui.save.disabled = !allText();
    ui.partial.textContent = "";
  } else if (event.type === "partial") {
    ui.partial.textContent = event.text;
  } else if (event.type === "end") {
    // the whole transcript, which the finals already show: rewritten only if it differs (a screen reader would
    // read it all again)
    if (ui.committed.textContent !== event.text) ui.committed.textContent = event.text;
    ui.partial.textContent = "";
    ui.save.disabled = !allText();
    clearTimeout(current.stopTimer);
    setState("done", `done: ${event.audio_s.toFixed(1)} s of audio`);
  } else if (event.type === "error") {
    ui.error.textContent = event.message;
    ui.partial.textContent = ""; // the server closes the stream: its uncommitted tail will not be committed
    clearTimeout(current.stopTimer);
    setState("error", "error");
    stopAudio(current); // the server reads no more: the microphone goes off now
  }
  const box = ui.committed.parentElement; // follow the newest text
  box.scrollTop = box.scrollHeight;
}

function socketURL() {
  const url = new URL("ws", location.href); // beside the page (also under a proxy's sub-path)
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

function keepTake() {
  // the previous recording's text stays on the page, above the new one (and in "Save text")
  const text = ui.committed.textContent.trim();
  if (text) {
    const kept = document.createElement("p");
    kept.className = "take";
    kept.textContent = text;
    ui.takes.appendChild(kept);
  }
  ui.committed.textContent = "";
  ui.partial.textContent = "";
}

function allText() {
  const takes = Array.from(ui.takes.children, (kept) => kept.textContent);
  const current = ui.committed.textContent.trim();
  return (current ? [...takes, current] : takes).join("\n\n");
}

function save() {
  // every take's committed text as a .txt download (the uncommitted tail is not text yet)
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([allText() + "\n"], { type: "text/plain" }));
  link.download = `transcript-${new Date().toISOString().replace(/[:.]/g, "-")}.txt`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function microphoneError(error) {
  // getUserMedia's refusals, in words a user can act on
  if (error.name === "NotAllowedError" || error.name === "SecurityError") {
    return "The microphone was not allowed: allow it for this page in the browser's site settings, then press Start.";
  }
  if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
    return "No microphone was found: connect one, then press Start.";
  }
  if (error.name === "NotReadableError") {
    return "The microphone could not be opened (another program may be using it).";
  }
  return `The microphone could not be opened: ${error.message || error}`;
}

function endTake(old) {
  // a finished take (done or failed) lets go of its socket and audio before the next one starts
  clearTimeout(old.stopTimer);
  stopAudio(old);
  if (old.socket) old.socket.close();
}

async function start() {
  if (take) endTake(take);
  const current = {
    socket: null, context: null, media: null, node: null, flushed: false, stopTimer: null,
    samples: 0, heard: 0, // samples sent, and the latest source_s of the server's events (seconds it has read)
  };
  take = current;
  keepTake();
  ui.error.textContent = "";
  window.speechstream.events = [];
  setState("connecting", "connecting");
  try {
    // the server first: when it is down, say so (its worklet module would fail to load with a network error), and
    // do not ask for the microphone
    const health = await fetch("health").then(
      // (behind a proxy a stopped server is an HTML error page, not a failed fetch)
      (response) => response.json().catch(() => serverDown(` (/health answered HTTP ${response.status})`)),
      () => serverDown(""),
    );
    if (health.status === "error") {
      // (its /health answers 503 once the decode thread has died: the socket would be refused after the prompt)
      throw new Error("The server cannot transcribe: its decoder has failed (see the server's log).");
    }
    current.media = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    }).catch((error) => {
      throw new Error(microphoneError(error));
    });
    for (const track of current.media.getTracks()) track.addEventListener("ended", () => microphoneLost(current));
    const context = (current.context = new AudioContext());
    if (context.state === "suspended") await context.resume();
    await context.audioWorklet.addModule("capture-worklet.js");
    const socket = (current.socket = new WebSocket(socketURL()));
    socket.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      socket.onopen = resolve;
      socket.onerror = () => reject(new Error("cannot connect to the server"));
    });
    socket.onmessage = (message) => onEvent(current, JSON.parse(message.data));
    socket.onclose = (close) => {
      clearTimeout(current.stopTimer);
      const state = window.speechstream.state;
      if (take === current && (state === "recording" || state === "stopping")) {
        setState("error", "connection closed");
        ui.partial.textContent = "";
        if (!ui.error.textContent) {
          ui.error.textContent = `The connection closed before the transcript ended (code ${close.code}` +
            `${close.reason ? ": " + close.reason : ""}).`;
        }
      }
      stopAudio(current);
    };
    socket.send(JSON.stringify({ type: "start", sample_rate: 16000, task: health.task }));
    const node = (current.node = new AudioWorkletNode(context, "speechstream-capture",
      { numberOfInputs: 1, numberOfOutputs: 1 }));
    node.port.onmessage = (message) => {
      if (message.data instanceof ArrayBuffer) {
        if (!current.flushed && socket.readyState === WebSocket.OPEN) {
          socket.send(message.data);
          window.speechstream.framesSent += 1;
          window.speechstream.samplesSent += message.data.byteLength / 2;
          current.samples += message.data.byteLength / 2;
          showLag(current);
        }
      } else if (message.data.type === "flushed") {
        current.flushed = true;
        if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "end" }));
        stopAudio(current);
      }
    };
    const mute = new GainNode(context, { gain: 0 }); // keeps the graph pulling the worklet, silently
    context.createMediaStreamSource(current.media).connect(node).connect(mute).connect(context.destination);
    setState("recording", `recording (${context.sampleRate} Hz in, 16000 Hz sent)`);
  } catch (error) {
    if (take === current) {
      ui.error.textContent = String(error.message || error);
      setState("error", "error");
    }
    stopAudio(current);
    if (current.socket) current.socket.close(); // the server would keep the session's slot until the tab closed
  }
}

function serverDown(detail) {
  throw new Error(`Cannot reach the server${detail}: is speechstream serve still running?`);
}

function microphoneLost(current) {
  // the device went away mid-take (unplugged, its permission withdrawn): finish what was heard
  if (take !== current || window.speechstream.state !== "recording") return;
  ui.error.textContent = "The microphone stopped; the transcript of what it heard is being finished.";
  stop();
}

function showLag(current) {
  // audio the socket has not sent yet: the server reads no faster than it decodes (backpressure)
  if (take !== current || window.speechstream.state !== "recording") return;
  const behind = current.socket.bufferedAmount / BYTES_PER_SECOND;
  if (behind > LAG_LIMIT_S) {
    ui.error.textContent = `The server is ${behind.toFixed(0)} s behind the microphone; recording stopped.`;
    stop();
  } else {
    const rate = current.context ? current.context.sampleRate : 0;
    ui.status.textContent = behind > LAG_SHOWN_S ? `recording: the server is ${behind.toFixed(1)} s behind`
      : `recording (${rate} Hz in, 16000 Hz sent)`;
  }
}

function stop() {
  const current = take;
  setState("stopping", "finishing the transcript");
  armStopTimer(current);
  if (current.media) current.media.getTracks().forEach((track) => track.stop());
  if (current.node) current.node.port.postMessage("flush");
  else if (current.socket && current.socket.readyState === WebSocket.OPEN) {
    current.socket.send(JSON.stringify({ type: "end" }));
  }
}

function armStopTimer(current) {
  // (re)starts the wait for the end event (STOP_TIMEOUT_S)
  clearTimeout(current.stopTimer);
  const unread = Math.max(0, current.samples / 16000 - current.heard);
  current.stopTimer = setTimeout(() => {
    if (take === current) {
      ui.error.textContent = "The server did not finish the transcript in time; the connection was closed.";
      ui.partial.textContent = ""; // the uncommitted tail will not be committed now (as after a server's error)
      setState("error", "error");
    }
    stopAudio(current);
    if (current.socket) current.socket.close();
  }, (STOP_TIMEOUT_S + 2 * unread) * 1000);
}

function stopAudio(current) {
  // the take's microphone and audio graph, once (its socket is closed by the server, or by the caller)
  if (current.media) current.media.getTracks().forEach((track) => track.stop());
  if (current.context) current.context.close().catch(() => {});
  current.media = current.context = current.node = null;
}

ui.save.addEventListener("click", save);
window.speechstream.text = allText; // every take's committed text, as "Save text" writes it
ui.toggle.addEventListener("click", () => {
  if (window.speechstream.state === "recording") stop();
  else start();
});
