# Sourced by the auto-fit CLI tests (tests/cli/autofit.sh, autofit_sweep.sh; this folder is not
# globbed as tests), after lib/rpc.bash's start_rpc_pair ($tmp, $rpc, fails). The caller sets
# $easel and the array job (the generate flags of the point).
#
# uncapped_need SIZE: `$easel plan "${job[@]}" $rpc --auto-fit` (its output in $tmp/need.log),
# no --max-vram: $need, the largest predicted peak (MiB) of an RPC0/RPC1 row of the plan's device
# table (the job's need on one device when the plan puts everything there); when there is none,
# one FAIL line naming SIZE (the plan's last line), fails incremented, status 1.
uncapped_need() {
  "$easel" plan "${job[@]}" $rpc --auto-fit >"$tmp/need.log" 2>&1
  need=$(awk '$1 ~ /^RPC[01]/ && NF == 2 && $2 > n { n = $2 } END { if (n) print n }' "$tmp/need.log")
  if [ -z "$need" ]; then
    echo "FAIL uncapped plan at $1: $(tail -1 "$tmp/need.log")"
    fails=$((fails + 1))
    return 1
  fi
}
