# The libraries of a MinGW-w64 cross-build (cmake/mingw-w64-x86_64.cmake), from the prefix
# EASEL_WIN_DEPS that scripts/fetch-win-deps.sh fills:
#   include/  copies of Debian's header-only libraries (nlohmann-json, CLI11, stb, fmt used in
#             its header-only mode, xxhash inlined, cpp-httplib), and the headers of
#   lib/      libpng16.a and libsentencepiece.a built from Debian's source packages;
# zlib is Debian's libz-mingw-w64-dev (/usr/x86_64-w64-mingw32). Defines the same targets as
# the native find_package calls of the top-level CMakeLists.txt.
if(NOT EASEL_WIN_DEPS OR NOT EXISTS "${EASEL_WIN_DEPS}/include/nlohmann/json.hpp")
  message(FATAL_ERROR "easel: EASEL_WIN_DEPS (${EASEL_WIN_DEPS}) holds no dependencies: run scripts/fetch-win-deps.sh first")
endif()
set(_inc "${EASEL_WIN_DEPS}/include")

add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_inc}")
add_library(CLI11::CLI11 INTERFACE IMPORTED)
set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_inc}")
# fmt in its header-only mode (Debian's libfmt-dev ships format-inl.h)
add_library(fmt::fmt INTERFACE IMPORTED)
set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_inc}" INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
set(STB_INCLUDE_DIR "${_inc}/stb")

find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PNG REQUIRED)

# xxhash inlined (XXH_INLINE_ALL): the whole library is in xxhash.h, nothing to link
set(XXHASH_INCLUDE_DIR "${_inc}" CACHE PATH "" FORCE)
set(XXHASH_LIBRARY "" CACHE STRING "" FORCE)
set(EASEL_XXHASH_DEFINITIONS XXH_INLINE_ALL=1)
