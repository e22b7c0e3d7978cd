// speechstream live page: microphone -> capture worklet (16 kHz int16 frames) -> /ws -> transcript.
"use strict";

const ui = {
  toggle: document.getElementById("toggle"),
  status: document.getElementById("status"),
  committed: document.getElementById("committed"),
  partial: document.getElementById("partial"),
  error: document.getElementById("error"),
};
// what the page did, for people debugging it (and for tests): every event received, frames sent
window.speechstream = { events: [], framesSent: 0, samplesSent: 0, state: "idle" };

let socket = null;
let context = null;
let media = null;
let node = null;
let flushed = false; // the worklet has sent its last frame: nothing more goes to the server

function setState(state, text) {
  window.speechstream.state = state;
  ui.status.textContent = text || state;
  ui.toggle.textContent = state === "recording" ? "Stop" : "Start";
  ui.toggle.disabled = state === "stopping" || state === "connecting";
}

function onEvent(event) {
  window.speechstream.events.push(event);
  if (event.type === "final") {
    ui.committed.textContent += event.text;
    ui.partial.textContent = "";
  } else if (event.type === "partial") {
    ui.partial.textContent = event.text;
  } else if (event.type === "end") {
    ui.committed.textContent = event.text;
    ui.partial.textContent = "";
    setState("done", `done: ${event.audio_s.toFixed(1)} s of audio`);
  } else if (event.type === "error") {
    ui.error.textContent = event.message;
    setState("error", "error");
  }
}

async function start() {
  ui.committed.textContent = "";
  ui.partial.textContent = "";
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
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      socket.onopen = resolve;
      socket.onerror = () => reject(new Error("cannot connect to the server"));
    });
    socket.onmessage = (message) => onEvent(JSON.parse(message.data));
    socket.onclose = () => {
      if (window.speechstream.state === "recording" || window.speechstream.state === "stopping") {
        setState("error", "connection closed");
      }
      stopAudio();
    };
    socket.send(JSON.stringify({ type: "start", sample_rate: 16000, task: "asr" }));
    node = new AudioWorkletNode(context, "speechstream-capture", { numberOfInputs: 1, numberOfOutputs: 1 });
    node.port.onmessage = (message) => {
      if (message.data instanceof ArrayBuffer) {
        if (!flushed && socket && socket.readyState === WebSocket.OPEN) {
          socket.send(message.data);
          window.speechstream.framesSent += 1;
          window.speechstream.samplesSent += message.data.byteLength / 2;
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
  }
}

function stop() {
  setState("stopping", "finishing the transcript");
  if (media) media.getTracks().forEach((track) => track.stop());
  if (node) node.port.postMessage("flush");
  else if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "end" }));
}

function stopAudio() {
  if (media) media.getTracks().forEach((track) => track.stop());
  if (context) context.close();
  media = context = node = null;
}

ui.toggle.addEventListener("click", () => {
  if (window.speechstream.state === "recording") stop();
  else start();
});
