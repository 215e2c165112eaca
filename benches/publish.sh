#!/usr/bin/env bash
# Published ports (`run -p`) against direct loopback, measured on one host
# in one run: HTTP round trips on fresh connections (connect + one small
# request, p50/p90) and download throughput, from a server in the guest
# through -p and from the same server on this host. Run in the rig, where
# absolute numbers are those of a software CPU and only the ratio means much:
#   tests/rig/run-in-l1.sh benches/publish.sh [CONNECTIONS] [MIB]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=${STOCKADE:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
conns=${1:-50} mib=${2:-64}
ws=$(mktemp -d /tmp/bench.XXXXXX)
cd "$ws"
cat > server.py <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"ok" if self.path != "/big" else None
        size = 2 if body else int(sys.argv[2]) << 20
        self.send_response(200); self.send_header("content-length", str(size)); self.end_headers()
        if body:
            self.wfile.write(body)
        else:
            block = b"x" * (1 << 20)
            for _ in range(size >> 20):
                self.wfile.write(block)
        if self.path == "/quit":
            self.server.quit_requested = True
    def log_message(self, *a): pass
# One request at a time: a threaded server could miss /quit and wait forever.
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
server.quit_requested = False
while not server.quit_requested:
    server.handle_request()
PY
cat > measure.py <<'PY'
import socket, sys, time
conns, mib = int(sys.argv[1]), int(sys.argv[2])
def get(port, path):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = 0
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    sock.close()
    return got
def wait_up(port):
    for _ in range(600):
        try:
            if get(port, b"/") > 0:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"nothing answered on port {port}")
rows = {}
for name, port in (("published (-p)", 18090), ("direct loopback", 18091)):
    wait_up(port)
    times = []
    for _ in range(conns):
        start = time.perf_counter()
        get(port, b"/")
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    start = time.perf_counter()
    got = get(port, b"/big")
    mbps = got / (1 << 20) / (time.perf_counter() - start)
    rows[name] = (times[len(times) // 2], times[(len(times) * 9) // 10], mbps)
    get(port, b"/quit")
print(f"{'path':<18} {'p50 ms':>8} {'p90 ms':>8} {'MiB/s':>8}")
for name, (p50, p90, mbps) in rows.items():
    print(f"{name:<18} {p50:8.2f} {p90:8.2f} {mbps:8.1f}")
pub, direct = rows["published (-p)"], rows["direct loopback"]
print(f"ratio p50 {pub[0] / direct[0]:.1f}x, throughput {pub[2] / direct[2]:.2f}x of direct")
PY
python3 server.py 18091 "$mib" &
"$S" run --cpus 1 --memory 512M -p 18090:8080 -- python3 server.py 8080 "$mib" >/dev/null 2>"$ws/run.err" &
run=$!
python3 measure.py "$conns" "$mib" || { kill "$run"; wait "$run"; cat "$ws/run.err" >&2; exit 1; }
wait "$run" || { cat "$ws/run.err" >&2; exit 1; }
