// mvGPT live: the page of scripts/serve.py. Plain JS, no framework, nothing from the network.
// The server does the model's work (mvgpt/live/views.py); this file only draws what it sends:
//   api/info          the models and limits, to build the forms
//   api/write?...     server-sent events: start, token (one per token, with the cache's state), done
//   api/read?...      server-sent events: piece (the tokens), scored (one per method), done
//   api/angles?...    JSON: the pairs' speeds and one pair's angles, per scaling method
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const page = { info: null, write: null, read: null, angles: null, play: null, anglesAsked: 0 };

// ---------------------------------------------------------------------------------------------
// Helpers: elements, numbers, the server

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : x.toFixed(digits));
const quote = (text) => "“" + text.replace(/\n/g, "⏎") + "”";

function setStatus(id, text, error = false) {
  $(id).textContent = text;
  $(id).classList.toggle("error", error);
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// Server-sent events read with fetch (not EventSource): a refused request's message can be read,
// and Stop is an AbortController, which closes the stream, and so stops the server's generate.
async function streamEvents(url, onEvent, signal) {
  const response = await fetch(url, { signal });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error || response.statusText);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", finished = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      if (finished) return;
      throw new Error("the stream ended early: the server stopped, or the connection broke");
    }
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (!data) continue; // comment lines (": waiting") carry no data
      if (event === "error") { // the server's last word on a stream that failed: the page shows it
        reader.cancel().catch(() => {});
        throw new Error(JSON.parse(data).message);
      }
      finished = event === "done";
      onEvent(event, JSON.parse(data));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Start: the models, the forms, the tabs

async function start() {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => showView(button.dataset.view));
  }
  // The forms never submit themselves (that would reload the page); they wait for the models' list.
  $("write-form").addEventListener("submit", (e) => { e.preventDefault(); if (page.info) write(); });
  $("read-form").addEventListener("submit", (e) => { e.preventDefault(); if (page.info) read(); });
  $("angles-form").addEventListener("submit", (e) => e.preventDefault());
  try {
    page.info = await getJSON("api/info");
  } catch (e) {
    setStatus("write-status", "the server did not answer: " + e.message, true);
    return;
  }
  const { models, limits, vocab } = page.info;
  $("models-line").textContent = models.map((m) => `${m.name}: ${m.rope ? "rope" : "learned positions"}, ` +
    `window ${m.window}, ${(m.params / 1e6).toFixed(1)} M parameters`).join(" · ");
  for (const m of models) {
    $("write-models").append(el("label", {}, el("input", { type: "checkbox", value: m.name, checked: "" }), m.name));
    $("read-model").append(el("option", { value: m.name }, m.name));
    if (m.rope) $("angles-model").append(el("option", { value: m.name }, m.name));
  }
  $("prompt").maxLength = limits.prompt_chars;
  $("prompt-limit").textContent = `(up to ${limits.prompt_chars.toLocaleString("en")} characters)`;
  $("tokens-limit").textContent = `(up to ${limits.tokens.toLocaleString("en")})`;
  $("tokens").max = limits.tokens;
  $("tokens").value = Math.min(600, limits.tokens);
  $("temperature").max = limits.temperature;
  $("top-k").max = vocab;
  $("write-stop").addEventListener("click", () => page.write && page.write.abort());
  setUpRead();
  setUpAngles();
  document.body.dataset.ready = "yes"; // for scripts that drive the page (tests, screenshots)
}

function showView(name) {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.view === name);
  }
  for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== name;
  if (name === "angles" && !page.angles && $("angles-model").value) loadAngles();
}

// ---------------------------------------------------------------------------------------------
// Write: the story, the cache's rows, ms per token

async function write() {
  const models = [...document.querySelectorAll("#write-models input:checked")].map((i) => i.value);
  const query = new URLSearchParams({
    prompt: $("prompt").value, models: models.join(","), temperature: $("temperature").value,
    top_k: $("top-k").value, tokens: $("tokens").value, seed: $("seed").value,
  });
  const asked = Number($("tokens").value);
  const columns = {};
  page.write = new AbortController();
  $("write-go").disabled = true;
  $("write-stop").disabled = false;
  setStatus("write-status", "writing…");
  $("write").dataset.state = "writing";
  try {
    await streamEvents("api/write?" + query, (event, data) => {
      if (event === "wait") setStatus("write-status", data.message);
      else if (event === "start") {
        setStatus("write-status", "writing…");
        $("columns").replaceChildren();
        for (const name of data.models) {
          columns[name] = new Column(page.info.models.find((m) => m.name === name), data.prompt, asked);
          $("columns").append(columns[name].node);
        }
      } else if (event === "token") columns[data.model].add(data);
      else if (event === "done") {
        setStatus("write-status", "done: " + Object.entries(data).map(([name, s]) =>
          `${name} ${fmt(s.median_ms)} ms/token (median), first token ${fmt(s.first_ms, 0)} ms`).join(" · "));
        $("write").dataset.state = "done"; // for scripts that drive the page (tests, screenshots)
      }
    }, page.write.signal);
  } catch (e) {
    if (e.name === "AbortError") setStatus("write-status", "stopped: the server stopped writing too");
    else setStatus("write-status", e.message, true);
  } finally {
    $("write-go").disabled = false;
    $("write-stop").disabled = true;
    page.write = null;
    if ($("write").dataset.state !== "done") $("write").dataset.state = "stopped";
  }
}

class Column {
  // One model's story and cache, drawn as the token events come.
  constructor(model, prompt, asked) {
    this.model = model;
    this.texts = [...prompt]; // every story token's text, prompt first
    this.asked = asked;
    this.total = prompt.length + asked; // story places the bars are drawn for
    this.windowFullAt = Math.max(0, model.window - prompt.length); // the first token written with a full window
    this.ms = []; this.sorted = []; this.pastSorted = [];
    this.outUpTo = 0; // story tokens before this one are drawn grey
    this.offset = 0;
    const kind = model.rope ? "rope: the cache slides past the window" : "learned positions: the window re-runs";
    this.story = el("div", { class: "story" });
    this.spans = prompt.map((t) => el("span", { class: "prompt" }, t));
    this.story.append(...this.spans);
    this.numbers = el("p", { class: "numbers" }, "position 0 · length 0");
    this.event = el("p", { class: "event" });
    this.bar = this.makeBar();
    this.grid = this.makeGrid();
    this.line = this.makeMsLine();
    this.msText = el("p", { class: "numbers ms-numbers" });
    this.node = el("div", { class: "column " + (model.rope ? "rope" : "learned"), "data-model": model.name },
      el("h2", {}, model.name + " ", el("small", {}, kind)), this.story, this.numbers, this.event,
      el("p", { class: "caption" }, "the story: what the model reads for the next token (grey: gone)"), this.bar,
      el("p", { class: "caption" }, `the cache's ${model.capacity} rows, ${this.cols} a line: held (colour), ` +
        "newest (dark), just dropped (red)"), this.grid,
      el("p", { class: "caption" }, "ms per token (dashed: running median; the mark: the window is full)"),
      this.line.node, this.msText);
  }

  makeBar() {
    const bar = svg("svg", { class: "bar", viewBox: "0 0 400 22", preserveAspectRatio: "none" });
    this.barAll = svg("rect", { class: "story-all", x: 0, y: 4, height: 14, width: 0 });
    this.barGone = svg("rect", { class: "gone", x: 0, y: 4, height: 14, width: 0 });
    this.barReads = svg("rect", { class: "reads", x: 0, y: 4, height: 14, width: 0 });
    this.barRerun = svg("rect", { class: "rerun-box", x: 0, y: 2, height: 18, width: 0 });
    bar.append(this.barAll, this.barGone, this.barReads, this.barRerun);
    return bar;
  }

  makeGrid() {
    const capacity = this.model.capacity;
    this.cols = Math.min(32, capacity);
    const rows = Math.ceil(capacity / this.cols), cell = 400 / this.cols;
    const grid = svg("svg", { class: "grid", viewBox: `0 0 400 ${rows * cell}` });
    this.cells = [];
    this.cellClass = [];
    for (let r = 0; r < capacity; r++) {
      const rect = svg("rect", { class: "empty", x: (r % this.cols) * cell + 0.5, y: Math.floor(r / this.cols) * cell + 0.5,
                                 width: cell - 1, height: cell - 1 });
      rect.append(svg("title"));
      this.cells.push(rect);
      this.cellClass.push("empty");
      grid.append(rect);
    }
    return grid;
  }

  makeMsLine() {
    const node = svg("svg", { class: "ms", viewBox: "0 0 400 90" });
    const line = svg("polyline", { class: "ms-line", points: "" });
    const median = svg("line", { class: "median-line", x1: 0, x2: 400, y1: 90, y2: 90 });
    const x = 400 * this.windowFullAt / Math.max(1, this.asked - 1);
    const mark = svg("line", { class: "window-mark", x1: x, x2: x, y1: 0, y2: 90 });
    const top = svg("text", { x: 2, y: 10 });
    node.append(mark, line, median, top);
    return { node, line, median, top };
  }

  add(e) {
    // The text: the new token, and grey for what the model no longer reads.
    this.texts.push(e.text);
    const span = el("span", { class: "last" }, e.text);
    if (this.spans.length) this.spans[this.spans.length - 1].classList.remove("last");
    this.spans.push(span);
    this.story.append(span);
    this.story.scrollTop = this.story.scrollHeight;
    const reads = e.rerun || e.held; // learned positions past the window read the re-run window, not the cache
    for (; this.outUpTo < reads[0]; this.outUpTo++) this.spans[this.outUpTo].classList.add("out");

    this.numbers.replaceChildren("position ", el("b", {}, String(e.position)), " · length ", el("b", {}, String(e.length)),
      ` of a window of ${this.model.window} · rows ${e.offset}–${e.offset + e.length - 1} of ${e.capacity}`);
    this.numbers.dataset.position = e.position;
    this.numbers.dataset.length = e.length;
    this.drawEvent(e, reads);
    this.drawBar(e, reads);
    this.drawGrid(e);
    this.drawMs(e);
    this.offset = e.offset;
  }

  drawEvent(e, reads) {
    let text = "", kind = "";
    if (e.dropped) {
      const [a, b] = e.dropped;
      text = `slide: story token ${a} ${quote(this.texts[a])}${b - a > 1 ? ` and ${b - a - 1} more` : ""} dropped, ` +
             "the new one takes a row: the window moves on by one, nothing is recomputed";
      kind = "slide";
    } else if (e.rerun) {
      text = `re-run: story tokens ${reads[0]}–${reads[1] - 1} (${reads[1] - reads[0]}) through the model again, ` +
             "without the cache: their learned positions all moved";
      kind = "rerun";
    } else if (e.index > 0) {
      text = `the cache grows: ${e.length} of ${this.model.window} tokens`;
    }
    if (e.offset < this.offset) text += ` · compacted: the held rows moved to the front (once a window)`;
    this.event.textContent = text;
    this.event.className = "event " + kind;
  }

  drawBar(e, reads) {
    const x = (i) => 400 * i / this.total;
    const written = this.texts.length;
    this.barAll.setAttribute("width", x(written));
    this.barGone.setAttribute("width", x(reads[0]));
    this.barReads.setAttribute("x", x(reads[0]));
    this.barReads.setAttribute("width", x(reads[1] - reads[0]));
    this.barRerun.setAttribute("x", x(reads[0]));
    this.barRerun.setAttribute("width", e.rerun ? x(reads[1] - reads[0]) : 0);
  }

  drawGrid(e) {
    const first = e.offset, last = e.offset + e.length - 1;
    const droppedRow = e.dropped ? e.offset - 1 : -1; // slide moved the offset past it
    for (let r = 0; r < this.cells.length; r++) {
      let kind = "empty";
      if (r === last) kind = "newest";
      else if (r >= first && r < last) kind = "held";
      else if (r === droppedRow) kind = "dropped";
      if (kind !== this.cellClass[r]) {
        this.cells[r].setAttribute("class", kind);
        this.cellClass[r] = kind;
      }
      if (kind !== "empty") {
        const place = e.held[0] + (r - first); // story place this row holds
        this.cells[r].firstChild.textContent = kind === "dropped" ? "just dropped"
          : `row ${r}: story token ${place} ${quote(this.texts[place] || "")}`;
      }
    }
    this.grid.classList.toggle("frozen", Boolean(e.rerun));
  }

  drawMs(e) {
    this.ms.push(e.ms);
    if (e.index > 0) { // the first token's time includes the prompt's pass: not in the median
      insertSorted(this.sorted, e.ms);
      if (e.index > this.windowFullAt) insertSorted(this.pastSorted, e.ms);
    }
    const times = this.ms.slice(1);
    const median = medianOf(this.sorted);
    const top = Math.max(1e-3, ...times, 2 * (median || 0));
    const n = Math.max(1, this.asked - 1); // x: token index 1..asked-1
    const y = (ms) => 88 - 80 * ms / top;
    this.line.line.setAttribute("points", times.map((ms, i) => `${(400 * (i + 1) / n).toFixed(1)},${y(ms).toFixed(1)}`).join(" "));
    if (median !== null) {
      this.line.median.setAttribute("y1", y(median));
      this.line.median.setAttribute("y2", y(median));
    }
    this.line.top.textContent = `${top.toFixed(1)} ms`;
    const past = medianOf(this.pastSorted);
    this.msText.replaceChildren(`this token ${fmt(e.ms)} ms · median `, el("b", {}, fmt(median)),
      " ms/token" + (past !== null ? ` (past the window ${fmt(past)})` : "") +
      ` · first token ${fmt(this.ms[0], 0)} ms (with the prompt)`);
    this.msText.dataset.median = median === null ? "" : median;
  }
}

function insertSorted(sorted, x) {
  let lo = 0, hi = sorted.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (sorted[mid] < x) lo = mid + 1; else hi = mid; }
  sorted.splice(lo, 0, x);
}

function medianOf(sorted) {
  const n = sorted.length;
  if (n === 0) return null;
  return n % 2 ? sorted[(n - 1) / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

// ---------------------------------------------------------------------------------------------
// Read past the window: each token coloured by its loss

const READ_MODES = [
  { name: "sliding window", label: "sliding window" },
  { name: "sliding cache", label: "sliding cache" },
  { name: "full context", label: "full context" },
  { name: "sliding cache", minus: "sliding window", label: "cache − window" },
  { name: "full context", minus: "sliding window", label: "full − window" },
];

function setUpRead() {
  READ_MODES.forEach((mode, i) => {
    const input = el("input", { type: "radio", name: "read-mode", value: String(i) });
    if (i === 0) input.checked = true;
    input.addEventListener("change", colourRead);
    $("read-methods").append(el("label", {}, input, mode.label));
  });
  const setMax = () => {
    const m = page.info.models.find((m) => m.name === $("read-model").value);
    if (m) $("read-piece").max = Math.max(0, m.pieces - 1);
  };
  $("read-model").addEventListener("change", setMax);
  setMax();
  $("read-text").addEventListener("mousemove", showTooltip);
  $("read-text").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  drawLegend();
}

async function read() {
  const query = new URLSearchParams({ model: $("read-model").value, piece: $("read-piece").value });
  page.read = null;
  $("read").dataset.state = "reading";
  $("read-go").disabled = true;
  setStatus("read-status", "reading…");
  try {
    await streamEvents("api/read?" + query, (event, data) => {
      if (event === "piece") startRead(data);
      else if (event === "wait") setStatus("read-status", data.message);
      else if (event === "scored") {
        page.read.scored[data.method] = data;
        drawMeans();
        colourRead();
        const left = page.read.methods.filter((m) => !page.read.scored[m]);
        setStatus("read-status", left.length ? `scoring with the ${left[0]}…` : "");
      } else if (event === "done") {
        setStatus("read-status", page.read.notes.join(" "));
        $("read").dataset.state = "done"; // for scripts that drive the page (tests, screenshots)
      }
    });
  } catch (e) {
    setStatus("read-status", e.message, true);
  } finally {
    $("read-go").disabled = false;
  }
}

function startRead(data) {
  page.read = { ...data, scored: {} };
  const spans = data.tokens.map((text, i) => el("span", { "data-i": String(i), class: i < data.window ? "context" : "" },
    text));
  if (spans.length > data.window) spans[data.window].classList.add("mark");
  page.read.spans = spans;
  $("read-text").replaceChildren(...spans);
  drawMeans();
  setStatus("read-status", `scoring with the ${data.methods[0]}…`);
}

function drawMeans() {
  const r = page.read;
  const rows = r.methods.map((m) => {
    const s = r.scored[m];
    return el("tr", {}, el("td", {}, m), el("td", {}, s ? fmt(s.mean, 4) : "…"), el("td", {}, s ? fmt(s.ms_per_token) : "…"));
  });
  $("read-means").replaceChildren(el("tr", {}, el("th", {}, `${r.model}, piece ${r.piece}: tokens ${r.window}–` +
    `${r.tokens.length - 1}`), el("th", {}, "mean loss"), el("th", {}, "ms/token")), ...rows);
}

function readLoss(method, i) { // the loss of token i under method (token i is scored at index i - window)
  const s = page.read && page.read.scored[method];
  return s && i >= page.read.window ? s.losses[i - page.read.window] : undefined;
}

function colourRead() {
  if (!page.read) return;
  const mode = READ_MODES[Number(document.querySelector("input[name=read-mode]:checked").value)];
  drawLegend(mode);
  page.read.spans.forEach((span, i) => {
    const a = readLoss(mode.name, i), b = mode.minus ? readLoss(mode.minus, i) : 0;
    if (a === undefined || b === undefined) { span.style.background = ""; span.style.color = ""; return; }
    const [colour, dark] = mode.minus ? diffColour(a - b) : lossColour(a);
    span.style.background = colour;
    span.style.color = dark ? "#fff" : "";
  });
}

const LOSS_STOPS = [[0, [255, 255, 229]], [2, [254, 227, 145]], [4, [254, 153, 41]], [6, [204, 76, 2]], [8, [102, 37, 6]]];
const DIFF_STOPS = [[-1, [33, 102, 172]], [0, [247, 247, 247]], [1, [178, 24, 43]]];

function ramp(stops, x) {
  x = Math.min(Math.max(x, stops[0][0]), stops[stops.length - 1][0]);
  for (let k = 1; k < stops.length; k++) {
    const [x1, c1] = stops[k], [x0, c0] = stops[k - 1];
    if (x <= x1) {
      const t = (x - x0) / (x1 - x0);
      return `rgb(${c0.map((c, j) => Math.round(c + t * (c1[j] - c))).join(",")})`;
    }
  }
}

const lossColour = (loss) => [ramp(LOSS_STOPS, loss), loss > 5];
const diffColour = (d) => [ramp(DIFF_STOPS, d), Math.abs(d) > 0.7];

function drawLegend(mode = READ_MODES[0]) {
  const stops = mode.minus ? DIFF_STOPS : LOSS_STOPS;
  const lo = stops[0][0], hi = stops[stops.length - 1][0];
  const legend = svg("svg", { viewBox: "0 0 420 34" });
  for (let k = 0; k < 40; k++) {
    legend.append(svg("rect", { x: 10 + k * 10, y: 2, width: 10.5, height: 12, fill: ramp(stops, lo + (hi - lo) * (k + 0.5) / 40) }));
  }
  for (const [x] of stops) {
    const label = svg("text", { x: 10 + 400 * (x - lo) / (hi - lo), y: 27, "text-anchor": "middle" });
    label.textContent = (x > 0 && mode.minus ? "+" : "") + x;
    legend.append(label);
  }
  const caption = mode.minus ? `${mode.label}, nats (blue: better than the window)` : `${mode.name} loss, nats per token`;
  $("read-legend").replaceChildren(legend, el("span", { class: "caption" }, caption));
}

function showTooltip(event) {
  const span = event.target.closest("span[data-i]");
  const tip = $("tooltip");
  if (!span || !page.read) { tip.hidden = true; return; }
  const i = Number(span.dataset.i), r = page.read;
  let text = `token ${i} ${quote(r.tokens[i])}`;
  if (i < r.window) text += "\nthe first window: read, not scored";
  else {
    for (const m of ["sliding window", "sliding cache", "full context"]) {
      if (!r.methods.includes(m)) continue;
      const loss = readLoss(m, i), mean = r.scored[m] && r.scored[m].mean;
      text += `\n${m}: ${loss === undefined ? "…" : fmt(loss, 3)} (mean ${mean === undefined ? "…" : fmt(mean, 3)})`;
    }
  }
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = Math.min(event.pageX + 14, document.documentElement.scrollWidth - tip.offsetWidth - 8) + "px";
  tip.style.top = (event.pageY + 16) + "px"; // in the page, not the window: a full-page picture keeps it
}

// ---------------------------------------------------------------------------------------------
// Rotary angles: a pair's arrow, and every pair's speed, under each way of scaling

const ANGLE_COLOURS = { none: "#1d232b", linear: "#2f6fb0", ntk: "#2e9c5a", yarn: "#c0392b" };

function setUpAngles() {
  const rope = page.info.models.find((m) => m.rope);
  if (!rope) {
    setStatus("angles-status", "no rope model loaded: the angles need one (a checkpoint trained with --rope)");
    $("angles-form").hidden = true;
    return;
  }
  $("angles-pair").max = rope.pairs - 1;
  $("angles-pair").value = $("angles-pair-out").value = Math.min(8, rope.pairs - 1);
  $("angles-ctx").value = 4 * rope.window;
  $("angles-ctx").min = rope.window;
  $("angles-ctx").max = page.info.limits.ctx_factor * rope.window;
  $("angles-pair").addEventListener("input", () => { $("angles-pair-out").value = $("angles-pair").value; loadAngles(); });
  $("angles-ctx").addEventListener("change", loadAngles);
  $("angles-model").addEventListener("change", loadAngles);
  $("angles-position").addEventListener("input", drawArrow);
  $("angles-play").addEventListener("click", togglePlay);
}

async function loadAngles() {
  const query = new URLSearchParams({ model: $("angles-model").value, ctx: $("angles-ctx").value,
                                      pair: $("angles-pair").value });
  const ask = ++page.anglesAsked;
  try {
    const data = await getJSON("api/angles?" + query);
    if (ask !== page.anglesAsked) return; // an older answer, overtaken by a newer question
    page.angles = data;
    $("angles-pair").max = data.pairs - 1;
    $("angles-position").max = data.ctx - 1;
    setStatus("angles-status", "");
    drawSpeeds();
    drawArrow();
    $("angles").dataset.state = "drawn";
  } catch (e) {
    setStatus("angles-status", e.message, true);
  }
}

function togglePlay() {
  if (page.play) {
    cancelAnimationFrame(page.play);
    page.play = null;
    $("angles-play").textContent = "Play";
    return;
  }
  $("angles-play").textContent = "Pause";
  const step = () => {
    const input = $("angles-position");
    input.value = (Number(input.value) + 1) % (Number(input.max) + 1);
    drawArrow();
    page.play = requestAnimationFrame(step);
  };
  page.play = requestAnimationFrame(step);
}

function drawArrow() {
  const a = page.angles;
  if (!a) return;
  const pos = Math.min(Number($("angles-position").value), a.ctx - 1);
  $("angles-position-out").value = pos;
  const root = $("arrow");
  root.replaceChildren(svg("circle", { class: "circle", cx: 0, cy: 0, r: 1 }),
    svg("line", { class: "axis", x1: -1.4, x2: 1.4, y1: 0, y2: 0 }), svg("line", { class: "axis", x1: 0, x2: 0, y1: -1.4, y2: 1.4 }));
  const lines = [];
  for (const [method, m] of Object.entries(a.methods)) {
    const colour = ANGLE_COLOURS[method];
    for (let back = 5; back >= 1; back--) { // where the arrow pointed at the last few positions
      if (pos - back < 0) continue;
      const t = m.angles[pos - back];
      root.append(svg("line", { class: "trail", x1: 0, y1: 0, x2: m.magnitude * Math.cos(t), y2: -m.magnitude * Math.sin(t),
                                stroke: colour }));
    }
    const t = m.angles[pos];
    root.append(svg("line", { class: "arrow", x1: 0, y1: 0, x2: m.magnitude * Math.cos(t), y2: -m.magnitude * Math.sin(t),
                              stroke: colour, "data-method": method }));
    lines.push(`${method.padEnd(6)} ${fmt(t / (2 * Math.PI), 2).padStart(9)} turns` +
               `  (${fmt(m.speeds[a.pair], 5)} rad/token${m.magnitude !== 1 ? `, length ${fmt(m.magnitude, 3)}` : ""})`);
  }
  $("arrow-caption").textContent = `pair ${a.pair} at position ${pos}, asked for n_ctx ${a.ctx}:\n` + lines.join("\n");
}

function drawSpeeds() {
  const a = page.angles, root = $("speeds");
  const W = 640, H = 300, left = 52, right = 12, top = 14, bottom = 36;
  const x = (i) => left + (W - left - right) * i / (a.pairs - 1);
  const lo = 0, hi = 6.5; // log10 of tokens per turn: from 1 to about 3 million
  const y = (turnTokens) => top + (H - top - bottom) * (1 - (Math.log10(turnTokens) - lo) / (hi - lo));
  root.replaceChildren(svg("rect", { class: "pick", x: x(a.pair) - 7, width: 14, y: top, height: H - top - bottom }));
  for (let p = 0; p <= 6; p++) {
    root.append(svg("line", { class: "grid-line", x1: left, x2: W - right, y1: y(10 ** p), y2: y(10 ** p) }));
    const label = svg("text", { x: left - 6, y: y(10 ** p) + 3, "text-anchor": "end" });
    label.textContent = ["1", "10", "100", "1k", "10k", "100k", "1M"][p];
    root.append(label);
  }
  for (let i = 0; i < a.pairs; i += 4) {
    const label = svg("text", { x: x(i), y: H - bottom + 14, "text-anchor": "middle" });
    label.textContent = i;
    root.append(label);
  }
  const axis = svg("text", { x: (left + W) / 2, y: H - 6, "text-anchor": "middle" });
  axis.textContent = "pair i (fast → slow); up: tokens for one turn, 2π / speed";
  root.append(axis);
  for (const [value, name] of [[a.train_ctx, `trained: ${a.train_ctx}`], [a.ctx, `n_ctx: ${a.ctx}`]]) {
    root.append(svg("line", { class: "ctx-line", x1: left, x2: W - right, y1: y(value), y2: y(value),
                              stroke: value === a.ctx ? "#c0392b" : "#1d232b" }));
    const label = svg("text", { class: "label", x: left + 4, y: y(value) - 4 });
    label.textContent = name;
    root.append(label);
  }
  let legendX = left + 120;
  for (const [method, m] of Object.entries(a.methods)) {
    const points = m.speeds.map((s, i) => `${x(i).toFixed(1)},${y(2 * Math.PI / s).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { class: "series", points, stroke: ANGLE_COLOURS[method], "data-method": method }));
    const key = svg("text", { class: "label", x: legendX, y: top + 2 });
    key.style.fill = ANGLE_COLOURS[method]; // a style: the stylesheet's text colour would win over an attribute
    key.textContent = "— " + method;
    root.append(key);
    legendX += 70;
  }
  const never = a.methods.none.speeds.filter((s) => 2 * Math.PI / s > a.train_ctx).length;
  $("speeds-caption").textContent = `${never} of ${a.pairs} pairs take longer than the trained ${a.train_ctx} tokens ` +
    `for one turn (above the dashed line): past it, they meet angles they never saw in training.`;
}

start();
