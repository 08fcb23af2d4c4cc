#!/bin/bash
# The official openai npm SDK against `easel server --api-key` on the demo model (baseURL and the
# key are all that change): models.list, images.generate (b64_json, n=2, url), images.edit with an
# RGBA mask and without, its error classes (tests/server/openai.mjs); the API key is needed on
# API routes only. Usage: server_openai.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
start_server 40200 "$tmp/state" --api-key sk-easel-test || exit 1
node "$node_tests/openai.mjs" "$url" sk-easel-test || fails=$((fails + 1))
# the page is served without the key; an API route without it is 401 with a JSON body
page=$(node -e "fetch('$url/').then(r => r.text().then(t => console.log(r.status, t.includes('<title>easel</title>'))))")
if [ "$page" = "200 true" ]; then echo "ok   the page needs no key"; else echo "FAIL the page: $page"; fails=$((fails + 1)); fi
unauth=$(node -e "fetch('$url/sdapi/v1/samplers').then(r => r.json().then(j => console.log(r.status, j.error)))")
if [ "$unauth" = "401 HTTPException" ]; then echo "ok   an API route without the key: 401"; else echo "FAIL without the key: $unauth"; fails=$((fails + 1)); fi
stop_server TERM || { echo "FAIL SIGTERM exit status"; fails=$((fails + 1)); }
exit $((fails > 0))
