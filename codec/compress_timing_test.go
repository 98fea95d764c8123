package codec

import (
	"fmt"
	"testing"
)

// jsonRecords is n records with ~120-byte JSON-like values: compressible as real payloads are.
func jsonRecords(n int) []byte {
	return recordsOf(n, keyed, inOrder)
}

// BenchmarkValidateCompressed measures produce-side validation per source codec: "producer" is
// compression.type=producer (decompress + walk every record, the batch kept as is); "to-X"
// adds recompression into codec X at its Apache default level. Bytes are uncompressed record
// bytes, so MB/s compare across codecs.
func BenchmarkValidateCompressed(b *testing.B) {
	raw := jsonRecords(1000)
	for _, from := range allCodecs {
		src := wrapBatch(libCompress(b, from, raw), 1000, int16(from), 0)
		targets := []int{-1, CompressionNone, CompressionLZ4, CompressionZstd, CompressionGzip, CompressionSnappy}
		for _, to := range targets {
			name := fmt.Sprintf("%s/producer", CompressionName(from))
			o := ValidateOptions{MaxMessageBytes: 1 << 24, TimestampBeforeMaxMs: -1, TimestampAfterMaxMs: -1}
			if to >= 0 {
				if to == from {
					continue
				}
				name = fmt.Sprintf("%s/to-%s", CompressionName(from), CompressionName(to))
				o.Recompress, o.TargetCompression = true, to
				switch to {
				case CompressionGzip:
					o.TargetLevel = GzipLevelDefault
				case CompressionLZ4:
					o.TargetLevel = LZ4LevelDefault
				case CompressionZstd:
					o.TargetLevel = ZstdLevelDefault
				}
			}
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(raw)))
				for i := 0; i < b.N; i++ {
					v := ValidateProduceBatch(src, o)
					if v.Code != CodeNone {
						b.Fatal(v.Code)
					}
					v.Release()
				}
			})
		}
	}
}
