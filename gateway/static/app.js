// infercept web client: sessions, streamed chat with tool calls and intercepts, a live KV panel.
// Plain browser JavaScript, no build step and no CDN: it must work offline.
"use strict";

const $ = (sel) => document.querySelector(sel);
const store = {
  get sessions() { return JSON.parse(localStorage.getItem("infercept.sessions") || "[]"); },
  set sessions(v) { localStorage.setItem("infercept.sessions", JSON.stringify(v)); },
  get key() { return localStorage.getItem("infercept.key") || ""; },
  set key(v) { localStorage.setItem("infercept.key", v); },
};
let current = null;      // {id, token, title, tools}
let busy = false;

function headers(extra = {}) {
  const h = { "Content-Type": "application/json", ...extra };
  if (store.key) h["Authorization"] = "Bearer " + store.key;
  if (current) h["X-Session-Token"] = current.token;
  return h;
}

async function api(method, path, body) {
  const r = await fetch(path, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 204) return null;
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((data.error && data.error.message) || r.statusText);
  return data;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---------------------------------------------------------------- health, tools, KV panel
async function refreshHealth() {
  try {
    const h = await (await fetch("/healthz")).json();
    $("#health").textContent = h.status === "ok" ? `model ${h.model} · policy ${h.policy}` : `engine ${h.status}`;
    return h.status === "ok";
  } catch (e) { $("#health").textContent = "gateway unreachable"; return false; }
}

async function loadTools() {
  try {
    const data = await api("GET", "/v1/tools");
    const box = $("#toolboxes");
    box.textContent = "";
    for (const t of data.tools) {
      const label = el("label");
      const cb = el("input");
      cb.type = "checkbox"; cb.value = t.name; cb.checked = t.name === "Calculator";
      cb.dataset.testid = "tool-" + t.name;
      label.append(cb, ` ${t.name} `, el("span", "small", `(${t.type})`));
      box.append(label);
    }
  } catch (e) { $("#toolboxes").textContent = "tools: " + e.message; }
}

const KV_STATES = [["free", "k-free"], ["running", "k-running"], ["preserved", "k-preserved"], ["swapped_to_host", "k-swapped"]];

async function refreshKv() {
  try {
    const s = await api("GET", "/v1/stats");
    const b = s.blocks;
    const device = b.total || 1;
    const bar = $("#kvbar");
    bar.textContent = "";
    const table = $("#kv");
    table.textContent = "";
    for (const [state, cls] of KV_STATES) {
      const n = b[state] || 0;
      if (state !== "swapped_to_host") {
        const seg = el("span", cls);
        seg.style.width = (100 * n / device) + "%";
        bar.append(seg);
      }
      const tr = el("tr");
      tr.dataset.state = state;
      const name = el("td");
      name.append(el("span", "dot " + cls), state === "swapped_to_host" ? "swapped (host)" : state);
      tr.append(name, el("td", "", String(n)));
      table.append(tr);
    }
    const t = s.totals;
    $("#kvtotals").textContent = `${b.total} blocks × ${s.block_size} tokens · policy ${s.policy} · ` +
      `${t.intercepts} intercepts, ${t.recomputed_tokens} tokens recomputed, ${t.swapped_out_tokens} swapped out`;
  } catch (e) { /* not ready yet, or a key is needed */ }
}

// ---------------------------------------------------------------- sessions
function renderSessions() {
  const ul = $("#sessions");
  ul.textContent = "";
  for (const s of store.sessions) {
    const li = el("li", current && current.id === s.id ? "active" : "");
    li.dataset.id = s.id;
    const name = el("span", "", s.title || s.id.slice(0, 13));
    const right = el("span");
    const close = el("button", "", "×");
    close.title = "close session (frees its KV)";
    close.onclick = async (ev) => { ev.stopPropagation(); await closeSession(s); };
    right.append(el("span", "st", s.tools.join(",")), " ", close);
    li.append(name, right);
    li.onclick = () => openSession(s);
    ul.append(li);
  }
}

async function createSession() {
  const tools = [...document.querySelectorAll("#toolboxes input:checked")].map((c) => c.value);
  const system = $("#system").value.trim() || undefined;
  const saved = current;
  current = null;
  try {
    const s = await api("POST", "/v1/sessions", { tools, system });
    const entry = { id: s.id, token: s.token, tools: s.tools, title: "" };
    store.sessions = [entry, ...store.sessions];
    await openSession(entry);
  } catch (e) { current = saved; showError(e.message); }
}

async function closeSession(s) {
  const saved = current;
  current = s;
  try { await api("DELETE", `/v1/sessions/${s.id}`); } catch (e) { /* already gone */ }
  store.sessions = store.sessions.filter((x) => x.id !== s.id);
  current = saved && saved.id === s.id ? null : saved;
  if (!current) { $("#log").textContent = ""; $("#chatinfo").textContent = "no session"; setWaiting(null); }
  renderSessions();
}

async function openSession(s) {
  current = s;
  renderSessions();
  $("#log").textContent = "";
  try {
    const info = await api("GET", `/v1/sessions/${s.id}`);
    $("#chatinfo").textContent = `session ${s.id} · tools ${info.tools.join(", ") || "none"} · ${info.context_tokens} context tokens`;
    replay(info);
  } catch (e) {
    // Expired or closed on the server: forget it.
    store.sessions = store.sessions.filter((x) => x.id !== s.id);
    current = null;
    renderSessions();
    showError(e.message);
  }
}

async function refreshInfo() {
  if (!current) return;
  try {
    const info = await api("GET", `/v1/sessions/${current.id}`);
    $("#chatinfo").textContent = `session ${current.id} · tools ${info.tools.join(", ") || "none"} · ${info.context_tokens} context tokens · ${info.intercepts.length} intercepts`;
  } catch (e) { /* closed meanwhile */ }
}

function replay(info) {
  const calls = Object.fromEntries(info.calls.map((c) => [c.call_id, c]));
  const intercepts = info.intercepts;
  let bubble = null;
  for (const m of info.transcript) {
    if (m.role === "user" && !m.answers) { addUser(m.content); bubble = null; continue; }
    if (m.role === "user") { continue; }
    if (!bubble) bubble = newAssistant();
    if (m.role === "assistant" && m.call_id) {
      appendText(bubble, m.content);
      const c = calls[m.call_id];
      const card = addCall(bubble, { call_id: c.call_id, tool: c.tool, arguments: c.arguments });
      const i = intercepts.find((x) => x.intercept_id === c.intercept_id);
      setIntercept(card, { type: c.aug_type, policy: c.policy, context_tokens: c.context_tokens });
      if (c.result !== null) setResult(card, { content: c.result, error: c.error, artifacts: c.artifacts, duration_s: c.duration_s });
      if (i && i.restored_by) setResume(card, { restored_by: i.restored_by });
    } else if (m.role === "assistant") {
      const tail = m.content.split("\nObservation: ").pop();
      appendText(bubble, tail.includes("\n") ? tail.slice(tail.indexOf("\n") + 1) : "");
      if (m.reply) bubble.append(el("div", "reply", "final answer: " + m.reply));
      bubble = null;
    }
  }
  setWaiting(info.pending_call);
}

// ---------------------------------------------------------------- chat rendering
function addUser(text) {
  const d = el("div", "msg user", text);
  d.dataset.testid = "user-message";
  $("#log").append(d);
  scroll();
}

function newAssistant() {
  const d = el("div", "msg assistant");
  d.dataset.testid = "assistant-message";
  d.append(el("div", "text"));
  $("#log").append(d);
  return d;
}

function appendText(bubble, text) {
  let last = bubble.lastElementChild;
  if (!last || !last.classList.contains("text")) { last = el("div", "text"); bubble.append(last); }
  last.textContent += text;
  scroll();
}

function addCall(bubble, ev) {
  const card = el("div", "call");
  card.dataset.testid = "tool-call";
  card.dataset.callId = ev.call_id;
  card.append(el("div", "head", `tool call · ${ev.tool}[${ev.arguments}]`));
  const meta = el("div", "meta");
  meta.dataset.role = "meta";
  card.append(meta);
  bubble.append(card);
  scroll();
  return card;
}

function setIntercept(card, ev) {
  const meta = card.querySelector("[data-role=meta]");
  meta.textContent = "";
  const pol = el("span", "policy", ev.policy || "?");
  pol.dataset.testid = "intercept-policy";
  meta.append(`intercept: ${ev.type || "?"} · policy `, pol, ` · ${ev.context_tokens ?? "?"} context tokens`);
  card.dataset.started = String(performance.now());
}

function setResult(card, ev) {
  if (ev.error) card.classList.add("error");
  const r = el("div", "result", "→ " + ev.content);
  r.dataset.testid = "tool-result";
  card.append(r);
  for (const url of ev.artifacts || []) {
    if (/\.(png|jpg)$/.test(url)) { const img = el("img"); img.src = url; img.alt = "generated image"; card.append(img); }
    else if (/\.wav$/.test(url)) { const a = el("audio"); a.controls = true; a.src = url; card.append(a); }
    else { const a = el("a", "", url); a.href = url; card.append(a); }
  }
  if (ev.duration_s !== undefined && ev.duration_s !== null) {
    const t = el("div", "meta", `call took ${Number(ev.duration_s).toFixed(3)} s`);
    t.dataset.testid = "call-time";
    card.append(t);
  }
  scroll();
}

function setResume(card, ev) {
  const m = el("div", "meta", `resumed by ${ev.restored_by || "?"}` +
    (ev.tokens_recomputed ? ` · ${ev.tokens_recomputed} tokens recomputed` : "") +
    (ev.tokens_swapped_in ? ` · ${ev.tokens_swapped_in} tokens swapped in` : ""));
  m.dataset.testid = "resume";
  card.append(m);
}

function setWaiting(pending) {
  const w = $("#waiting");
  if (pending && pending.kind === "human") {
    w.hidden = false;
    w.textContent = `⏳ waiting for you: the model asks “${pending.arguments}” (the session is paused; your next message answers it)`;
  } else if (pending && pending.kind === "client") {
    w.hidden = false;
    w.textContent = `⏳ waiting for the client tool ${pending.tool} (POST /v1/sessions/${current.id}/tool_results)`;
  } else { w.hidden = true; w.textContent = ""; }
}

function showError(msg) {
  const d = el("div", "msg err", "error: " + msg);
  d.dataset.testid = "error";
  $("#log").append(d);
  scroll();
}

function scroll() { const log = $("#log"); log.scrollTop = log.scrollHeight; }

// ---------------------------------------------------------------- sending and streaming
async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message"; const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield [name, JSON.parse(data.join("\n"))];
    }
  }
}

async function send(text) {
  if (!current) await createSession();
  if (!current || busy) return;
  busy = true;
  $("#sendbtn").disabled = true;
  addUser(text);
  setWaiting(null);
  const entry = store.sessions.find((s) => s.id === current.id);
  if (entry && !entry.title) { entry.title = text.slice(0, 28); store.sessions = store.sessions.map((s) => s.id === entry.id ? entry : s); renderSessions(); }
  const bubble = newAssistant();
  const cards = {};
  try {
    const r = await fetch(`/v1/sessions/${current.id}/messages`, { method: "POST", headers: headers(), body: JSON.stringify({ content: text, stream: true }) });
    if (!r.ok) { const e = await r.json().catch(() => ({})); throw new Error((e.error && e.error.message) || r.statusText); }
    for await (const [name, ev] of sse(r)) {
      if (name === "token") appendText(bubble, ev.text);
      else if (name === "tool_call") cards[ev.call_id] = addCall(bubble, ev);
      else if (name === "intercept") setIntercept(cards[ev.call_id] || addCall(bubble, ev), ev);
      else if (name === "tool_result") {
        const card = cards[ev.call_id];
        if (card) setResult(card, ev);
        else { const c = addCall(bubble, { call_id: ev.call_id, tool: ev.tool, arguments: "(answered)" }); setResult(c, ev); }
        appendText(bubble, "");
      } else if (name === "resume") { if (ev.call_id && cards[ev.call_id]) setResume(cards[ev.call_id], ev); }
      else if (name === "done") {
        if (ev.reply && ev.finish_reason !== "ask_human" && ev.finish_reason !== "tool_calls") {
          const rep = el("div", "reply", "final answer: " + ev.reply);
          rep.dataset.testid = "reply";
          bubble.append(rep);
        }
        setWaiting(ev.pending_call);
      } else if (name === "error") showError(ev.message);
    }
  } catch (e) { showError(e.message); }
  busy = false;
  $("#sendbtn").disabled = false;
  refreshKv();
  refreshInfo();
}

// ---------------------------------------------------------------- wiring
$("#apikey").value = store.key;
$("#apikey").onchange = () => { store.key = $("#apikey").value.trim(); loadTools(); refreshKv(); };
$("#create").onclick = (ev) => { ev.preventDefault(); createSession(); };
$("#send").onsubmit = (ev) => {
  ev.preventDefault();
  const text = $("#msg").value.trim();
  if (!text) return;
  $("#msg").value = "";
  send(text);
};
$("#msg").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#send").requestSubmit(); }
});

(async function init() {
  while (!(await refreshHealth())) await new Promise((r) => setTimeout(r, 1000));
  await loadTools();
  renderSessions();
  const first = store.sessions[0];
  if (first) await openSession(first);
  refreshKv();
  setInterval(refreshKv, 1000);
  setInterval(refreshHealth, 10000);
})();
