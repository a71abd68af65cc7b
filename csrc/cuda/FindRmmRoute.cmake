# Locates what libdihal_rmm_torch.so (rmm_torch.cpp: cuVS's RMM resource through torch's allocator)
# builds against: the RMM headers with the CCCL they were made with (librmm's include/ and
# include/rapids) and librmm.so, from the librmm-cu12/-cu13 wheel that libcuvs depends on (its prefix
# is on CMAKE_PREFIX_PATH through FindCuvsHeaders.cmake) or CMAKE_PREFIX_PATH. RMM must be the cuVS
# release (RMM's ABI namespace, _RMM_26_10, names the state the two libraries share).
# Sets DIHAL_RMM_INCLUDE_DIRS and DIHAL_RMM_LIBRARY, or leaves them empty and says why in DIHAL_RMM_REASON.
set(DIHAL_RMM_INCLUDE_DIRS "")
set(DIHAL_RMM_LIBRARY "")
find_path(DIHAL_RMM_HEADER_DIR rmm/mr/per_device_resource.hpp PATH_SUFFIXES include)
find_library(DIHAL_RMM_LIBRARY_PATH NAMES rmm PATH_SUFFIXES lib64 lib)
if(NOT DIHAL_RMM_HEADER_DIR OR NOT DIHAL_RMM_LIBRARY_PATH)
  set(DIHAL_RMM_REASON "rmm/mr/per_device_resource.hpp or librmm.so not found; pip install librmm-cu12 or librmm-cu13")
  return()
endif()
file(STRINGS "${DIHAL_RMM_HEADER_DIR}/rmm/version_config.hpp" _rmm_lines REGEX "define RMM_VERSION_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*RMM_VERSION_MAJOR ([0-9]+).*" "\\1" _rmm_major "${_rmm_lines}")
string(REGEX REPLACE ".*RMM_VERSION_MINOR ([0-9]+).*" "\\1" _rmm_minor "${_rmm_lines}")
file(STRINGS "${DIHAL_CUVS_HEADER_DIR}/cuvs/version_config.h" _cuvs_lines REGEX "define CUVS_VERSION_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*CUVS_VERSION_MAJOR ([0-9]+).*" "\\1" _cuvs_major "${_cuvs_lines}")
string(REGEX REPLACE ".*CUVS_VERSION_MINOR ([0-9]+).*" "\\1" _cuvs_minor "${_cuvs_lines}")
if(NOT "${_rmm_major}.${_rmm_minor}" STREQUAL "${_cuvs_major}.${_cuvs_minor}")
  set(DIHAL_RMM_REASON "RMM ${_rmm_major}.${_rmm_minor} in ${DIHAL_RMM_HEADER_DIR} is not the cuVS release ${_cuvs_major}.${_cuvs_minor}")
  return()
endif()
set(_rmm_cccl "${DIHAL_RMM_HEADER_DIR}/rapids")
if(NOT EXISTS "${_rmm_cccl}/cuda/memory_resource")
  set(_rmm_cccl "")  # a conda / system RMM uses the toolkit's CCCL
endif()
set(DIHAL_RMM_INCLUDE_DIRS "${DIHAL_RMM_HEADER_DIR}" ${_rmm_cccl})
set(DIHAL_RMM_LIBRARY "${DIHAL_RMM_LIBRARY_PATH}")
set(DIHAL_RMM_VERSION "${_rmm_major}.${_rmm_minor}")
