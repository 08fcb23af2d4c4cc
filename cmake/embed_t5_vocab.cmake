# T5 tokenizer support (src/text/t5_tokenizer.cpp):
#  * embeds the T5 SentencePiece vocabulary (models/tokenizers/t5/tokenizer.json.gz, HF
#    tokenizer.json form) into the library, so FLUX.1 / SD3 text-encoder files that carry no
#    tokenizer still work; the array holds the gzip bytes, inflated with zlib on first use;
#  * links libsentencepiece (Debian libsentencepiece-dev), which runs the normalizer and the
#    unigram segmentation on a model built in memory from that vocabulary.
# Included from the top-level CMakeLists.txt after add_subdirectory(src).
find_path(EASEL_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
find_library(EASEL_SENTENCEPIECE_LIBRARY sentencepiece)
if(NOT EASEL_SENTENCEPIECE_INCLUDE_DIR OR NOT EASEL_SENTENCEPIECE_LIBRARY)
  message(FATAL_ERROR "libsentencepiece not found: install libsentencepiece-dev (scripts/setup.sh does)")
endif()
target_include_directories(easel_objects SYSTEM PUBLIC ${EASEL_SENTENCEPIECE_INCLUDE_DIR})
target_link_libraries(easel_objects PUBLIC ${EASEL_SENTENCEPIECE_LIBRARY})

set(EASEL_T5_VOCAB_GZ ${PROJECT_SOURCE_DIR}/models/tokenizers/t5/tokenizer.json.gz)
set(EASEL_T5_VOCAB_CPP ${PROJECT_BINARY_DIR}/generated/t5_vocab_data.cpp)
add_custom_command(
  OUTPUT ${EASEL_T5_VOCAB_CPP}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${EASEL_T5_VOCAB_GZ} -DOUTPUT=${EASEL_T5_VOCAB_CPP}
          -DSYMBOL=easel_t5_vocab_gz -P ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  DEPENDS ${EASEL_T5_VOCAB_GZ} ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  COMMENT "Embedding the T5 SentencePiece vocabulary"
  VERBATIM)
add_custom_target(easel_t5_vocab DEPENDS ${EASEL_T5_VOCAB_CPP})
add_dependencies(easel_objects easel_t5_vocab)
target_sources(easel_objects PRIVATE ${EASEL_T5_VOCAB_CPP})
