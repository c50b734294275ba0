# One ctest test per GoogleTest suite of a test program, for programs whose start is the larger
# part of a test: see Note [One ctest per suite] below.
#
# Included from a CMakeLists.txt, it defines trainyard_suite_tests(target LABEL l TIMEOUT s).
# Run with `cmake -P` (after each build of the target), it lists the program's suites and writes
# the ctest file that registers them.

# Note [One ctest per suite]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# A program that links LibTorch spends about 0.8 s before main() on this machine: LibTorch's
# static initialisers register its operators (the dynamic loader itself takes 30 ms). Registered
# one ctest per test case (gtest_discover_tests), unit_tests' 289 cases paid that 289 times, more
# than half of their 229 s; per suite it is paid 57 times (`ctest -L unit`: 277 s -> 136 s), and a
# failure still names the case (GoogleTest prints each case's result, and ctest shows the output
# of a failed suite). A suite must finish within TIMEOUT as a whole, so this is for programs
# whose suites are short; the multi-process tests stay one ctest per case. `ctest -R Suite` still
# selects a suite; `tests/unit_tests --gtest_filter=Suite.Case` runs one case.

if(CMAKE_SCRIPT_MODE_FILE)
  # Script mode: EXE, OUT, LABEL, TIMEOUT.
  execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing
                  ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 60)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${status}): ${errors}")
  endif()
  # Suite lines start in the first column and end with '.' (a typed suite's line adds
  # "  # TypeParam = ..."); case lines are indented.
  string(REGEX MATCHALL "(^|\n)[^ \n#][^ \n]*\\." suites "${listing}")
  set(script "# Written by ${CMAKE_SCRIPT_MODE_FILE} from `${EXE} --gtest_list_tests`.\n")
  foreach(suite IN LISTS suites)
    string(STRIP "${suite}" suite)
    string(REGEX REPLACE "\\.$" "" suite "${suite}")
    string(APPEND script
           "add_test([==[${suite}]==] [==[${EXE}]==] [==[--gtest_filter=${suite}.*]==])\n"
           "set_tests_properties([==[${suite}]==] PROPERTIES LABELS [==[${LABEL}]==] "
           "TIMEOUT ${TIMEOUT})\n")
  endforeach()
  file(WRITE "${OUT}" "${script}")
  return()
endif()

set(_trainyard_suite_tests_script "${CMAKE_CURRENT_LIST_FILE}")

function(trainyard_suite_tests target)
  cmake_parse_arguments(arg "" "LABEL;TIMEOUT" "" ${ARGN})
  set(listed "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" "-DEXE=$<TARGET_FILE:${target}>" "-DOUT=${listed}"
            "-DLABEL=${arg_LABEL}" "-DTIMEOUT=${arg_TIMEOUT}"
            -P "${_trainyard_suite_tests_script}"
    BYPRODUCTS "${listed}"
    VERBATIM)
  # ctest includes this at its start; before the first build there is nothing to list.
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  file(WRITE "${include_file}"
       "if(EXISTS [==[${listed}]==])\n"
       "  include([==[${listed}]==])\n"
       "else()\n"
       "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
