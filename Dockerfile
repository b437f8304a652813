# The operator image: built in a Rust builder stage, run from a distroless,
# non-root base with nothing but the binary.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin slotkeeper

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/slotkeeper /slotkeeper
USER nonroot:nonroot
ENTRYPOINT ["/slotkeeper"]
