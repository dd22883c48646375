# syntax=docker/dockerfile:1
# The meterline binary in a small runtime image; docker-compose.yml runs
# every stage from it (`meterline dedup`, `aggregate`, `sink`, `topics`,
# `migrate`). Build: docker build -t meterline/meterline:local .

# Go version: keep in step with go.mod (deploy/deploy_test.go checks it).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Pure Go (Pebble, franz-go, clickhouse-go): a static binary. VERSION is
# what `meterline version` and meterline_build_info report
# (docker build --build-arg VERSION=$(git describe --tags --always --dirty)).
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/meterline/meterline/internal/service.version=${VERSION}" -o /out/meterline ./cmd/meterline

# Alpine rather than distroless: the compose health checks need wget.
FROM alpine:3.22
RUN addgroup -S -g 10001 meterline \
 && adduser -S -D -H -u 10001 -G meterline meterline \
 && mkdir -p /var/lib/meterline \
 && chown meterline:meterline /var/lib/meterline
COPY --from=build /out/meterline /usr/local/bin/meterline
USER meterline
# Pebble state lives here (--state-dir); docker-compose.yml mounts a named
# volume on it, which takes this directory's owner.
WORKDIR /var/lib/meterline
EXPOSE 9464 9465 9466
ENTRYPOINT ["/usr/local/bin/meterline"]
CMD ["--help"]
