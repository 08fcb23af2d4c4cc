#!/bin/bash
# Bad values of `easel` flags (tests from the tryout report, /work/notes/tryout_report.md) are
# refused up front, before any model is opened: one stderr line naming the flag, a failing exit
# status, no output file, and nothing replaced. Usage: bad_input.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0

# expect_refused NAME PATTERN CMD ARGS...: a failing exit status that is not a crash (1..127), stderr holds PATTERN,
# no stage ran (no "stage " line), no out.png.
expect_refused() {
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$(timeout 60 "$easel" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -lt 1 ] || [ "$rc" -gt 127 ] || [[ "$err" != *"$pattern"* ]] || [[ "$err" == *"stage "* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

# F1: -t above GGML_MAX_N_THREADS (512) segfaulted (100000) or hung (4096) inside ggml
for cmd in generate plan denoise; do
  expect_refused "$cmd -t 100000" "above ggml's maximum of 512" $cmd -m "$sd" -p x --steps 1 -W 64 -H 64 -t 100000 -o "$tmp/out.png"
done
expect_refused "generate -t 4096" "above ggml's maximum of 512" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 4096 -o "$tmp/out.png"
expect_refused "generate -t 2^63" "above ggml's maximum of 512" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 99999999999999999999 -o "$tmp/out.png"
expect_refused "rpc-server -t 100000" "above ggml's maximum of 512" rpc-server --port 62000 -t 100000

[ "$fails" -eq 0 ] && echo "all bad input checks passed" || echo "$fails bad input checks failed"
[ "$fails" -eq 0 ]
