// What every page of the UI shares: the API client, a DOM builder, formats, polling.
//
// Everything the API returns is data a run was given or made (issue text, model output, tool
// results): it reaches the page only as text nodes (`textContent`, `append(string)`), never as
// HTML.

export const API = "/api/v1";
export const STATUSES = [
  "queued", "running", "waiting", "awaiting_approval", "done", "skipped", "failed", "cancelled", "rejected",
];
export const TERMINAL = new Set(["done", "skipped", "failed", "cancelled", "rejected"]);
export const POLL_MS = 2000;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Calls the API and returns its JSON. A lost session goes back to the login page; any other
// error is thrown with the message the API gave.
export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json", "X-Baton-Request": "1" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const reply = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  if (reply.status === 401) {
    toLogin();
    throw new ApiError(401, "your session has ended: log in again");
  }
  if (!reply.ok) throw new ApiError(reply.status, await errorMessage(reply));
  return reply.json();
}

// The first `maxBytes` of a text the API serves (an artifact, a diff): a big log is not read
// whole into the page.
export async function apiText(path, maxBytes = 2 * 1024 * 1024) {
  const reply = await fetch(API + path, { credentials: "same-origin" });
  if (reply.status === 401) toLogin();
  if (!reply.ok) throw new ApiError(reply.status, await errorMessage(reply));
  const reader = reply.body.getReader();
  const chunks = [];
  let size = 0;
  let cut = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.length;
    if (size >= maxBytes) {
      cut = true;
      await reader.cancel();
      break;
    }
  }
  const bytes = new Uint8Array(Math.min(size, maxBytes));
  let at = 0;
  for (const chunk of chunks) {
    const part = chunk.subarray(0, bytes.length - at);
    bytes.set(part, at);
    at += part.length;
  }
  return { text: new TextDecoder().decode(bytes), cut };
}

async function errorMessage(reply) {
  try {
    const body = await reply.json();
    return body?.error?.message || `${reply.status} ${reply.statusText}`;
  } catch {
    return `${reply.status} ${reply.statusText}`;
  }
}

function toLogin() {
  const here = location.pathname + location.search + location.hash;
  location.assign(`/login?next=${encodeURIComponent(here)}`);
}

// el("a", {href: "/", class: "x", data: {stage: "fix"}, onclick: f}, "text", child, …)
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "data") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...present(children));
  return node;
}

// Replaces `node`'s children with those given, leaving out null, undefined and false.
export function fill(node, ...children) {
  node.replaceChildren(...present(children));
  return node;
}

function present(children) {
  return children.flat().filter((c) => c !== null && c !== undefined && c !== false);
}

// -- formats ----------------------------------------------------------------------------------

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)}ms`;
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const whole = Math.round(seconds);
  if (whole < 3600) return `${Math.floor(whole / 60)}m ${pad(whole % 60)}s`;
  return `${Math.floor(whole / 3600)}h ${pad(Math.floor((whole % 3600) / 60))}m`;
}

export function formatAge(epoch, now = Date.now() / 1000) {
  const s = Math.max(0, now - epoch);
  if (s < 60) return `${Math.floor(s)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function formatClock(epoch) {
  const d = new Date(epoch * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function formatDate(epoch) {
  if (!epoch) return "—";
  const d = new Date(epoch * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${formatClock(epoch)}`;
}

export function formatCount(n) {
  return (n ?? 0).toLocaleString("en-US");
}

// 37993 → "38.0k"
export function formatCompact(n) {
  if (n < 1000) return String(n);
  if (n < 1_000_000) return `${(n / 1000).toFixed(1)}k`;
  return `${(n / 1_000_000).toFixed(1)}M`;
}

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function pad(n) {
  return String(n).padStart(2, "0");
}

// -- pieces -----------------------------------------------------------------------------------

export function statusBadge(status, label = status) {
  return el("span", { class: `status status-${status}`, data: { status } }, label);
}

// A button that copies `text`: the Clipboard API where the page may use it, else a selected
// hidden text area and the older copy command.
export function copyButton(text, what = "run id") {
  const button = el("button", {
    type: "button",
    class: "copy",
    title: `Copy the ${what}`,
    "aria-label": `Copy the ${what}`,
    data: { copy: text },
  }, "Copy");
  button.addEventListener("click", async () => {
    const copied = await copyText(text);
    button.textContent = copied ? "Copied" : "Press Ctrl+C";
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // denied: fall through to the older way
    }
  }
  const area = el("textarea", { class: "offscreen", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  area.remove();
  return copied;
}

// Calls `tick` now and every `intervalMs` after it finishes, until it returns false or `stop`
// is called. A tick that throws is shown in #error and the polling goes on.
export function startPolling(tick, intervalMs = POLL_MS) {
  let timer = null;
  let stopped = false;
  async function run() {
    let again = true;
    try {
      again = (await tick()) !== false;
      showError(null);
    } catch (error) {
      showError(error);
    }
    if (again && !stopped) timer = setTimeout(run, intervalMs);
  }
  run();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}

export function showError(error) {
  const box = document.getElementById("error");
  if (!box) return;
  box.hidden = !error;
  box.textContent = error ? error.message || String(error) : "";
}

// Who is logged in, written in the top bar; returns /api/v1/me.
export async function showUser() {
  const me = await api("/me");
  const slot = document.getElementById("user");
  if (slot) slot.replaceChildren(el("span", { class: "user-name" }, me.name), ` (${me.scope})`);
  document.body.dataset.scope = me.scope;
  return me;
}

// A link target taken from configuration or data: only http(s) URLs become links.
export function safeUrl(url) {
  return typeof url === "string" && /^https?:\/\//i.test(url) ? url : null;
}
