//go:build tools

// Package tools pins the Prometheus server and node-exporter the lab's Prometheus tests scrape with; build.sh
// builds both from this module graph (go.sum verified).
package tools

import (
	_ "github.com/prometheus/node_exporter"
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
