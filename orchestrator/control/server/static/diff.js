// A unified diff shown with its lines coloured: files, hunks, additions, removals.

import { el } from "./common.js";

const HUNK = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/;

// Each line's kind: "file", "hunk", "add", "del", "context" or "other". Inside a hunk its
// header's line counts decide, so that a removed line reading "-- x" is not taken for a
// file header "--- x".
export function classify(text) {
  const lines = text.replace(/\n$/, "").split("\n");
  let oldLeft = 0;
  let newLeft = 0;
  return lines.map((line) => {
    if (oldLeft > 0 || newLeft > 0) {
      if (line.startsWith("+")) {
        newLeft -= 1;
        return [line, "add"];
      }
      if (line.startsWith("-")) {
        oldLeft -= 1;
        return [line, "del"];
      }
      if (line.startsWith("\\")) return [line, "other"]; // \ No newline at end of file
      oldLeft -= 1;
      newLeft -= 1;
      return [line, "context"];
    }
    const hunk = HUNK.exec(line);
    if (hunk) {
      oldLeft = hunk[1] === undefined ? 1 : Number(hunk[1]);
      newLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
      return [line, "hunk"];
    }
    if (/^(diff |index |\+\+\+ |--- |new file|deleted file|similarity |rename |old mode|new mode)/.test(line)) {
      return [line, "file"];
    }
    return [line, "other"];
  });
}

export function renderDiff(text) {
  return el("pre", { class: "diff", data: { diff: "" } },
    ...classify(text).map(([line, kind]) =>
      el("span", { class: `diff-line diff-${kind}` }, line || " ")));
}

// "2 files changed, +19 −1"
export function diffSummary(text) {
  const kinds = classify(text);
  const files = kinds.filter(([line]) => line.startsWith("+++ ")).length;
  const added = kinds.filter(([, kind]) => kind === "add").length;
  const removed = kinds.filter(([, kind]) => kind === "del").length;
  return `${files} file${files === 1 ? "" : "s"} changed, +${added} −${removed}`;
}
