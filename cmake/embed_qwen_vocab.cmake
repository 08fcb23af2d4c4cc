# Embeds the Qwen3 tokenizer (models/tokenizers/qwen3/tokenizer.json.gz) into the library at build
# time, so text::QwenTokenizer::builtin() needs no file at run time. The array holds the gzip
# bytes; src/text/qwen_tokenizer.cpp inflates them with zlib on first use.
# Included from the top-level CMakeLists.txt after add_subdirectory(src).
set(EASEL_QWEN3_TOKENIZER_GZ ${PROJECT_SOURCE_DIR}/models/tokenizers/qwen3/tokenizer.json.gz)
set(EASEL_QWEN3_TOKENIZER_CPP ${PROJECT_BINARY_DIR}/generated/qwen3_tokenizer_data.cpp)
add_custom_command(
  OUTPUT ${EASEL_QWEN3_TOKENIZER_CPP}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${EASEL_QWEN3_TOKENIZER_GZ} -DOUTPUT=${EASEL_QWEN3_TOKENIZER_CPP}
          -DSYMBOL=easel_qwen3_tokenizer_gz -P ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  DEPENDS ${EASEL_QWEN3_TOKENIZER_GZ} ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  COMMENT "Embedding the Qwen3 tokenizer"
  VERBATIM)
add_custom_target(easel_qwen3_tokenizer DEPENDS ${EASEL_QWEN3_TOKENIZER_CPP})
add_dependencies(easel_objects easel_qwen3_tokenizer)
target_sources(easel_objects PRIVATE ${EASEL_QWEN3_TOKENIZER_CPP})
