# shellcheck shell=bash
# Sourced by .ci/run: a PostgreSQL server for the tests that run against PostgreSQL as well as
# SQLite (the results_db contract tests, the tuners sharing one database). It listens on
# loopback only, runs as an unprivileged user (PostgreSQL refuses root) from a temporary data
# directory, asks for a password (so that a wrong one is refused, as a team's server refuses
# it), and is stopped by stop_postgres, which the caller traps on exit.

postgres_bin_dir() {
    # Debian installs the server's programs under /usr/lib/postgresql/VERSION/bin, off PATH.
    find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null \
        | sort -V | tail -n 1
}

start_postgres() {
    if ! command -v pg_ctl >/dev/null; then
        if [[ -z "$(postgres_bin_dir)" ]]; then
            apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null
        fi
        PATH="$(postgres_bin_dir):$PATH"
    fi
    pg_dir=$(mktemp -d)
    local run_as=()
    if (( EUID == 0 )); then
        local user=postgres
        id -u "$user" >/dev/null 2>&1 || user=nobody
        chown "$user" "$pg_dir"
        run_as=(runuser -u "$user" --)
    fi
    local password port
    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    printf '%s\n' "$password" > "$pg_dir/password"
    chmod 644 "$pg_dir/password"
    "${run_as[@]}" initdb -D "$pg_dir/data" -U cutetune -A scram-sha-256 \
        --pwfile="$pg_dir/password" >"$pg_dir/initdb.log"
    rm "$pg_dir/password"
    "${run_as[@]}" pg_ctl -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
        -o "-h 127.0.0.1 -p $port -k $pg_dir -c fsync=off -c max_connections=200" start >/dev/null
    export CUTETUNE_TEST_POSTGRES_URL="postgresql+psycopg://cutetune:$password@127.0.0.1:$port/postgres"
    echo "postgres: $(postgres --version) on 127.0.0.1:$port"
}

stop_postgres() {
    if [[ -n "${pg_dir:-}" && -d "$pg_dir/data" ]]; then
        local run_as=()
        (( EUID == 0 )) && run_as=(runuser -u "$(stat -c %U "$pg_dir")" --)
        "${run_as[@]}" pg_ctl -D "$pg_dir/data" -m fast -w stop >/dev/null || true
    fi
    [[ -n "${pg_dir:-}" ]] && rm -rf "$pg_dir"
}
