// A stage's session read from the audit stream, in order: the user message, the model's
// replies, its tool calls with their arguments, the tools' results (cut to a few lines, with a
// button to see them whole), the summaries that stood in for its older history (compaction)
// and the stage's transitions. A fan-out stage's branches run at once and their entries
// interleave: each is tagged with its branch (`b2`), and attempts are counted per branch.

import { api, el, formatClock, formatCount, formatDuration } from "./common.js";

const PAGE = 500;
const CUT_LINES = 6;
const CUT_CHARS = 1200;
const TURNS = {
  user_message: "user",
  model_reply: "model",
  tool_call: "tool call",
  tool_result: "tool result",
  compaction: "summary",
  error: "error",
};

export class Transcript {
  constructor(runId, stage) {
    this.runId = runId;
    this.stage = stage;
    this.cursor = null;
    this.first = null;
    this.attempts = new Map(); // branch ("" for the stage itself) → the attempt shown last
    this.busy = false;
    this.list = el("ol", { class: "transcript", data: { transcript: stage, complete: "false" } });
    this.empty = el("p", { class: "muted" }, "Nothing recorded yet.");
    this.node = el("div", { class: "transcript-box" }, this.list, this.empty);
  }

  // Reads the entries added since the last call, a page at a time.
  async more() {
    if (this.busy) return;
    this.busy = true;
    try {
      for (;;) {
        const query = new URLSearchParams({ stage: this.stage, limit: String(PAGE) });
        if (this.cursor) query.set("after", this.cursor);
        const page = await api(`/runs/${encodeURIComponent(this.runId)}/audit?${query}`);
        for (const entry of page.entries) this.add(entry);
        if (page.entries.length) this.cursor = page.entries[page.entries.length - 1].id;
        if (!page.next_after) break;
        this.cursor = page.next_after;
      }
      this.list.dataset.complete = "true";
    } finally {
      this.busy = false;
    }
  }

  add(entry) {
    if (this.first === null) this.first = entry.ts;
    const lane = branchOf(entry);
    const shown = this.attempts.get(lane) ?? null;
    if (entry.attempt !== null && entry.attempt !== shown) {
      if (shown !== null) {
        this.list.append(el("li", { class: "attempt" }, `${lane ? `${lane}: ` : ""}attempt ${entry.attempt}`));
      }
      this.attempts.set(lane, entry.attempt);
    }
    const item = entry.kind in TURNS ? turn(entry, this.first) : transition(entry, this.first);
    if (lane) {
      item.dataset.branch = lane;
      item.querySelector(".when")?.after(el("span", { class: "lane mono", title: entry.branch }, lane));
    }
    this.list.append(item);
    this.empty.hidden = true;
  }
}

// The branch of a fan-out stage an entry is of (`b2`, from its label `<pipeline>.<stage>.b2`);
// "" for the stage's own.
function branchOf(entry) {
  return /\.(b[0-9]+)$/.exec(entry.branch || "")?.[1] ?? "";
}

function when(entry, first) {
  return el("span", { class: "when", title: formatClock(entry.ts) }, `+${formatDuration(entry.ts - first)}`);
}

function turn(entry, first) {
  const usage = entry.usage
    ? el("span", { class: "usage" },
      `${formatCount(entry.usage.prompt_tokens)} in · ${formatCount(entry.usage.output_tokens)} out`
      + (entry.usage.cached_tokens ? ` · ${formatCount(entry.usage.cached_tokens)} cached` : ""))
    : null;
  return el("li", { class: `entry kind-${entry.kind}`, data: { kind: entry.kind, entryId: entry.id } },
    el("div", { class: "entry-head" },
      when(entry, first),
      el("span", { class: "who" }, entry.author || "—"),
      el("span", { class: "kind" }, TURNS[entry.kind]),
      usage),
    ...entry.parts.map(part),
    entry.error ? el("div", { class: "part error" }, cut(entry.error)) : null);
}

function part(p) {
  if (p.kind === "call") {
    const argsShown = asText(p.args);
    return el("div", { class: "part call", data: { tool: p.tool || "" } },
      el("span", { class: "tool" }, `${p.tool}(${argsShown ? "…" : ""})`), argsShown ? cut(argsShown) : null);
  }
  if (p.kind === "result") {
    return el("div", { class: "part result", data: { tool: p.tool || "" } },
      el("span", { class: "tool" }, `${p.tool} returned`), cut(asText(p.result)));
  }
  return el("div", { class: `part ${p.kind}` }, cut(p.text, p.kind === "text" ? 12 : CUT_LINES));
}

// A transition of the stage (begins, waits, fails, …): one line with its fields.
function transition(entry, first) {
  const data = entry.data || {};
  let said = Object.entries(data).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ");
  if (entry.kind === "stage_waiting" && data.delay_s !== undefined) {
    said = `until ${formatClock(entry.ts + Number(data.delay_s))} (${formatDuration(Number(data.delay_s))})`
      + (data.reason ? `: ${data.reason}` : "");
  }
  const short = said.length > 200 ? `${said.slice(0, 200)}…` : said;
  return el("li", { class: `event kind-${entry.kind}`, data: { kind: entry.kind, entryId: entry.id } },
    when(entry, first),
    el("span", { class: "kind" }, entry.kind.replaceAll("_", " ")),
    el("span", { class: "said", title: said }, short));
}

// Arguments and results as lines a person reads: `key: value`, a text of several lines below
// its key, a list one item a line.
export function asText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") return value;
  if (typeof value !== "object") return String(value);
  if (Array.isArray(value)) return value.map((v) => (typeof v === "string" ? v : JSON.stringify(v))).join("\n");
  return Object.entries(value).map(([key, v]) => {
    if (typeof v === "string") return v.includes("\n") ? `${key}:\n${v}` : `${key}: ${v}`;
    if (Array.isArray(v) && v.length) return `${key}:\n${v.map((i) => `  ${typeof i === "string" ? i : JSON.stringify(i)}`).join("\n")}`;
    return `${key}: ${JSON.stringify(v)}`;
  }).join("\n");
}

// A block of text cut to its first lines, with a button that shows it whole (and cuts it again).
export function cut(text, lines = CUT_LINES) {
  const all = text.split("\n");
  const short = all.slice(0, lines).join("\n").slice(0, CUT_CHARS);
  const pre = el("pre", { class: "block" }, short);
  if (short === text) return pre;
  let whole = false;
  const toggle = el("button", { type: "button", class: "expand link", data: { expand: "" } });
  const label = () => {
    toggle.textContent = whole ? "show less" : `show all ${all.length} line${all.length === 1 ? "" : "s"}`;
  };
  label();
  toggle.addEventListener("click", () => {
    whole = !whole;
    pre.textContent = whole ? text : short;
    pre.classList.toggle("whole", whole);
    label();
  });
  return el("div", { class: "cut" }, pre, toggle);
}
