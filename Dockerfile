# The etjob images, from one build: `docker build --target agent` for the node
# agent, the default (last) target for the controller. The flags are the
# Makefile's (`make build` passes the same GOFLAGS_BUILD). Base images are
# pinned by version (no registry is reachable from the build machines to
# look up their digests); pin them by digest where you build, e.g.
#   docker build --build-arg GO_IMAGE=golang:1.26.8-bookworm@sha256:... \
#                --build-arg BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:...
ARG GO_IMAGE=golang:1.26.8-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot
FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/etjob-controller ./cmd/etjob-agent

# The binaries go on the image's PATH: the chart's containers run them by
# name (command: [etjob-agent]), as the local cluster's process nodes do.

# ghcr.io/etjob/etjob-agent: the node agent DaemonSet (charts/etjob).
FROM ${BASE_IMAGE} AS agent
COPY --from=build /out/etjob-agent /usr/local/bin/etjob-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/etjob-agent"]

# ghcr.io/etjob/etjob-controller: the controller Deployment (charts/etjob).
FROM ${BASE_IMAGE} AS controller
COPY --from=build /out/etjob-controller /usr/local/bin/etjob-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/etjob-controller"]
