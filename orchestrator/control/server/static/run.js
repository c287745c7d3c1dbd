// The run page: the run's header and controls, its time line, one stage at a time (output,
// proof, artifacts, transcript), its change and where its tokens went. Polled while the run
// goes on.

import {
  api, apiText, copyButton, el, fill, formatCount, formatDate, formatDuration, safeUrl, showError,
  showUser, startPolling, statusBadge, TERMINAL,
} from "./common.js";
import { diffSummary, renderDiff } from "./diff.js";
import { GateEditor } from "./gate_editor.js";
import { StagePanel } from "./stage.js";
import { renderLegend, renderTimeline, stageDuration } from "./timeline.js";
import { renderTokens } from "./tokens.js";

const RESUMABLE = new Set(["failed", "cancelled", "rejected"]);
const runId = decodeURIComponent(location.pathname.replace(/^\/runs\//, ""));
const path = `/runs/${encodeURIComponent(runId)}`;
const page = {
  me: null,
  view: null, // /runs/{id}
  seen: null, // its JSON: a new one redraws what depends on it
  spans: [], // /timeline
  tokens: null, // /tokens
  selected: null,
  following: false, // the stage shown follows the run's current stage
  changeShown: null,
  panel: null,
  poller: null,
  editor: null, // a plan gate's edit before approval
};

const $ = (id) => document.getElementById(id);
const stages = () => Object.entries(page.view.stages);
const ended = () => TERMINAL.has(page.view.summary.status);
// The end of what is still going: now, or when the run ended.
const now = () => (ended() ? page.view.summary.ended_at ?? page.view.summary.updated_at : Date.now() / 1000);

async function refresh() {
  const view = await api(path);
  const seen = JSON.stringify(view);
  if (seen !== page.seen) {
    const [spans, tokens] = await Promise.all([api(`${path}/timeline`), api(`${path}/tokens`)]);
    Object.assign(page, { view, seen, spans, tokens });
    drawHeader();
    drawControls();
    drawTabs();
    drawChange();
    renderTokens($("tokens"), tokens, { onSelect: (stage) => select(stage) });
    $("tokens-total").textContent =
      `${formatCount(tokens.prompt_tokens)} prompt and ${formatCount(tokens.output_tokens)} output tokens in ${tokens.calls.length} model calls`;
    const current = view.summary.current_stage;
    if (page.following && current in view.stages && current !== page.selected) {
      select(current, false);
    } else {
      page.panel.show(page.selected, view, spans, now());
    }
  } else if (!ended()) {
    drawTabs(); // the durations of what goes on
  }
  drawTimeline();
  await page.panel.poll();
}

// Shows a stage: one the person chose (kept in the address), or the one going on, which the
// page follows until a person chooses.
function select(stage, chosen = true) {
  if (!(stage in page.view.stages)) return;
  page.selected = stage;
  if (chosen) {
    page.following = false;
    history.replaceState(null, "", `#${encodeURIComponent(stage)}`);
  }
  drawTabs();
  drawTimeline();
  page.panel.show(stage, page.view, page.spans, now());
}

// The stage shown first: the one named in the address, else the one going on or that
// stopped the run, else the last that ran.
function firstStage() {
  const named = decodeURIComponent(location.hash.slice(1));
  if (named in page.view.stages) return named;
  const { current_stage: current } = page.view.summary;
  if (current && current in page.view.stages) return current;
  const stopped = stages().find(([, r]) => r.status === "failed" || r.status === "cancelled");
  if (stopped) return stopped[0];
  const ran = stages().filter(([, r]) => r.started_at);
  return (ran.length ? ran[ran.length - 1] : stages()[0])[0];
}

function drawHeader() {
  const { summary, issue, commit, environment } = page.view;
  document.title = `${runId} · Baton`;
  $("run-status").replaceChildren(statusBadge(summary.status));
  $("issue-title").textContent = issue.title;
  const frame = [...(issue.frames || [])].reverse().find((f) => f.in_app) || null;
  const error = [issue.error_type, issue.error_message].filter(Boolean).join(": ");
  $("issue-error").textContent = [error, frame ? `at ${frame.file}:${frame.line} in ${frame.function}` : ""]
    .filter(Boolean).join(" ");
  const waiting = pendingGates();
  $("run-gates").hidden = !waiting.length;
  $("run-gates").textContent = waiting.map(([id, gate]) =>
    `Gate ${id} awaits approval of ${gate.stage}'s ${gate.approve}` +
    (gate.escalated_at ? " (past its timeout: escalated)" : "") +
    (gate.approve === "plan" ? `: see the ${gate.stage} tab, or approve it with an edit` : "")).join(". ");
  $("run-reason").hidden = !summary.reason;
  $("run-reason").textContent = summary.reason || "";
  $("run-budget").hidden = !page.view.budget_line;
  $("run-budget").textContent = page.view.budget_line || "";
  const unserved = page.view.unserved_queue;
  $("run-unserved").hidden = !unserved;
  $("run-unserved").textContent = unserved
    ? `No worker serves ${unserved}, where ${summary.current_stage} waits: start one with ` +
      `baton worker --pipeline ${summary.pipeline} --stages ${summary.current_stage}`
    : "";
  const repoUrl = safeUrl(summary.repo);
  const facts = [
    ["pipeline", page.view.pipeline_hash
      ? el("span", { title: `sha256 ${page.view.pipeline_hash}` }, `${summary.pipeline} · ${page.view.pipeline_hash.slice(0, 12)}`)
      : summary.pipeline],
    ["repository", repoUrl ? el("a", { href: repoUrl, rel: "noreferrer" }, summary.repo) : summary.repo],
    ["commit", el("span", { class: "mono", title: commit }, commit.slice(0, 12))],
    ["environment", environment ? el("span", { class: "mono" }, environment) : "—"],
    ["created", formatDate(summary.created_at)],
    ["ended", summary.ended_at ? formatDate(summary.ended_at) : "—"],
    summary.current_stage ? ["stage", summary.current_stage] : null,
    ["model calls", formatCount(summary.requests)],
    ["tokens", `${formatCount(summary.prompt_tokens)} prompt · ${formatCount(summary.output_tokens)} output`],
  ];
  $("run-facts").replaceChildren(...facts.filter(Boolean).flatMap(([k, v]) => [el("dt", {}, k), el("dd", { data: { fact: k } }, v)]));
}

function drawTimeline() {
  renderTimeline($("timeline"), {
    stages: stages(), spans: page.spans, now: now(), selected: page.selected,
    onSelect: (stage) => select(stage),
  });
}

function drawTabs() {
  $("stage-tabs").replaceChildren(...stages().map(([name, record]) => {
    const seconds = stageDuration(page.spans.filter((s) => s.stage === name), now());
    return el("button", {
      type: "button",
      role: "tab",
      class: "tab",
      "aria-selected": String(name === page.selected),
      data: { tab: name, status: record.status },
      onclick: () => select(name),
    }, el("span", { class: `dot status-${record.status}`, title: record.status }), name,
    seconds !== null ? el("span", { class: "muted" }, ` ${formatDuration(seconds)}`) : null);
  }));
}

// A gate's approve (as it is, or a plan's with an edit) and reject, cancel and resume, for a
// login with the control scope only.
function drawControls() {
  const box = $("controls");
  if (page.me.scope !== "control") {
    box.replaceChildren();
    page.editor.close();
    return;
  }
  const status = page.view.summary.status;
  const from = $("resume-from")?.value ?? "";
  const parts = [];
  page.editor.sync(pendingGates().map(([id]) => id));
  for (const [id, gate] of pendingGates()) {
    parts.push(el("button", { id: `approve-${id}`, type: "button", data: { gate: id }, onclick: () => decide(id, "approve") }, `Approve ${id}`));
    if (gate.approve === "plan") {
      parts.push(el("button", { id: `edit-${id}`, type: "button", data: { gate: id }, onclick: () => page.editor.open(id, gate) }, "Approve with edit…"));
    }
    parts.push(el("button", { id: `reject-${id}`, type: "button", class: "danger", data: { gate: id }, onclick: () => decide(id, "reject") }, `Reject ${id}`));
  }
  if (!TERMINAL.has(status)) {
    parts.push(el("button", { id: "cancel", type: "button", class: "danger", onclick: cancel }, "Cancel run"));
  }
  if (RESUMABLE.has(status)) {
    const choice = el("select", { id: "resume-from", "aria-label": "Resume from" },
      el("option", { value: "" }, "where it stopped"),
      ...stages().map(([name]) => el("option", { value: name }, `from ${name}`)));
    choice.value = from;
    parts.push(choice, el("button", { id: "resume", type: "button", onclick: resume }, "Resume"));
  }
  box.replaceChildren(...parts);
}

function say(message, failed = false) {
  const line = $("control-message");
  line.hidden = false;
  line.textContent = message;
  line.classList.toggle("error", failed);
}

const pendingGates = () => Object.entries(page.view.gates || {}).filter(([, g]) => g.status === "pending");

// Approve a gate as it is (an edit goes through the gate editor), or reject it with a reason
// the person types.
async function decide(gate, verb) {
  let body = {};
  if (verb === "reject") {
    const reason = window.prompt(`Reject gate ${gate} of run ${runId}: why?`);
    if (!reason) return;
    body = { reason };
  } else if (!window.confirm(`Approve gate ${gate} of run ${runId}?`)) {
    return;
  }
  try {
    const reply = await api(`${path}/gates/${encodeURIComponent(gate)}/${verb}`, { method: "POST", body });
    await decided(gate, reply);
  } catch (error) {
    say(error.message, true);
    await refresh().catch(showError);
  }
}

async function decided(gate, reply) {
  say(reply.applied
    ? `Gate ${gate} ${reply.gate_status}${reply.queued ? `: ${reply.queued} queued` : ""}.`
    : `Gate ${gate} was ${reply.gate_status} already: nothing changed.`);
  await refresh().catch(showError);
}

async function cancel() {
  if (!window.confirm(`Cancel run ${runId}?\nIts running stage stops at its next safe point.`)) return;
  try {
    const reply = await api(`${path}/cancel`, { method: "POST" });
    say(`Run ${reply.run_id} is ${reply.status}.`);
  } catch (error) {
    say(error.message, true);
  }
  await refresh().catch(showError);
}

async function resume() {
  const from = $("resume-from").value;
  if (!window.confirm(`Resume run ${runId} ${from ? `from ${from}` : "where it stopped"}?`)) return;
  try {
    const reply = await api(`${path}/resume`, { method: "POST", body: from ? { from_stage: from } : {} });
    say(`Resumed from ${reply.resumed_from}.`);
    follow();
  } catch (error) {
    say(error.message, true);
  }
}

async function drawChange() {
  const name = page.view.change;
  const [stage, ...rest] = (name || "").split("/");
  const sha = page.view.stages[stage]?.artifacts[rest.join("/")]?.sha256;
  const shown = name ? `${name}@${sha}` : null;
  if (shown === page.changeShown) return;
  page.changeShown = shown;
  $("change-section").hidden = !name;
  if (!name) return;
  $("change-name").textContent = name;
  try {
    const { text, cut } = await apiText(`${path}/diff`);
    fill($("change"), el("p", { class: "muted" }, diffSummary(text)), renderDiff(text),
      cut ? el("p", { class: "muted" }, "Only the beginning is shown.") : null);
  } catch (error) {
    $("change").replaceChildren(el("p", { class: "error" }, error.message));
  }
}

function drawFlower() {
  const flower = safeUrl(page.me.flower_url);
  if (!flower) return;
  const base = flower.replace(/\/+$/, "");
  $("flower").hidden = false;
  $("flower").replaceChildren(
    "Flower: ", el("a", { href: `${base}/tasks`, rel: "noreferrer", id: "flower-tasks" }, "the tasks view"),
    ". Each stage of this run is a task whose id starts with the run id (",
    el("code", {}, `${runId}.${stages()[0][0]}`), ", …; a branch of a fan-out stage adds its own: ",
    el("code", {}, `${runId}.<stage>.b1`), "): search for it there.");
}

function follow() {
  page.poller?.stop();
  page.poller = startPolling(async () => {
    await refresh();
    return !ended();
  });
}

async function start() {
  $("run-id").textContent = runId;
  $("run-copy").replaceChildren(copyButton(runId));
  renderLegend($("legend"));
  try {
    page.me = await showUser();
    page.view = await api(path);
  } catch (error) {
    showError(error);
    return;
  }
  page.selected = firstStage();
  page.following = !ended() && !location.hash;
  page.editor = new GateEditor({ runId, path, onDecided: decided });
  page.panel = new StagePanel($("stage-panel"), {
    runId, flowerUrl: safeUrl(page.me.flower_url)?.replace(/\/+$/, "") ?? null,
  });
  drawFlower();
  await refresh().catch(showError);
  $("run").dataset.loaded = "true";
  if (!ended()) follow();
}

start();
