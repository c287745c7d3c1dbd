// The run's time line drawn to scale: a row per stage, a bar per span of /timeline placed by
// its start and end between the run's first start and its last end. A fan-out stage's
// branches ran at once: each gets a lane of its own under the stage's row, side by side in
// time, the one whose output became the stage's marked ★.

import { el, formatClock, formatDuration } from "./common.js";

export const STATES = ["queued", "running", "waiting", "done", "failed", "cancelled", "skipped"];
const TICK_STEPS_S = [
  0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
  7200, 14400, 43200, 86400,
];
const MAX_TICKS = 8;

// A stage's running time: from the start of its first running span (an iteration) to the end
// of its last; time queued is not counted, a wait inside it is.
export function stageDuration(spans, now) {
  const ran = spans.filter((s) => s.state !== "queued" && s.state !== "waiting");
  if (!ran.length) return null;
  const start = Math.min(...ran.map((s) => s.start));
  const end = Math.max(...ran.map((s) => s.end ?? now));
  return Math.max(0, end - start);
}

export function renderLegend(root) {
  root.replaceChildren(...STATES.map((state) =>
    el("li", {}, el("span", { class: `swatch state-${state}` }), state)));
}

// `stages`: [[name, record]] in pipeline order; `spans`: /timeline; `now`: epoch seconds, the
// end of what is still going.
export function renderTimeline(root, { stages, spans, now, selected, onSelect }) {
  if (!spans.length) {
    root.replaceChildren(el("p", { class: "muted" }, "No stage has started yet."));
    return;
  }
  const first = Math.min(...spans.map((s) => s.start));
  const last = Math.max(...spans.map((s) => s.end ?? now));
  const scale = { first, length: Math.max(last - first, 0.001) };
  const rows = stages.flatMap(([name, record]) => {
    const own = spans.filter((s) => s.stage === name && !s.branch);
    const lanes = branchLanes(name, record, spans.filter((s) => s.stage === name && s.branch), scale, now);
    return [row(name, record, own, scale, now, name === selected, onSelect), ...lanes];
  });
  root.replaceChildren(axis(scale), ...rows);
}

function axis(scale) {
  const step = TICK_STEPS_S.find((s) => scale.length / s <= MAX_TICKS) ?? scale.length;
  const ticks = [];
  for (let t = 0; t <= scale.length + 1e-9; t += step) {
    const tick = el("span", { class: "tl-tick" }, t === 0 ? "0" : formatDuration(t));
    tick.style.left = `${(100 * t) / scale.length}%`;
    ticks.push(tick);
  }
  return el("div", { class: "tl-row tl-axis", "aria-hidden": "true" },
    el("span", { class: "tl-name" }, "stage"), el("span", { class: "tl-duration" }, "ran"),
    el("div", { class: "tl-track" }, ...ticks), el("span", { class: "tl-note" }));
}

function row(name, record, spans, scale, now, selected, onSelect) {
  const seconds = stageDuration(spans, now);
  const duration = el("span", { class: "tl-duration" }, formatDuration(seconds));
  if (seconds !== null) duration.dataset.duration = seconds.toFixed(3);
  const ordered = [...spans.filter((s) => s.state !== "waiting"), ...spans.filter((s) => s.state === "waiting")];
  return el("div", {
    class: selected ? "tl-row selected" : "tl-row",
    data: { stage: name, status: record.status },
  },
    el("button", {
      type: "button", class: "tl-name", title: `Show the ${name} stage`, onclick: () => onSelect(name),
    }, name),
    duration,
    el("div", { class: "tl-track" }, ...ordered.map((s) => bar(s, scale, now))),
    el("span", { class: "tl-note" }, note(record, spans)),
  );
}

// A lane per branch of a fan-out stage that started, in branch order (b2 before b10).
function branchLanes(stage, record, spans, scale, now) {
  const branches = [...new Set(spans.map((s) => s.branch))]
    .sort((a, b) => Number(a.slice(1)) - Number(b.slice(1)));
  const fan = record.fan_in?.branches ?? {};
  return branches.map((branch) => {
    const own = spans.filter((s) => s.branch === branch);
    const selected = own.some((s) => s.selected);
    const seconds = stageDuration(own, now);
    const state = fan[branch]?.status ?? own[own.length - 1].state;
    return el("div", {
      class: selected ? "tl-row tl-branch chosen" : "tl-row tl-branch",
      data: { stage, branch, status: state, selected: String(selected) },
    },
      el("span", { class: "tl-name", title: selected ? `${stage}.${branch}: its output became ${stage}'s` : `${stage}.${branch}` },
        `└ ${branch}${selected ? " ★" : ""}`),
      el("span", { class: "tl-duration" }, formatDuration(seconds)),
      el("div", { class: "tl-track" }, ...own.map((s) => bar(s, scale, now))),
      el("span", { class: "tl-note", title: fan[branch]?.session_id ?? "" }, branchNote(fan[branch], selected)),
    );
  });
}

// Beside a branch's lane: selected, its attempts, why it failed.
function branchNote(branch, selected) {
  if (!branch) return "";
  const parts = [];
  if (selected) parts.push("selected");
  if (branch.attempts > 1) parts.push(`${branch.attempts} attempts`);
  if (branch.proof_passed !== null && branch.proof_passed !== undefined) parts.push(branch.proof_passed ? "proof passed" : "proof failed");
  if (branch.status === "failed" && branch.error) parts.push(branch.error);
  return parts.join(" · ");
}

function bar(span, scale, now) {
  const end = span.end ?? now;
  const node = el("div", {
    class: `tl-bar state-${span.state}${span.end === null ? " live" : ""}`,
    data: { state: span.state, label: span.label },
    title: describe(span, end),
  }, span.label !== span.stage && !span.branch ? el("span", { class: "tl-bar-label" }, span.label) : null);
  node.style.left = `${(100 * (span.start - scale.first)) / scale.length}%`;
  node.style.width = `${(100 * (end - span.start)) / scale.length}%`;
  return node;
}

function describe(span, end) {
  const what = span.state === "waiting"
    ? `waiting until ${formatClock(end)}`
    : `${span.state}${span.end === null ? " (going on)" : ""}`;
  const lines = [`${span.label}: ${what}`, `${formatClock(span.start)} → ${formatClock(end)}, ${formatDuration(end - span.start)}`];
  if (span.note) lines.push(span.note);
  return lines.join("\n");
}

// What the row says beside its bars: a wait on a rate limit, iterations, an error.
function note(record, spans) {
  const waits = spans.filter((s) => s.state === "waiting");
  if (record.status === "waiting" && record.waiting_until) {
    return el("span", { class: "wait" }, `waiting until ${formatClock(record.waiting_until)}`);
  }
  const parts = [];
  if (waits.length) {
    const last = waits[waits.length - 1];
    const reason = last.note ? ` (${last.note})` : "";
    parts.push(el("span", { class: "wait", title: last.note }, `waited until ${formatClock(last.end)}${reason}`));
  }
  if (record.iterations?.length > 1) parts.push(`${record.iterations.length} iterations`);
  if (record.attempts > 1) parts.push(`${record.attempts} attempts`);
  return parts.flatMap((p, i) => (i ? [" · ", p] : [p]));
}
