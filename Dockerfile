# Tally service image: static Go binaries on distroless, running as nonroot (uid 65532).
# Build: make docker   (docker build -t tally .)

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Module downloads in their own layer, reused while go.mod/go.sum don't change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/server ./cmd/migrate ./cmd/billingctl

FROM gcr.io/distroless/static-debian12:nonroot
# migrate and billingctl ride along for one-off jobs, e.g.
#   docker run --rm -e DATABASE_URL=... --entrypoint /usr/local/bin/migrate tally up
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENV TALLY_HTTP_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/server"]
