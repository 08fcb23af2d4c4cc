# ggml: a system ggml (find_package) when one is found, else the pinned copy that
# scripts/fetch-ggml.sh puts in third_party/ggml, built as a subproject.
# Defines the interface target easel::ggml.
set(EASEL_GGML_SOURCE "system")
if(EASEL_SYSTEM_GGML)
  find_package(ggml CONFIG QUIET)
endif()

# Tensor names of SD checkpoints are longer than ggml's default 64 bytes
# ("cond_stage_model.transformer.text_model.encoder.layers.11.self_attn.out_proj.weight"), and GGUF
# files of SD models in the wild carry them: build ggml and easel with 128 (as sd.cpp does). This
# changes the layout of struct ggml_tensor, so it must be the same for ggml and easel.
set(EASEL_GGML_MAX_NAME 128)
add_library(easel_ggml INTERFACE)
add_library(easel::ggml ALIAS easel_ggml)

if(ggml_FOUND)
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
