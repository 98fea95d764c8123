package storage

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Decompression and recompression of record batches for the cleaner (cleaner.go), the minimum
// it needs to read the keys of a compressed batch and to write back the records it keeps in the
// batch's own codec, as Apache's cleaner does. (codec does not decompress: the produce path
// does not need to.) Kafka's codec ids: 1 gzip, 2 snappy (xerial framing from the Java client,
// raw blocks from others: both are read, xerial is written), 3 lz4 (frame format), 4 zstd.

// maxCleanerDecompressed bounds one decompressed batch: a batch is at most max.message.bytes
// compressed, and a decompression bomb must not take the broker's memory. A batch past it is a
// cleaner error (the partition's cleaning goes offline, kaas_cleaner_errors_total).
const maxCleanerDecompressed = 256 << 20

var errTooLarge = errors.New("decompressed batch exceeds the cleaner's limit")

var (
	zstdDec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxCleanerDecompressed))
	zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
)

// decompressRecords returns the uncompressed records of a batch compressed with codec c.
func decompressRecords(c int, data []byte) ([]byte, error) {
	var r io.Reader
	switch c {
	case 1:
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		r = zr
	case 2:
		out, err := xerial.Decode(data)
		if err == nil && len(out) > maxCleanerDecompressed {
			return nil, errTooLarge
		}
		return out, err
	case 3:
		r = lz4.NewReader(bytes.NewReader(data))
	case 4:
		return zstdDec.DecodeAll(data, nil)
	default:
		return nil, fmt.Errorf("unknown compression codec %d", c)
	}
	out, err := io.ReadAll(io.LimitReader(r, maxCleanerDecompressed+1))
	if err == nil && len(out) > maxCleanerDecompressed {
		err = errTooLarge
	}
	return out, err
}

// compressRecords compresses raw records with codec c (default levels, as Apache's cleaner
// writes with the codec's default).
func compressRecords(c int, raw []byte) ([]byte, error) {
	switch c {
	case 1:
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		if _, err := w.Write(raw); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	case 2:
		return xerial.Encode(nil, raw), nil
	case 3:
		var buf bytes.Buffer
		w := lz4.NewWriter(&buf)
		if _, err := w.Write(raw); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	case 4:
		return zstdEnc.EncodeAll(raw, nil), nil
	}
	return nil, fmt.Errorf("unknown compression codec %d", c)
}
