#!/bin/bash
# scripts/ncu-loop-regions.py on the hand-made ncu source CSV beside this file must print
# expected.txt exactly; a file that is not ncu's source page is refused with exit code 2.
#   usage: check.sh SCRIPT DIR
set -u
out=$(python3 "$1" "$2/loop.csv" --top 3) || { echo "FAIL: ncu-loop-regions.py exited $?"; exit 1; }
if ! diff <(printf '%s\n' "$out") "$2/expected.txt"; then
    echo "FAIL: ncu-loop-regions.py output differs from expected.txt"
    exit 1
fi
python3 "$1" "$2/expected.txt" >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || { echo "FAIL: a file without ncu's columns gave exit $rc, not 2"; exit 1; }
echo "ncu-loop-regions: regions as expected; a foreign file refused"
