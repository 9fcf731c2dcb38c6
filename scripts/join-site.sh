#!/bin/bash
# Run on the GPU machine, from the checkout, in EVERY run that carries a part: keeps the parts
# that came with this run in $parts (which lives as long as the machine stays up: about
# 30 s after a run), and once all of them are there unpacks the site to $site.
#   usage: source scripts/join-site.sh (a copy of ../shared/peers/join-site.sh)
# Afterwards: export PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages
# (the second entry is what the cutlass DSL's .pth file would add; PYTHONPATH runs no .pth files).
parts=${PEER_PARTS:-$HOME/peer-parts}
site=${PEER_SITE:-${TMPDIR:-/tmp}/site}  # the packed folder is named site: keep that last name
mkdir -p "$parts"
cp .peers/site.part* "$parts"/ 2>/dev/null
if [ -d $site/cudnn ]; then
    echo "peer site: already unpacked"
elif ls $parts/site.part* >/dev/null 2>&1 &&
     cat $parts/site.part* | xz -t 2>/dev/null; then
    cat $parts/site.part* | xz -d | tar x -C "$(dirname "$site")" && echo "peer site: unpacked to $site"
else
    echo "peer site: have $(ls $parts | tr '\n' ' '); carry the next part in the next run"
fi
export PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
