package storage

import "github.com/VictoriaMetrics/metrics"

// Package-level metrics, registered once in the default VictoriaMetrics set. Nothing here is per
// partition, so creating topics never creates metrics.
var (
	fsyncDuration      = metrics.NewHistogram("kaas_storage_fsync_duration_seconds")
	fsyncsTotal        = metrics.NewCounter("kaas_storage_fsyncs_total")
	appendBytesTotal   = metrics.NewCounter("kaas_storage_append_bytes_total")
	appendErrorsTotal  = metrics.NewCounter("kaas_storage_append_errors_total")
	markersResentTotal = metrics.NewCounter("kaas_storage_markers_resent_total") // a resent marker not written twice
	segmentRollsTotal  = metrics.NewCounter("kaas_storage_segment_rolls_total")

	// Pre-zeroing (segment.go): flushes done with fdatasync (a subset of fsyncs_total /
	// fsync_duration_seconds), zero bytes written ahead of active segments, failures that
	// stopped pre-zeroing of a segment.
	fdatasyncDuration    = metrics.NewHistogram("kaas_storage_fdatasync_duration_seconds")
	fdatasyncsTotal      = metrics.NewCounter("kaas_storage_fdatasyncs_total")
	prezeroBytesTotal    = metrics.NewCounter("kaas_storage_prezero_bytes_total")
	prezeroFailuresTotal = metrics.NewCounter("kaas_storage_prezero_failures_total")

	// Shared write-ahead log (wal.go): one sync per round of records from every partition,
	// the records in each round, bytes written (records, headers, padding), failures, zero bytes
	// written to prepare generations, and checkpoints (segment fsyncs that let generations go).
	walSyncDuration       = metrics.NewHistogram("kaas_storage_wal_sync_duration_seconds")
	walSyncsTotal         = metrics.NewCounter("kaas_storage_wal_syncs_total")
	walRecordsPerSync     = metrics.NewHistogram("kaas_storage_wal_records_per_sync")
	walBytesTotal         = metrics.NewCounter("kaas_storage_wal_bytes_total")
	walErrorsTotal        = metrics.NewCounter("kaas_storage_wal_errors_total")
	walZeroBytesTotal     = metrics.NewCounter("kaas_storage_wal_prezero_bytes_total")
	walCheckpointDuration = metrics.NewHistogram("kaas_storage_wal_checkpoint_duration_seconds")

	// Data directory lock (lock.go): starts refused because another process holds it.
	lockRefusalsTotal = metrics.NewCounter("kaas_storage_dir_lock_refusals_total")

	// producer.id.expiration.ms (producer.go): idle producer entries removed.
	producersExpiredTotal = metrics.NewCounter("kaas_storage_producers_expired_total")

	// Store.FenceProducer (txn.go): fences, and partitions visited by them (bounded by the
	// partitions holding state for the producer, not by the partition count).
	fencesTotal          = metrics.NewCounter("kaas_storage_fences_total")
	fencePartitionsTotal = metrics.NewCounter("kaas_storage_fence_partitions_total")

	// Runtime partition load / release (store.go).
	partitionLoadsTotal    = metrics.NewCounter("kaas_storage_partition_loads_total")
	partitionReleasesTotal = metrics.NewCounter("kaas_storage_partition_releases_total")

	// Cluster mode (cluster.go): takeover duration, WAL records salvaged from a dead holder,
	// takeovers refused because an acknowledged record was missing, stores fenced by Rule P,
	// dead WAL directories removed, and failed volume self-tests.
	takeoverDuration            = metrics.NewHistogram("kaas_storage_takeover_seconds")
	salvagedRecordsTotal        = metrics.NewCounter("kaas_storage_salvaged_records_total")
	salvageGapsTotal            = metrics.NewCounter("kaas_storage_salvage_gaps_total")
	publishRefusedTotal         = metrics.NewCounter("kaas_storage_publish_refused_total")
	deadWALsRemovedTotal        = metrics.NewCounter("kaas_storage_dead_wal_removed_total")
	volumeSelfTestFailuresTotal = metrics.NewCounter("kaas_storage_volume_selftest_failures_total")
	recoveryCheckpointsTotal    = metrics.NewCounter("kaas_storage_recovery_checkpoints_total")
)
