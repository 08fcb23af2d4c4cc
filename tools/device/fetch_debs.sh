#!/usr/bin/env bash
# Downloads (on this Debian 12 machine) the Debian packages an easel build needs, into .carry/debs,
# for the GPU machine: its image has nvcc, cmake, ninja and g++ but not these libraries, and it
# cannot download anything. build_cuda.sh unpacks them under /tmp/deps there (never into /).
# Usage (repo root): tools/device/fetch_debs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/debs
cd .carry/debs
apt-get download \
  libstb-dev libstb0 libpng-dev libpng16-16 zlib1g-dev zlib1g nlohmann-json3-dev libcpp-httplib-dev libcpp-httplib0.11 \
  libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libxxhash-dev libxxhash0 libssl-dev libssl3 \
  libsqlite3-dev libsqlite3-0 libsentencepiece-dev libsentencepiece0 libprotobuf-lite32 libgtest-dev libgmock-dev \
  libbrotli-dev libbrotli1 pkgconf pkgconf-bin libpkgconf3 2>&1 | grep -v "^Get:\|unsandboxed" || true
du -sh .
