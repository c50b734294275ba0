# trainyard in a container image: Debian 12, the project's own scripts/setup.sh (Debian packages, torch)
# and scripts/build.sh, the `trainyard` binary on PATH, and a non-root user. The Kubernetes
# manifests in deploy/kubernetes run this image. From the repository root:
#   docker build -t trainyard:latest .
#   docker run --rm trainyard:latest train fashion-mnist --epochs 1 --limit 2048
FROM debian:12

# setup.sh installs with apt-get (as root here, so without sudo) and PyTorch's wheel from PyPI into
# /opt/trainyard/venv (its LibTorch is what the build links); --image leaves out the test,
# benchmark and comparison tools.
COPY scripts/setup.sh scripts/requirements-image.txt scripts/constraints.txt /src/trainyard/scripts/
RUN /src/trainyard/scripts/setup.sh --image && rm -rf /var/lib/apt/lists/*

# The sources, then the build (Release, Ninja), without the tests, benchmarks and examples.
COPY . /src/trainyard
WORKDIR /src/trainyard
RUN CMAKE_ARGS="-DTRAINYARD_BUILD_TESTS=OFF -DTRAINYARD_BUILD_BENCH=OFF -DTRAINYARD_BUILD_EXAMPLES=OFF" \
      JOBS="$(nproc)" scripts/build.sh \
 && install -m 0755 build/trainyard build/trainyard-plan /usr/local/bin/ \
 && rm -rf build

# A user without privileges runs everything; its home and the directories the manifests mount
# (checkpoints, the head's and the workers' state) are its own.
RUN useradd --create-home --uid 1000 --user-group trainyard \
 && install -d -o trainyard -g trainyard /mnt/runs /var/lib/trainyard /var/lib/trainyard-worker
USER 1000:1000
WORKDIR /home/trainyard

ENTRYPOINT ["trainyard"]
CMD ["--help"]
