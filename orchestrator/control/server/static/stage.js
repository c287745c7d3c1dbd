// One stage of a run: its record, its output (the fix's proof first), its artifacts with an
// inline viewer, and its transcript.

import {
  api, apiText, el, fill, formatBytes, formatClock, formatCount, formatDuration, statusBadge,
} from "./common.js";
import { branchTable } from "./branches.js";
import { renderDiff } from "./diff.js";
import { renderOutput } from "./output.js";
import { stageDuration } from "./timeline.js";
import { Transcript } from "./transcript.js";

const VIEWABLE = new Set(["text/plain", "text/x-diff", "application/json"]);

export class StagePanel {
  constructor(root, { runId, flowerUrl }) {
    this.root = root;
    this.runId = runId;
    this.flowerUrl = flowerUrl;
    this.stage = null;
  }

  get path() {
    return `/runs/${encodeURIComponent(this.runId)}`;
  }

  // Shows `stage` of `view` (the run as /runs/{id} answers); called again with a newer view,
  // it redraws what changed and keeps the open artifact and the transcript read so far.
  show(stage, view, spans, now) {
    if (stage !== this.stage) this.start(stage);
    const record = view.stages[stage];
    this.summary.replaceChildren(...summary(stage, record, spans, now, this.flowerTask(stage, record)),
      ...(record.fan_in ? branchTable(this.runId, stage, record.fan_in, this.flowerUrl) : []));

    const keys = view.outputs.filter((k) => k === stage || k.startsWith(`${stage}.`)); // not a branch's `fix#b2`
    const outputsSeen = JSON.stringify([keys, record.status, record.finished_at]);
    if (outputsSeen !== this.outputsSeen) {
      this.outputsSeen = outputsSeen;
      this.showOutputs(keys);
    }
    const refs = Object.values(record.artifacts);
    const artifactsSeen = JSON.stringify(refs.map((r) => [r.name, r.sha256]));
    if (artifactsSeen !== this.artifactsSeen) {
      this.artifactsSeen = artifactsSeen;
      this.artifacts.replaceChildren(...artifactTable(refs, this.path, (ref) => this.open(ref)));
    }
  }

  // New transcript entries, if any.
  poll() {
    return this.transcript.more();
  }

  start(stage) {
    this.stage = stage;
    this.outputsSeen = null;
    this.artifactsSeen = null;
    this.outputKey = null;
    this.summary = el("div", { class: "stage-summary" });
    this.output = el("div", { class: "stage-output" });
    this.artifacts = el("div", { class: "stage-artifacts" });
    this.viewer = el("section", { class: "viewer", hidden: true, data: { viewer: "" } });
    this.transcript = new Transcript(this.runId, stage);
    this.root.dataset.stage = stage;
    this.root.replaceChildren(el("div", { class: "panel-grid" },
      el("div", { class: "panel-main" },
        this.summary,
        el("h3", {}, "Output"), this.output,
        el("h3", {}, "Artifacts"), this.artifacts,
        this.viewer),
      el("div", { class: "panel-side" }, el("h3", {}, "Transcript"), this.transcript.node)));
    this.transcript.more();
  }

  flowerTask(stage, record) {
    if (!this.flowerUrl || !record.started_at || record.fan_in) return null; // a branch has its own task
    const task = record.iteration > 1 ? `${this.runId}.${stage}.${record.iteration}` : `${this.runId}.${stage}`;
    return el("a", { href: `${this.flowerUrl}/task/${encodeURIComponent(task)}`, class: "flower-task", rel: "noreferrer" },
      `Flower task ${task}`);
  }

  showOutputs(keys) {
    if (!keys.length) {
      this.output.replaceChildren(el("p", { class: "muted" }, "No output recorded."));
      return;
    }
    if (!keys.includes(this.outputKey)) this.outputKey = keys.includes(this.stage) ? this.stage : keys[keys.length - 1];
    const picker = keys.length > 1
      ? el("div", { class: "picker", role: "group", "aria-label": "Output" }, ...keys.map((key) =>
        el("button", {
          type: "button",
          class: key === this.outputKey ? "chosen" : "",
          data: { output: key },
          onclick: () => {
            this.outputKey = key;
            this.showOutputs(keys);
          },
        }, key === this.stage ? "final" : `iteration ${key.split(".")[1]}`)))
      : null;
    const shown = el("div", { class: "output-body", data: { outputKey: this.outputKey } }, el("p", { class: "muted" }, "Loading…"));
    this.output.replaceChildren(...[picker, shown].filter(Boolean));
    api(`${this.path}/outputs/${encodeURIComponent(this.outputKey)}`)
      .then((value) => shown.replaceChildren(...renderOutput(value)))
      .catch((error) => shown.replaceChildren(el("p", { class: "error" }, error.message)));
  }

  // The artifact in the viewer: a diff coloured, JSON indented, a log as it is.
  async open(ref) {
    const viewer = this.viewer;
    const url = artifactPath(this.path, ref);
    const body = el("div", { class: "viewer-body" }, el("p", { class: "muted" }, "Loading…"));
    viewer.dataset.artifact = ref.name;
    viewer.dataset.ready = "false";
    viewer.hidden = false;
    viewer.replaceChildren(
      el("div", { class: "viewer-head" },
        el("strong", { class: "mono" }, ref.name),
        el("span", { class: "muted" }, ` ${formatBytes(ref.size_bytes)} · sha256 ${ref.sha256.slice(0, 12)}`),
        el("span", { class: "spacer" }),
        el("a", { href: `/api/v1${url}?download=1`, download: fileName(ref) }, "Download"),
        el("button", { type: "button", class: "close", onclick: () => { viewer.hidden = true; } }, "Close")),
      body);
    try {
      const { text, cut } = await apiText(url);
      fill(body, viewed(ref, text), cut ? el("p", { class: "muted" }, "Only the beginning is shown: download it for the rest.") : null);
    } catch (error) {
      body.replaceChildren(el("p", { class: "error" }, error.message));
    }
    if (!viewer.contains(body)) return; // another artifact was opened meanwhile
    viewer.dataset.ready = "true";
    viewer.scrollIntoView({ block: "nearest" });
  }
}

function artifactPath(runPath, ref) {
  return `${runPath}/artifacts/${ref.name.split("/").map(encodeURIComponent).join("/")}`;
}

function fileName(ref) {
  return ref.name.split("/").pop();
}

function viewed(ref, text) {
  if (ref.media_type === "text/x-diff") return renderDiff(text);
  if (ref.media_type === "application/json") {
    try {
      return el("pre", { class: "log" }, JSON.stringify(JSON.parse(text), null, 2));
    } catch {
      // shown as it is
    }
  }
  return el("pre", { class: "log" }, text);
}

function summary(stage, record, spans, now, flowerTask) {
  const facts = [
    ["attempts", record.attempts],
    ["started", record.started_at ? formatClock(record.started_at) : "—"],
    ["finished", record.finished_at ? formatClock(record.finished_at) : "—"],
    ["ran", formatDuration(stageDuration(spans.filter((s) => s.stage === stage), now))],
    ["model calls", record.requests],
    ["prompt tokens", `${formatCount(record.prompt_tokens_total)} (largest ${formatCount(record.prompt_tokens_max)})`],
    ["output tokens", formatCount(record.output_tokens)],
  ];
  if (record.rate_limit_retries) {
    facts.push(["rate limited", `${record.rate_limit_retries}×, ${formatDuration(record.rate_limit_wait_s)} waited`]);
  }
  if (record.waiting_until) facts.push(["waiting until", formatClock(record.waiting_until)]);
  return [
    el("div", { class: "stage-title" }, el("h2", {}, stage), statusBadge(record.status), flowerTask),
    el("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
    record.error ? el("pre", { class: "stage-error" }, record.error) : null,
    record.iterations.length ? iterations(record.iterations) : null,
  ].filter(Boolean);
}

function iterations(list) {
  return el("table", { class: "compact iterations" },
    el("thead", {}, el("tr", {}, ...["iteration", "proof", "reason", "calls", "prompt tokens", "ran"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...list.map((i) => el("tr", { data: { iteration: i.number } },
      el("td", {}, String(i.number)),
      el("td", {}, statusBadge(i.passed ? "done" : "failed", i.passed ? "passed" : "failed")),
      el("td", { class: "wrap" }, i.reason || "—"),
      el("td", { class: "num" }, String(i.requests)),
      el("td", { class: "num" }, formatCount(i.prompt_tokens_total)),
      el("td", { class: "num" }, i.finished_at && i.started_at ? formatDuration(i.finished_at - i.started_at) : "—")))));
}

function artifactTable(refs, path, open) {
  if (!refs.length) return [el("p", { class: "muted" }, "None.")];
  return [el("table", { class: "compact artifacts" },
    el("tbody", {}, ...refs.map((ref) => {
      const url = `/api/v1${artifactPath(path, ref)}`;
      return el("tr", { data: { artifact: ref.name } },
        el("td", { class: "mono" }, fileName(ref)),
        el("td", { class: "muted" }, ref.media_type),
        el("td", { class: "num" }, formatBytes(ref.size_bytes)),
        el("td", { class: "actions" },
          VIEWABLE.has(ref.media_type) ? el("button", { type: "button", class: "view", onclick: () => open(ref) }, "View") : null,
          " ",
          el("a", { href: `${url}?download=1`, class: "download", download: fileName(ref) }, "Download")));
    })))];
}
