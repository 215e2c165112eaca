#!/usr/bin/env bash
# Transparent path (eth0 -> VMM smoltcp -> proxy) against the vsock proxy
# path (127.0.0.1:3128 -> vsock -> proxy), measured inside one guest: HTTP
# request round trips on fresh connections (connection setup + one small
# request) and guest->host upload throughput, to a sink on this machine.
# Run in the rig, where absolute numbers are those of a software CPU and
# only the ratio between the two paths means much:
#   tests/rig/run-in-l1.sh benches/transparent.sh [CONNECTIONS] [MIB]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=${STOCKADE:-$here/target/x86_64-unknown-linux-gnu/release/stockade}
conns=${1:-50} mib=${2:-64}
ws=$(mktemp -d /tmp/bench.XXXXXX)
cd "$ws"
addr=$(hostname -I | awk '{print $1}')
cat > sink.py <<'PY'
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        left = int(self.headers["content-length"])
        while left:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        self.do_GET()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
PY
python3 sink.py & sink=$!
trap 'kill $sink' EXIT
cat > p.toml <<TOML
[network]
allow_private = ["bench.test:8080"]
[network.hosts]
"bench.test" = "$addr"
TOML
cat > measure.py <<'PY'
import socket, sys, time
conns, mib = int(sys.argv[1]), int(sys.argv[2])
def exchange(sock, request):
    sock.sendall(request)
    got = b""
    while not got.endswith(b"ok"):
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("connection closed early")
        got += chunk
def open_path(path):
    if path == "transparent":
        return socket.create_connection(("bench.test", 8080)), b"/"
    return socket.create_connection(("127.0.0.1", 3128)), b"http://bench.test:8080/"
for path in ("transparent", "proxy"):
    times = []
    for _ in range(conns):
        start = time.perf_counter()
        sock, target = open_path(path)
        exchange(sock, b"GET " + target + b" HTTP/1.1\r\nHost: bench.test:8080\r\n\r\n")
        sock.close()
        times.append(time.perf_counter() - start)
    times.sort()
    print("%-12s connect+request  p50 %7.2f ms  p90 %7.2f ms  (%d fresh connections)"
          % (path, 1000 * times[len(times) // 2], 1000 * times[len(times) * 9 // 10], conns))
    block = b"x" * (1 << 20)
    sock, target = open_path(path)
    start = time.perf_counter()
    sock.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: bench.test:8080\r\ncontent-length: %d\r\n\r\n" % (mib << 20))
    for _ in range(mib):
        sock.sendall(block)
    exchange(sock, b"")
    took = time.perf_counter() - start
    sock.close()
    print("%-12s upload guest->host  %7.1f MiB/s  (%d MiB in %.2f s)" % (path, mib / took, mib, took))
PY
sleep 1
"$S" run --policy ./p.toml -- python3 measure.py "$conns" "$mib"
