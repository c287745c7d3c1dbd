// A fan-out stage's branches in its panel: a row each with its status, executions, session
// id, proof, model calls, time and (with Flower configured) a link to its own Flower task,
// `<run>.<stage>.<branch>`; the one whose output became the stage's marked ★.

import { el, formatCount, formatDuration, statusBadge } from "./common.js";

export function branchTable(runId, stage, fan, flowerUrl) {
  const names = Object.keys(fan.branches).sort((a, b) => Number(a.slice(1)) - Number(b.slice(1)));
  const done = Object.values(fan.branches).filter((b) => b.status === "done" || b.status === "failed").length;
  const said = fan.joined
    ? (fan.selected ? `${fan.selected} selected of ${names.length}` : `none of ${names.length} selected`)
    : `${done}/${names.length} branches ended`;
  return [
    el("h3", {}, "Branches"),
    el("p", { class: "muted branch-progress" }, said),
    el("table", { class: "compact branches" },
      el("thead", {}, el("tr", {}, ...["branch", "status", "tries", "proof", "calls", "prompt tokens", "ran", "session"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...names.map((name) => row(runId, stage, name, fan.branches[name], name === fan.selected, flowerUrl)))),
  ];
}

function row(runId, stage, name, branch, selected, flowerUrl) {
  const task = `${runId}.${stage}.${name}`;
  const proof = branch.proof_passed === null || branch.proof_passed === undefined ? "—" : (branch.proof_passed ? "passed" : "failed");
  const ran = branch.started_at && branch.finished_at ? formatDuration(branch.finished_at - branch.started_at) : "—";
  return el("tr", { data: { branch: name, selected: String(selected) } },
    el("td", { class: "mono" }, `${name}${selected ? " ★" : ""}`,
      flowerUrl ? el("a", { href: `${flowerUrl}/task/${encodeURIComponent(task)}`, class: "flower-task", rel: "noreferrer", data: { branch: name }, title: `Flower task ${task}` }, " Flower") : null),
    el("td", {}, statusBadge(branch.status)),
    el("td", { class: "num" }, String(branch.attempts)),
    el("td", {}, proof),
    el("td", { class: "num" }, String(branch.requests)),
    el("td", { class: "num" }, formatCount(branch.prompt_tokens_total)),
    el("td", { class: "num" }, ran),
    el("td", { class: "mono wrap", title: branch.error || "" }, branch.status === "failed" && branch.error ? branch.error : (branch.session_id || "—")));
}
