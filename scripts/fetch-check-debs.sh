#!/bin/sh
# Run here (a Debian machine with apt): download Check and libsubunit as .deb files into the
# git-ignored folder .deps/debs, which travels to the GPU machine (carry: .deps).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
if ! apt-get download check libsubunit-dev libsubunit0 2>/dev/null; then
    apt-get update -qq
    apt-get download check libsubunit-dev libsubunit0
fi
ls -1 "$PWD"
