package codec

import "github.com/valyala/bytebufferpool"

// Distinct pools per buffer kind, as bytebufferpool recommends: request frames and response
// frames have different size distributions, and each pool calibrates to its own.
var (
	FramePool    bytebufferpool.Pool
	ResponsePool bytebufferpool.Pool
	// DecompressPool holds the decompressed records of a compressed batch while it is
	// validated (and recompressed); BatchPool holds batches the broker rebuilt.
	DecompressPool bytebufferpool.Pool
	BatchPool      bytebufferpool.Pool
)
