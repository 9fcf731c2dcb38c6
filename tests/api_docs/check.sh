#!/bin/bash
# Every function the public headers declare (SA_API) is named somewhere in docs/ or the README,
# so a new entry point cannot land without its reference text.
#   usage: check.sh SOURCE_ROOT
set -u
root=$1
names=$(grep -ho 'SA_API [^;(]*(' "$root"/include/*.h | sed 's/.*[ *]\([a-z_0-9]*\)($/\1/' | sort -u)
n=$(wc -w <<<"$names")
[ "$n" -gt 50 ] || { echo "FAIL: found only $n SA_API declarations: the pattern is broken"; exit 1; }
missing=0
for f in $names; do
    if ! grep -q -w -- "$f" "$root"/docs/*.md "$root"/README.md; then
        echo "FAIL: $f (declared in include/) is named in no page of docs/ nor in README.md"
        missing=1
    fi
done
[ $missing -eq 0 ] && echo "api docs: all $n public functions are named in the docs"
exit $missing
