#!/usr/bin/env bash
# Replays issue 14's network attacks against a running engine emulator, a
# kvindex event subscriber (dialing the engine, plus a bound central SUB)
# with its admin API, and the gateway in front of two engines, all on
# 127.0.0.1 in one test process; after every phase it checks that they
# survived, that memory stayed within the stated bounds, and that a normal
# request (and a kvindex lookup) still succeeds. Phases, bounds and the
# numbers measured: docs/attacks.md. Takes a few minutes; needs 8192 file
# descriptors. Extra arguments go to go test (e.g. -run 'ZMQAttacks/storm').
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec go test -tags attack -run 'Attack' -v -timeout 15m ./internal/e2e/ "$@"
