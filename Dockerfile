# The tollgate binary (gateway, mock upstream, load generator) on Debian slim.
# Used by docker-compose.yml; the toolchain matches rust-toolchain.toml.
FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
# The pinned toolchain and its components first: a layer of its own, not
# fetched again on every source change.
COPY rust-toolchain.toml .
RUN rustup toolchain install
COPY . .
RUN cargo build --release --locked --bin tollgate

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tollgate /usr/local/bin/tollgate
USER nobody
ENTRYPOINT ["tollgate"]
CMD ["serve"]
