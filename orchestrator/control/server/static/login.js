// The login form: where to go once logged in, and why the last try failed. Where a login may
// go is the server's decision (login.py's safe_next): anything off this site becomes "/".

const query = new URLSearchParams(location.search);
const next = query.get("next");
if (next) {
  document.getElementById("next").value = next;
}
document.getElementById("login-failed").hidden = query.get("failed") !== "1";
