# Source this on the GPU machine (it has no Check and cannot install packages): unpacks the
# .deb files that scripts/fetch-check-debs.sh put in .deps/debs into .deps/prefix, points the
# .pc files there and exports PKG_CONFIG_PATH and LD_LIBRARY_PATH.
sa_root=$(cd "$(dirname "${BASH_SOURCE:-$0}")/.." && pwd)
sa_prefix="$sa_root/.deps/prefix"
if [ ! -d "$sa_prefix/usr" ]; then
    for deb in "$sa_root"/.deps/debs/*.deb; do
        dpkg -x "$deb" "$sa_prefix" || return 1
    done
fi
for pc in $(find "$sa_prefix" -name '*.pc'); do
    sed -i "s|^prefix=.*|prefix=$sa_prefix/usr|" "$pc"
done
sa_pcdir=$(dirname "$(find "$sa_prefix" -name check.pc | head -n 1)")
export PKG_CONFIG_PATH="$sa_pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$sa_pcdir/..${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
