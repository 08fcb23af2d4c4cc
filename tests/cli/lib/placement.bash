# Sourced by the placement CLI tests (tests/cli/placement_vae.sh, placement_vae_encode.sh,
# placement_taesd.sh; this folder is not globbed as tests), after lib/rpc.bash's start_rpc_pair
# ($tmp, $rpc, fails). The caller sets $easel and the array job (the generate flags of the run).
#
# require_different A B WHY: the PNGs A and B differ, else one line "FAIL WHY" and exit 1 (the
# checks that compare a placed run with A would not tell it from B).
require_different() {
  if cmp -s "$1" "$2"; then
    echo "FAIL $3"
    exit 1
  fi
}

# generate_same_png NAME REFERENCE FLAGS...: `$easel generate "${job[@]}" $rpc FLAGS...` writes
# $tmp/out.png (its output in $tmp/out.log) equal byte for byte to the PNG REFERENCE; else one
# FAIL line naming NAME (the run's first error line, or that the image differs from REFERENCE's
# run, named by $plain_run, default "the plain CPU run"), fails incremented, status 1.
generate_same_png() {
  local name="$1" ref="$2"
  shift 2
  if ! "$easel" generate "${job[@]}" $rpc "$@" -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
    echo "FAIL $name: $(grep -i error "$tmp/out.log" | head -1)"
    fails=$((fails + 1))
    return 1
  fi
  if ! cmp -s "$ref" "$tmp/out.png"; then
    echo "FAIL $name: image differs from ${plain_run:-the plain CPU run}"
    fails=$((fails + 1))
    return 1
  fi
}

# cap_at NEED FRACTION: $cap, FRACTION x NEED (MiB, 3 decimals), and $capg, the same cap in GiB
# as --max-vram takes it (7 decimals).
cap_at() {
  cap=$(awk -v n="$1" -v f="$2" 'BEGIN { printf "%.3f", n * f }')
  capg=$(awk -v c="$cap" 'BEGIN { printf "%.7f", c / 1024 }')
}

# peak_rows LOG STAGE DEVICES [measured]: the rows "DEVICE PREDICTED MEASURED" (MiB) of the table
# easel prints after the STAGE ("decode" or "image encode": "placement: peak bytes per device
# after the STAGE, ...") in LOG, for the devices whose name matches the awk regex DEVICES; with
# `measured`, only the rows with a measured peak (a device the plan uses but no stage has run on
# yet shows "-").
peak_rows() {
  local log="$1" stage="$2" devices="$3" only_measured="${4:-}"
  sed -n "/after the $stage/,/^\$/p" "$log" |
    awk -v re="$devices" -v m="$only_measured" '$1 ~ re && NF == 3 && (m != "measured" || $3 != "-") { print $1, $2, $3 }'
}

# check_peaks LOG STAGE DEVICES CAP NAME [measured]: the rows of peak_rows LOG STAGE DEVICES
# [measured]: at least one, each one's measured peak within 10% of the prediction and, unless CAP
# (MiB) is "-", not above CAP (a row without a measurement fails unless `measured` left it out);
# prints one "ok   NAME: DEVICE measured/predicted MiB ..." line or one FAIL line, status 1 on FAIL.
check_peaks() {
  local log="$1" stage="$2" devices="$3" cap="$4" name="$5" rows bad
  rows=$(peak_rows "$log" "$stage" "$devices" "${6:-}")
  if [ -z "$rows" ]; then
    echo "FAIL $name: no measured peak printed for a device matching $devices after the $stage"
    return 1
  fi
  bad=$(printf '%s\n' "$rows" | awk -v cap="$cap" '{
      if ($3 > $2 * 1.10 || $3 < $2 * 0.90) print "measured " $3 " MiB vs predicted " $2 " MiB on " $1;
      else if (cap != "-" && $3 > cap) print "measured " $3 " MiB above the cap " cap " MiB on " $1 }')
  if [ -n "$bad" ]; then
    echo "FAIL $name: $bad"
    return 1
  fi
  echo "ok   $name: $(printf '%s\n' "$rows" | awk '{ printf "%s %s/%s MiB  ", $1, $3, $2 }')"
}
