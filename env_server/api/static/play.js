// The play page: a small client of the REST API (docs/wire.md). No build step, no deps.
//
// Live play: every step and reset goes through one queue, sent one at a time with the
// step_index of the last reply, so n key presses are n steps (never lost, never answered
// as retries of one another); the return is the sum of the rewards the server applied.
// The page is bound to its session: the header names the live session's env, format,
// representation, config and seed; reset, send and the templates act on that session
// whatever the controls say (a changed control waits for "create session").
// Replay: an episode file (clients/episodes.py, format visenv.episode/1) shown with the
// same timeline. The timeline's entry 0 is the episode's start; entry k is step k: the
// observation the agent saw before it, what was sent, the reward and what it led to.
const $ = (id) => document.getElementById(id);
const ARROWS = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right" };
const ARROW_SIGN = { up: "↑", down: "↓", left: "←", right: "→" };
const PIXEL_ENVS = new Set(["sokoban", "frozenlake", "vicrit"]);  // grid art: crisp upscaling
const PIXEL_TARGET = 320;  // grid art is drawn at the largest whole-number scale up to this (96 px: 3x)
const ANSWER_IN_GT = new Set(["vicrit"]);  // its ground truth holds the answer: hidden at first
const SHORT = { observation: "obs", prediction: "pred" };  // reward part headers that fit
const EPISODE_FORMAT = "visenv.episode/1";
const IMAGE_NAMES = { svg: ["target", "agent's rendering"] };
// each format's response around its answer ("@" marks the answer's place)
const LAYOUTS = {
  no_think: "@", free_think: "<think>...</think>@",
  grounding: "<think><observation>...</observation><reasoning>...</reasoning></think>@",
  worldmodeling: "<think><reasoning>...</reasoning><prediction>...</prediction></think>@",
  grounding_worldmodeling: "<think><observation>...</observation><reasoning>...</reasoning><prediction>...</prediction></think>@",
  vagen_free_think: "<think>...</think>@",
  vagen_wm: "<observation>...</observation><think>...</think>@<prediction>...</prediction>",
  vagen_free_wm: "<observation>...</observation><think>...</think>@<prediction>...</prediction>",
  vagen_no_think: "@", vagen_eval_mode: "@",
};
const TAGS = ["think", "observation", "reasoning", "prediction", "answer"];

let envs = {};
// {session_id, env, format, representation, config, seed, episode, step_index, maxTurns, done, system_prompt}
let live = null;
let replay = null;    // {name, episodes: [...], index}
let entries = [];     // the timeline of the episode on screen
let selected = -1;    // the entry shown large; -1: follow the episode (live: the current observation)
const queue = [];     // steps/resets waiting to be sent
const moves = [];     // the moves of the turn being built (several moves a turn)
let busy = false;     // a request is in flight
let creating = false;
let gtHidden = false;

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if ($("token").value) headers["Authorization"] = "Bearer " + $("token").value;
  const res = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  let data = null;
  try { data = await res.json(); } catch { /* not JSON: reported below */ }
  if (!res.ok || data === null) {
    const e = data && data.error;
    throw new Error(e ? `${e.code}: ${e.message}` : `HTTP ${res.status} ${res.statusText} from ${path}`);
  }
  return data;
}

function escape(s) { const d = document.createElement("div"); d.textContent = s; return d.innerHTML; }
// numbers to 3 decimals, so 0.6666666666666666 reads 0.667
const rounded = (v) => JSON.stringify(v, (_, x) => (typeof x === "number" && !Number.isInteger(x) ? Number(x.toFixed(3)) : x));
function lines(obj) {  // one line per key keeps long lists (walls, relations) readable
  if (!obj || typeof obj !== "object") return String(obj ?? "");
  return Object.entries(obj).map(([k, v]) => `${k}: ${rounded(v)}`).join("\n");
}
const fmt = (x) => (typeof x === "number" ? x.toFixed(3) : "-");
const imageUrl = (im) => (im && im.encoding !== "raw" ? `data:image/${im.encoding};base64,${im.data}` : null);

function setStatus(html) { $("status").innerHTML = html; }
function fail(err) {
  const hint = err.message.startsWith("NOT_FOUND") ? " — create a new session to go on"
    : err.message.startsWith("UNAUTHENTICATED") ? " — enter the server's token" : "";
  setStatus(`<span class="err">error: ${escape(err.message)}</span>${hint}`);
}

// ---------------------------------------------------------------- the timeline and view

function observed(obs) {
  return obs ? { images: obs.images || [], text: obs.text || "", ground_truth: obs.ground_truth || {}, info: obs.info || {} }
    : { images: [], text: "", ground_truth: {}, info: {} };
}

// one timeline entry: `before` is what the agent saw when it acted, `after` what it led to
function entryOf(turn, sent, result, before, after) {
  return {
    turn, sent,
    before: before ? observed(before) : null,
    after: observed(after),
    reward: result ? result.reward : null,
    reward_parts: result ? result.reward_parts : null,
    terminated: !!(result && result.terminated), truncated: !!(result && result.truncated),
    success: !!(result && result.success),
    info: result ? result.info || {} : {},
    error: null,
  };
}

const sentText = (e) => (e.turn === 0 ? "start" : e.sent || "");
// what a card shows of a raw response: its answer, when it has one
function answerOf(text) {
  const m = /<answer>([\s\S]*?)<\/answer>/.exec(text);
  return m ? m[1].trim() : text;
}
const episodeReturn = () => entries.reduce((sum, e) => sum + (e.reward || 0), 0);

// each executed action and what it did, e.g. "Left moved · Up blocked · Right pushed (box onto target)"
function results(info) {
  if (Array.isArray(info.results)) return info.results.join(" · ");  // primitive_skill's own words
  if (!Array.isArray(info.actions)) return "";
  return info.actions.filter((a) => a && a.name).map((a) => `${a.name}${a.args ? `(${a.args.join(", ")})` : ""}`
    + (a.result ? ` ${a.result}` : "") + (a.box ? ` (box ${a.box})` : "")).join(" · ");
}

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = reject;
    img.src = url;
  });
}

// A thumbnail of `after` with a red box around the pixels that differ from `before`
// (small frames of a grid look alike at 48 px: the box says what the turn changed).
async function drawChange(canvas, afterUrl, beforeUrl) {
  const after = await loadImage(afterUrl);
  const scale = 48 / after.naturalHeight;
  canvas.width = Math.round(after.naturalWidth * scale);
  canvas.height = 48;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = !PIXEL_ENVS.has(currentEnv());
  ctx.drawImage(after, 0, 0, canvas.width, canvas.height);
  if (!beforeUrl) return;
  const before = await loadImage(beforeUrl);
  if (before.naturalWidth !== after.naturalWidth || before.naturalHeight !== after.naturalHeight) return;
  const w = after.naturalWidth, h = after.naturalHeight;
  const pixels = (img) => {
    const c = document.createElement("canvas");
    c.width = w; c.height = h;
    const x = c.getContext("2d");
    x.drawImage(img, 0, 0);
    return x.getImageData(0, 0, w, h).data;
  };
  const a = pixels(after), b = pixels(before);
  let x0 = w, y0 = h, x1 = -1, y1 = -1;
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const i = (y * w + x) * 4;
      if (Math.abs(a[i] - b[i]) + Math.abs(a[i + 1] - b[i + 1]) + Math.abs(a[i + 2] - b[i + 2]) > 24) {
        x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y);
      }
    }
  }
  if (x1 < 0 || (x1 - x0) * (y1 - y0) > 0.6 * w * h) return;  // nothing, or everything, changed
  ctx.strokeStyle = "#e00";
  ctx.lineWidth = 2;
  ctx.strokeRect(x0 * scale - 1, y0 * scale - 1, (x1 - x0 + 1) * scale + 2, (y1 - y0 + 1) * scale + 2);
  canvas.dataset.changed = `${x0},${y0},${x1},${y1}`;
}

function thumbs(e) {
  const box = document.createElement("div");
  box.className = "thumbs";
  const names = IMAGE_NAMES[currentEnv()] || [];
  e.after.images.forEach((im, i) => {
    const url = imageUrl(im);
    if (!url) return;
    const canvas = document.createElement("canvas");
    canvas.title = names[i] || `image ${i + 1}`;
    canvas.setAttribute("aria-label", canvas.title);
    const before = e.before && imageUrl(e.before.images[i]);
    drawChange(canvas, url, before).catch(() => {});
    box.appendChild(canvas);
  });
  return box;
}

function renderTimeline() {
  const tl = $("timeline");
  tl.innerHTML = "";
  entries.forEach((e, i) => {
    const card = document.createElement("div");
    const bad = e.error || e.info.action_valid === false;
    card.className = "turn" + (i === shownIndex() ? " selected" : "") + (bad ? " failed" : e.success ? " success" : "");
    card.dataset.turn = String(i);
    card.appendChild(thumbs(e));
    const head = document.createElement("div");
    head.innerHTML = `<b>turn ${i}</b>` + (e.reward === null ? "" : ` · reward ${fmt(e.reward)}`)
      + (e.success ? ' <span class="ok">✓ success</span>' : "")
      + (e.error ? ' <span class="err">error</span>' : bad ? ' <span class="err">invalid</span>' : "");
    card.appendChild(head);
    const act = document.createElement("div");
    act.className = "act";
    act.textContent = answerOf(sentText(e));
    card.appendChild(act);
    const did = results(e.info);
    if (did) {
      const res = document.createElement("div");
      res.className = "results";
      res.textContent = did;
      card.appendChild(res);
    }
    if (e.reward_parts) {
      const parts = document.createElement("div");
      parts.textContent = Object.entries(e.reward_parts).filter(([, v]) => v).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
      card.appendChild(parts);
    }
    card.onclick = () => select(i === entries.length - 1 && live ? -1 : i);
    tl.appendChild(card);
  });
  const card = tl.querySelector(".turn.selected");  // keep it in view (the strip scrolls, not the page)
  if (card && (card.offsetLeft < tl.scrollLeft || card.offsetLeft + card.offsetWidth > tl.scrollLeft + tl.clientWidth)) {
    tl.scrollLeft = card.offsetLeft - tl.clientWidth + card.offsetWidth + 8;
  }
}

const shownIndex = () => (selected < 0 ? entries.length - 1 : selected);
function currentEnv() { return live ? live.env : replay ? replay.episodes[replay.index].env : ""; }

function select(i) {
  selected = i;
  renderView();
  renderTimeline();
}

// the response split by tag: think, observation, reasoning, prediction, answer (nested
// sections listed on their own, in the order written); text without tags as it is
function sections(text) {
  const names = TAGS.join("|");
  const found = [];
  for (const m of text.matchAll(new RegExp(`<(${names})>`, "g"))) {
    const end = text.indexOf(`</${m[1]}>`, m.index);
    if (end < 0) continue;
    const own = text.slice(m.index + m[0].length, end).replace(new RegExp(`<(${names})>[\\s\\S]*?</\\1>`, "g"), "").trim();
    if (own) found.push([m[1], own]);
  }
  return found.length ? found : [["response", text]];
}

function renderSent(e) {
  const box = $("sent");
  box.innerHTML = "";
  $("sent-head").textContent = e && e.turn > 0 ? `turn ${e.turn}: what was sent` : "";
  if (!e || e.turn === 0) return;
  for (const [tag, body] of sections(e.sent || "")) {
    const row = document.createElement("div");
    row.className = "section";
    row.innerHTML = `<b>${escape(tag)}</b> <span></span>`;
    row.querySelector("span").textContent = body;
    box.appendChild(row);
  }
  const did = results(e.info);
  const parsed = e.info.parse_error ? `not parsed: ${e.info.parse_error}` : did;
  if (parsed) {
    const row = document.createElement("div");
    row.className = "section" + (e.info.parse_error ? " err" : "");
    row.innerHTML = "<b>actions</b> <span></span>";
    row.querySelector("span").textContent = parsed;
    box.appendChild(row);
  }
}

function figure(im, caption, k, cls) {
  const url = imageUrl(im);
  if (!url) return null;
  const fig = document.createElement("figure");
  if (cls) fig.className = cls;
  const img = document.createElement("img");
  img.src = url;
  img.alt = caption;
  img.dataset.index = String(k);
  if (PIXEL_ENVS.has(currentEnv())) {  // small grid art: a whole-number scale, drawn crisply
    img.onload = () => {
      const scale = Math.max(1, Math.floor((cls === "after" ? PIXEL_TARGET / 2 : PIXEL_TARGET) / img.naturalHeight));
      img.style.height = `${img.naturalHeight * scale}px`;
    };
  }
  fig.appendChild(img);
  const cap = document.createElement("figcaption");
  cap.textContent = caption;
  fig.appendChild(cap);
  return fig;
}

function renderView() {
  const i = shownIndex();
  const e = entries[i];
  const view = $("view");
  view.innerHTML = "";
  view.className = PIXEL_ENVS.has(currentEnv()) ? "pixel" : "";
  renderSent(e);
  if (!e) { $("obs").textContent = $("gt").textContent = $("info").textContent = ""; $("reward").innerHTML = ""; return; }
  const names = IMAGE_NAMES[currentEnv()] || [];
  const name = (k, n) => names[k] || (n > 1 ? `image ${k + 1}` : "");
  // a turn looked at: what the agent saw before it, large, and what it led to; following
  // a live episode: the observation to act on now
  const turnView = e.before && (selected >= 0 || replay);
  const shown = turnView ? e.before : e.after;
  shown.images.forEach((im, k) => {
    const label = turnView ? `seen before turn ${i}${name(k, shown.images.length) ? ` · ${name(k, shown.images.length)}` : ""}`
      : name(k, shown.images.length) || (live && !e.before ? "start" : "now");
    const fig = figure(im, label, k, "seen");
    if (fig) view.appendChild(fig);
  });
  if (turnView) {
    e.after.images.forEach((im, k) => {
      const fig = figure(im, `after turn ${i}${name(k, e.after.images.length) ? ` · ${name(k, e.after.images.length)}` : ""}`, k, "after");
      if (fig) view.appendChild(fig);
    });
  }
  if (!view.querySelector("img")) {  // a text observation: say so, never keep an older frame
    const note = document.createElement("div");
    note.className = "textobs";
    note.textContent = "This observation is text only (below).";
    view.appendChild(note);
  }
  bindClicks(view, shown);
  $("obs").textContent = turnView ? `${shown.text}\n\n— after turn ${i}:\n${e.after.text}` : shown.text;
  $("gt").textContent = lines(shown.ground_truth);
  $("info").textContent = lines(e.info);
  const parts = e.reward_parts || {};
  $("reward").innerHTML =
    `<tr><th>reward</th><th>return</th>` + Object.keys(parts).map((k) => `<th title="${k}">${SHORT[k] || k}</th>`).join("") + "</tr>" +
    `<tr><td><b>${fmt(e.reward)}</b></td><td>${fmt(entries.slice(0, i + 1).reduce((s, x) => s + (x.reward || 0), 0))}</td>` +
    Object.values(parts).map((v) => `<td>${fmt(v)}</td>`).join("") + "</tr>";
  $("viewing").textContent = selected >= 0 && i < entries.length - 1
    ? `viewing turn ${i} of ${entries.length - 1}: click the last turn (or press End) to follow the episode` : "";
  renderWhere();
}

function renderWhere() {
  const turn = entries.length ? entries.length - 1 : 0;
  if (live) {
    $("where").textContent = `seed ${live.seed} · episode ${live.episode} · turn ${turn}/${live.maxTurns ?? "?"} · return ${fmt(episodeReturn())}`;
    $("sid").textContent = `${live.session_id} · episode ${live.episode} · step ${live.step_index}`;
  } else if (replay) {
    const ep = replay.episodes[replay.index];
    $("where").textContent = `replay of ${replay.name} · ${ep.env} seed ${ep.seed} · episode ${ep.episode} · turn ${turn}/${ep.turns} · return ${fmt(ep.return)}`;
    $("sid").textContent = ep.session_id ? `recorded from session ${ep.session_id}` : "";
  }
  renderSession();
}

// The header: the live session's options, and whether the controls say something else
function controls() {
  return { env: $("env").value, format: $("format").value, representation: $("rep").value, config: $("config").value.trim() || "{}" };
}
function sameConfig(a, b) {
  try { return JSON.stringify(JSON.parse(a)) === JSON.stringify(JSON.parse(b)); } catch { return a === b; }
}
function renderSession() {
  if (!live) {
    $("session").textContent = replay ? "replay: no live session" : "no session";
    $("pending").textContent = "";
    return;
  }
  $("session").textContent = `session: ${live.env} · format ${live.format} · representation ${live.representation} · config ${live.config} · seed ${live.seed}`;
  const now = controls();
  const changed = Object.keys(now).filter((k) => (k === "config" ? !sameConfig(now[k], live[k]) : now[k] !== live[k]));
  $("pending").textContent = changed.length
    ? `${changed.map((k) => `${k} ${now[k]}`).join(", ")}: press create to apply (reset and send act on this ${live.env} session)`
    : "";
}
["env", "format", "rep", "config"].forEach((id) => {
  $(id).addEventListener("change", renderSession);
  $(id).addEventListener("input", renderSession);
});

function applyGtVisibility() {
  $("gt").classList.toggle("hidden", gtHidden);
  $("gt-toggle").textContent = gtHidden ? "show" : "hide";
  $("gt-note").textContent = gtHidden ? (ANSWER_IN_GT.has(currentEnv()) ? "hidden: it holds the answer" : "hidden") : "";
}
$("gt-toggle").onclick = () => { gtHidden = !gtHidden; applyGtVisibility(); };

// ---------------------------------------------------------------- clicking on the scene

// primitive_skill's observation carries its camera (info.camera): a click on the image is
// the table point under it, or the listed object drawn there
function cameraBasis(cam) {
  const sub = (a, b) => a.map((x, i) => x - b[i]);
  const norm = (a) => { const n = Math.hypot(...a); return a.map((x) => x / n); };
  const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
  const f = norm(sub(cam.target_m, cam.eye_m));
  const r = norm(cross(f, [0, 0, 1]));
  const u = cross(r, f);
  return { f, r, u, t: Math.tan(cam.fov_rad / 2), eye: cam.eye_m, n: cam.size_px };
}
function project(cam, pointMm) {  // a point (mm) -> pixel [x, y]
  const b = cameraBasis(cam);
  const d = pointMm.map((v, i) => v / 1000 - b.eye[i]);
  const dot = (a, c) => a[0] * c[0] + a[1] * c[1] + a[2] * c[2];
  const z = dot(d, b.f);
  return [(dot(d, b.r) / (z * b.t) + 1) / 2 * b.n, (1 - dot(d, b.u) / (z * b.t)) / 2 * b.n];
}
function pointAt(cam, px, py, heightMm) {  // pixel -> the point (mm) at that height under it
  const b = cameraBasis(cam);
  const nx = (px / b.n) * 2 - 1, ny = 1 - (py / b.n) * 2;
  const dir = b.f.map((v, i) => v + nx * b.t * b.r[i] + ny * b.t * b.u[i]);
  const s = (heightMm / 1000 - b.eye[2]) / dir[2];
  return b.eye.map((v, i) => Math.round((v + s * dir[i]) * 1000));
}
function sceneClick(obs, img, ev) {
  const cam = obs.info.camera;
  const rect = img.getBoundingClientRect();
  const px = ((ev.clientX - rect.left) / rect.width) * cam.size_px;
  const py = ((ev.clientY - rect.top) / rect.height) * cam.size_px;
  let best = null;
  for (const [name, pos] of Object.entries(obs.ground_truth.objects || {})) {
    const [x, y] = project(cam, pos);
    const d = Math.hypot(x - px, y - py);
    if (d < cam.size_px * 0.05 && (!best || d < best.d)) best = { d, name, pos };
  }
  const point = best ? best.pos.map(Math.round) : pointAt(cam, px, py, 20);
  const box = $("response");
  const text = point.join(", ");
  const at = box.selectionStart ?? box.value.length;
  box.value = box.value.slice(0, at) + text + box.value.slice(box.selectionEnd ?? at);
  box.selectionStart = box.selectionEnd = at + text.length;
  $("clicked").textContent = `clicked: ${text}${best ? ` (the ${best.name.replace(/_/g, " ")})` : " (on the table)"}, written into the response`;
}
function bindClicks(view, obs) {
  if (!live || !obs.info.camera) return;
  view.querySelectorAll("figure.seen img").forEach((img) => {
    img.classList.add("clickable");
    img.title = "click: write this point's x, y, z (mm) into the response";
    img.addEventListener("mousedown", (ev) => ev.preventDefault());  // keep the response's cursor
    img.onclick = (ev) => sceneClick(obs, img, ev);
  });
}

// ---------------------------------------------------------------- live play

function setInFlight() {
  const on = busy || queue.length > 0;
  $("inflight").classList.toggle("on", on);
  $("inflight").textContent = on ? `step in flight${queue.length ? `, ${queue.length} queued` : ""}` : "";
}

function refreshControls() {
  const playable = !!live && !live.done;
  document.querySelectorAll("#actions button").forEach((b) => (b.disabled = !playable));
  $("send").disabled = !playable;
  $("template").disabled = !live;
  $("reset").disabled = $("next").disabled = !live;
  $("send-moves").disabled = !playable || !moves.length;
  $("clear-moves").disabled = !moves.length;
}

function startEpisode(reply, seed) {
  live = { ...live, step_index: reply.step_index, seed, episode: reply.episode, done: reply.terminated || reply.truncated };
  live.maxTurns = maxTurns(reply);
  live.system_prompt = reply.system_prompt || live.system_prompt || "";
  moves.length = 0;
  renderMoves();
  entries = [entryOf(0, null, null, null, reply.observation)];
  selected = -1;
  $("prompt").textContent = live.system_prompt;
  setStatus("");
  refreshControls();
  renderView();
  renderTimeline();
}

function maxTurns(reply) {
  const gt = reply.observation.ground_truth || {};
  if (typeof gt.max_turns === "number") return gt.max_turns;
  let config = {};
  try { config = JSON.parse(live.config); } catch { /* refused at create */ }
  if (config.max_attempts && config.feedback === "unary") return config.max_attempts;
  if (config.max_turns) return config.max_turns;
  const schema = envs[reply.env] && envs[reply.env].config_schema;
  const prop = schema && schema.properties && schema.properties.max_turns;
  return prop && prop.default !== undefined ? prop.default : null;
}

function addStep(reply, sent) {
  if (reply.step_index <= live.step_index) return;  // answered from memory: not a new step
  live.step_index = reply.step_index;
  live.done = reply.terminated || reply.truncated;
  const before = entries[entries.length - 1].after;
  const e = entryOf(reply.turn, sent, reply, null, reply.observation);
  e.before = before;
  entries.push(e);
  const info = reply.info || {};
  const notes = [];
  if (info.action_valid === false) notes.push(`<span class="err">invalid response: ${escape(info.parse_error || "no valid action")}</span>`);
  if (info.invalid_actions && info.invalid_actions.length) notes.push(`<span class="err">invalid actions: ${escape(JSON.stringify(info.invalid_actions))}</span>`);
  if (info.judge_error) notes.push(`<span class="err">judge error: ${escape(String(info.judge_error))}</span>`);
  if (live.done) {
    notes.push(`<b class="${reply.success ? "ok" : "err"}">episode over: ${reply.success ? "success" : "failed"}</b>`);
    const gt = reply.observation.ground_truth || {};
    if (ANSWER_IN_GT.has(live.env) && gt.span) {  // the answer, now that it can be shown
      notes.push(`the wrong span was <b>“${escape(gt.span)}”</b>${gt.original ? ` (the image shows “${escape(gt.original)}”)` : ""} · score ${fmt((reply.reward_parts || {}).env)} (reward with the format's ${fmt(reply.reward)})`);
    }
    notes.push("press reset (same seed) or next seed");
  }
  setStatus(notes.join(" · "));
}

function describe(body) {
  if (body.response !== undefined) return body.response;
  return body.actions.map((a) => a.name + (a.args ? `(${a.args.join(", ")})` : "")).join(", ");
}

function enqueue(item) {
  if (!live) return;
  queue.push(item);
  pump();
}

async function pump() {
  if (busy) { setInFlight(); return; }
  busy = true;
  try {
    while (queue.length) {
      setInFlight();
      const item = queue.shift();
      const target = live;  // a new session or a replay may replace it while we wait
      if (!target) break;
      if (item.reset !== undefined) {
        const reply = await api("POST", `/v1/sessions/${target.session_id}/reset`, { seed: item.reset });
        if (live === target) startEpisode(reply, item.reset);
        continue;
      }
      if (live.done) {  // the episode ended: the presses left over are not played
        setStatus($("status").innerHTML + ` · <span class="err">${queue.length + 1} queued step(s) dropped: the episode is over</span>`);
        queue.length = 0;
        break;
      }
      const reply = await api("POST", `/v1/sessions/${target.session_id}/step`, { step_index: target.step_index, ...item.body });
      if (live !== target) continue;  // the page moved on: this reply is not on screen
      addStep(reply, describe(item.body));
      selected = -1;
      refreshControls();
      renderView();
      renderTimeline();
    }
  } catch (err) {
    queue.length = 0;  // what was queued after a failure is not sent
    fail(err);
  } finally {
    busy = false;
    setInFlight();
  }
}

const step = (body) => { if (live && !live.done) enqueue({ body }); };

// a move pressed: a turn of its own, or (several moves a turn) one more move of the turn being built
function press(name) {
  if (!live || live.done) return;
  if (!$("multi").checked) { step({ actions: [{ name }] }); return; }
  const most = envs[live.env].action_space.max_per_turn || 1;
  if (moves.length >= most) { $("moves").textContent = `a turn holds at most ${most} moves: send them`; return; }
  moves.push(name);
  renderMoves();
}
function renderMoves() {
  const most = live && envs[live.env] ? envs[live.env].action_space.max_per_turn : null;
  $("moves").textContent = moves.length ? `this turn: ${moves.join(", ")} (${moves.length}/${most ?? "?"})` : "";
  refreshControls();
}
function sendMoves() {
  if (!moves.length) return;
  step({ actions: moves.map((name) => ({ name })) });
  moves.length = 0;
  renderMoves();
}
$("send-moves").onclick = sendMoves;
$("clear-moves").onclick = () => { moves.length = 0; renderMoves(); };
$("multi").addEventListener("change", () => { moves.length = 0; renderMoves(); $("multi").blur(); });

function buildActions(space) {
  const box = $("actions");
  box.innerHTML = "";
  const keys = [];
  $("turn-mode").classList.toggle("hidden", !(space && space.kind === "discrete"));
  if (space && space.kind === "discrete") {
    space.names.forEach((name, i) => {
      const b = document.createElement("button");
      const arrow = ARROW_SIGN[name.toLowerCase()];
      b.textContent = arrow ? `${name} ${arrow}` : name;
      b.dataset.action = name;
      if (i < 9) { b.title = `key ${i + 1}`; keys.push(`${i + 1}: ${name}`); }
      b.onclick = () => press(name);
      box.appendChild(b);
    });
  }
  const arrows = space && space.names ? space.names.filter((n) => ARROW_SIGN[n.toLowerCase()]) : [];
  $("keys").textContent = keys.length
    ? `Keys: ${arrows.length ? "arrow keys, " : ""}${keys.join(", ")} (presses queue while a step is in flight; Enter sends the moves of a turn). Ctrl+Enter sends the raw response.`
    : space && space.kind === "document"
      ? `This environment takes one free-text answer (${space.description}): write a raw response ("fill template" starts one). Ctrl+Enter sends it.`
      : `This environment takes calls with arguments${space ? ` (${space.description})` : ""}: write a raw response ("fill template" starts one from the listed positions; click the image to write a point's x, y, z). Ctrl+Enter sends it.`;
}

// A response in the session's format with an example answer for its action space and
// its current observation (primitive_skill: pick the first listed object, place it on the second).
function template(space, format, obs) {
  let answer = "...";
  if (space && space.kind === "discrete") answer = space.names.slice(0, 2).join(", ");
  else if (space && space.kind === "call") {
    const objects = Object.values((obs && obs.ground_truth.objects) || {}).map((p) => p.map(Math.round));
    const [a, b] = [objects[0] || [0, 0, 20], objects[1] || objects[0] || [0, 0, 20]];
    const calls = { pick: a, place: [b[0], b[1], b[2] + 40], push: [...a, b[0], b[1], a[2]] };
    answer = space.names.filter((n) => calls[n]).slice(0, 2)
      .map((n) => `${n}(${calls[n].slice(0, space.arity[n] || 0).join(", ")})`).join(", ");
  } else if (space && space.kind === "document") {
    answer = space.names[0] === "svg"
      ? '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72"><circle cx="36" cy="36" r="20" fill="#fcea2b"/></svg>'
      : "the wrong words, as written in the caption";
  }
  return (LAYOUTS[format] ?? "@").replace("@", `<answer>${answer}</answer>`);
}
const liveTemplate = () => template(envs[live.env].action_space, live.format, entries[entries.length - 1].after);

$("create").onclick = async (ev) => {
  // one session per click while one is being made, and none for a double click's second
  if (creating || ev.detail > 1) return;
  creating = true;
  $("create").disabled = true;
  setInFlight();
  $("inflight").classList.add("on");
  $("inflight").textContent = "creating a session";
  // the page's session is replaced, whether or not the new one can be made: nothing is
  // left to drive under controls that now say another env
  const old = live;
  queue.length = 0;
  live = null;
  try {
    const opts = controls();
    const seed = Number($("seed").value);
    let config;
    try { config = JSON.parse(opts.config); } catch (err) { throw new Error(`INVALID_ARGUMENT: config is not JSON: ${err.message}`); }
    const reply = await api("POST", "/v1/sessions", {
      env: opts.env, seed, format: opts.format, representation: opts.representation, config,
    });
    replay = null;
    $("replay-pick").classList.add("hidden");
    live = { session_id: reply.session_id, env: reply.env, format: opts.format, representation: opts.representation, config: opts.config };
    buildActions(envs[reply.env].action_space);
    $("response").value = "";
    gtHidden = ANSWER_IN_GT.has(reply.env);
    startEpisode(reply, seed);
    $("response").placeholder = liveTemplate();
    applyGtVisibility();
  } catch (err) {
    entries = [];
    replay = null;
    $("actions").innerHTML = "";
    $("keys").textContent = "No session: the create failed. Fix the controls and create again.";
    refreshControls();
    renderView();
    renderTimeline();
    renderWhere();
    $("where").textContent = "no session: the create failed";
    $("sid").textContent = "";
    fail(err);
  } finally {
    if (old) api("DELETE", `/v1/sessions/${old.session_id}`).catch(() => {});  // the page's old session
    creating = false;
    $("create").disabled = false;
    setInFlight();
  }
};
$("reset").onclick = () => enqueue({ reset: Number($("seed").value) });
$("next").onclick = () => { $("seed").value = String(Number($("seed").value) + 1); enqueue({ reset: Number($("seed").value) }); };
$("send").onclick = () => step({ response: $("response").value });
$("template").onclick = () => { if (live) $("response").value = liveTemplate(); };
$("response").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && ev.ctrlKey && !$("send").disabled) { ev.preventDefault(); $("send").click(); }
});

document.addEventListener("keydown", (ev) => {
  if (["TEXTAREA", "INPUT", "SELECT"].includes(ev.target.tagName)) return;
  if (ev.key === "End") { select(-1); return; }
  if (!live) return;
  if (ev.key === "Enter" && moves.length) { ev.preventDefault(); sendMoves(); return; }
  const buttons = [...document.querySelectorAll("#actions button")];
  let button = null;
  if (ARROWS[ev.key]) button = buttons.find((b) => b.dataset.action.toLowerCase() === ARROWS[ev.key]);
  else if (/^[1-9]$/.test(ev.key)) button = buttons[Number(ev.key) - 1];
  if (button) { ev.preventDefault(); if (!button.disabled) button.click(); }
});

// ---------------------------------------------------------------- episode files

function replayEntries(ep) {
  const steps = ep.steps || [];
  const first = steps.length ? steps[0].observation : ep.final_observation;
  const out = [entryOf(0, null, null, null, first)];
  steps.forEach((s, k) => {
    const next = k + 1 < steps.length ? steps[k + 1].observation : ep.final_observation;
    out.push(entryOf(k + 1, s.response, s, s.observation, next));
  });
  if (ep.error) out[out.length - 1].error = ep.error;
  return out;
}

function showReplay(index) {
  replay.index = index;
  const ep = replay.episodes[index];
  entries = replayEntries(ep);
  selected = entries.length > 1 ? 1 : 0;  // the first turn: what the agent saw, and wrote
  gtHidden = ANSWER_IN_GT.has(ep.env);
  $("prompt").textContent = ep.system_prompt || "";
  const result = ep.error ? `<span class="err">episode failed: ${escape(`${ep.error.code}: ${ep.error.message}`)}</span>`
    : `<b class="${ep.success ? "ok" : "err"}">${ep.success ? "success" : "no success"}</b>`;
  setStatus(`${result} · click a turn to see what the agent saw and wrote`);
  applyGtVisibility();
  renderView();
  renderTimeline();
}

$("episode-file").addEventListener("change", async () => {
  const file = $("episode-file").files[0];
  if (!file) return;
  const episodes = [];
  try {
    (await file.text()).split("\n").forEach((text, n) => {
      if (!text.trim()) return;
      const ep = JSON.parse(text);
      if (ep.format !== EPISODE_FORMAT) throw new Error(`line ${n + 1} is not a ${EPISODE_FORMAT} episode`);
      episodes.push(ep);
    });
    if (!episodes.length) throw new Error("it holds no episodes");
  } catch (err) {
    setStatus(`<span class="err">can't read ${escape(file.name)}: ${escape(err.message)}</span>`);
    return;
  }
  queue.length = 0;
  live = null;
  moves.length = 0;
  replay = { name: file.name, episodes, index: 0 };
  $("actions").innerHTML = "";
  $("turn-mode").classList.add("hidden");
  $("keys").textContent = "Replaying an episode file: click a turn, or choose another episode of the file.";
  refreshControls();
  const pick = $("replay-pick");
  pick.innerHTML = "";
  episodes.forEach((ep, i) => {
    const opt = document.createElement("option");
    opt.value = String(i);
    opt.textContent = `${ep.env} seed ${ep.seed} · ${ep.turns} turns · return ${fmt(ep.return)}${ep.success ? " · success" : ""}${ep.error ? " · failed" : ""}`;
    pick.appendChild(opt);
  });
  pick.classList.remove("hidden");
  showReplay(0);
});
$("replay-pick").addEventListener("change", () => showReplay(Number($("replay-pick").value)));

// The env list; loaded again when a token is entered (a server with --token refuses it without).
async function loadEnvs() {
  try {
    const data = await api("GET", "/v1/envs");
    envs = {};
    $("env").innerHTML = "";
    for (const e of data.envs) {
      envs[e.name] = e;
      const opt = document.createElement("option");
      opt.value = e.name;
      opt.textContent = e.available && e.enabled ? e.name : `${e.name} (unavailable)`;
      opt.disabled = !(e.available && e.enabled);
      opt.title = e.description || e.unavailable_reason || "";
      $("env").appendChild(opt);
    }
    setStatus("");
  } catch (err) { fail(err); }
}
$("token").addEventListener("change", loadEnvs);
loadEnvs();
renderSession();
