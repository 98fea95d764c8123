package storage

import "github.com/VictoriaMetrics/metrics"

// Package-level metrics, registered once in the default VictoriaMetrics set. Nothing here is per
// partition, so creating topics never creates metrics.
var (
	fsyncDuration     = metrics.NewHistogram("kaas_storage_fsync_duration_seconds")
	fsyncsTotal       = metrics.NewCounter("kaas_storage_fsyncs_total")
	appendBytesTotal  = metrics.NewCounter("kaas_storage_append_bytes_total")
	appendErrorsTotal = metrics.NewCounter("kaas_storage_append_errors_total")
	segmentRollsTotal = metrics.NewCounter("kaas_storage_segment_rolls_total")
)
