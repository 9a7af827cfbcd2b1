# A static, non-root tokenserver image. Build: docker build -t tokenserver .
# (or --build-arg VERSION=v1.2.3 to name the build in --version and
# tokenserver_build_info).
FROM golang:1.26 AS build
ARG VERSION=container
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY client/ client/
COPY internal/ internal/
COPY proto/ proto/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/tokenserver/tokenserver/internal/buildinfo.buildVersion=${VERSION}" -o /out/tokenserver ./cmd/tokenserver && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/tokenserver/tokenserver/internal/buildinfo.buildVersion=${VERSION}" -o /out/tokenctl ./cmd/tokenctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tokenserver /out/tokenctl /usr/local/bin/
USER 65532:65532
EXPOSE 7070 7071 7072
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/tokenserver"]
# A container is reached through its published ports, so it listens on
# 0.0.0.0; --insecure says so knowingly (plain TCP, no authentication). For
# anything but a trial give TLS and tokens instead (README, "Running it
# safely"): docker run ... tokenserver --data-dir=/data --grpc-addr=0.0.0.0:7070
# --raft-addr=0.0.0.0:7071 --http-addr=0.0.0.0:7072 --tls-cert=... --tls-key=...
# --tls-client-ca=... --auth-tokens=...
CMD ["--data-dir=/data", "--grpc-addr=0.0.0.0:7070", "--raft-addr=0.0.0.0:7071", "--http-addr=0.0.0.0:7072", "--insecure"]
