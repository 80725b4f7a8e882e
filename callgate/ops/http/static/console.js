// The approval console: sign in with an approver's key, poll the tenant's requests, approve
// or deny with the session's CSRF token. Every value from the server is set as text, never
// as HTML.
"use strict";

const POLL_MS = 2000;
let csrf = null;
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function status(text) { $("status").textContent = text || ""; }

async function problemText(resp) {
  try {
    const p = await resp.json();
    return `${p.code}: ${p.detail}`;
  } catch (_) {
    return `HTTP ${resp.status}`;
  }
}

function age(seconds) {
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function amount(impact) {
  if (impact.amount === undefined) return null;
  const n = Number(impact.amount).toLocaleString("en-US");
  return impact.currency ? `${n} ${impact.currency}` : n;
}

function resources(impact) {
  if (impact.count !== undefined) {
    const where = impact.account ? ` in ${impact.account}` : "";
    return `${impact.count} item(s)${where}`;
  }
  const ids = ["order_id", "payment_id", "resource", "email_id", "to"]
    .filter((k) => impact[k] !== undefined)
    .map((k) => `${k} ${impact[k]}`);
  if (ids.length) return ids.join(", ");
  if (impact.server && impact.tool) return `${impact.server} / ${impact.tool}`;
  return "—";
}

function reversibility(impact) {
  if (impact.reversible === undefined) return "not stated (treated as irreversible)";
  return impact.reversible ? "reversible" : "irreversible";
}

function outcome(call) {
  const r = call.result;
  if (!r) return `${call.call_id}: ${call.state}`;
  if (r.status === "succeeded") {
    // A safe result wraps the tool's output with its trust label; show the output.
    const content = r.data && r.data.content !== undefined ? r.data.content : r.data;
    return `${call.call_id}: succeeded ${JSON.stringify(content)}`;
  }
  const error = r.error || {};
  return `${call.call_id}: ${r.status} ${error.code || ""}`;
}

function card(view, pending) {
  const impact = view.impact || {};
  const fields = [
    ["Action", impact.action || view.tool_name],
    ["Resources", resources(impact)],
    ["Amount", amount(impact) || "—"],
    ["Reversibility", reversibility(impact)],
    ["Requested by", view.requested_by],
    ["Age", age(view.age_seconds)],
  ];
  if (!pending) fields.push(["Decided by", view.decided_by || "—"]);
  const dl = el("dl");
  for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {}, v));
  const node = el(
    "article",
    { class: "card", "data-approval": view.approval_id, "data-state": view.state },
    el("h3", {}, `${view.tool_name} `, el("span", { class: `state ${view.state}` }, view.state),
       ` · version ${view.version}`),
    dl,
  );
  if (view.notice) node.append(el("p", { class: "notice" }, view.notice));
  if (pending) {
    const yes = el("button", { class: "approve", type: "button" }, "Approve");
    const no = el("button", { class: "deny", type: "button" }, "Deny");
    yes.addEventListener("click", () => decide(view.approval_id, "approve"));
    no.addEventListener("click", () => decide(view.approval_id, "deny"));
    node.append(el("div", { class: "actions" }, yes, no));
  } else {
    for (const call of view.calls || []) node.append(el("p", { class: "result" }, outcome(call)));
  }
  return node;
}

async function refresh() {
  const resp = await fetch("/console/approvals", { credentials: "same-origin" });
  if (resp.status === 401) return signedOut();
  if (!resp.ok) return status(await problemText(resp));
  const board = await resp.json();
  $("pending-count").textContent = `(${board.pending.length})`;
  $("pending").replaceChildren(
    ...(board.pending.length ? board.pending.map((v) => card(v, true)) : [el("p", { class: "hint" }, "Nothing waits for a decision.")]),
  );
  $("recent").replaceChildren(...board.recent.map((v) => card(v, false)));
}

async function decide(id, verdict) {
  status(`${verdict === "approve" ? "Approving" : "Denying"} ${id}…`);
  const resp = await fetch(`/console/approvals/${encodeURIComponent(id)}/${verdict}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-CSRF-Token": csrf },
  });
  status(resp.ok ? `${verdict === "approve" ? "Approved" : "Denied"} ${id}.` : await problemText(resp));
  await refresh();
}

function signedIn(session) {
  csrf = session.csrf_token;
  $("sign-in").hidden = true;
  $("board").hidden = false;
  $("who").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = `${session.user_id} · ${session.tenant_id}`;
  refresh();
  clearInterval(timer);
  timer = setInterval(refresh, POLL_MS);
}

function signedOut() {
  csrf = null;
  clearInterval(timer);
  $("sign-in").hidden = false;
  $("board").hidden = true;
  $("who").hidden = true;
  $("sign-out").hidden = true;
}

async function signIn(event) {
  event.preventDefault();
  const input = $("key");
  const key = input.value;
  input.value = "";  // never kept in the page
  const resp = await fetch("/console/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ key }),
  });
  if (!resp.ok) return status(await problemText(resp));
  status("");
  signedIn(await resp.json());
}

async function signOut() {
  await fetch("/console/session", {
    method: "DELETE",
    credentials: "same-origin",
    headers: { "X-CSRF-Token": csrf || "" },
  });
  signedOut();
}

async function start() {
  $("sign-in").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  const resp = await fetch("/console/session", { credentials: "same-origin" });
  if (resp.ok) signedIn(await resp.json());
  else signedOut();
}

start();
