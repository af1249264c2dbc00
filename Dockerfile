# syntax=docker/dockerfile:1
# gpu-steward container image: the agent, the simulated NVML (for `demo`) and the default config,
# at the same paths as the .deb. Build: `docker build -t gpu-steward .`
# Run on a GPU node: `docker run --runtime=nvidia --gpus all -p 9400:9400 gpu-steward`
# Run without a GPU: `docker run -p 9400:9400 gpu-steward demo --listen 0.0.0.0:9400`

# --- Build stage: the whole workspace, so that libnvml_sim.so is built beside the agent.
FROM rust:bookworm AS builder
ARG GPU_STEWARD_REVISION=""
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target/ between builds; the artifacts are copied out in the
# same step because a cache mount is not part of the image. Packed relative relocations (DT_RELR)
# take about 0.7 MiB off the agent's resident memory (BENCHMARKS.md) and need glibc 2.36, which
# the runtime stage below ships; the .deb, which must load on glibc 2.35 (Ubuntu 22.04), is
# built without them.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C link-arg=-Wl,-z,pack-relative-relocs" \
    cargo build --release --workspace --locked \
    && mkdir -p /out \
    && cp target/release/gpu-steward target/release/libnvml_sim.so nvml-sim/nvidia-smi-sim /out/

# --- Runtime stage: glibc and libgcc_s are all the agent links against; NVML itself is loaded at
# run time from the driver libraries that the NVIDIA container runtime mounts into the container.
FROM debian:bookworm-slim
# A fixed numeric UID, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 65532 gpu-steward \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-steward
COPY --from=builder /out/gpu-steward /usr/bin/gpu-steward
COPY --from=builder /out/libnvml_sim.so /usr/lib/gpu-steward/libnvml_sim.so
# The simulated node's stand-in nvidia-smi (compute-policy), so `demo` with [sharing] works here too.
COPY --from=builder /out/nvidia-smi-sim /usr/lib/gpu-steward/nvidia-smi-sim
COPY packaging/deb/config.toml /etc/gpu-steward/config.toml
# Ask the NVIDIA container runtime for every GPU and for the "utility" driver libraries only
# (libnvidia-ml.so.1 and nvidia-smi): the agent reads telemetry and runs no CUDA code.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Non-root: telemetry needs only the device nodes the runtime injects (created 0666 by the driver
# by default; where the host restricts them to a group, add it: `--group-add <gid>` or the pod's
# supplementalGroups); GPM profiling works as any user. What changes the node (MIG layouts,
# compute mode and time-slice, signals to other users' processes) needs root: run such a
# container as root, as the Kubernetes device-plugin component does.
USER 65532:65532
EXPOSE 9400
# No HEALTHCHECK: the image has no HTTP client, and orchestrators probe /livez and /readyz.
# No init: as PID 1 the agent reaps the orphans its hooks leave (src/exec.rs, docs/safety.md),
# whether or not the runtime adds one (docker --init, Kubernetes does not).
ENTRYPOINT ["/usr/bin/gpu-steward"]
CMD ["run"]
