#!/bin/bash
# scripts/where-things-stand.py on the hand-made JSON inputs beside this file must print
# expected.md exactly (the README's table generator, without a GPU).
#   usage: check.sh SCRIPT DIR
set -u
out=$(python3 "$1" --peers "$2/peers.json" --causal "$2/causal.json" --bench "$2/bench.jsonl") ||
    { echo "FAIL: where-things-stand.py exited $?"; exit 1; }
if ! diff <(printf '%s\n' "$out") "$2/expected.md"; then
    echo "FAIL: where-things-stand.py output differs from expected.md"
    exit 1
fi
echo "where-things-stand: table as expected"
