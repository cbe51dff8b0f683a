# Catena's image: both binaries, static, run as a non-root user.
# Where no Docker engine is available, hack/ builds the same image with a
# Go image builder (added with the Kubernetes tooling).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/catena ./cmd/catena && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/catenactl ./cmd/catenactl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/catena /out/catenactl /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/catena"]
