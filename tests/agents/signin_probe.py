#!/usr/bin/env python3
"""Investigation tool: a logging TLS-terminating HTTPS proxy (stdlib only).

Point a CLI at it with HTTPS_PROXY=http://127.0.0.1:PORT and make it trust
--ca (NODE_EXTRA_CA_CERTS / SSL_CERT_FILE). For every CONNECT it mints a
certificate for the requested host signed by --ca/--ca-key (openssl CLI),
terminates TLS and records each request (host, method, path, headers, body)
as one JSON line in --log. Then:

  * POST .../oauth/token on any host  -> a fake token response
    (Anthropic shape: access_token/refresh_token/expires_in/scope;
     OpenAI shape: id_token/access_token/refresh_token) so a refresh succeeds;
  * hosts given with --route HOST=https://127.0.0.1:PORT -> forwarded there
    (e.g. api.anthropic.com or chatgpt.com to fake_api.py);
  * anything else -> 404 {}.

This lets a test observe, with the real CLI binaries, how subscription
sign-in tokens are refreshed and which headers carry them, without any
network access. Used to write README.md's sign-in section.

Usage:
  signin_probe.py --port 18080 --ca ca.pem --ca-key ca.key --log probe.log \
      --route api.anthropic.com=https://127.0.0.1:18443 \
      --route chatgpt.com=https://127.0.0.1:18444
"""

import argparse
import base64
import http.client
import json
import os
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse

ARGS = None
LOCK = threading.Lock()
CERT_DIR = None


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fake_jwt(claims):
    head = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return "%s.%s.%s" % (head, b64url(json.dumps(claims).encode()), b64url(b"sig"))


def openai_tokens(n):
    exp = int(time.time()) + 3600
    auth = {"chatgpt_account_id": "acct-fake-0001", "chatgpt_plan_type": "pro",
            "chatgpt_user_id": "user-fake-0001"}
    return {
        "id_token": fake_jwt({"email": "probe@example.com", "exp": exp,
                              "https://api.openai.com/auth": auth}),
        "access_token": fake_jwt({"exp": exp, "refreshed": n,
                                  "https://api.openai.com/auth": auth}),
        "refresh_token": "rt-refreshed-%d" % n,
    }


def anthropic_tokens(n):
    return {
        "token_type": "Bearer",
        "access_token": "sk-ant-oat01-refreshed-%d" % n,
        "refresh_token": "sk-ant-ort01-refreshed-%d" % n,
        "expires_in": 28800,
        "scope": "user:profile user:inference user:sessions:claude_code "
                 "user:mcp_servers user:file_upload",
    }


REFRESH_COUNT = [0]


def host_cert(host):
    crt = os.path.join(CERT_DIR, host + ".pem")
    key = os.path.join(CERT_DIR, host + ".key")
    with LOCK:
        if not os.path.exists(crt):
            csr = crt + ".csr"
            ext = crt + ".ext"
            san = "IP:" + host if host.replace(".", "").isdigit() else "DNS:" + host
            with open(ext, "w") as f:
                f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
            subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", key, "-out", csr, "-subj", "/CN=" + host],
                           check=True, capture_output=True)
            subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ARGS.ca,
                            "-CAkey", ARGS.ca_key, "-CAcreateserial", "-out", crt,
                            "-days", "2", "-extfile", ext],
                           check=True, capture_output=True)
    return crt, key


def log(entry):
    with LOCK, open(ARGS.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")


def read_head(r):
    line = r.readline().decode("latin-1").rstrip("\r\n")
    headers = []
    while True:
        h = r.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers.append((k.strip(), v.strip()))
    return line, headers


def read_body(r, headers):
    hd = {k.lower(): v for k, v in headers}
    if "chunked" in hd.get("transfer-encoding", "").lower():
        data = b""
        while True:
            size = int(r.readline().strip().split(b";")[0] or b"0", 16)
            if size == 0:
                r.readline()
                return data
            data += r.read(size)
            r.readline()
    n = int(hd.get("content-length", "0") or 0)
    return r.read(n) if n else b""


def respond(w, status, body, ctype="application/json"):
    data = body.encode() if isinstance(body, str) else body
    w.write(("HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
             % (status, ctype, len(data))).encode())
    w.write(data)
    w.flush()


def forward(target, method, path, headers, body):
    u = urllib.parse.urlsplit(target)
    ctx = ssl.create_default_context(cafile=ARGS.ca)
    ctx.check_hostname = False
    conn = http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx, timeout=60)
    hop = {"connection", "proxy-connection", "keep-alive", "transfer-encoding", "host",
           "content-length"}
    hdrs = {k: v for k, v in headers if k.lower() not in hop}
    hdrs["Content-Length"] = str(len(body))
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    ctype = resp.getheader("Content-Type", "application/octet-stream")
    conn.close()
    return resp.status, data, ctype


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        line, headers = read_head(self.rfile)
        if not line:
            return  # a bare connect (port check)
        if not line.startswith("CONNECT "):
            log({"time": time.time(), "plain": line, "headers": headers})
            respond(self.wfile, 502, "{}")
            return
        host = line.split()[1].rsplit(":", 1)[0]
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        crt, key = host_cert(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        ctx.set_alpn_protocols(["http/1.1"])
        try:
            s = ctx.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log({"time": time.time(), "host": host, "tls_error": str(e)})
            return
        r = s.makefile("rb")
        w = s.makefile("wb")
        while True:
            try:
                req, hdrs = read_head(r)
            except (ssl.SSLError, OSError):
                break
            if not req:
                break
            method, path = req.split()[0], req.split()[1]
            body = read_body(r, hdrs)
            text = body.decode("utf-8", "replace")
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = None
            if "/oauth/token" in path and method == "POST":
                REFRESH_COUNT[0] += 1
                is_openai = "openai" in host
                tok = openai_tokens(REFRESH_COUNT[0]) if is_openai else \
                    anthropic_tokens(REFRESH_COUNT[0])
                status, out, ctype = 200, json.dumps(tok).encode(), "application/json"
            elif host in ARGS.routes:
                try:
                    status, out, ctype = forward(ARGS.routes[host], method, path, hdrs, body)
                except Exception as e:  # noqa: BLE001
                    status, out, ctype = 502, json.dumps({"error": repr(e)}).encode(), \
                        "application/json"
            else:
                status, out, ctype = 404, b"{}", "application/json"
            log({"time": time.time(), "host": host, "method": method, "path": path,
                 "headers": hdrs, "body": text, "json": parsed, "status": status})
            try:
                respond(w, status, out, ctype)
            except OSError:
                break
        try:
            s.close()
        except OSError:
            pass


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main():
    global ARGS, CERT_DIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--ca-key", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--route", action="append", default=[],
                    help="HOST=https://127.0.0.1:PORT (repeatable)")
    ARGS = ap.parse_args()
    ARGS.routes = dict(r.split("=", 1) for r in ARGS.route)
    CERT_DIR = tempfile.mkdtemp(prefix="signin-probe-certs.")
    Server(("127.0.0.1", ARGS.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
