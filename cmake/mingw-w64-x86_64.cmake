# Cross-compiling easel for 64-bit Windows with Debian's MinGW-w64 toolchain
# (packages g++-mingw-w64-x86-64-posix, gcc-mingw-w64-x86-64-posix; scripts/test-windows.sh
# installs them). The posix thread model is needed: GCC 12's win32 model has no std::thread.
#
#   cmake -S . -B build-win -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
#         -DEASEL_WIN_DEPS=$PWD/build-win/deps
#
# EASEL_WIN_DEPS is the prefix scripts/fetch-win-deps.sh fills (libpng, sentencepiece built from
# Debian's sources, and copies of the header-only libraries); cmake/mingw-deps.cmake reads it.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(EASEL_MINGW_TRIPLE x86_64-w64-mingw32)

find_program(EASEL_MINGW_CC ${EASEL_MINGW_TRIPLE}-gcc-posix REQUIRED)
find_program(EASEL_MINGW_CXX ${EASEL_MINGW_TRIPLE}-g++-posix REQUIRED)
set(CMAKE_C_COMPILER ${EASEL_MINGW_CC})
set(CMAKE_CXX_COMPILER ${EASEL_MINGW_CXX})
set(CMAKE_RC_COMPILER ${EASEL_MINGW_TRIPLE}-windres)

set(CMAKE_FIND_ROOT_PATH /usr/${EASEL_MINGW_TRIPLE} ${EASEL_WIN_DEPS})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The pieces of Debian's zlib for MinGW (libz-mingw-w64-dev) and our prefix: static libraries.
set(CMAKE_FIND_LIBRARY_SUFFIXES .a)

# One self-contained easel.exe: libstdc++, libgcc, winpthread and libgomp linked in, so that it
# runs on a Windows (or Wine) without MinGW's DLLs beside it.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static -static-libgcc -static-libstdc++")
# the settings above reach try_compile projects too
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES EASEL_WIN_DEPS)
