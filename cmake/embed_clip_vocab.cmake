# Embeds the CLIP BPE vocabulary (models/tokenizers/clip/bpe_simple_vocab_16e6.txt.gz) into the
# library at build time, so the tokenizer needs no file at run time. The array holds the gzip
# bytes; src/text/clip_tokenizer.cpp inflates them with zlib on first use.
# Included from the top-level CMakeLists.txt after add_subdirectory(src).
set(EASEL_CLIP_VOCAB_GZ ${PROJECT_SOURCE_DIR}/models/tokenizers/clip/bpe_simple_vocab_16e6.txt.gz)
set(EASEL_CLIP_VOCAB_CPP ${PROJECT_BINARY_DIR}/generated/clip_vocab_data.cpp)
add_custom_command(
  OUTPUT ${EASEL_CLIP_VOCAB_CPP}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${EASEL_CLIP_VOCAB_GZ} -DOUTPUT=${EASEL_CLIP_VOCAB_CPP}
          -DSYMBOL=easel_clip_vocab_gz -P ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  DEPENDS ${EASEL_CLIP_VOCAB_GZ} ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  COMMENT "Embedding the CLIP BPE vocabulary"
  VERBATIM)
add_custom_target(easel_clip_vocab DEPENDS ${EASEL_CLIP_VOCAB_CPP})
add_dependencies(easel_objects easel_clip_vocab)
target_sources(easel_objects PRIVATE ${EASEL_CLIP_VOCAB_CPP})
target_link_libraries(easel_objects PUBLIC ZLIB::ZLIB)
