# kvrt_add_plugin(<name> SOURCES ...): one plugin = one shared library named <name>.so,
# exporting only kvrt_plugin_query. Used in-tree and, through find_package(kvrt), out of tree.
function(kvrt_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${name} MODULE ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES PREFIX "" C_VISIBILITY_PRESET hidden
                                           CXX_VISIBILITY_PRESET hidden
                                           VISIBILITY_INLINES_HIDDEN ON)
  if(TARGET kvrt::sdk)
    target_link_libraries(${name} PRIVATE kvrt::sdk ${ARG_LIBRARIES})
  else()
    target_link_libraries(${name} PRIVATE kvrt_sdk ${ARG_LIBRARIES})
  endif()
  # A project that names no build type would build the plugin at -O0, and a store's write and
  # gather run for every token: without one it gets Release's optimisation.
  if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
    target_compile_options(${name} PRIVATE -O3)
    target_compile_definitions(${name} PRIVATE NDEBUG)
  endif()
  # Every symbol resolved at link time, except under clang's sanitizers (the fuzz build), whose
  # runtime lives in the executable that loads the plugin.
  if(NOT (CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND (KVRT_FUZZ OR KVRT_SANITIZE)))
    target_link_options(${name} PRIVATE -Wl,--no-undefined)
  endif()
endfunction()
