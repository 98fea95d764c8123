package storage

import (
	"errors"
	"fmt"

	"github.com/kaas-go/kaas/codec"
)

// Decompression and recompression of record batches for the cleaner (cleaner.go): it reads the
// keys of a compressed batch and writes back the records it keeps in the batch's own codec, as
// Apache's cleaner does. Both go through codec's compressors (codec/compress.go), the same ones
// the produce path validates and recompresses with; Apache's cleaner writes at the codec's
// default level.

// maxCleanerDecompressed bounds one decompressed batch: a batch is at most max.message.bytes
// compressed, and a decompression bomb must not take the broker's memory. A batch past it is a
// cleaner error (the partition's cleaning goes offline, kaas_cleaner_errors_total).
const maxCleanerDecompressed = 256 << 20

var errTooLarge = errors.New("decompressed batch exceeds the cleaner's limit")

// decompressRecords returns the uncompressed records of a batch compressed with codec c.
func decompressRecords(c int, data []byte) ([]byte, error) {
	out, err := codec.Decompress(nil, c, data, maxCleanerDecompressed)
	if errors.Is(err, codec.ErrDecompressLimit) {
		return nil, errTooLarge
	}
	return out, err
}

// compressRecords compresses raw records with codec c at the codec's default level.
func compressRecords(c int, raw []byte) ([]byte, error) {
	level := 0
	switch c {
	case codec.CompressionGzip:
		level = codec.GzipLevelDefault
	case codec.CompressionLZ4:
		level = codec.LZ4LevelDefault
	case codec.CompressionZstd:
		level = codec.ZstdLevelDefault
	case codec.CompressionSnappy:
	default:
		return nil, fmt.Errorf("unknown compression codec %d", c)
	}
	return codec.Compress(nil, c, level, raw)
}
