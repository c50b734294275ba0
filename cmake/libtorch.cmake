# Finds the LibTorch trainyard builds against and defines one target for it, trainyard::torch.
#
# Where: the LibTorch inside the project's venv (/opt/trainyard/venv, PyTorch's own wheel, which
# scripts/setup.sh installs), found as torch.utils.cmake_prefix_path says; -DCMAKE_PREFIX_PATH or
# -DTorch_DIR select another LibTorch 2.x (a pytorch.org archive, another pip install).
#
# What: see Note [Linking LibTorch without CUDA]. Sets
#   TRAINYARD_TORCH_PREFIX   the LibTorch folder (holding include/ and lib/)
#   TRAINYARD_TORCH_VERSION  its version, e.g. 2.15.0
#   TRAINYARD_CUDA           ON for the CUDA build (-DTRAINYARD_CUDA=ON, scripts/build.sh --cuda)
#   NCCL_INCLUDE_DIR         nccl.h's folder in the CUDA build
#
# Note [Linking LibTorch without CUDA]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# PyTorch's wheel on PyPI is a CUDA build: its TorchConfig asks for a CUDA toolkit at configure
# time (a fatal error without one), and its libtorch.so names libtorch_cuda.so, which loads cuDNN,
# cuBLAS and the rest (gigabytes) into every process that starts. Everything trainyard calls on
# the CPU lives in libtorch_cpu.so and libc10.so, and CUDA reaches libtorch_cpu through hooks that
# libtorch_cuda registers when it is loaded. So the CPU build reads only the folder's layout and
# links those two libraries: it configures without a CUDA toolkit, against a CPU archive or a CUDA
# wheel alike, and loads no CUDA library of its own (libtorch_cpu itself still names CUDA's small
# runtime and CUPTI, for its profiler). The CUDA build (TRAINYARD_CUDA) goes through
# find_package(Torch) as PyTorch documents it, with the toolkit, and links all of LibTorch.

option(TRAINYARD_CUDA "Build against LibTorch's CUDA libraries and NCCL (needs a CUDA toolkit)" OFF)
set(TRAINYARD_VENV "/opt/trainyard/venv" CACHE PATH "The Python environment scripts/setup.sh makes")

# The venv's LibTorch comes after anything the caller named.
if(NOT Torch_DIR AND EXISTS "${TRAINYARD_VENV}/bin/python")
  execute_process(COMMAND "${TRAINYARD_VENV}/bin/python" -c
                          "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
                  OUTPUT_VARIABLE _venv_torch_cmake RESULT_VARIABLE _venv_rc ERROR_QUIET)
  if(_venv_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH "${_venv_torch_cmake}")
  endif()
endif()

if(TRAINYARD_CUDA)
  find_package(Torch REQUIRED)
  get_filename_component(TRAINYARD_TORCH_PREFIX "${TORCH_INSTALL_PREFIX}" ABSOLUTE)
  set(TRAINYARD_TORCH_VERSION "${Torch_VERSION}")
  if(NOT TORCH_CUDA_LIBRARIES)
    message(FATAL_ERROR "TRAINYARD_CUDA is ON but the LibTorch at ${TRAINYARD_TORCH_PREFIX} has no "
                        "CUDA. HINT: point CMAKE_PREFIX_PATH at a CUDA LibTorch (PyPI's torch wheel is "
                        "one), or build without --cuda.")
  endif()
  # The wheel's own NCCL first (site-packages/nvidia/nccl): ProcessGroupNCCL's layout depends on
  # the NCCL version its headers declare, so they must be the ones LibTorch was built with.
  find_path(NCCL_INCLUDE_DIR nccl.h
            HINTS ${TRAINYARD_TORCH_PREFIX}/../nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS}
                  ENV NCCL_INCLUDE_DIR)
  if(NOT NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "nccl.h is missing: the CUDA build needs NCCL's headers (PyPI's "
                        "nvidia-nccl wheel beside torch, or set NCCL_INCLUDE_DIR).")
  endif()
  add_library(trainyard_torch INTERFACE)
  target_link_libraries(trainyard_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_definitions(trainyard_torch INTERFACE USE_C10D_GLOO USE_DISTRIBUTED USE_C10D_NCCL)
  target_include_directories(trainyard_torch SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
  # The wheel's CUDA libraries (site-packages/nvidia/*/lib) are found through libtorch_cuda's own
  # RPATH when a program runs, but the linker looks in the system's folders first: there the CUDA
  # toolkit's older NCCL lacks symbols libtorch_cuda needs. Point the linker at the wheel's.
  file(GLOB _wheel_cuda_lib_dirs LIST_DIRECTORIES true "${TRAINYARD_TORCH_PREFIX}/../nvidia/*/lib")
  foreach(_dir ${_wheel_cuda_lib_dirs})
    target_link_options(trainyard_torch INTERFACE "LINKER:-rpath-link,${_dir}")
  endforeach()
else()
  find_file(TRAINYARD_TORCH_CONFIG TorchConfig.cmake PATH_SUFFIXES Torch share/cmake/Torch
            HINTS ${Torch_DIR} NO_CACHE)
  if(NOT TRAINYARD_TORCH_CONFIG)
    message(FATAL_ERROR "LibTorch is missing: no TorchConfig.cmake in ${TRAINYARD_VENV} (the venv "
                        "scripts/setup.sh makes) or on CMAKE_PREFIX_PATH. HINT: run scripts/setup.sh, "
                        "or pass -DCMAKE_PREFIX_PATH=<a LibTorch 2.x folder>.")
  endif()
  get_filename_component(_torch_cmake_dir "${TRAINYARD_TORCH_CONFIG}" DIRECTORY)
  get_filename_component(TRAINYARD_TORCH_PREFIX "${_torch_cmake_dir}/../../.." ABSOLUTE)
  include("${_torch_cmake_dir}/TorchConfigVersion.cmake")
  set(TRAINYARD_TORCH_VERSION "${PACKAGE_VERSION}")
  foreach(_lib torch_cpu c10)
    find_library(TRAINYARD_${_lib}_LIBRARY ${_lib} PATHS "${TRAINYARD_TORCH_PREFIX}/lib"
                 NO_DEFAULT_PATH REQUIRED)
  endforeach()
  add_library(trainyard_torch INTERFACE)
  target_include_directories(trainyard_torch SYSTEM INTERFACE
    "${TRAINYARD_TORCH_PREFIX}/include" "${TRAINYARD_TORCH_PREFIX}/include/torch/csrc/api/include")
  target_link_libraries(trainyard_torch INTERFACE ${TRAINYARD_torch_cpu_LIBRARY}
                                                  ${TRAINYARD_c10_LIBRARY})
  target_compile_definitions(trainyard_torch INTERFACE USE_C10D_GLOO USE_DISTRIBUTED)
  set(TORCH_INCLUDE_DIRS "${TRAINYARD_TORCH_PREFIX}/include")
endif()
add_library(trainyard::torch ALIAS trainyard_torch)

if(TRAINYARD_TORCH_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "LibTorch ${TRAINYARD_TORCH_VERSION} at ${TRAINYARD_TORCH_PREFIX} is too old: "
                      "trainyard builds against LibTorch 2.x. HINT: run scripts/setup.sh (PyPI's "
                      "torch into ${TRAINYARD_VENV}), or point CMAKE_PREFIX_PATH at a LibTorch 2.x.")
endif()
