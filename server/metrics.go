package server

import (
	"fmt"

	"github.com/VictoriaMetrics/metrics"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Server metrics, created once at package level (VictoriaMetrics/metrics panics on duplicates).
var (
	mConnsOpened     = metrics.NewCounter(`kaas_connections_opened_total`)
	mConnsOpen       = metrics.NewGauge(`kaas_connections_open`, nil)
	mBytesIn         = metrics.NewCounter(`kaas_network_received_bytes_total`)
	mBytesOut        = metrics.NewCounter(`kaas_network_sent_bytes_total`)
	mFrameRejected   = metrics.NewCounter(`kaas_request_frames_rejected_total`)
	mInboundOverflow = metrics.NewCounter(`kaas_connection_inbound_limit_reached_total`)
	// mMutedWaits counts requests that waited for a client-quota mute (KIP-219) to pass.
	mMutedWaits  = metrics.NewCounter(`kaas_quota_muted_waits_total`)
	mBadRequests = metrics.NewCounter(`kaas_requests_malformed_total`)
	mPanics      = metrics.NewCounter(`kaas_handler_panics_total`)
	mFailStops   = metrics.NewCounter(`kaas_cluster_broker_failstops_total`)
	// mSlowConsumerCloses counts connections closed for unread responses over
	// connection.max.outbound.bytes (conn.noteOutbound).
	mSlowConsumerCloses = metrics.NewCounter(`kaas_slow_consumer_closes_total`)

	mRequests [128]*metrics.Counter
	mLatency  [128]*metrics.Histogram
)

func init() {
	for k := range mRequests {
		name := kmsg.NameForKey(int16(k))
		if name == "Unknown" || name == "" {
			name = fmt.Sprintf("key%d", k)
		}
		mRequests[k] = metrics.NewCounter(fmt.Sprintf(`kaas_requests_total{api=%q}`, name))
		mLatency[k] = metrics.NewHistogram(fmt.Sprintf(`kaas_request_duration_seconds{api=%q}`, name))
	}
}

var mProduceRejected = metrics.NewCounter(`kaas_produce_rejected_batches_total`)

// Invalid records of rejected batches left out of the Produce response's RecordErrors
// (codec.MaxRecordErrors per batch).
var mProduceRecordErrorsDropped = metrics.NewCounter(`kaas_produce_record_errors_dropped_total`)

// Compressed produce: batches refused because they inflate past the decompression limit
// (codec.DefaultMaxUncompressedBytes; a decompression bomb or an outsized batch), bytes
// decompressed for validation, and batches recompressed into the topic's compression.type.
var (
	mProduceDecompressLimited = metrics.NewCounter(`kaas_produce_decompress_limit_total`)
	mProduceDecompressedBytes = metrics.NewCounter(`kaas_produce_decompressed_bytes_total`)
	mProduceRecompressed      = metrics.NewCounter(`kaas_produce_recompressed_batches_total`)
)

// Listener security (listener.go, tls.go, sasl.go).
var (
	mTLSHandshakeFailures = metrics.NewCounter(`kaas_tls_handshake_failures_total`)
	mTLSReloads           = metrics.NewCounter(`kaas_tls_reloads_total`)
	mTLSReloadFailures    = metrics.NewCounter(`kaas_tls_reload_failures_total`)
	// mSASLFailures counts failed SASL authentications (bad password, unknown user, garbage
	// token, unsupported mechanism); mSASLAuthentications successful ones, re-authentications
	// included.
	mSASLFailures        = metrics.NewCounter(`kaas_sasl_authentication_failures_total`)
	mSASLAuthentications = metrics.NewCounter(`kaas_sasl_authentications_total`)
	// mSASLPreAuthRequests counts connections closed for a request before authentication.
	mSASLPreAuthRequests = metrics.NewCounter(`kaas_sasl_unauthenticated_requests_total`)
	// mSASLOversized counts frames / tokens over sasl.server.max.receive.size.
	mSASLOversized = metrics.NewCounter(`kaas_sasl_oversized_tokens_total`)
	// mSASLExpiredCloses counts connections closed because their KIP-368 session expired.
	mSASLExpiredCloses     = metrics.NewCounter(`kaas_sasl_expired_session_closes_total`)
	mCredentialStoreErrors = metrics.NewCounter(`kaas_sasl_credential_store_errors_total`)
)
