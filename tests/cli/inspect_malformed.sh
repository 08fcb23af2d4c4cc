#!/bin/bash
# Every file of tests/data/malformed must make `easel inspect FILE` exit 1 with exactly one line
# on stderr, starting "error: ", and no crash. Usage: inspect_malformed.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
fails=0
n=0
for f in "$data"/malformed/*; do
  n=$((n + 1))
  err=$("$easel" inspect "$f" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | wc -l)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]]; then
    echo "FAIL: $(basename "$f"): exit $rc, stderr ($lines lines): $err"
    fails=$((fails + 1))
  fi
done
echo "$n files, $fails failures"
[ "$n" -gt 0 ] && [ "$fails" -eq 0 ]
