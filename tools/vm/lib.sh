# Helpers for scripts that run inside the bench VM:  . tools/vm/lib.sh
# (bash; the VM's rxe0 is 10.0.0.1 and rxe1 is 10.0.0.2)

# wait_until SECS CMD...: retry CMD every 0.1 s until it succeeds; fail after SECS.
# (bash's SECONDS, not date: each program started in the VM costs ~0.1 s under TCG)
wait_until() {
  local deadline=$(( SECONDS + $1 )); shift
  until "$@" > /dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "wait_until: gave up on: $*" >&2; return 1; fi
    sleep 0.1
  done
}
# A TCP listener on PORT (perftest and the ibv_*_pingpong examples exchange QP data over TCP).
tcp_listening() { ss -Hltn "sport = :$1" | grep -q .; }
# An rdma_cm listener on PORT (not a TCP socket: it shows up as a LISTEN cm_id).
cm_listening() { rdma res show cm_id 2>/dev/null | grep -q "state LISTEN.*src-addr [^ ]*:$1 "; }

# pair NAME READY "SERVER COMMAND" "CLIENT COMMAND"
# Starts the server, waits until READY (e.g. "tcp_listening 18515") holds, runs the client,
# waits for the server, and prints both outputs between "=== NAME" markers. Fails when either
# side fails or the server never gets ready (30 s).
pair() {
  local name=$1 ready=$2 server=$3 client=$4 log spid crc src
  log=$(mktemp)
  echo "=== $name"
  bash -c "$server" > "$log" 2>&1 & spid=$!
  # shellcheck disable=SC2086
  if ! wait_until 30 $ready; then
    kill "$spid" 2>/dev/null; wait "$spid"
    echo "--- server (never ready):"; cat "$log"; rm -f "$log"
    echo "=== $name: FAILED: server not ready"; return 1
  fi
  bash -c "$client"; crc=$?
  wait "$spid"; src=$?
  echo "--- server:"; cat "$log"; rm -f "$log"
  echo "=== $name: client rc=$crc server rc=$src"
  [ $crc -eq 0 ] && [ $src -eq 0 ]
}

# rxe_counter DEV NAME: one of the device's hw_counters (sent_pkts, rcvd_pkts, ...).
rxe_counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }
