# syntax=docker/dockerfile:1
# capstan's two images, both the one `capstan` binary (the release workflow publishes them,
# docs/github-action.md):
#
#   docker build --target capstan -t ghcr.io/capstan-dev/capstan:v0.1.0 .
#     the controller (`capstan sync`), non-root; the default target
#   docker build --target capstan-worker -t ghcr.io/capstan-dev/capstan-worker:v0.1.0 .
#     the kmod worker KMM worker pods run (`capstan worker kmod load|unload <config>`),
#     with kmod's modprobe, as root in the privileged worker pod
#
# The binary links glibc, OpenSSL 3 and zlib dynamically (git2's https transport and
# libgit2's compression); libgit2 and libssh2 are built into it. Both final stages are the
# builder's Debian release, so the libraries it linked are the ones installed.

FROM rust:1-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep downloaded crates and build output between builds on one machine
# and are not part of any layer, so the binary is copied out of target/ in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin capstan \
 && hack/release/split-debuginfo target/release/capstan \
 && install -D -m 0755 target/release/capstan /out/capstan \
 && install -D -m 0644 target/release/capstan.debug /out/capstan.debug

# The images carry the binary without its debug info (hack/release/split-debuginfo); this
# stage holds the debug info of that same build, for `--target debuginfo --output <dir>`.
FROM scratch AS debuginfo
COPY --from=builder /out/capstan.debug /capstan.debug

# The worker loads and unloads kernel modules on the node: it runs modprobe (kmod), pulls
# the kmod image itself over TLS (ca-certificates), and needs root, which its privileged
# pod gives it. The pod's args are `worker kmod <load|unload> <config> --firmware-path
# <dir>` (src/controllers/nmc/worker_pod.rs), so the entrypoint is the bare binary.
FROM debian:bookworm-slim AS capstan-worker
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/capstan /usr/local/bin/capstan
ENTRYPOINT ["capstan"]

# The controller needs no root and no shell tools: git over https (ca-certificates,
# OpenSSL) and over ssh (libssh2, built in; known_hosts is read by capstan itself, so no
# OpenSSH client). Its state dir is the working directory, writable by its user, for runs
# without a volume there.
FROM debian:bookworm-slim AS capstan
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/capstan
COPY --from=builder /out/capstan /usr/local/bin/capstan
WORKDIR /var/lib/capstan
ENV HOME=/var/lib/capstan
USER 65532:65532
EXPOSE 9477
ENTRYPOINT ["capstan"]
