// Where the tokens went: per stage, with its share of the run's, and per model call.

import { el, fill, formatClock, formatCount } from "./common.js";

const CALLS_SHOWN = 100;

export function renderTokens(root, tokens, { onSelect }) {
  const total = tokens.prompt_tokens + tokens.output_tokens || 1;
  const stages = el("table", { id: "token-stages", class: "compact tokens" },
    el("thead", {}, el("tr", {},
      ...["stage", "calls", "prompt", "output", "largest prompt", "share"].map((h, i) =>
        el("th", { class: i && i < 5 ? "num" : "" }, h)))),
    el("tbody", {}, ...tokens.stages.map((s) => {
      const share = (s.prompt_tokens + s.output_tokens) / total;
      const bar = el("span", { class: "share-fill" });
      bar.style.width = `${(100 * share).toFixed(1)}%`;
      return el("tr", { data: { stage: s.stage } },
        el("td", {}, el("button", { type: "button", class: "link", onclick: () => onSelect(s.stage) }, s.stage)),
        el("td", { class: "num" }, formatCount(s.requests)),
        el("td", { class: "num" }, formatCount(s.prompt_tokens)),
        el("td", { class: "num" }, formatCount(s.output_tokens)),
        el("td", { class: "num" }, formatCount(s.prompt_tokens_max)),
        el("td", { class: "share" }, el("span", { class: "share-bar" }, bar), ` ${(100 * share).toFixed(0)}%`));
    })));
  const callsBox = el("div", { class: "calls" });
  const showCalls = (all) => {
    const shown = all ? tokens.calls : tokens.calls.slice(0, CALLS_SHOWN);
    const more = tokens.calls.length - shown.length;
    fill(callsBox, callTable(shown),
      more > 0 ? el("button", { type: "button", class: "link", onclick: () => showCalls(true) }, `show ${more} more calls`) : null);
  };
  showCalls(false);
  root.replaceChildren(
    el("div", { class: "tokens-grid" },
      el("div", {}, el("h3", {}, "Per stage"), stages),
      el("div", {}, el("h3", {}, `Per model call (${tokens.calls.length})`), callsBox)));
}

function callTable(calls) {
  if (!calls.length) return el("p", { class: "muted" }, "No model calls recorded.");
  return el("table", { id: "token-calls", class: "compact tokens" },
    el("thead", {}, el("tr", {},
      ...["time", "stage", "attempt", "made", "prompt", "cached", "output"].map((h, i) =>
        el("th", { class: i >= 4 ? "num" : "" }, h)))),
    el("tbody", {}, ...calls.map((c) => el("tr", { data: { stage: c.stage } },
      el("td", { class: "mono" }, formatClock(c.ts)),
      el("td", {}, c.stage),
      el("td", { class: "num" }, c.attempt ?? "—"),
      el("td", { class: "mono made" }, c.made),
      el("td", { class: "num" }, formatCount(c.prompt_tokens)),
      el("td", { class: "num" }, formatCount(c.cached_tokens)),
      el("td", { class: "num" }, formatCount(c.output_tokens))))));
}
