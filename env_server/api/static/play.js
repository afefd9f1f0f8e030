// The play page: a small client of the REST API (docs/wire.md). No build step, no deps.
//
// Live play: every step and reset goes through one queue, sent one at a time with the
// step_index of the last reply, so n key presses are n steps (never lost, never answered
// as retries of one another); the return is the sum of the rewards the server applied.
// Replay: an episode file (clients/episodes.py, format visenv.episode/1) shown with the
// same timeline. The timeline's entry 0 is the episode's start; entry k is step k: what
// was sent, the reward it got and the observation it led to.
const $ = (id) => document.getElementById(id);
const ARROWS = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right" };
const ARROW_SIGN = { up: "↑", down: "↓", left: "←", right: "→" };
const PIXEL_ENVS = new Set(["sokoban", "frozenlake", "vicrit"]);  // grid art: crisp upscaling
const ANSWER_IN_GT = new Set(["vicrit"]);  // its ground truth holds the answer: hidden at first
const SHORT = { observation: "obs", prediction: "pred" };  // reward part headers that fit
const EPISODE_FORMAT = "visenv.episode/1";
const IMAGE_NAMES = { svg: ["target", "agent's rendering"] };

let envs = {};
let live = null;      // {session_id, env, seed, episode, step_index, maxTurns, done, system_prompt}
let replay = null;    // {name, episodes: [...], index}
let entries = [];     // the timeline of the episode on screen
let selected = -1;    // the entry shown large; -1: the latest
const queue = [];     // steps/resets waiting to be sent
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

function entryOf(turn, sent, result, obs) {
  return {
    turn, sent,
    images: obs ? obs.images || [] : [],
    text: obs ? obs.text || "" : "",
    ground_truth: obs ? obs.ground_truth || {} : {},
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

function thumbs(e, cls) {
  const box = document.createElement("div");
  box.className = cls;
  const names = IMAGE_NAMES[currentEnv()] || [];
  e.images.forEach((im, i) => {
    const url = imageUrl(im);
    if (!url) return;
    const img = document.createElement("img");
    img.src = url;
    img.alt = img.title = names[i] || `image ${i + 1}`;
    box.appendChild(img);
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
    card.appendChild(thumbs(e, "thumbs"));
    const head = document.createElement("div");
    head.innerHTML = `<b>turn ${i}</b>` + (e.reward === null ? "" : ` · reward ${fmt(e.reward)}`)
      + (e.success ? ' <span class="ok">✓ success</span>' : "")
      + (e.error ? ' <span class="err">error</span>' : bad ? ' <span class="err">invalid</span>' : "");
    card.appendChild(head);
    const act = document.createElement("div");
    act.className = "act";
    act.textContent = answerOf(sentText(e));
    act.title = sentText(e);
    card.appendChild(act);
    if (e.reward_parts) {
      const parts = document.createElement("div");
      parts.textContent = Object.entries(e.reward_parts).filter(([, v]) => v).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
      card.appendChild(parts);
    }
    card.onclick = () => select(i === entries.length - 1 ? -1 : i);
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

function renderView() {
  const i = shownIndex();
  const e = entries[i];
  const view = $("view");
  view.innerHTML = "";
  view.className = PIXEL_ENVS.has(currentEnv()) ? "pixel" : "";
  if (!e) { $("obs").textContent = $("gt").textContent = $("info").textContent = ""; $("reward").innerHTML = ""; return; }
  const names = IMAGE_NAMES[currentEnv()] || [];
  e.images.forEach((im, k) => {
    const url = imageUrl(im);
    if (!url) return;
    const fig = document.createElement("figure");
    const img = document.createElement("img");
    img.src = url;
    img.alt = names[k] || `image ${k + 1}`;
    if (view.className === "pixel") {  // small grid art: the largest whole-number scale up to 256 px
      img.onload = () => { img.style.height = `${img.naturalHeight * Math.max(1, Math.floor(256 / img.naturalHeight))}px`; };
    }
    fig.appendChild(img);
    if (names[k] || e.images.length > 1) {
      const cap = document.createElement("figcaption");
      cap.textContent = names[k] || `image ${k + 1}`;
      fig.appendChild(cap);
    }
    view.appendChild(fig);
  });
  if (!view.children.length) {  // a text observation: say so, never keep an older frame
    const note = document.createElement("div");
    note.className = "textobs";
    note.textContent = "This observation is text only (below).";
    view.appendChild(note);
  }
  $("obs").textContent = e.text;
  $("gt").textContent = lines(e.ground_truth);
  $("info").textContent = lines(e.info);
  const parts = e.reward_parts || {};
  $("reward").innerHTML =
    `<tr><th>reward</th><th>return</th>` + Object.keys(parts).map((k) => `<th title="${k}">${SHORT[k] || k}</th>`).join("") + "</tr>" +
    `<tr><td><b>${fmt(e.reward)}</b></td><td>${fmt(entries.slice(0, i + 1).reduce((s, x) => s + (x.reward || 0), 0))}</td>` +
    Object.values(parts).map((v) => `<td>${fmt(v)}</td>`).join("") + "</tr>";
  $("viewing").textContent = i < entries.length - 1
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
}

function applyGtVisibility() {
  $("gt").classList.toggle("hidden", gtHidden);
  $("gt-toggle").textContent = gtHidden ? "show" : "hide";
  $("gt-note").textContent = gtHidden ? (ANSWER_IN_GT.has(currentEnv()) ? "hidden: it holds the answer" : "hidden") : "";
}
$("gt-toggle").onclick = () => { gtHidden = !gtHidden; applyGtVisibility(); };

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
}

function startEpisode(reply, seed) {
  live = {
    session_id: reply.session_id, env: reply.env, seed, episode: reply.episode,
    step_index: reply.step_index, done: reply.terminated || reply.truncated,
    maxTurns: maxTurns(reply), system_prompt: reply.system_prompt || (live && live.system_prompt) || "",
  };
  replay = null;
  $("replay-pick").classList.add("hidden");
  entries = [entryOf(0, null, null, reply.observation)];
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
  try { config = JSON.parse($("config").value || "{}"); } catch { /* refused at create */ }
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
  const e = entryOf(reply.turn, sent, reply, reply.observation);
  entries.push(e);
  const info = reply.info || {};
  const notes = [];
  if (info.action_valid === false) notes.push(`<span class="err">invalid response: ${escape(info.parse_error || "no valid action")}</span>`);
  if (info.invalid_actions && info.invalid_actions.length) notes.push(`<span class="err">invalid actions: ${escape(JSON.stringify(info.invalid_actions))}</span>`);
  if (info.judge_error) notes.push(`<span class="err">judge error: ${escape(String(info.judge_error))}</span>`);
  if (live.done) notes.push(`<b class="${reply.success ? "ok" : "err"}">episode over: ${reply.success ? "success" : "failed"}</b> — press reset (same seed) or next seed`);
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

function buildActions(space) {
  const box = $("actions");
  box.innerHTML = "";
  const keys = [];
  if (space && space.kind === "discrete") {
    space.names.forEach((name, i) => {
      const b = document.createElement("button");
      const arrow = ARROW_SIGN[name.toLowerCase()];
      b.textContent = arrow ? `${name} ${arrow}` : name;
      b.dataset.action = name;
      if (i < 9) { b.title = `key ${i + 1}`; keys.push(`${i + 1}: ${name}`); }
      b.onclick = () => step({ actions: [{ name }] });
      box.appendChild(b);
    });
  }
  const arrows = space && space.names ? space.names.filter((n) => ARROW_SIGN[n.toLowerCase()]) : [];
  $("keys").textContent = keys.length
    ? `Keys: ${arrows.length ? "arrow keys, " : ""}${keys.join(", ")} (presses queue while a step is in flight). Ctrl+Enter sends the raw response.`
    : space && space.kind === "document"
      ? `This environment takes one free-text answer (${space.description}): write a raw response ("fill template" starts one). Ctrl+Enter sends it.`
      : `This environment takes calls with arguments${space ? ` (${space.description})` : ""}: write a raw response ("fill template" starts one). Ctrl+Enter sends it.`;
}

// A response skeleton in the session's format with an example answer for its action space.
function template(space, format) {
  let answer = "...";
  if (space && space.kind === "discrete") answer = space.names.slice(0, 2).join(", ");
  else if (space && space.kind === "call") {
    const sample = [120, -110, 20, 140, 110, 60];
    answer = space.names.slice(0, 2).map((n) => `${n}(${sample.slice(0, space.arity[n] || 0).join(", ")})`).join(", ");
  } else if (space && space.kind === "document") {
    answer = space.names[0] === "svg"
      ? '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72"><circle cx="36" cy="36" r="20" fill="#fcea2b"/></svg>'
      : "the wrong words, as written in the caption";
  }
  const sections = {
    no_think: "", free_think: "<think>...</think>",
    grounding: "<think><observation>...</observation><reasoning>...</reasoning></think>",
    worldmodeling: "<think><reasoning>...</reasoning><prediction>...</prediction></think>",
    grounding_worldmodeling: "<think><observation>...</observation><reasoning>...</reasoning><prediction>...</prediction></think>",
  };
  return `${sections[format] ?? ""}<answer>${answer}</answer>`;
}

$("create").onclick = async (ev) => {
  // one session per click while one is being made, and none for a double click's second
  if (creating || ev.detail > 1) return;
  creating = true;
  $("create").disabled = true;
  setInFlight();
  $("inflight").classList.add("on");
  $("inflight").textContent = "creating a session";
  try {
    const name = $("env").value;
    const seed = Number($("seed").value);
    const reply = await api("POST", "/v1/sessions", {
      env: name, seed, format: $("format").value,
      representation: $("rep").value, config: JSON.parse($("config").value || "{}"),
    });
    queue.length = 0;
    live = null;
    buildActions(envs[name].action_space);
    $("response").placeholder = template(envs[name].action_space, $("format").value);
    $("response").value = "";
    gtHidden = ANSWER_IN_GT.has(name);
    startEpisode(reply, seed);
    applyGtVisibility();
  } catch (err) { fail(err); } finally {
    creating = false;
    $("create").disabled = false;
    setInFlight();
  }
};
$("reset").onclick = () => enqueue({ reset: Number($("seed").value) });
$("next").onclick = () => { $("seed").value = String(Number($("seed").value) + 1); enqueue({ reset: Number($("seed").value) }); };
$("send").onclick = () => step({ response: $("response").value });
$("template").onclick = () => { if (live) $("response").value = template(envs[live.env].action_space, $("format").value); };
$("response").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && ev.ctrlKey && !$("send").disabled) { ev.preventDefault(); $("send").click(); }
});

document.addEventListener("keydown", (ev) => {
  if (["TEXTAREA", "INPUT", "SELECT"].includes(ev.target.tagName)) return;
  if (ev.key === "End") { select(-1); return; }
  if (!live) return;
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
  const out = [entryOf(0, null, null, first)];
  steps.forEach((s, k) => {
    const next = k + 1 < steps.length ? steps[k + 1].observation : ep.final_observation;
    out.push(entryOf(k + 1, s.response, s, next));
  });
  if (ep.error) out[out.length - 1].error = ep.error;
  return out;
}

function showReplay(index) {
  replay.index = index;
  const ep = replay.episodes[index];
  entries = replayEntries(ep);
  selected = -1;
  gtHidden = ANSWER_IN_GT.has(ep.env);
  $("prompt").textContent = ep.system_prompt || "";
  const result = ep.error ? `<span class="err">episode failed: ${escape(`${ep.error.code}: ${ep.error.message}`)}</span>`
    : `<b class="${ep.success ? "ok" : "err"}">${ep.success ? "success" : "no success"}</b>`;
  setStatus(`${result} · click a turn to see it large`);
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
  replay = { name: file.name, episodes, index: 0 };
  $("actions").innerHTML = "";
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
