#!/usr/bin/env bash
# The dependencies of a Windows cross-build with Debian's MinGW-w64 toolchain, in a prefix that
# cmake/mingw-deps.cmake reads (default build-win/deps). Idempotent: a finished prefix is kept.
#
#   - header-only libraries: copied from Debian's -dev packages (nlohmann-json3-dev, libcli11-dev,
#     libstb-dev, libfmt-dev used header-only, libxxhash-dev inlined, libcpp-httplib-dev);
#   - zlib: Debian's libz-mingw-w64-dev (nothing to build);
#   - libpng and sentencepiece: built from Debian's source packages (apt-get source, through a
#     deb-src entry this script adds), the upstream tarball checked against the SHA-256 pinned
#     below (Debian's own patches come with the package, verified by apt's signed index).
#
# Options (environment): EASEL_WIN_DEPS (the prefix), EASEL_SKIP_APT=1 (install no packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
prefix="${EASEL_WIN_DEPS:-$root/build-win/deps}"
src="$(dirname "$prefix")/deps-src"

# package, upstream version, SHA-256 of its .orig.tar.gz
PINS=(
  "libpng1.6 1.6.39 a00e9d2f2f664186e4202db9299397f851aea71b36a35e74910b8820e380d441"
  "sentencepiece 0.1.97 56430381f45dc6debfd2e0cbde4f039f9499c49ca825af184b0cbf318c17a18f"
)
STAMP="$prefix/.easel-win-deps-v1"

WIN_PACKAGES=(patch g++-mingw-w64-x86-64-posix gcc-mingw-w64-x86-64-posix binutils-mingw-w64-x86-64 libz-mingw-w64-dev
  dpkg-dev cmake nlohmann-json3-dev libcli11-dev libstb-dev libfmt-dev libxxhash-dev libcpp-httplib-dev)
apt_ready=0
install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${EASEL_SKIP_APT:-0}" = "1" ]; then
    echo "fetch-win-deps: missing packages ${missing[*]} (EASEL_SKIP_APT=1: not installing)" >&2
    exit 1
  fi
  echo "fetch-win-deps: installing ${missing[*]}"
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  [ $apt_ready = 1 ] || { $SUDO apt-get update -qq; apt_ready=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
install_packages "${WIN_PACKAGES[@]}"

if [ -f "$STAMP" ]; then
  echo "fetch-win-deps: $prefix is complete"
  exit 0
fi

# Debian's source packages: a deb-src entry for the release this machine runs.
if ! apt-get source --print-uris libpng1.6 >/dev/null 2>&1; then
  codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "fetch-win-deps: adding a deb-src entry for $codename"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$codename" | $SUDO tee /etc/apt/sources.list.d/easel-src.sources >/dev/null
  $SUDO apt-get update -qq
fi

rm -rf "$prefix"
mkdir -p "$prefix/include" "$prefix/lib" "$src"

# header-only libraries
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/fmt /usr/include/stb "$prefix/include/"
cp /usr/include/xxhash.h /usr/include/httplib.h "$prefix/include/"

toolchain="$root/cmake/mingw-w64-x86_64.cmake"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
jobs="$(nproc 2>/dev/null || echo 2)"

fetch_source() {  # package version sha256 -> prints the unpacked folder
  local pkg=$1 ver=$2 sum=$3
  (cd "$src" && rm -rf "$pkg"-* && apt-get source -qq "$pkg" >/dev/null 2>&1) || {
    echo "fetch-win-deps: apt-get source $pkg failed (is a deb-src entry reachable?)" >&2
    exit 1
  }
  local tar="$src/${pkg}_${ver}.orig.tar.gz"
  [ -f "$tar" ] || { echo "fetch-win-deps: Debian's $pkg is no longer upstream version $ver: update the pin in $0" >&2; exit 1; }
  echo "$sum  $tar" | sha256sum -c --quiet - >&2 || { echo "fetch-win-deps: $tar does not match its pinned SHA-256" >&2; exit 1; }
  local dir
  dir="$(find "$src" -maxdepth 1 -type d -name "${pkg}-${ver}*" | head -1)"
  [ -d "$dir" ] || { echo "fetch-win-deps: no unpacked source of $pkg in $src" >&2; exit 1; }
  echo "$dir"
}

# libpng (static), with Debian's zlib for MinGW
read -r pkg ver sum <<<"${PINS[0]}"
dir="$(fetch_source "$pkg" "$ver" "$sum")"
cmake -S "$dir" -B "$src/build-libpng" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DEASEL_WIN_DEPS="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DPNG_SHARED=OFF -DPNG_STATIC=ON -DPNG_TESTS=OFF -DPNG_EXECUTABLES=OFF -DSKIP_INSTALL_PROGRAMS=ON \
  -DSKIP_INSTALL_FILES=ON "${launcher[@]}" >/dev/null
cmake --build "$src/build-libpng" -j "$jobs" --target png_static >/dev/null
cp "$src"/build-libpng/libpng16.a "$prefix/lib/"
cp "$dir"/png.h "$dir"/pngconf.h "$src"/build-libpng/pnglibconf.h "$prefix/include/"

# sentencepiece: only its static library target is built (its bundled protobuf-lite inside)
read -r pkg ver sum <<<"${PINS[1]}"
dir="$(fetch_source "$pkg" "$ver" "$sum")"
# Debian builds only the shared library (its patch disable-static-library.patch); undo that patch
patch -s -R -p1 -d "$dir" < "$dir/debian/patches/disable-static-library.patch"
cmake -S "$dir" -B "$src/build-sentencepiece" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DEASEL_WIN_DEPS="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DSPM_ENABLE_SHARED=OFF -DSPM_ENABLE_TCMALLOC=OFF -DSPM_BUILD_TEST=OFF "${launcher[@]}" >/dev/null
cmake --build "$src/build-sentencepiece" -j "$jobs" --target sentencepiece-static >/dev/null
cp "$src"/build-sentencepiece/src/libsentencepiece.a "$prefix/lib/"
cp "$dir"/src/sentencepiece_processor.h "$prefix/include/"

touch "$STAMP"
echo "fetch-win-deps: built $prefix"
