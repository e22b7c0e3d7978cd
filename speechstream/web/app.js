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
const STOP_TIMEOUT_S = 30; // after Stop, how long to wait for the server's end event (plus the audio still queued)

let socket = null;
let context = null;
let media = null;
let node = null;
let flushed = false; // the worklet has sent its last frame: nothing more goes to the server
let stopTimer = null;

if (!window.isSecureContext || !navigator.mediaDevices) {
  // browsers give pages the microphone only over https or on localhost
  ui.toggle.disabled = true;
  ui.error.textContent = "The microphone needs a secure page: open it as http://localhost:PORT/ on the server's " +
    "machine (or through an SSH tunnel: ssh -L PORT:localhost:PORT host), or serve it over https.";
}

function setState(state, text) {
  window.speechstream.state = state;
  ui.status.textContent = text || state;
  ui.toggle.textContent = state === "recording" ? "Stop" : "Start";
  ui.toggle.disabled = state === "stopping" || state === "connecting";
}

function onEvent(event) {
  const events = window.speechstream.events;
  events.push(event);
  if (events.length > KEEP_EVENTS) events.splice(0, events.length - KEEP_EVENTS);
  if (event.type === "final") {
    ui.committed.textContent += event.text;
    ui.save.disabled = false;
    ui.partial.textContent = "";
  } else if (event.type === "partial") {
    ui.partial.textContent = event.text;
  } else if (event.type === "end") {
    ui.committed.textContent = event.text;
    ui.partial.textContent = "";
    ui.save.disabled = !allText();
    clearTimeout(stopTimer);
    setState("done", `done: ${event.audio_s.toFixed(1)} s of audio`);
  } else if (event.type === "error") {
    ui.error.textContent = event.message;
    setState("error", "error");
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
    const take = document.createElement("p");
    take.className = "take";
    take.textContent = text;
    ui.takes.appendChild(take);
  }
  ui.committed.textContent = "";
  ui.partial.textContent = "";
}

function allText() {
  const takes = Array.from(ui.takes.children, (take) => take.textContent);
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

async function start() {
  keepTake();
  ui.error.textContent = "";
  window.speechstream.events = [];
  flushed = false;
  setState("connecting", "connecting");
  try {
    media = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    context = new AudioContext();
    if (context.state === "suspended") await context.resume();
    await context.audioWorklet.addModule("capture-worklet.js");
    const health = await fetch("health").then((response) => response.json());
    socket = new WebSocket(socketURL());
    socket.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      socket.onopen = resolve;
      socket.onerror = () => reject(new Error("cannot connect to the server"));
    });
    socket.onmessage = (message) => onEvent(JSON.parse(message.data));
    socket.onclose = (close) => {
      clearTimeout(stopTimer);
      if (window.speechstream.state === "recording" || window.speechstream.state === "stopping") {
        setState("error", "connection closed");
        if (!ui.error.textContent) {
          ui.error.textContent = `The connection closed before the transcript ended (code ${close.code}` +
            `${close.reason ? ": " + close.reason : ""}).`;
        }
      }
      stopAudio();
    };
    socket.send(JSON.stringify({ type: "start", sample_rate: 16000, task: health.task }));
    node = new AudioWorkletNode(context, "speechstream-capture", { numberOfInputs: 1, numberOfOutputs: 1 });
    node.port.onmessage = (message) => {
      if (message.data instanceof ArrayBuffer) {
        if (!flushed && socket && socket.readyState === WebSocket.OPEN) {
          socket.send(message.data);
          window.speechstream.framesSent += 1;
          window.speechstream.samplesSent += message.data.byteLength / 2;
          showLag();
        }
      } else if (message.data.type === "flushed") {
        flushed = true;
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "end" }));
        stopAudio();
      }
    };
    const mute = new GainNode(context, { gain: 0 }); // keeps the graph pulling the worklet, silently
    context.createMediaStreamSource(media).connect(node).connect(mute).connect(context.destination);
    setState("recording", `recording (${context.sampleRate} Hz in, 16000 Hz sent)`);
  } catch (error) {
    ui.error.textContent = String(error.message || error);
    setState("error", "error");
    stopAudio();
    if (socket) socket.close(); // the server would keep the session's slot until the tab closed
  }
}

function showLag() {
  // audio the socket has not sent yet: the server reads no faster than it decodes (backpressure)
  const behind = socket.bufferedAmount / BYTES_PER_SECOND;
  if (window.speechstream.state !== "recording") return;
  if (behind > LAG_LIMIT_S) {
    ui.error.textContent = `The server is ${behind.toFixed(0)} s behind the microphone; recording stopped.`;
    stop();
  } else {
    const rate = context ? context.sampleRate : 0;
    ui.status.textContent = behind > LAG_SHOWN_S ? `recording: the server is ${behind.toFixed(1)} s behind`
      : `recording (${rate} Hz in, 16000 Hz sent)`;
  }
}

function stop() {
  setState("stopping", "finishing the transcript");
  const queued = socket ? socket.bufferedAmount / BYTES_PER_SECOND : 0;
  stopTimer = setTimeout(() => {
    ui.error.textContent = "The server did not finish the transcript in time; the connection was closed.";
    setState("error", "error");
    if (socket) socket.close();
  }, (STOP_TIMEOUT_S + 2 * queued) * 1000);
  if (media) media.getTracks().forEach((track) => track.stop());
  if (node) node.port.postMessage("flush");
  else if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "end" }));
}

function stopAudio() {
  if (media) media.getTracks().forEach((track) => track.stop());
  if (context) context.close();
  media = context = node = null;
}

ui.save.addEventListener("click", save);
window.speechstream.text = allText; // every take's committed text, as "Save text" writes it
ui.toggle.addEventListener("click", () => {
  if (window.speechstream.state === "recording") stop();
  else start();
});
