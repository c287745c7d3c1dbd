// A plan gate approved with an edit: the gated stage's output in a JSON editor, prefilled as
// the stage left it. What the person writes is checked here only as JSON (an object); whether
// it fits the stage's schema is the approve endpoint's to say (422, naming the field), and
// the editor stays open with that message until the edit is right or the person closes it.

import { api } from "./common.js";

const $ = (id) => document.getElementById(id);

export class GateEditor {
  // `path`: the run's API path; `onDecided(reply)`: after an approval went through.
  constructor({ runId, path, onDecided }) {
    Object.assign(this, { runId, path, onDecided, gate: null });
    $("gate-editor").addEventListener("submit", (event) => {
      event.preventDefault();
      this.approve();
    });
    $("gate-edit-close").addEventListener("click", () => this.close());
  }

  // Opens the editor on gate `id` (of stage `gate.stage`), prefilled with its output.
  async open(id, gate) {
    this.gate = id;
    $("gate-editor").hidden = false;
    $("gate-editor").dataset.gate = id;
    $("gate-editor-label").textContent = `Edit ${gate.stage}'s output, then approve gate ${id}: later stages read the edit.`;
    this.complain("");
    const text = $("gate-edit");
    text.value = "Loading…";
    text.disabled = true;
    try {
      // Where the gated output is recorded: the stage's output key, or a branch's (`fix#b2`).
      const key = gate.output_key || gate.stage;
      const output = await api(`${this.path}/outputs/${encodeURIComponent(key)}`);
      text.value = JSON.stringify(output, null, 2);
      text.disabled = false;
      text.focus();
    } catch (error) {
      text.value = "";
      this.complain(`The output of ${gate.stage} could not be read: ${error.message}`);
    }
  }

  close() {
    this.gate = null;
    $("gate-editor").hidden = true;
    delete $("gate-editor").dataset.gate;
  }

  // Closes the editor once its gate no longer waits (decided here, or elsewhere).
  sync(pendingIds) {
    if (this.gate !== null && !pendingIds.includes(this.gate)) this.close();
  }

  complain(message) {
    $("gate-edit-error").hidden = !message;
    $("gate-edit-error").textContent = message;
  }

  async approve() {
    const id = this.gate;
    let edit;
    try {
      edit = JSON.parse($("gate-edit").value);
    } catch (error) {
      this.complain(`The edit is not JSON: ${error.message}. Nothing was sent.`);
      return;
    }
    if (edit === null || typeof edit !== "object" || Array.isArray(edit)) {
      this.complain("The edit must be a JSON object, as the stage's output is. Nothing was sent.");
      return;
    }
    try {
      const reply = await api(`${this.path}/gates/${encodeURIComponent(id)}/approve`, { method: "POST", body: { edit } });
      this.close();
      await this.onDecided(id, reply);
    } catch (error) {
      this.complain(`Gate ${id} was not approved: ${error.message}`);
    }
  }
}
