#!/usr/bin/env bash
# What the device machine has for building trainyard against its pip LibTorch: compilers, CMake,
# the LibTorch tree, Gloo/NCCL headers, and which of the project's -dev dependencies exist.
set -u
echo "== system"; cat /etc/os-release | head -2; nproc; g++ --version | head -1; cmake --version | head -1; ninja --version; nvcc --version | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
P=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'); echo "cmake prefix $P"
python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.compiled_with_cxx11_abi(), torch.distributed.is_nccl_available(), torch.distributed.is_gloo_available())'
TI=$(dirname $(dirname $P))/include; echo "include $TI"; ls $TI; ls $TI/gloo 2>/dev/null | head -3
ls $TI/torch/csrc/distributed/c10d | head -80
ls $(dirname $(dirname $P))/lib | head -40
echo "== headers"; for h in spdlog/spdlog.h CLI/CLI.hpp nlohmann/json.hpp curl/curl.h openssl/sha.h unicode/unorm2.h microhttpd.h sqlite3.h png.h turbojpeg.h zlib.h gtest/gtest.h benchmark/benchmark.h fmt/core.h; do printf '%-24s' $h; ls /usr/include/$h /usr/local/include/$h 2>/dev/null | head -1; echo; done
echo "== libs"; ldconfig -p | grep -E 'libcurl|libssl|libcrypto|libicuuc|libpng16|libturbojpeg|libsqlite3|libz\.so|libfmt|libspdlog|libgomp|libnccl' | head -30
find / -name 'libnccl*.so*' -not -path '/proc/*' 2>/dev/null | head -3
find / -name 'nccl.h' -not -path '/proc/*' 2>/dev/null | head -3
