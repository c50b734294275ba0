#!/usr/bin/env bash
# Packs the device machine's LibTorch 2.x headers, CMake config and CUDA/NCCL headers into $OUT, so
# that trainyard's sources can be compile-checked against them on a machine without a GPU.
set -u
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
cd /tmp && rm -rf torchprobe && mkdir torchprobe && cd torchprobe
cat > CMakeLists.txt <<'CM'
cmake_minimum_required(VERSION 3.22)
project(p CXX)
find_package(Torch REQUIRED)
message(STATUS "TORCH_CXX_FLAGS=${TORCH_CXX_FLAGS}")
message(STATUS "TORCH_LIBRARIES=${TORCH_LIBRARIES}")
message(STATUS "TORCH_INCLUDE_DIRS=${TORCH_INCLUDE_DIRS}")
get_target_property(d torch INTERFACE_COMPILE_DEFINITIONS)
message(STATUS "torch defs=${d}")
get_target_property(o torch INTERFACE_COMPILE_OPTIONS)
message(STATUS "torch opts=${o}")
get_target_property(i torch INTERFACE_INCLUDE_DIRECTORIES)
message(STATUS "torch incs=${i}")
get_target_property(l torch INTERFACE_LINK_LIBRARIES)
message(STATUS "torch links=${l}")
CM
cmake -S . -B b -DCMAKE_PREFIX_PATH=$T/share/cmake > $OUT/cmake_probe.txt 2>&1; tail -40 $OUT/cmake_probe.txt
python3 -c 'import torch;print(torch.__config__.show())' > $OUT/torch_config.txt 2>&1
cd /
tar -cf - -C $T include share/cmake | xz -T16 -6 > /tmp/torch.tar.xz
tar -cf - -C /usr/local/cuda include | xz -T16 -6 > /tmp/cuda.tar.xz
ls -la /tmp/*.tar.xz; du -sh $T/include /usr/local/cuda/include
split -b 15M -d /tmp/torch.tar.xz $OUT/torch.tar.xz.
split -b 15M -d /tmp/cuda.tar.xz $OUT/cuda.tar.xz.
ls -la $OUT
