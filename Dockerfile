# A small static image of pgdispatch that runs as non-root.
#   docker build -t pgdispatch .
#   docker run --rm -e DATABASE_URL=postgres://... pgdispatch run --migrate

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pgdispatch ./cmd/pgdispatch

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pgdispatch /usr/local/bin/pgdispatch
USER nonroot:nonroot
# METRICS_ADDR, when set to :9090
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/pgdispatch"]
CMD ["run", "--migrate"]
