#!/usr/bin/env python3
"""Local HTTPS fake of a coding agent's model provider API (stdlib only).

Flavors:
  anthropic  Messages API as Claude Code uses it (POST /v1/messages, SSE or JSON).
  openai     Responses API as the Codex CLI uses it (POST /v1/responses, SSE).
  gemini     Gemini API as Gemini CLI uses it
             (POST /v1beta/models/<m>:streamGenerateContent?alt=sse, :generateContent,
              :countTokens).

The first model turn asks the agent to write --write-path with --write-content
using the agent's own file-writing tool (Claude Code: Write; Codex: apply_patch;
Gemini CLI: write_file). Once the tool result comes back the fake answers with a
final text "done".

Every request is appended to --log as one JSON line:
  {"time", "method", "path", "headers": {lower-case name: value},
   "header_list": [[name, value], ...], "body": text, "json": parsed body or null,
   "status": status sent}

Usage:
  fake_api.py --cert CERT --key KEY --port PORT --log LOGFILE \
      --flavor anthropic|openai|gemini [--write-path PATH --write-content TEXT]
      [--host 127.0.0.1]
"""

import argparse
import gzip
import json
import shutil
import ssl
import subprocess
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOG_LOCK = threading.Lock()
FINAL_TEXT = "done"


def log_request(entry):
    with LOG_LOCK:
        with open(ARGS.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")


def sse(event, data, with_event_line=True):
    out = ""
    if with_event_line and event:
        out += "event: %s\n" % event
    out += "data: %s\n\n" % json.dumps(data, separators=(",", ":"))
    return out


def file_content():
    c = ARGS.write_content or ""
    return c


# ---------------------------------------------------------------- anthropic
def anthropic_has_tool_result(body):
    for m in body.get("messages", []) or []:
        content = m.get("content")
        if isinstance(content, list):
            for blk in content:
                if isinstance(blk, dict) and blk.get("type") == "tool_result":
                    return True
    return False


def anthropic_tool_names(body):
    return [t.get("name") for t in (body.get("tools") or []) if isinstance(t, dict)]


def anthropic_plan(body):
    """Return a list of content blocks for the reply and the stop reason."""
    wants_write = (
        ARGS.write_path is not None
        and "Write" in anthropic_tool_names(body)
        and not anthropic_has_tool_result(body)
    )
    if wants_write:
        blocks = [
            {"type": "text", "text": "I will write the file."},
            {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:24],
                "name": "Write",
                "input": {"file_path": ARGS.write_path, "content": file_content()},
            },
        ]
        return blocks, "tool_use"
    return [{"type": "text", "text": FINAL_TEXT}], "end_turn"


def anthropic_usage(out_tokens=5):
    return {
        "input_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": out_tokens,
        "service_tier": "standard",
    }


def anthropic_messages(body):
    model = body.get("model") or "claude-sonnet-4-5"
    blocks, stop = anthropic_plan(body)
    msg_id = "msg_" + uuid.uuid4().hex[:24]
    if not body.get("stream"):
        return 200, "application/json", json.dumps({
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": anthropic_usage(),
        })
    out = sse("message_start", {
        "type": "message_start",
        "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": anthropic_usage(1),
        },
    })
    for i, blk in enumerate(blocks):
        if blk["type"] == "text":
            out += sse("content_block_start", {
                "type": "content_block_start", "index": i,
                "content_block": {"type": "text", "text": ""}})
            out += sse("content_block_delta", {
                "type": "content_block_delta", "index": i,
                "delta": {"type": "text_delta", "text": blk["text"]}})
        else:
            out += sse("content_block_start", {
                "type": "content_block_start", "index": i,
                "content_block": {"type": "tool_use", "id": blk["id"],
                                  "name": blk["name"], "input": {}}})
            out += sse("content_block_delta", {
                "type": "content_block_delta", "index": i,
                "delta": {"type": "input_json_delta",
                          "partial_json": json.dumps(blk["input"])}})
        out += sse("content_block_stop", {"type": "content_block_stop", "index": i})
    out += sse("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": 5}})
    out += sse("message_stop", {"type": "message_stop"})
    return 200, "text/event-stream", out


def anthropic_route(method, path, body, headers=None):
    p = path.split("?", 1)[0]
    if method == "POST" and p.endswith("/v1/messages"):
        return anthropic_messages(body or {})
    if method == "POST" and p.endswith("/v1/messages/count_tokens"):
        return 200, "application/json", json.dumps({"input_tokens": 100})
    if p.endswith("/v1/models") or "/v1/models/" in p:
        model = {"type": "model", "id": "claude-sonnet-4-5",
                 "display_name": "Claude Sonnet 4.5",
                 "created_at": "2025-09-29T00:00:00Z"}
        if p.endswith("/v1/models"):
            return 200, "application/json", json.dumps(
                {"data": [model], "has_more": False,
                 "first_id": model["id"], "last_id": model["id"]})
        return 200, "application/json", json.dumps(model)
    # /api/... (oauth profile, settings, metrics, event logging, ...) and anything
    # else: an empty JSON object is harmless.
    return 200, "application/json", "{}"


# ---------------------------------------------------------------- openai
def openai_tools(body):
    """name -> tool dict, for tools at top level (function / custom / namespaces)."""
    tools = {}
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        name = t.get("name") or (t.get("function") or {}).get("name")
        if name:
            tools[name] = t
    return tools


def openai_has_tool_output(body):
    inp = body.get("input")
    if not isinstance(inp, list):
        return False
    for item in inp:
        if isinstance(item, dict) and item.get("type") in (
                "function_call_output", "custom_tool_call_output",
                "local_shell_call_output"):
            return True
    return False


def apply_patch_text():
    lines = file_content().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    patch = "*** Begin Patch\n*** Add File: %s\n" % ARGS.write_path
    patch += "".join("+%s\n" % ln for ln in lines)
    patch += "*** End Patch"
    return patch


def openai_tool_call_item():
    """The output item that makes Codex write the file, chosen after the tools
    the request offers."""
    tools = OPENAI_LAST_TOOLS.get("tools", {})
    call_id = "call_" + uuid.uuid4().hex[:24]
    patch = apply_patch_text()
    ap = tools.get("apply_patch")
    if ap is not None and ap.get("type") == "custom":
        return {"type": "custom_tool_call", "id": "ctc_" + uuid.uuid4().hex[:16],
                "status": "completed", "call_id": call_id,
                "name": "apply_patch", "input": patch}
    if ap is not None:
        return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:16],
                "status": "completed", "call_id": call_id,
                "name": "apply_patch", "arguments": json.dumps({"input": patch})}
    # No apply_patch tool offered: Codex intercepts `apply_patch` run via its
    # shell tools.
    for name, args in (
            ("shell", {"command": ["apply_patch", patch]}),
            ("shell_command", {"command": "apply_patch <<'EOF'\n%s\nEOF" % patch}),
            ("exec_command", {"cmd": "apply_patch <<'EOF'\n%s\nEOF" % patch})):
        if name in tools:
            return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:16],
                    "status": "completed", "call_id": call_id,
                    "name": name, "arguments": json.dumps(args)}
    return None


OPENAI_LAST_TOOLS = {}


def openai_usage():
    return {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15}


def openai_responses(body):
    OPENAI_LAST_TOOLS["tools"] = openai_tools(body)
    resp_id = "resp_" + uuid.uuid4().hex[:24]
    model = body.get("model") or "gpt-5"
    item = None
    if ARGS.write_path is not None and not openai_has_tool_output(body):
        item = openai_tool_call_item()
    if item is None:
        msg_id = "msg_" + uuid.uuid4().hex[:24]
        item = {"type": "message", "id": msg_id, "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": FINAL_TEXT,
                             "annotations": []}]}
    base = {"id": resp_id, "object": "response", "created_at": int(time.time()),
            "model": model, "status": "in_progress", "output": []}
    if not body.get("stream"):
        done = dict(base, status="completed", output=[item], usage=openai_usage())
        return 200, "application/json", json.dumps(done)
    seq = [0]

    def ev(typ, **kw):
        d = {"type": typ, "sequence_number": seq[0]}
        d.update(kw)
        seq[0] += 1
        return sse(typ, d)

    out = ev("response.created", response=base)
    out += ev("response.in_progress", response=base)
    if item["type"] == "message":
        added = dict(item, status="in_progress", content=[])
        out += ev("response.output_item.added", output_index=0, item=added)
        out += ev("response.content_part.added", output_index=0, item_id=item["id"],
                  content_index=0,
                  part={"type": "output_text", "text": "", "annotations": []})
        out += ev("response.output_text.delta", output_index=0, item_id=item["id"],
                  content_index=0, delta=FINAL_TEXT)
        out += ev("response.output_text.done", output_index=0, item_id=item["id"],
                  content_index=0, text=FINAL_TEXT)
        out += ev("response.content_part.done", output_index=0, item_id=item["id"],
                  content_index=0, part=item["content"][0])
    else:
        added = dict(item, status="in_progress")
        if "arguments" in added:
            added["arguments"] = ""
        if "input" in added:
            added["input"] = ""
        out += ev("response.output_item.added", output_index=0, item=added)
    out += ev("response.output_item.done", output_index=0, item=item)
    done = dict(base, status="completed", output=[item], usage=openai_usage())
    out += ev("response.completed", response=done)
    return 200, "text/event-stream", out


def openai_route(method, path, body, headers=None):
    p = path.split("?", 1)[0]
    if method == "POST" and p.endswith("/responses"):
        # A body that could not be decoded (e.g. zstd without the zstd tool):
        # answer as to a streaming first turn.
        return openai_responses(body if isinstance(body, dict) else {"stream": True})
    if p.endswith("/accounts/check"):
        # ChatGPT (subscription) mode: Codex's workspace routing discovery
        # (GET {chatgpt_base_url}/wham/accounts/check) must list the account id
        # it sent in ChatGPT-Account-Id.
        acct = (headers or {}).get("chatgpt-account-id") or "acct-fake"
        return 200, "application/json", json.dumps({"accounts": [{
            "id": acct, "plan_type": "pro",
            "workspace_backend_origin": "NO_CONSTRAINT",
            "account_routing_override": "NO_CONSTRAINT"}],
            "account_ordering": [acct], "default_account_id": acct})
    if method == "POST" and p.endswith("/mcp"):
        # ChatGPT mode: the apps MCP server ({chatgpt_base_url}/ps/mcp). A
        # JSON-RPC error keeps Codex going without apps.
        rid = body.get("id") if isinstance(body, dict) else None
        return 200, "application/json", json.dumps({
            "jsonrpc": "2.0", "id": rid,
            "error": {"code": -32601, "message": "fake: no apps"}})
    if p.endswith("/models"):
        return 200, "application/json", json.dumps({
            "object": "list",
            "data": [{"id": "gpt-5", "object": "model", "created": 0,
                      "owned_by": "openai"}],
            "models": []})
    return 200, "application/json", "{}"


# ---------------------------------------------------------------- gemini
def gemini_has_function_response(body):
    for c in body.get("contents") or []:
        for part in c.get("parts") or []:
            if isinstance(part, dict) and "functionResponse" in part:
                return True
    return False


def gemini_tool_names(body):
    names = []
    for t in body.get("tools") or []:
        for fd in t.get("functionDeclarations") or []:
            names.append(fd.get("name"))
    return names


def gemini_chunk(parts, finish=True):
    d = {"candidates": [{"content": {"role": "model", "parts": parts},
                         "index": 0}],
         "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                           "totalTokenCount": 15},
         "modelVersion": "gemini-2.5-pro",
         "responseId": uuid.uuid4().hex[:20]}
    if finish:
        d["candidates"][0]["finishReason"] = "STOP"
    return d


def schema_value(schema, name):
    """A small value that fits a (Gemini / JSON) schema."""
    if name == "next_speaker":
        return "user"
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    typ = str(schema.get("type", "object")).lower()
    if isinstance(schema.get("type"), list):
        typ = str(schema["type"][0]).lower()
    if typ == "object":
        props = schema.get("properties") or {}
        return {k: schema_value(v, k) for k, v in props.items()}
    if typ == "array":
        return []
    if typ in ("integer", "number"):
        return 1
    if typ == "boolean":
        return False
    return FINAL_TEXT


def gemini_route(method, path, body, headers=None):
    p = path.split("?", 1)[0]
    body = body or {}
    if p.endswith(":countTokens"):
        return 200, "application/json", json.dumps({"totalTokens": 100})
    if p.endswith(":embedContent") or p.endswith(":batchEmbedContents"):
        return 200, "application/json", json.dumps({"embedding": {"values": [0.0]}})
    if p.endswith(":generateContent") or p.endswith(":streamGenerateContent"):
        if (ARGS.write_path is not None and "write_file" in gemini_tool_names(body)
                and not gemini_has_function_response(body)):
            parts = [{"functionCall": {"name": "write_file", "args": {
                "file_path": ARGS.write_path, "content": file_content()}}}]
        elif body.get("generationConfig", {}).get("responseMimeType") == "application/json":
            # Internal JSON calls (model routing classifier, next-speaker check,
            # ...): an object that fits the requested schema and ends the loop.
            gc = body["generationConfig"]
            schema = gc.get("responseJsonSchema") or gc.get("responseSchema") or {}
            obj = schema_value(schema, "")
            if not isinstance(obj, dict):
                obj = {}
            obj.setdefault("next_speaker", "user")
            obj.setdefault("reasoning", FINAL_TEXT)
            parts = [{"text": json.dumps(obj)}]
        else:
            parts = [{"text": FINAL_TEXT}]
        chunk = gemini_chunk(parts)
        if p.endswith(":streamGenerateContent"):
            return 200, "text/event-stream", sse(None, chunk, with_event_line=False)
        return 200, "application/json", json.dumps(chunk)
    if p.endswith("/models") or "/models/" in p:
        return 200, "application/json", json.dumps({"models": []})
    return 200, "application/json", "{}"


ROUTES = {"anthropic": anthropic_route, "openai": openai_route, "gemini": gemini_route}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-api/1"

    def log_message(self, fmt, *args):  # keep stderr quiet
        pass

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            data = b""
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            return data
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def handle_any(self):
        raw = self.read_body()
        enc = (self.headers.get("Content-Encoding") or "").lower()
        note = None
        try:
            if enc == "gzip":
                raw = gzip.decompress(raw)
            elif enc == "deflate":
                raw = zlib.decompress(raw)
            elif enc == "zstd" and shutil.which("zstd"):
                # Codex compresses request bodies with zstd in ChatGPT mode
                # (feature enable_request_compression); stdlib has no zstd.
                raw = subprocess.run(["zstd", "-dc"], input=raw, check=True,
                                     capture_output=True).stdout
            elif enc:
                note = "undecoded content-encoding " + enc
        except Exception as e:  # noqa: BLE001
            note = "decode failed: %s" % e
        text = raw.decode("utf-8", "replace")
        parsed = None
        if text:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
        if self.headers.get("Upgrade", "").lower() == "websocket":
            # No websocket transport here: clients fall back to plain HTTP.
            status, ctype, out = 404, "application/json", '{"error":"no websocket"}'
        else:
            try:
                status, ctype, out = ROUTES[ARGS.flavor](
                    self.command, self.path, parsed,
                    {k.lower(): v for k, v in self.headers.items()})
            except Exception as e:  # noqa: BLE001
                status, ctype, out = 500, "application/json", json.dumps(
                    {"error": {"type": "fake_error", "message": repr(e)}})
        entry = {
            "time": time.time(), "method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "header_list": [[k, v] for k, v in self.headers.items()],
            "body": text, "json": parsed, "status": status,
        }
        if note:
            entry["note"] = note
        log_request(entry)
        data = out.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if ctype == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        if ARGS.flavor == "anthropic":
            self.send_header("request-id", "req_" + uuid.uuid4().hex[:24])
        if ARGS.flavor == "openai":
            self.send_header("x-request-id", uuid.uuid4().hex)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_any


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log", required=True)
    ap.add_argument("--flavor", required=True, choices=sorted(ROUTES))
    ap.add_argument("--write-path")
    ap.add_argument("--write-content", default="")
    ARGS = ap.parse_args()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(ARGS.cert, ARGS.key)
    ctx.set_alpn_protocols(["http/1.1"])
    httpd = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    httpd.daemon_threads = True
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    print("fake_api %s listening on https://%s:%d" % (ARGS.flavor, ARGS.host, ARGS.port),
          file=sys.stderr, flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
