# Embeds the server's web page (src/server/web/index.html: one file, no build step) into the
# library, so `easel server` serves it without any file at run time (src/server/http_api.cpp).
# Included from the top-level CMakeLists.txt after add_subdirectory(src).
set(EASEL_SERVER_PAGE ${PROJECT_SOURCE_DIR}/src/server/web/index.html)
set(EASEL_SERVER_PAGE_CPP ${PROJECT_BINARY_DIR}/generated/server_page_data.cpp)
add_custom_command(
  OUTPUT ${EASEL_SERVER_PAGE_CPP}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${EASEL_SERVER_PAGE} -DOUTPUT=${EASEL_SERVER_PAGE_CPP}
          -DSYMBOL=easel_server_page -P ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  DEPENDS ${EASEL_SERVER_PAGE} ${PROJECT_SOURCE_DIR}/cmake/bin2cpp.cmake
  COMMENT "Embedding the server's web page"
  VERBATIM)
add_custom_target(easel_server_page DEPENDS ${EASEL_SERVER_PAGE_CPP})
add_dependencies(easel_objects easel_server_page)
target_sources(easel_objects PRIVATE ${EASEL_SERVER_PAGE_CPP})
