// The login form: where to go once logged in, and why the last try failed.

const query = new URLSearchParams(location.search);
const next = query.get("next");
if (next && next.startsWith("/") && !next.startsWith("//")) {
  document.getElementById("next").value = next;
}
document.getElementById("login-failed").hidden = query.get("failed") !== "1";
