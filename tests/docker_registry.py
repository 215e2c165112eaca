# A minimal Docker registry (the v2 API's read side) for tests/docker_e2e.rs:
# serves one image, "hello", over HTTPS on 127.0.0.1:8443, with srv.pem and
# srv.key from the working directory. It answers only requests carrying the
# credential the egress proxy injects, and logs each request to the file
# named by its first argument.
import gzip, hashlib, http.server, io, json, ssl, struct, sys, tarfile

# The image: one layer holding /hello, a static x86-64 ELF that writes a
# line and exits (no libc, so a few hundred bytes).
def hello_elf(message):
    base, code_at = 0x400000, 64 + 56
    msg_addr = base + code_at + 36
    code = (b"\xb8\x01\x00\x00\x00" + b"\xbf\x01\x00\x00\x00"
            + b"\x48\xbe" + struct.pack("<Q", msg_addr)
            + b"\xba" + struct.pack("<I", len(message))
            + b"\x0f\x05" + b"\xb8\x3c\x00\x00\x00" + b"\x31\xff" + b"\x0f\x05")
    size = code_at + len(code) + len(message)
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01", 2, 0x3E, 1,
                         base + code_at, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return header + segment + code + message

def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()

program = hello_elf(b"Hello from a stockade test image\n")
tar_bytes = io.BytesIO()
with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
    info = tarfile.TarInfo("hello"); info.size = len(program); info.mode = 0o755
    tar.addfile(info, io.BytesIO(program))
layer_tar = tar_bytes.getvalue()
layer = gzip.compress(layer_tar, mtime=0)
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/hello"]},
                     "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]}}).encode()
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config), "digest": digest(config)},
    "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer), "digest": digest(layer)}],
}).encode()
blobs = {digest(config): config, digest(layer): layer}

class Registry(http.server.BaseHTTPRequestHandler):
    def answer(self, body_wanted):
        with open(sys.argv[1], "a") as log:
            log.write("%s %s auth=%s\n" % (self.command, self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != "Bearer test-registry-token":
            return self.reply(401, b"no credential\n", "text/plain")
        if self.path == "/v2/":
            return self.reply(200, b"{}", "application/json")
        if self.path in ("/v2/hello/manifests/latest", "/v2/hello/manifests/" + digest(manifest)):
            return self.reply(200, manifest, "application/vnd.docker.distribution.manifest.v2+json",
                              digest(manifest), body_wanted)
        prefix = "/v2/hello/blobs/"
        if self.path.startswith(prefix) and self.path[len(prefix):] in blobs:
            name = self.path[len(prefix):]
            return self.reply(200, blobs[name], "application/octet-stream", name, body_wanted)
        self.reply(404, b"{}", "application/json")
    def reply(self, status, body, kind, content_digest=None, body_wanted=True):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if content_digest:
            self.send_header("Docker-Content-Digest", content_digest)
        self.end_headers()
        if body_wanted:
            self.wfile.write(body)
    def do_GET(self): self.answer(True)
    def do_HEAD(self): self.answer(False)
    def log_message(self, *a): pass

s = http.server.ThreadingHTTPServer(("127.0.0.1", 8443), Registry)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain("srv.pem", "srv.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
