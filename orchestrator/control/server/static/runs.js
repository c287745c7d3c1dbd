// The runs list: newest first, filtered, a page at a time, polled while it is open.

import {
  api, copyButton, el, formatAge, formatCompact, formatCount, formatDate, safeUrl, showUser,
  startPolling, STATUSES, statusBadge,
} from "./common.js";

const LIMIT = 50;
const TYPING_MS = 300;

const form = document.getElementById("filters");
const body = document.querySelector("#runs tbody");
const rows = new Map(); // run id → {tr, signature}
const pipelinesSeen = new Set();
let offset = Number(new URLSearchParams(location.search).get("offset")) || 0;
let nextOffset = null;
let asked = 0; // the number of the newest request: an older answer arriving late is dropped

function filters() {
  const found = {};
  for (const name of ["status", "pipeline", "q"]) {
    const value = form.elements[name].value.trim();
    if (value) found[name] = value;
  }
  return found;
}

// The filters and page live in the address, so that a reload or a shared link shows the same.
function remember() {
  const query = new URLSearchParams(filters());
  if (offset) query.set("offset", String(offset));
  const search = query.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
}

async function load() {
  const query = new URLSearchParams({ ...filters(), offset: String(offset), limit: String(LIMIT) });
  const mine = ++asked;
  const page = await api(`/runs?${query}`);
  if (mine !== asked) return;
  nextOffset = page.next_offset;
  show(page);
  document.getElementById("runs-page").dataset.loaded = "true";
}

function show(page) {
  const now = Date.now() / 1000;
  const wanted = page.runs.map((run) => row(run, now));
  const kept = new Set(page.runs.map((run) => run.run_id));
  for (const [id, entry] of rows) {
    if (!kept.has(id)) {
      entry.tr.remove();
      rows.delete(id);
    }
  }
  // Rows that did not change stay the same nodes (a selection or a focused button survives).
  if (wanted.some((tr, i) => body.children[i] !== tr)) body.append(...wanted);

  document.getElementById("runs-empty").hidden = page.runs.length > 0;
  document.getElementById("runs-total").textContent = `${formatCount(page.total)} in the store`;
  const last = page.offset + page.runs.length;
  document.getElementById("page-info").textContent =
    page.runs.length ? `${page.offset + 1}–${last}` : "";
  document.getElementById("newer").disabled = page.offset === 0;
  document.getElementById("older").disabled = page.next_offset === null;
  for (const run of page.runs) pipelinesSeen.add(run.pipeline);
  const list = document.getElementById("pipelines");
  if (list.children.length !== pipelinesSeen.size) {
    list.replaceChildren(...[...pipelinesSeen].sort().map((p) => el("option", { value: p })));
  }
}

function row(run, now) {
  const signature = JSON.stringify(run);
  let entry = rows.get(run.run_id);
  if (!entry || entry.signature !== signature) {
    const tr = cells(run);
    if (entry) entry.tr.replaceWith(tr);
    entry = { tr, signature };
    rows.set(run.run_id, entry);
  }
  const age = entry.tr.querySelector(".age");
  age.textContent = formatAge(run.created_at, now);
  return entry.tr;
}

function cells(run) {
  const link = `/runs/${encodeURIComponent(run.run_id)}`;
  const repoUrl = safeUrl(run.repo);
  return el("tr", { data: { runId: run.run_id, status: run.status } },
    el("td", {}, statusBadge(run.status)),
    el("td", { class: "run-cell" },
      el("a", { href: link, class: "run-id mono" }, run.run_id), " ", copyButton(run.run_id)),
    el("td", {}, run.pipeline),
    el("td", { class: "repo", title: run.repo },
      repoUrl ? el("a", { href: repoUrl, rel: "noreferrer" }, shortRepo(run.repo))
        : shortRepo(run.repo)),
    el("td", { class: "issue", title: run.issue }, el("a", { href: link }, run.issue || "—")),
    el("td", { title: run.reason || null }, run.current_stage || "—"),
    el("td", { class: "age", title: formatDate(run.created_at) }),
    el("td", {
      class: "num",
      title: `${formatCount(run.prompt_tokens)} prompt, ${formatCount(run.output_tokens)} output tokens in ${run.requests} model calls`,
    }, `${formatCompact(run.prompt_tokens)} / ${formatCompact(run.output_tokens)}`),
  );
}

// "/tmp/x/shopcart.git" → "shopcart", "https://github.com/o/r" → "o/r"
function shortRepo(repo) {
  const github = /github\.com[/:]([^/]+\/[^/]+?)(?:\.git)?\/?$/.exec(repo);
  if (github) return github[1];
  const last = repo.replace(/\/+$/, "").split("/").pop() || repo;
  return last.replace(/\.git$/, "");
}

function setUp() {
  const query = new URLSearchParams(location.search);
  const status = form.elements.status;
  status.append(...STATUSES.map((s) => el("option", { value: s }, s)));
  for (const name of ["status", "pipeline", "q"]) form.elements[name].value = query.get(name) || "";

  let typing = null;
  const changed = () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      offset = 0;
      remember();
      load();
    }, TYPING_MS);
  };
  form.addEventListener("input", changed);
  form.addEventListener("change", changed);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    changed();
  });
  document.getElementById("newer").addEventListener("click", () => {
    offset = Math.max(0, offset - LIMIT);
    remember();
    load();
  });
  document.getElementById("older").addEventListener("click", () => {
    if (nextOffset === null) return;
    offset = nextOffset;
    remember();
    load();
  });
}

setUp();
showUser();
startPolling(async () => {
  if (!document.hidden) await load();
});
