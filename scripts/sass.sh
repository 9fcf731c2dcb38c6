#!/bin/bash
# The SASS of the library's kernels without a GPU machine: this machine's CUDA toolkit has nvcc
# and ptxas but no cuobjdump or nvdisasm. The first run downloads NVIDIA's cuobjdump and nvdisasm
# wheels from PyPI (pip download: nothing is installed) and keeps the two programs in the
# git-ignored folder .sass-tools (about 6 MB; not under .deps, which travels to the GPU machine).
# A cuobjdump already on the PATH (the GPU machine's) is used as it is.
#   bash scripts/sass.sh FILE [PATTERN]
# FILE: a library, program or cubin (e.g. build/libsparseattn.so). PATTERN (an awk regex):
# only the kernels whose mangled name matches, e.g. 'score_wgmmaILi2ELi0E'.
set -euo pipefail
usage='usage: bash scripts/sass.sh FILE [PATTERN]'
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
file=$1
pattern=${2:-.}
[ -f "$file" ] || { echo "sass.sh: no file $file" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/.sass-tools
if ! command -v cuobjdump >/dev/null; then
    if [ ! -x "$tools/bin/cuobjdump" ] || [ ! -x "$tools/bin/nvdisasm" ]; then
        echo "sass.sh: fetching cuobjdump and nvdisasm from PyPI into $tools" >&2
        mkdir -p "$tools/wheels" "$tools/bin"
        python3 -m pip download --quiet --no-deps -d "$tools/wheels" \
            nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2 ||
            { echo "sass.sh: pip download failed (PyPI reachable?)" >&2; exit 1; }
        for whl in "$tools"/wheels/*.whl; do
            python3 -m zipfile -e "$whl" "$tools/unpacked"
        done
        for exe in cuobjdump nvdisasm; do
            found=$(find "$tools/unpacked" -type f -name "$exe" | head -n 1)
            [ -n "$found" ] || { echo "sass.sh: no $exe in the wheels" >&2; exit 1; }
            install -m 755 "$found" "$tools/bin/$exe"
        done
        rm -rf "$tools/wheels" "$tools/unpacked"
    fi
    export PATH="$tools/bin:$PATH"
fi
# cuobjdump prints every kernel; keep those whose "Function :" line matches. A reader that
# stops early (head, awk ... exit) ends the pipe with SIGPIPE: not an error here.
status=0
cuobjdump -sass "$file" |
    awk -v pat="$pattern" '/Function :/ { keep = ($3 ~ pat); n += keep } keep
                           END { if (n == 0) exit 3 }' || status=$?
case $status in
0 | 141) ;;
3) echo "sass.sh: no kernel in $file matches '$pattern'" >&2; exit 1 ;;
*) exit "$status" ;;
esac
