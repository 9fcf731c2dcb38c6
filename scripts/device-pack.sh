# Sourced by the device scripts (device-gpu-suite.sh, device-ab.sh, device-ncu.sh). The device
# tool brings back at most 8 files from its output folder $OUT; a run that wrote more (one log
# per sanitizer run, say) would lose the rest. On exit, when $OUT holds more than that, its
# files are packed into $OUT/logs.tar.gz (`tar -xzf logs.tar.gz` to read them). Without $OUT
# (logs in device-logs/) nothing changes. The script's exit status is kept.
SA_OUT_MAX_FILES=8
sa_pack_out() {
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
    [ "$(find "$OUT" -type f | wc -l)" -gt "$SA_OUT_MAX_FILES" ] || return 0
    # A second script in the same call packs beside the first one's archive, not over it.
    local name=logs.tar.gz n=2
    while [ -e "$OUT/$name" ]; do name=logs-$n.tar.gz; n=$((n + 1)); done
    (cd "$OUT" && find . -type f ! -name 'logs*.tar.gz' -print0 |
        tar -czf "$name" --null -T - --remove-files &&
        find . -mindepth 1 -type d -empty -delete) ||
        echo "device-pack.sh: could not pack $OUT (some logs may not come back)"
}
trap sa_pack_out EXIT
