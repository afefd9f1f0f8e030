// The play page: a small client of the REST API (docs/wire.md). No build step, no deps.
const $ = (id) => document.getElementById(id);
let session = null;   // the last SessionReply
let episodeReturn = 0;
let envs = {};
const ARROWS = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right" };
const ARROW_SIGN = { up: "↑", down: "↓", left: "←", right: "→" };

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

// One line per key keeps long lists (walls, relations) readable.
function lines(obj) {
  if (!obj || typeof obj !== "object") return String(obj ?? "");
  return Object.entries(obj).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join("\n");
}

function show(reply) {
  session = reply;
  const img = reply.observation.images[0];
  if (img && img.encoding !== "raw") $("frame").src = `data:image/${img.encoding};base64,${img.data}`;
  $("sid").textContent = `${reply.session_id} · episode ${reply.episode} · step ${reply.step_index}`;
  $("obs").textContent = reply.observation.text;
  $("gt").textContent = lines(reply.observation.ground_truth);
  $("info").textContent = lines(reply.info);
  if (reply.system_prompt) $("prompt").textContent = reply.system_prompt;
  if (reply.step_index === 0) episodeReturn = 0;
  episodeReturn += reply.reward;
  $("reward").innerHTML =
    `<tr><th>reward</th><th>return</th>` + Object.keys(reply.reward_parts).map((k) => `<th>${k}</th>`).join("") + "</tr>" +
    `<tr><td><b>${reply.reward.toFixed(3)}</b></td><td>${episodeReturn.toFixed(3)}</td>` +
    Object.values(reply.reward_parts).map((v) => `<td>${v.toFixed(3)}</td>`).join("") + "</tr>";
  const done = reply.terminated || reply.truncated;
  const info = reply.info || {};
  const notes = [];
  if (info.action_valid === false) notes.push(`<span class="err">invalid response: ${escape(info.parse_error || "no valid action")}</span>`);
  if (info.invalid_actions && info.invalid_actions.length) notes.push(`<span class="err">invalid actions: ${escape(JSON.stringify(info.invalid_actions))}</span>`);
  if (done) notes.push(`<b class="${reply.success ? "ok" : "err"}">episode over: ${reply.success ? "success" : "failed"}</b> — press reset to play again`);
  $("status").innerHTML = notes.join("<br>");
  $("send").disabled = done;
  document.querySelectorAll("#actions button").forEach((b) => (b.disabled = done));
  $("reset").disabled = false;
}

function escape(s) { const d = document.createElement("div"); d.textContent = s; return d.innerHTML; }
function fail(err) {
  const hint = err.message.startsWith("NOT_FOUND") ? " — create a new session to go on"
    : err.message.startsWith("UNAUTHENTICATED") ? " — enter the server's token" : "";
  $("status").innerHTML = `<span class="err">error: ${escape(err.message)}</span>${hint}`;
}

async function step(body) {
  if (!session) return;
  try { show(await api("POST", `/v1/sessions/${session.session_id}/step`, { step_index: session.step_index, ...body })); }
  catch (err) { fail(err); }
}

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
    ? `Keys: ${arrows.length ? "arrow keys, " : ""}${keys.join(", ")}. Ctrl+Enter sends the raw response.`
    : space && space.kind === "document"
      ? `This environment takes one free-text answer (${space.description}): type a raw response, e.g. <answer>...</answer>. Ctrl+Enter sends it.`
      : "This environment takes calls with arguments: type a raw response. Ctrl+Enter sends it.";
}

$("create").onclick = async () => {
  try {
    const name = $("env").value;
    const reply = await api("POST", "/v1/sessions", {
      env: name, seed: Number($("seed").value), format: $("format").value,
      representation: $("rep").value, config: JSON.parse($("config").value || "{}"),
    });
    buildActions(envs[name].action_space);
    show(reply);
  } catch (err) { fail(err); }
};
$("reset").onclick = async () => {
  try { show(await api("POST", `/v1/sessions/${session.session_id}/reset`, {})); } catch (err) { fail(err); }
};
$("send").onclick = () => step({ response: $("response").value });
$("response").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && ev.ctrlKey && !$("send").disabled) { ev.preventDefault(); $("send").click(); }
});

document.addEventListener("keydown", (ev) => {
  if (!session || ["TEXTAREA", "INPUT", "SELECT"].includes(ev.target.tagName)) return;
  const buttons = [...document.querySelectorAll("#actions button")];
  let button = null;
  if (ARROWS[ev.key]) button = buttons.find((b) => b.dataset.action.toLowerCase() === ARROWS[ev.key]);
  else if (/^[1-9]$/.test(ev.key)) button = buttons[Number(ev.key) - 1];
  if (button) { ev.preventDefault(); if (!button.disabled) button.click(); }
});

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
    $("status").innerHTML = "";
  } catch (err) { fail(err); }
}
$("token").addEventListener("change", loadEnvs);
loadEnvs();
