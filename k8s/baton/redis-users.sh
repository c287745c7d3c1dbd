#!/bin/sh
# Turns Baton's Redis ACL (redis-users.acl, given as $1) into redis.conf `user` lines, each
# user with the password of its variable, and prints them. Redis's start script, in Compose
# and in Kubernetes alike, feeds them to redis-server on stdin, so no command line and no file
# on disk shows a password. docs/redis.md has the rules this enforces.
#
# The password of user NAME is $BATON_REDIS_<NAME>_PASSWORD (NAME in capitals), the `default`
# user's (Redis's admin, used by nothing of Baton's) $BATON_REDIS_PASSWORD. Every password must
# be at least 16 characters of letters, digits and `.`, `_`, `~`, `-` (URL-safe, so it goes
# into a client's BATON_REDIS_URL as it is), and must not be an example file's placeholder.
# A user whose variable is unset is left out (it cannot log in), except `default`, which must
# have one. Exits 1, naming the variable and never its value, on anything else.
set -eu
[ $# -eq 1 ] && [ -r "$1" ] || { echo "usage: redis-users.sh <redis-users.acl>" >&2; exit 2; }
exec awk '
function fail(message) { print "redis-users: " message > "/dev/stderr"; failed = 1; exit 1 }
function add(rules) {
    if (current == "") fail("line " NR ": a rule outside any `user` or `rules` block")
    body[current] = body[current] " " rules
}
function variable(user) { return user == "default" ? "BATON_REDIS_PASSWORD" : "BATON_REDIS_" toupper(user) "_PASSWORD" }
/^[ \t]*(#|$)/ { next }
$1 == "rules" || $1 == "user" {
    if (NF != 2 || $2 !~ /^[a-z][a-z0-9-]*$/) fail("line " NR ": expected `" $1 " <name>`")
    current = $1 ":" $2
    if (current in body) fail("line " NR ": " $1 " " $2 " is defined twice")
    body[current] = ""
    if ($1 == "user") users[++count] = $2
    next
}
$1 == "include" {
    if (NF != 2 || !(("rules:" $2) in body)) fail("line " NR ": no `rules " $2 "` above to include")
    add(body["rules:" $2])
    next
}
{ sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); add($0) }
END {
    if (failed) exit 1
    if (!("user:default" in body)) fail("the ACL defines no `default` user: it would stay open to anyone")
    # Every password is checked before a line is printed: all the users, or none.
    for (i = 1; i <= count; i++) {
        user = users[i]; name = variable(user)
        if (!(name in ENVIRON)) {
            if (user == "default") fail(name " is not set: Redis needs an admin password")
            print "redis-users: " name " is not set; user " user " is left out" > "/dev/stderr"
            continue
        }
        password = ENVIRON[name]
        if (password ~ /^(change-me|replace-with)/) fail(name " still holds the example placeholder: set your own (openssl rand -hex 32)")
        if (length(password) < 16) fail(name " is shorter than 16 characters: use openssl rand -hex 32")
        if (password !~ /^[A-Za-z0-9._~-]+$/) fail(name " may hold only letters, digits and . _ ~ - (openssl rand -hex 32)")
        line[i] = "user " user " reset on >" password body["user:" user]
    }
    for (i = 1; i <= count; i++) if (i in line) print line[i]
}
' "$1"
