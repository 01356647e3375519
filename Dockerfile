# outbox-cdc as a small static image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /outbox-cdc .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /outbox-cdc /outbox-cdc
ENTRYPOINT ["/outbox-cdc"]
CMD ["run"]
