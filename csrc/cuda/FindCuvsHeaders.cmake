# Locates the cuVS C API headers (and dlpack/dlpack.h, which they include) for cuvs_knn.cu.
# Sets DIHAL_CUVS_INCLUDE_DIRS, or leaves it empty and says why in DIHAL_CUVS_REASON.
# Searched: find_package(cuvs) (when this CMake can read its config; cuVS 26.x needs CMake >= 4.0),
# then the prefixes of the RAPIDS wheels (libcuvs-cu12/-cu13 and its dependencies) installed in the
# Python that builds us (an isolated build gets them from the GPU variants' build requirements,
# wheel_variant.py), then CMAKE_PREFIX_PATH. dlpack/dlpack.h: the same places, then the vendored copy
# (csrc/third_party/dlpack); DIHAL_DLPACK_INCLUDE_DIR may be set by hand.
set(DIHAL_CUVS_INCLUDE_DIRS "")
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
          "import importlib.util as u\nfor m in ('libcuvs', 'libraft', 'librmm', 'rapids_logger', 'libkvikio'):\n    s = u.find_spec(m)\n    if s and s.submodule_search_locations: print(list(s.submodule_search_locations)[0])"
  OUTPUT_VARIABLE _rapids_prefixes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
string(REPLACE "\n" ";" _rapids_prefixes "${_rapids_prefixes}")
list(APPEND CMAKE_PREFIX_PATH ${_rapids_prefixes})

set(_cuvs_target_dirs "")
find_file(_cuvs_config cuvs-config.cmake PATH_SUFFIXES lib64/cmake/cuvs lib/cmake/cuvs NO_CACHE)
if(_cuvs_config)
  file(STRINGS "${_cuvs_config}" _cuvs_min_line REGEX "^cmake_minimum_required")
  string(REGEX MATCH "[0-9]+(\\.[0-9]+)*" _cuvs_min_version "${_cuvs_min_line}")
  if(NOT _cuvs_min_version OR NOT CMAKE_VERSION VERSION_LESS _cuvs_min_version)
    find_package(cuvs CONFIG QUIET COMPONENTS c_api)
    if(TARGET cuvs::c_api)
      get_target_property(_cuvs_target_dirs cuvs::c_api INTERFACE_INCLUDE_DIRECTORIES)
    endif()
  else()
    message(STATUS "dihal_fast: ${_cuvs_config} needs CMake ${_cuvs_min_version}; using its headers directly")
  endif()
endif()

find_path(DIHAL_CUVS_HEADER_DIR cuvs/neighbors/brute_force.h HINTS ${_cuvs_target_dirs} PATH_SUFFIXES include)
find_path(DIHAL_DLPACK_INCLUDE_DIR dlpack/dlpack.h HINTS ${_cuvs_target_dirs} PATH_SUFFIXES include)
if(NOT DIHAL_DLPACK_INCLUDE_DIR)
  # The libcuvs wheels do not ship dlpack/dlpack.h: the vendored DLPack 1.3 header (csrc/third_party/dlpack,
  # Apache-2.0; DLManagedTensor / DLDataType / DLDevice, all that the cuVS C API uses, keep the 0.x layout).
  set(DIHAL_DLPACK_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/csrc/third_party/dlpack/include" CACHE PATH "dlpack/dlpack.h prefix" FORCE)
endif()
if(NOT DIHAL_CUVS_HEADER_DIR)
  set(DIHAL_CUVS_REASON "cuvs/neighbors/brute_force.h not found; pip install libcuvs-cu12 or libcuvs-cu13")
else()
  set(DIHAL_CUVS_INCLUDE_DIRS "${DIHAL_CUVS_HEADER_DIR}" "${DIHAL_DLPACK_INCLUDE_DIR}")
endif()
