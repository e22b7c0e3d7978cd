// Runs speechstream/web/app.js in Node with stand-ins for the DOM, the microphone, Web Audio and WebSocket, then an
// async scenario (argv[3]) that drives it; what the scenario returns is printed as JSON (tests/test_live_page.py).
"use strict";
const fs = require("fs");
const vm = require("vm");

const [appPath, scenario, secure] = process.argv.slice(2);

class Element {
  constructor(tag, id) {
    this.tag = tag;
    this.id = id;
    this.text = "";
    this.added = []; // text nodes put in, as a live region announces them (a replaced text is announced whole)
    this.disabled = false;
    this.children = [];
    this.listeners = {};
    this.scrollTop = 0;
    this.scrollHeight = 0;
    this.parentElement = null;
  }
  get textContent() {
    return this.text;
  }
  set textContent(text) {
    this.text = String(text);
    this.children = [];
    if (this.text) this.added.push(this.text);
  }
  append(text) {
    this.text += text;
    this.added.push(String(text));
  }
  appendChild(child) {
    this.children.push(child);
    this.text += child.textContent;
    child.parentElement = this;
    return child;
  }
  addEventListener(type, listener) {
    (this.listeners[type] = this.listeners[type] || []).push(listener);
  }
  click() {
    if (this.tag === "a") downloads.push({ name: this.download, blob: blobs.get(this.href) });
    if (!this.disabled) for (const listener of this.listeners.click || []) listener({});
  }
}

const elements = {};
for (const id of ["toggle", "status", "committed", "partial", "takes", "save", "error", "transcript"]) {
  elements[id] = new Element(id === "toggle" || id === "save" ? "button" : "div", id);
}
for (const id of ["takes", "committed", "partial"]) elements[id].parentElement = elements.transcript;
elements.save.disabled = true; // as index.html has it
const downloads = [];
const blobs = new Map();

// timers run only when the scenario advances the clock
let now = 0;
let timerIds = 0;
const timers = new Map();
function setTimeout(fn, ms) {
  timers.set(++timerIds, { at: now + (ms || 0), fn });
  return timerIds;
}
function clearTimeout(id) {
  timers.delete(id);
}
async function advance(ms) {
  const until = now + ms;
  for (;;) {
    const due = [...timers.entries()].filter(([, t]) => t.at <= until).sort((a, b) => a[1].at - b[1].at)[0];
    if (!due) break;
    timers.delete(due[0]);
    now = due[1].at;
    due[1].fn();
    await settle();
  }
  now = until;
}

const sockets = [];
class WebSocket {
  constructor(url) {
    this.url = url;
    this.readyState = WebSocket.CONNECTING;
    this.sent = [];
    this.bufferedAmount = 0;
    this.closeCalls = 0;
    sockets.push(this);
  }
  send(data) {
    if (this.readyState !== WebSocket.OPEN) throw new Error("send on a socket that is not open");
    this.sent.push(typeof data === "string" ? JSON.parse(data) : data.byteLength);
  }
  close() {
    this.closeCalls += 1;
    if (this.readyState === WebSocket.OPEN || this.readyState === WebSocket.CONNECTING) {
      this.readyState = WebSocket.CLOSING; // the close event comes when the scenario calls closed()
    }
  }
  // driven by the scenario
  open() {
    this.readyState = WebSocket.OPEN;
    this.onopen && this.onopen({});
  }
  fail() {
    this.readyState = WebSocket.CLOSED;
    this.onerror && this.onerror({});
    this.onclose && this.onclose({ code: 1006, reason: "" });
  }
  receive(event) {
    this.onmessage && this.onmessage({ data: JSON.stringify(event) });
  }
  closed(code = 1000, reason = "") {
    this.readyState = WebSocket.CLOSED;
    this.onclose && this.onclose({ code, reason });
  }
}
Object.assign(WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });

// the server, as the page's fetches see it (setServer(false): stopped; setServer(502): stopped behind a proxy;
// setServer(503): up, its decoder failed)
let serverUp = true;
const contexts = [];
const nodes = [];
const tracks = [];
class AudioContext {
  constructor() {
    this.sampleRate = 48000;
    this.state = "running";
    this.destination = {};
    this.audioWorklet = {
      addModule: async (url) => {
        if (serverUp !== true && serverUp !== 503) {
          throw new Error(`Failed to load worklet module script: ${url} (Network error)`);
        }
      },
    };
    contexts.push(this);
  }
  async resume() {}
  close() {
    if (this.state === "closed") return Promise.reject(new Error("InvalidStateError: already closed"));
    this.state = "closed";
    return Promise.resolve();
  }
  createMediaStreamSource() {
    return { connect: (next) => next };
  }
}
class AudioWorkletNode {
  constructor(context) {
    if (!(context instanceof AudioContext) || context.state === "closed") throw new Error("no running context");
    this.context = context;
    this.posted = [];
    this.port = { postMessage: (m) => this.posted.push(m) };
    nodes.push(this);
  }
  connect(next) {
    return next;
  }
  frame(samples = 320) {
    this.port.onmessage({ data: new Int16Array(samples).buffer });
  }
}
class GainNode {
  connect(next) {
    return next;
  }
}
class Track {
  constructor() {
    this.stopped = false;
    this.listeners = {};
    tracks.push(this);
  }
  stop() {
    this.stopped = true;
  }
  addEventListener(type, listener) {
    (this.listeners[type] = this.listeners[type] || []).push(listener);
  }
  end() {
    // the device went away (unplugged, permission revoked): the browser stops the track and fires "ended"
    this.stopped = true;
    for (const listener of this.listeners.ended || []) listener({});
  }
}
let microphone = async () => {
  const track = new Track();
  return { getTracks: () => [track] };
};

class FakeURL extends URL {
  static createObjectURL(blob) {
    const href = `blob:${blobs.size}`;
    blobs.set(href, blob);
    return href;
  }
  static revokeObjectURL() {}
}

const window = {
  isSecureContext: secure !== "insecure",
  speechstream: null,
};
const sandbox = {
  window,
  document: {
    getElementById: (id) => elements[id],
    createElement: (tag) => new Element(tag),
  },
  navigator: { mediaDevices: { getUserMedia: (constraints) => microphone(constraints) } },
  location: { href: "http://localhost:8765/", protocol: "http:", host: "localhost:8765", port: "8765" },
  fetch: async () => {
    if (serverUp === false) throw new TypeError("Failed to fetch");
    if (serverUp === 503) return { status: 503, json: async () => ({ status: "error", task: "asr" }) };
    if (serverUp !== true) {
      return { status: serverUp, json: async () => JSON.parse("<html>Bad Gateway</html>") }; // (a proxy's page)
    }
    return { status: 200, json: async () => ({ status: "ok", task: "asr" }) };
  },
  URL: FakeURL,
  Blob,
  WebSocket,
  AudioContext,
  AudioWorkletNode,
  GainNode,
  setTimeout,
  clearTimeout,
  console,
  Array,
  Promise,
  Error,
  JSON,
  String,
  Math,
  Date,
  ArrayBuffer,
  Int16Array,
};
sandbox.window = Object.assign(window, sandbox);
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(appPath, "utf8"), sandbox, { filename: appPath });

async function settle() {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
}
const page = () => ({
  state: window.speechstream.state,
  status: elements.status.textContent,
  toggle: elements.toggle.textContent,
  toggleDisabled: elements.toggle.disabled,
  saveDisabled: elements.save.disabled,
  committed: elements.committed.textContent,
  partial: elements.partial.textContent,
  takes: elements.takes.children.map((take) => take.textContent),
  announced: elements.committed.added,
  error: elements.error.textContent,
  text: window.speechstream.text(),
});
const click = async (id) => {
  elements[id].click();
  await settle();
};
// Start, the socket opens, recording: the take's socket and worklet node
const record = async () => {
  await click("toggle");
  const socket = sockets[sockets.length - 1];
  socket.open();
  await settle();
  return { socket, node: nodes[nodes.length - 1] };
};
const setMicrophone = (fn) => {
  microphone = fn;
};
const setServer = (up) => {
  serverUp = up;
};

const body = new Function(
  "page", "click", "record", "settle", "advance", "sockets", "nodes", "contexts", "tracks", "downloads",
  "setMicrophone", "setServer", "elements",
  `return (async () => { ${scenario} })();`,
);
body(
  page, click, record, settle, advance, sockets, nodes, contexts, tracks, downloads, setMicrophone, setServer, elements,
)
  .then((result) => console.log(JSON.stringify(result === undefined ? null : result)))
  .catch((error) => {
    console.error(error && error.stack ? error.stack : String(error));
    process.exit(1);
  });
