module github.com/tensorplay/tensorplay-rpc/tools

go 1.26.0

require (
	github.com/go-python/gopy v0.4.10
	golang.org/x/tools v0.52.0
)

require (
	github.com/gonuts/commander v0.1.0 // indirect
	github.com/gonuts/flag v0.1.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/telemetry v0.0.0-20261009151841-97e8ea77aa2a // indirect
)
