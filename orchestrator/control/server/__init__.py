"""`baton serve`: a REST API over the run store and the web UI that reads it (`app`), behind
logins and bearer tokens with scopes (`auth`)."""
