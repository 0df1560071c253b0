# Tributary's container image: `tributary serve` standing in for Microsoft's Event Hubs emulator
# (AMQP on 5672, the HTTP door with GET /health on 5300, the emulator's well-known connection
# string accepted). See README.md, "Container".
#
# One Dockerfile, two ways to build it:
#
# 1. With a registry of base images (the usual way):
#
#        docker build -t tributary .
#        podman build --format docker -t tributary .    # docker format: OCI images drop HEALTHCHECK
#
#    The builder stage (BUILDER_IMAGE, a Rust toolchain image) compiles `tributary` from the
#    build context with `cargo build --release --locked`; the final stage (RUNTIME_IMAGE) gets
#    the binary only.
#
# 2. Without one (scripts/container-smoke, on a machine that reaches only Debian's mirrors): both
#    stages run on a Debian base made locally (debootstrap + `podman import`), and the binary is
#    built on the host and handed in through the build context; PREBUILT names it there, and
#    the builder stage then copies it instead of compiling:
#
#        podman build --format docker \
#            --build-arg BUILDER_IMAGE=localhost/tributary-base:local \
#            --build-arg RUNTIME_IMAGE=localhost/tributary-base:local \
#            --build-arg PREBUILT=target/container/tributary -t tributary .
#
#    The prebuilt binary must be linked against a glibc no newer than the runtime base's
#    (build it on the same Debian release). .dockerignore keeps target/ out of the context
#    except target/container/tributary.
#
# The final image holds `tributary` on a Debian slim base (bash is used by the health check; no
# CA certificates: the binary carries its TLS roots), runs as the non-root user `tributary`
# (uid 10001) and keeps its data directory in the volume /data.

ARG BUILDER_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILDER_IMAGE} AS builder
# Empty: compile here. A path inside the build context: use that binary as it is.
ARG PREBUILT=
WORKDIR /src
# The whole context (see .dockerignore). Where `strip` exists (the Rust image has it), the
# release profile's debug line tables are stripped: the binary shrinks several times.
COPY . .
RUN set -eu; \
    if [ -n "$PREBUILT" ]; then \
        echo "using the prebuilt binary $PREBUILT"; \
        install -D -m 0755 "$PREBUILT" /out/tributary; \
    else \
        cargo build --release --locked -p tributary-cli; \
        install -D -m 0755 target/release/tributary /out/tributary; \
    fi; \
    if command -v strip >/dev/null; then strip /out/tributary; fi; \
    /out/tributary --version

FROM ${RUNTIME_IMAGE}
# The user is written into /etc/passwd directly: `useradd` is not in every minimal Debian base.
# /data belongs to it before VOLUME, so a new named volume starts out writable by it (a bind
# mount keeps its host owner: make it writable by uid 10001, or run with --user).
RUN set -eu; \
    echo 'tributary:x:10001:10001:Tributary:/data:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'tributary:x:10001:' >> /etc/group; \
    mkdir -p /data /etc/tributary; \
    chown 10001:10001 /data
COPY --from=builder /out/tributary /usr/local/bin/tributary
USER 10001:10001
WORKDIR /data
ENV TRIBUTARY_DATA_DIR=/data
VOLUME /data
# 5672: AMQP (the Azure Event Hubs SDKs). 5300: the HTTP door with GET /health (with
# --emulator-compat; 8080 without it). 9092: Kafka clients (SASL_PLAINTEXT), as the emulator's.
EXPOSE 5672 5300 9092
# `serve` stops cleanly (listeners closed, partitions synced) on SIGINT, its Ctrl-C, as on
# SIGTERM; the smoke test stops it with SIGINT.
STOPSIGNAL SIGINT
# GET /health on the HTTP door, with bash's /dev/tcp (the image has no curl). The port is the
# one the running serve recorded in $TRIBUTARY_DATA_DIR/server.json, so --http-port and a start
# without --emulator-compat (8080) are followed; 5300 before the file exists.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "port=5300; [[ $(cat \"$TRIBUTARY_DATA_DIR/server.json\" 2>/dev/null) =~ \\\"http\\\":\\\"[^\\\"]*:([0-9]+)\\\" ]] && port=${BASH_REMATCH[1]}; exec 3<>/dev/tcp/127.0.0.1/$port && printf 'GET /health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && IFS= read -r -t 4 status <&3 && [[ $status == HTTP/1.?' 200'* ]]"]
ENTRYPOINT ["tributary"]
# Every interface (serve binds 127.0.0.1 by default) and the emulator's connection string and
# ports. Add `--emulator-config /etc/tributary/Config.json` with the emulator's Config.json
# mounted there to create its hubs (compose.yaml does); without it, hub "events", 4 partitions.
CMD ["serve", "--listen", "0.0.0.0", "--emulator-compat"]
