# Compile and link options of easel's own targets (the library, the CLI, the tests, the
# benchmarks, the fuzz targets), never of ggml:
#  * warnings: -Wall -Wextra (-Wno-unused-parameter), and -Werror unless EASEL_WERROR is OFF;
#  * EASEL_SANITIZE: AddressSanitizer + UBSan (ggml stays uninstrumented: its kernels run at
#    full speed and its own undefined behaviour is not ours to report);
#  * EASEL_FUZZ: libFuzzer's coverage instrumentation (-fsanitize=fuzzer-no-link) on top, so the
#    fuzz targets (tests/fuzz) link the same library objects as the tests of this build.
if(MSVC)
  set(EASEL_WARNING_FLAGS /W3)
else()
  set(EASEL_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)
endif()
if(EASEL_WERROR AND NOT MSVC)
  list(APPEND EASEL_WARNING_FLAGS -Werror)
endif()
set(EASEL_SANITIZER_COMPILE_FLAGS "")
set(EASEL_SANITIZER_LINK_FLAGS "")
if(EASEL_SANITIZE OR EASEL_FUZZ)
  set(EASEL_SANITIZER_COMPILE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  set(EASEL_SANITIZER_LINK_FLAGS -fsanitize=address,undefined)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # line tables only: symbolised reports at a fraction of -g's compile and link time
    list(APPEND EASEL_SANITIZER_COMPILE_FLAGS -gline-tables-only)
  else()
    list(APPEND EASEL_SANITIZER_COMPILE_FLAGS -g1)
  endif()
endif()
if(EASEL_FUZZ)
  list(APPEND EASEL_SANITIZER_COMPILE_FLAGS -fsanitize=fuzzer-no-link)
endif()

# easel_target_options(TARGET): the options above on TARGET (PRIVATE: they do not leak to ggml
# through the link interface).
function(easel_target_options tgt)
  target_compile_options(${tgt} PRIVATE ${EASEL_WARNING_FLAGS} ${EASEL_SANITIZER_COMPILE_FLAGS})
  get_target_property(type ${tgt} TYPE)
  if(NOT type STREQUAL "OBJECT_LIBRARY" AND NOT type STREQUAL "STATIC_LIBRARY")
    target_link_options(${tgt} PRIVATE ${EASEL_SANITIZER_LINK_FLAGS})
  endif()
endfunction()
