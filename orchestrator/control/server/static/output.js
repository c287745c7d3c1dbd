// A stage's output (any JSON object) as fields; a proof — the fix stage's — as the tests run
// before and after the change.

import { el } from "./common.js";

const SHOWN_WITH_PROOF = new Set(["proof", "tests_before", "tests_after"]);

export function renderOutput(output) {
  if (output === null || typeof output !== "object" || Array.isArray(output)) {
    return [value(output)];
  }
  const rest = Object.fromEntries(Object.entries(output).filter(([key]) => !output.proof || !SHOWN_WITH_PROOF.has(key)));
  return [output.proof ? proof(output) : null, fields(rest)].filter(Boolean);
}

function fields(object) {
  const entries = Object.entries(object);
  if (!entries.length) return el("span", { class: "muted" }, "{}");
  return el("dl", { class: "fields" }, ...entries.flatMap(([key, v]) => [
    el("dt", { data: { field: key } }, key.replaceAll("_", " ")),
    el("dd", { data: { field: key } }, value(v)),
  ]));
}

function value(v) {
  if (v === null || v === undefined) return el("span", { class: "muted" }, "—");
  if (typeof v === "boolean") return el("span", { class: v ? "yes" : "no" }, v ? "yes" : "no");
  if (typeof v === "number") return el("span", { class: "num" }, String(v));
  if (typeof v === "string") {
    return v.includes("\n") || v.length > 160 ? el("pre", { class: "block" }, v) : el("span", {}, v);
  }
  if (Array.isArray(v)) {
    if (!v.length) return el("span", { class: "muted" }, "none");
    return el("ul", { class: "values" }, ...v.map((item) => el("li", {}, value(item))));
  }
  return fields(v);
}

function proof(output) {
  const p = output.proof;
  const tests = (label, key, run) => el("tr", { data: { tests: key } },
    el("th", {}, label),
    el("td", { class: "mono wrap" }, run?.command ?? "—"),
    el("td", { class: "num" }, run?.exit_code ?? "—"),
    el("td", { class: "num" }, run?.passed ?? "—"),
    el("td", { class: "num" }, run?.failed ?? "—"));
  const list = (title, key) => {
    const names = p[key] || [];
    return el("div", { class: "proof-list", data: { list: key } },
      el("h4", {}, `${title} (${names.length})`),
      names.length ? el("ul", { class: "values mono" }, ...names.map((n) => el("li", {}, n))) : el("p", { class: "muted" }, "none"));
  };
  const suite = (s) => (s ? `${s.passed} passed, ${s.failed} failed` : "—");
  return el("div", { class: `proof ${p.passed ? "proven" : "unproven"}`, data: { proof: p.passed ? "passed" : "failed" } },
    el("div", { class: "verdict" },
      el("strong", {}, p.passed ? "Proven" : "Not proven"),
      p.reason ? el("span", {}, `: ${p.reason}`) : null),
    el("table", { class: "compact tests" },
      el("thead", {}, el("tr", {}, ...["", "command", "exit", "passed", "failed"].map((h) => el("th", {}, h)))),
      el("tbody", {},
        tests("tests before", "before", output.tests_before),
        tests("tests after", "after", output.tests_after))),
    el("p", { class: "suite" }, `Suite: ${suite(p.suite_before)} before → ${suite(p.suite_after)} after`,
      p.suite_command ? el("span", { class: "muted mono" }, ` (${p.suite_command})`) : null),
    p.reproducing_command ? el("p", {}, "Reproducing test: ", el("span", { class: "mono" }, p.reproducing_command)) : null,
    el("div", { class: "proof-lists" },
      list("Fail → pass", "fail_to_pass"),
      list("Pass → fail", "pass_to_fail"),
      (p.still_failing || []).length ? list("Still failing", "still_failing") : null),
    p.diff_stat ? el("pre", { class: "block" }, p.diff_stat) : null,
    p.failure_tail ? el("pre", { class: "block stage-error" }, p.failure_tail) : null);
}
