#!/usr/bin/env bash
# Gateway overhead, three rows in one run on loopback: the engine emulator
# directly, a bare httputil.ReverseProxy in front of it (the floor for any
# Go gateway), and kvgate serve in front of it. Needs wrk (apt-get install
# wrk). Load generator, proxy and engine share this machine's cores: the
# numbers are relative (ratios to the bare proxy), not absolute.
#
#   scripts/bench-gateway-overhead.sh [seconds per row, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
go build -o "$tmp/kvgate" ./cmd/kvgate
go build -o "$tmp/bareproxy" ./scripts/bareproxy
E=127.0.0.1:18001 B=127.0.0.1:18100 K=127.0.0.1:18200
"$tmp/kvgate" engine --port 18001 --model m --time-scale 1000 --max-num-seqs 4096 --max-num-batched-tokens 1000000 --http-max-conns 8192 --log-level error >"$tmp/engine.log" 2>&1 & pids+=($!)
"$tmp/bareproxy" --listen $B --target http://$E >"$tmp/bare.log" 2>&1 & pids+=($!)
"$tmp/kvgate" serve --listen $K --admin 127.0.0.1:18290 --engine url=http://$E,model=m \
  --tokenizer model=m,source=engine,url=http://$E --early-reject=false --log-level error >"$tmp/gw.log" 2>&1 & pids+=($!)
for u in $E/health $B/health $K/health; do
  for i in $(seq 50); do curl -sf "http://$u" >/dev/null && break; sleep 0.1; done
done

# wrk script: POST one of N bodies in turn (distinct prompts, so caches
# see distinct keys); bodies.lua is generated per row.
mkbodies() { # $1 = kind (small|chat4k), $2 = count
  python3 - "$1" "$2" >"$tmp/bodies.lua" <<'PY'
import json, sys, random
kind, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
words = ["alpha","bravo","charlie","delta","echo","foxtrot","golf","hotel","india","juliet"]
bodies = []
for i in range(n):
    if kind == "small":
        b = {"model": "m", "prompt": "hi %d" % i, "max_tokens": 1}
    else:  # about 4000 tokens of chat: a system prompt and a long user turn
        text = " ".join(random.choice(words) + str(random.randrange(1000)) for _ in range(2600))
        b = {"model": "m", "messages": [{"role": "system", "content": "You are helpful. Conversation %d." % i},
                                         {"role": "user", "content": text}], "max_tokens": 1}
    bodies.append(json.dumps(b))
print("bodies = {" + ",".join(json.dumps(b) for b in bodies) + "}")
print('''
i = 0
request = function()
  i = i % #bodies + 1
  local path = "/v1/completions"
  if string.find(bodies[i], '"messages"') then path = "/v1/chat/completions" end
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, bodies[i])
end''')
PY
}

row() { # $1 label, $2 host:port, $3 connections
  out=$(wrk -t2 -c"$3" -d"${DUR}s" --latency -s "$tmp/bodies.lua" "http://$2" 2>&1)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  errs=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
  printf "%-26s %10s %10s %10s  %s\n" "$1" "$rps" "$p50" "$p99" "$errs"
}

echo "# small requests (prompt 'hi N', max_tokens 1), 16 connections, ${DUR}s per row"
printf "%-26s %10s %10s %10s\n" "row" "req/s" "p50" "p99"
mkbodies small 64
for r in "engine directly:$E" "bare ReverseProxy:$B" "kvgate serve:$K"; do row "${r%%:*}" "${r#*:}" 16; done

echo
echo "# ~4000-token chat prompts (64 distinct, tokenizer cache warmed), 4 connections, ${DUR}s per row"
printf "%-26s %10s %10s %10s\n" "row" "req/s" "p50" "p99"
mkbodies chat4k 64
wrk -t1 -c4 -d3s -s "$tmp/bodies.lua" "http://$K" >/dev/null 2>&1 # warm kvgate's tokenizer cache
for r in "engine directly:$E" "bare ReverseProxy:$B" "kvgate serve:$K"; do row "${r%%:*}" "${r#*:}" 4; done
