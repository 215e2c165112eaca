#!/usr/bin/env bash
# Run the real coding-agent CLIs against the local HTTPS fakes of their APIs.
#
#   tests/agents/try.sh [PREFIX]
#
# PREFIX is an npm global prefix holding the CLIs, made e.g. with
#   npm install -g --prefix /tmp/agents-prefix @anthropic-ai/claude-code @openai/codex @google/gemini-cli
# (default /tmp/agents-prefix). AGENT_CASES picks cases (default: all of
#   claude codex gemini claude-oauth codex-chatgpt; cases whose CLI is absent are skipped).
#
# For each case: a throwaway HOME and project dir, fake_api.py on a free port
# with a throwaway CA, the CLI run non-interactively; then checks that the file
# was written by the agent's own tool with the exact content, that the fake saw
# the expected credential header, and that nothing else was contacted (every
# CLI runs with HTTPS_PROXY pointing at signin_probe.py, which records what
# would have left the machine).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${1:-/tmp/agents-prefix}
CASES=${AGENT_CASES:-"claude codex gemini claude-oauth codex-chatgpt"}
BIN=$PREFIX/bin
TIMEOUT=${AGENT_TIMEOUT:-240}

WORK=$(mktemp -d /tmp/agents-try.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
echo "work dir: $WORK"

# ---- throwaway CA and a certificate for localhost / 127.0.0.1
cd "$WORK" || exit 1
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
    -subj "/CN=stockade agents test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null || exit 1
openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj "/CN=localhost" 2>/dev/null || exit 1
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > srv.ext
openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem \
    -days 2 -extfile srv.ext 2>/dev/null || exit 1

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() {
    for _ in $(seq 1 50); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),1)" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# ---- recorder for anything that would leave the machine
PROBE_PORT=$(free_port)
python3 "$HERE/signin_probe.py" --port "$PROBE_PORT" --ca ca.pem --ca-key ca.key \
    --log "$WORK/outside.log" > "$WORK/probe.err" 2>&1 &
PIDS+=($!)
wait_port "$PROBE_PORT" || { echo "probe did not start"; exit 1; }
PROXY_ENV=(HTTPS_PROXY=http://127.0.0.1:$PROBE_PORT HTTP_PROXY=http://127.0.0.1:$PROBE_PORT
           https_proxy=http://127.0.0.1:$PROBE_PORT http_proxy=http://127.0.0.1:$PROBE_PORT
           NO_PROXY=localhost,127.0.0.1 no_proxy=localhost,127.0.0.1)

CONTENT=$'hello from the fake API\nsecond line\n'
PASSED=0
FAILED=0
SKIPPED=0

b64url() { python3 -c 'import base64,sys; print(base64.urlsafe_b64encode(sys.stdin.buffer.read()).rstrip(b"=").decode())'; }
fake_jwt() { # $1 = payload JSON
    printf '%s.%s.%s' "$(printf '{"alg":"none","typ":"JWT"}' | b64url)" "$(printf '%s' "$1" | b64url)" "$(printf 'sig' | b64url)"
}

# check CASE DIR LOG HEADER VALUE
check() {
    local name=$1 dir=$2 log=$3 header=$4 want=$5 ok=1
    if [ ! -f "$dir/hello.txt" ]; then
        echo "  FAIL: $dir/hello.txt was not written"; ok=0
    elif [ "$(cat "$dir/hello.txt"; echo x)" != "${CONTENT}x" ]; then
        echo "  FAIL: content differs:"; od -c "$dir/hello.txt" | head -5; ok=0
    else
        echo "  ok: file written with the expected content"
    fi
    if python3 - "$log" "$header" "$want" <<'EOF'
import json, sys
log, header, want = sys.argv[1:]
seen = set()
for line in open(log):
    e = json.loads(line)
    v = e["headers"].get(header)
    if v is not None:
        seen.add(v)
sys.exit(0 if want in seen else 1)
EOF
    then
        echo "  ok: fake saw $header: $want"
    else
        echo "  FAIL: fake never saw $header: $want"; ok=0
    fi
    if [ "$ok" = 1 ]; then PASSED=$((PASSED + 1)); echo "PASS $name"; else FAILED=$((FAILED + 1)); echo "FAIL $name"; fi
}

# outside CASE: print what the CLI tried to reach beyond the fake; $2=strict fails the case
outside() {
    local name=$1 strict=$2 n
    n=$(grep -c . "$WORK/outside.log" 2>/dev/null || true)
    n=${n:-0}
    if [ "$n" != 0 ]; then
        echo "  outside contacts of $name:"
        python3 -c '
import json,sys
for l in open(sys.argv[1]):
    e=json.loads(l); print("   ", e.get("host"), e.get("method"), e.get("path") or e.get("plain") or e.get("tls_error"))
' "$WORK/outside.log"
        if [ "$strict" = strict ]; then
            echo "  FAIL: $name reached outside the fake"; PASSED=$((PASSED - 1)); FAILED=$((FAILED + 1))
        fi
    else
        echo "  ok: nothing contacted besides the fake"
    fi
    mv "$WORK/outside.log" "$WORK/outside.$name.log" 2>/dev/null
}

# start_fake CASE FLAVOR DIR -> sets PORT, LOG
start_fake() {
    PORT=$(free_port)
    LOG=$WORK/$1.requests.jsonl
    python3 "$HERE/fake_api.py" --cert srv.pem --key srv.key --port "$PORT" --log "$LOG" \
        --flavor "$2" --write-path "$3/hello.txt" --write-content "$CONTENT" \
        > "$WORK/$1.fake.err" 2>&1 &
    FAKE_PID=$!
    PIDS+=($FAKE_PID)
    wait_port "$PORT" || echo "  fake for $1 did not start"
}
stop_fake() { kill "$FAKE_PID" 2>/dev/null; wait "$FAKE_PID" 2>/dev/null; }

newcase() { # CASE -> sets H (home), P (project dir)
    H=$WORK/$1.home; P=$WORK/$1.proj
    mkdir -p "$H" "$P"
    echo "== $1"
}

claude_env() {
    echo HOME="$H" NODE_EXTRA_CA_CERTS="$WORK/ca.pem" \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
        ANTHROPIC_BASE_URL="https://localhost:$PORT"
}

for c in $CASES; do
    case $c in
    claude|claude-oauth) exe=$BIN/claude ;;
    codex|codex-chatgpt) exe=$BIN/codex ;;
    gemini) exe=$BIN/gemini ;;
    *) echo "unknown case $c"; FAILED=$((FAILED + 1)); continue ;;
    esac
    if [ ! -x "$exe" ]; then echo "== $c: SKIP ($exe missing)"; SKIPPED=$((SKIPPED + 1)); continue; fi
    newcase "$c"
    case $c in
    claude)
        start_fake "$c" anthropic "$P"
        echo '{"hasCompletedOnboarding":true}' > "$H/.claude.json"
        (cd "$P" && env "${PROXY_ENV[@]}" $(claude_env) ANTHROPIC_API_KEY=sk-ant-api03-fake-key-0001 \
            timeout "$TIMEOUT" "$exe" -p "Create hello.txt" --permission-mode acceptEdits \
            < /dev/null > "$WORK/$c.out" 2>&1)
        echo "  exit $?; output: $(tr '\n' ' ' < "$WORK/$c.out" | cut -c1-200)"
        stop_fake
        check "$c" "$P" "$LOG" x-api-key sk-ant-api03-fake-key-0001
        outside "$c" strict
        ;;
    claude-oauth)
        # Subscription sign-in (Claude Pro/Max): ~/.claude/.credentials.json.
        start_fake "$c" anthropic "$P"
        echo '{"hasCompletedOnboarding":true}' > "$H/.claude.json"
        mkdir -p "$H/.claude"
        exp=$(( ($(date +%s) + 3600) * 1000 ))
        printf '{"claudeAiOauth":{"accessToken":"sk-ant-oat01-fake-access","refreshToken":"sk-ant-ort01-fake-refresh","expiresAt":%s,"scopes":["user:inference","user:profile","user:sessions:claude_code"],"subscriptionType":"max","rateLimitTier":"default_claude_max_20x"}}\n' \
            "$exp" > "$H/.claude/.credentials.json"
        chmod 600 "$H/.claude/.credentials.json"
        (cd "$P" && env "${PROXY_ENV[@]}" $(claude_env) \
            timeout "$TIMEOUT" "$exe" -p "Create hello.txt" --permission-mode acceptEdits \
            < /dev/null > "$WORK/$c.out" 2>&1)
        echo "  exit $?; output: $(tr '\n' ' ' < "$WORK/$c.out" | cut -c1-200)"
        stop_fake
        check "$c" "$P" "$LOG" authorization "Bearer sk-ant-oat01-fake-access"
        if grep -q 'oauth-2025-04-20' "$LOG"; then echo "  ok: anthropic-beta carries oauth-2025-04-20"; fi
        # Known: GET /api/oauth/profile still goes to api.anthropic.com.
        outside "$c" lenient
        ;;
    codex)
        start_fake "$c" openai "$P"
        (cd "$P" && env "${PROXY_ENV[@]}" HOME="$H" SSL_CERT_FILE="$WORK/ca.pem" \
            FAKE_OPENAI_KEY=sk-proj-fake-key-0002 \
            timeout "$TIMEOUT" "$exe" exec --skip-git-repo-check -s workspace-write \
            -m gpt-5.5 \
            -c model_provider=fake \
            -c model_providers.fake.name='"fake"' \
            -c model_providers.fake.base_url="\"https://localhost:$PORT/v1\"" \
            -c model_providers.fake.env_key='"FAKE_OPENAI_KEY"' \
            -c model_providers.fake.wire_api='"responses"' \
            -c analytics.enabled=false -c check_for_update_on_startup=false \
            --disable plugins \
            "Create hello.txt" < /dev/null > "$WORK/$c.out" 2>&1)
        echo "  exit $?; output: $(tr '\n' ' ' < "$WORK/$c.out" | tail -c 200)"
        stop_fake
        check "$c" "$P" "$LOG" authorization "Bearer sk-proj-fake-key-0002"
        if grep -q '"custom_tool_call_output"' "$LOG"; then echo "  ok: written by the apply_patch tool (custom_tool_call)"; fi
        outside "$c" strict
        ;;
    codex-chatgpt)
        # Subscription sign-in (ChatGPT plan): ~/.codex/auth.json, auth_mode chatgpt.
        start_fake "$c" openai "$P"
        mkdir -p "$H/.codex"
        exp=$(( $(date +%s) + 3600 ))
        claims='"https://api.openai.com/auth":{"chatgpt_account_id":"acct-fake-0003","chatgpt_plan_type":"pro","chatgpt_user_id":"user-fake-0003"}'
        idt=$(fake_jwt "{\"email\":\"fake@example.com\",\"exp\":$exp,$claims}")
        act=$(fake_jwt "{\"exp\":$exp,$claims}")
        printf '{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"%s","access_token":"%s","refresh_token":"rt-fake-0003","account_id":"acct-fake-0003"},"last_refresh":"%s"}\n' \
            "$idt" "$act" "$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)" > "$H/.codex/auth.json"
        chmod 600 "$H/.codex/auth.json"
        (cd "$P" && env "${PROXY_ENV[@]}" HOME="$H" SSL_CERT_FILE="$WORK/ca.pem" \
            timeout "$TIMEOUT" "$exe" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \
            -m gpt-5.5 \
            -c chatgpt_base_url="\"https://localhost:$PORT/backend-api\"" \
            -c openai_base_url="\"https://localhost:$PORT/backend-api/codex\"" \
            -c analytics.enabled=false -c check_for_update_on_startup=false \
            --disable plugins \
            "Create hello.txt" < /dev/null > "$WORK/$c.out" 2>&1)
        echo "  exit $?; output: $(tr '\n' ' ' < "$WORK/$c.out" | tail -c 200)"
        stop_fake
        check "$c" "$P" "$LOG" authorization "Bearer $act"
        if python3 -c 'import json,sys; sys.exit(0 if any(json.loads(l)["headers"].get("chatgpt-account-id")=="acct-fake-0003" for l in open(sys.argv[1])) else 1)' "$LOG"; then
            echo "  ok: chatgpt-account-id: acct-fake-0003 sent"
        fi
        outside "$c" strict
        ;;
    gemini)
        start_fake "$c" gemini "$P"
        mkdir -p "$H/.gemini"
        echo '{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false},"general":{"disableAutoUpdate":true,"disableUpdateNag":true}}' \
            > "$H/.gemini/settings.json"
        (cd "$P" && env "${PROXY_ENV[@]}" HOME="$H" NODE_EXTRA_CA_CERTS="$WORK/ca.pem" \
            GEMINI_CLI_TRUST_WORKSPACE=true \
            GOOGLE_GEMINI_BASE_URL="https://localhost:$PORT" GEMINI_API_KEY=fake-gemini-key-0004 \
            timeout "$TIMEOUT" "$exe" -p "Create hello.txt" --yolo \
            < /dev/null > "$WORK/$c.out" 2>&1)
        echo "  exit $?; output: $(tr '\n' ' ' < "$WORK/$c.out" | tail -c 200)"
        stop_fake
        check "$c" "$P" "$LOG" x-goog-api-key fake-gemini-key-0004
        outside "$c" strict
        ;;
    esac
done

for e in claude codex gemini; do
    [ -x "$BIN/$e" ] && echo "version $e: $(HOME=$WORK/version.home "$BIN/$e" --version 2>/dev/null | tail -1)"
done
echo "logs in $WORK"
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" = 0 ]
