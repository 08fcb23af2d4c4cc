# ggml: a system ggml (find_package) when one is found, else the pinned copy that
# scripts/fetch-ggml.sh puts in third_party/ggml, built as a subproject.
# Defines the interface target easel::ggml.
# EASEL_GGML_PREBUILT: a build folder of this source tree (scripts/setup.sh's build/) whose bundled
# ggml libraries (ggml/src/*.a) are linked instead of compiling ggml again. CI's sanitizer build
# (scripts/sanitize.sh) uses it: ggml is never instrumented, so the release build's ggml is the
# same code, and compiling it again with clang would only add build time. The libraries are plain C
# / C++ (libstdc++) static archives with gcc's OpenMP runtime (libgomp), so clang links them.
set(EASEL_GGML_PREBUILT "" CACHE PATH "Link the bundled ggml already built in this build folder instead of building it")
set(EASEL_GGML_SOURCE "system")
if(EASEL_SYSTEM_GGML AND NOT EASEL_GGML_PREBUILT)
  find_package(ggml CONFIG QUIET)
endif()

# Tensor names of SD checkpoints are longer than ggml's default 64 bytes
# ("cond_stage_model.transformer.text_model.encoder.layers.11.self_attn.out_proj.weight"), and GGUF
# files of SD models in the wild carry them: build ggml and easel with 128 (as sd.cpp does). This
# changes the layout of struct ggml_tensor, so it must be the same for ggml and easel.
set(EASEL_GGML_MAX_NAME 128)
add_library(easel_ggml INTERFACE)
add_library(easel::ggml ALIAS easel_ggml)


if(EASEL_GGML_PREBUILT)
  set(EASEL_GGML_SOURCE "bundled")
  set(_ggml_libs "${EASEL_GGML_PREBUILT}/ggml/src")
  foreach(lib ggml ggml-cpu ggml-rpc ggml-base)
    set(_a "${_ggml_libs}/lib${lib}.a")
    if(lib STREQUAL "ggml-rpc")
      set(_a "${_ggml_libs}/ggml-rpc/lib${lib}.a")
    endif()
    if(lib STREQUAL "ggml-rpc" AND NOT EASEL_RPC)
      continue()
    endif()
    if(NOT EXISTS "${_a}")
      message(FATAL_ERROR "easel: EASEL_GGML_PREBUILT=${EASEL_GGML_PREBUILT} has no ${_a}: build that folder first (scripts/setup.sh)")
    endif()
    add_library(easel_prebuilt_${lib} STATIC IMPORTED)
    set_target_properties(easel_prebuilt_${lib} PROPERTIES IMPORTED_LOCATION "${_a}")
    target_link_libraries(easel_ggml INTERFACE easel_prebuilt_${lib})
  endforeach()
  target_include_directories(easel_ggml SYSTEM INTERFACE "${PROJECT_SOURCE_DIR}/third_party/ggml/ggml/include")
  target_compile_definitions(easel_ggml INTERFACE GGML_USE_CPU $<$<BOOL:${EASEL_RPC}>:GGML_USE_RPC>)
  target_link_libraries(easel_ggml INTERFACE gomp Threads::Threads m dl)
  file(READ "${PROJECT_SOURCE_DIR}/third_party/ggml/.easel-ggml-commit" EASEL_GGML_COMMIT)
  string(STRIP "${EASEL_GGML_COMMIT}" EASEL_GGML_COMMIT)
elseif(ggml_FOUND)
  message(STATUS "easel: using system ggml ${ggml_VERSION} from ${ggml_DIR}")
  message(WARNING "easel: a system ggml is built with its own GGML_MAX_NAME (default 64); GGUF files with "
                  "longer tensor names (SD1.x/SDXL checkpoints) then cannot be read. Use -DEASEL_SYSTEM_GGML=OFF for the bundled ggml.")
  set(EASEL_GGML_MAX_NAME 64)
  target_link_libraries(easel_ggml INTERFACE ggml::ggml ggml::ggml-base)
  if(TARGET ggml::ggml-cpu)
    target_link_libraries(easel_ggml INTERFACE ggml::ggml-cpu)
  endif()
else()
  set(EASEL_GGML_SOURCE "bundled")
  set(_ggml_dir "${PROJECT_SOURCE_DIR}/third_party/ggml/ggml")
  if(NOT EXISTS "${_ggml_dir}/CMakeLists.txt")
    message(FATAL_ERROR "easel: ggml not found. Run scripts/fetch-ggml.sh (or scripts/setup.sh) first, "
                        "or install a system ggml that find_package(ggml) finds.")
  endif()
  set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
  set(GGML_STATIC OFF CACHE BOOL "" FORCE)
  set(GGML_BACKEND_DL OFF CACHE BOOL "" FORCE)
  set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
  set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
  set(GGML_NATIVE ${EASEL_NATIVE} CACHE BOOL "" FORCE)
  set(GGML_RPC ${EASEL_RPC} CACHE BOOL "" FORCE)
  set(GGML_CUDA ${EASEL_CUDA} CACHE BOOL "" FORCE)
  # CUDA graphs: measured 4-6 % faster on the SD1.5 UNet at 512, neutral on the 1024 Z-Image DiT
  # (bench/results/README.md, 2026-12-02); GGML_CUDA_DISABLE_GRAPHS=1 turns them off at run time
  set(GGML_CUDA_GRAPHS ${EASEL_CUDA} CACHE BOOL "" FORCE)
  set(GGML_VULKAN ${EASEL_VULKAN} CACHE BOOL "" FORCE)
  set(GGML_OPENMP ON CACHE BOOL "" FORCE)
  set(GGML_LLAMAFILE ON CACHE BOOL "" FORCE)
  add_compile_definitions(GGML_MAX_NAME=${EASEL_GGML_MAX_NAME})
  # ggml is third-party code: keep our sanitizer flags and warnings off it
  add_subdirectory("${_ggml_dir}" "${CMAKE_BINARY_DIR}/ggml" EXCLUDE_FROM_ALL SYSTEM)
  target_link_libraries(easel_ggml INTERFACE ggml ggml-base)
  if(MINGW)
    # Debian 12's MinGW-w64 headers lack a Windows 11 declaration ggml-cpu.c uses (cmake/mingw-compat.h)
    set_source_files_properties("${_ggml_dir}/src/ggml-cpu/ggml-cpu.c" TARGET_DIRECTORY ggml-cpu
      PROPERTIES COMPILE_OPTIONS "-include;${PROJECT_SOURCE_DIR}/cmake/mingw-compat.h")
  endif()
  file(READ "${PROJECT_SOURCE_DIR}/third_party/ggml/.easel-ggml-commit" EASEL_GGML_COMMIT)
  string(STRIP "${EASEL_GGML_COMMIT}" EASEL_GGML_COMMIT)
endif()
target_compile_definitions(easel_ggml INTERFACE GGML_MAX_NAME=${EASEL_GGML_MAX_NAME})
if(NOT EASEL_GGML_COMMIT)
  set(EASEL_GGML_COMMIT "unknown")
endif()
