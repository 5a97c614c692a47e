# Multi-stage build of the etjob binaries; the flags are the Makefile's
# (`make build` passes the same GOFLAGS_BUILD).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/etjob-controller ./cmd/etjob-agent

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/etjob-controller /etjob-controller
COPY --from=build /out/etjob-agent /etjob-agent
USER 65532:65532
# The agent's image is the same one with ENTRYPOINT ["/etjob-agent"].
ENTRYPOINT ["/etjob-controller"]
