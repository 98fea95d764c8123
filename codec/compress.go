package codec

// Record batch compression (attributes bits 0-2), as Kafka's producers and brokers write it:
//
//	1 gzip    RFC 1952 stream
//	2 snappy  snappy-java's "xerial" framing (16-byte header, then [int32 length][raw block]
//	          chunks), or one raw snappy block: Apache's SnappyInputStream falls back to a raw
//	          block when the header is absent, and librdkafka has written raw blocks.
//	3 lz4     LZ4 frame format (v2 batches; the broken header checksum of magic 0 is gone)
//	4 zstd    zstd frame(s) (KIP-110)
//
// Decompression is always bounded: Decompress never yields more than the caller's limit, so a
// small batch that inflates to gigabytes (a decompression bomb) is refused after limit bytes of
// work, not after exhausting memory. Readers, writers and their windows are pooled: a produce
// path that decompresses every batch must not allocate a decoder per batch.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Compression codecs (batch attributes & AttrCompressionMask).
const (
	CompressionNone   = 0
	CompressionGzip   = 1
	CompressionSnappy = 2
	CompressionLZ4    = 3
	CompressionZstd   = 4
)

// Apache 4.1 per-codec level defaults and bounds (KIP-390: compression.gzip.level,
// compression.lz4.level, compression.zstd.level).
const (
	GzipLevelDefault = -1 // zlib's default (6)
	GzipLevelMin     = 1
	GzipLevelMax     = 9
	LZ4LevelDefault  = 9
	LZ4LevelMin      = 1
	LZ4LevelMax      = 17
	ZstdLevelDefault = 3
	ZstdLevelMin     = -131072
	ZstdLevelMax     = 22
)

// ErrDecompressLimit is returned when a batch decompresses to more than the allowed bytes.
var ErrDecompressLimit = errors.New("decompressed records exceed the limit")

// errUnknownCodec is returned for attribute values 5-7.
var errUnknownCodec = errors.New("unknown compression codec")

// CompressionName is Kafka's name of a codec (compression.type values).
func CompressionName(c int) string {
	switch c {
	case CompressionNone:
		return "uncompressed"
	case CompressionGzip:
		return "gzip"
	case CompressionSnappy:
		return "snappy"
	case CompressionLZ4:
		return "lz4"
	case CompressionZstd:
		return "zstd"
	}
	return "unknown"
}

// Decompress appends the records compressed in src with codec c to dst and returns it. It
// produces at most limit new bytes; a batch that would inflate further is ErrDecompressLimit,
// detected after limit+1 bytes of output, whatever the claimed sizes in the stream say.
func Decompress(dst []byte, c int, src []byte, limit int) ([]byte, error) {
	switch c {
	case CompressionNone:
		if len(src) > limit {
			return dst, ErrDecompressLimit
		}
		return append(dst, src...), nil
	case CompressionGzip:
		r := gzipReaders.Get().(*gzipReader)
		defer gzipReaders.Put(r)
		r.src.Reset(src)
		if err := r.Reset(&r.src); err != nil {
			r.src.Reset(nil)
			return dst, err
		}
		// Kafka writes one member; a concatenation of members is still one valid gzip stream.
		out, err := readLimited(dst, &r.Reader, limit)
		r.src.Reset(nil) // the pool must not pin the request's bytes
		return out, err
	case CompressionSnappy:
		return decodeSnappy(dst, src, limit)
	case CompressionLZ4:
		r := lz4Readers.Get().(*lz4Reader)
		defer lz4Readers.Put(r)
		r.src.Reset(src)
		r.Reset(&r.src)
		out, err := readLimited(dst, r.Reader, limit)
		r.src.Reset(nil)
		r.Reset(nil)
		return out, err
	case CompressionZstd:
		d := zstdDecoders.Get().(*zstdDecoder)
		defer zstdDecoders.Put(d)
		d.src.Reset(src)
		if err := d.Reset(&d.src); err != nil {
			d.src.Reset(nil)
			return dst, err
		}
		out, err := readLimited(dst, d.Decoder, limit)
		d.src.Reset(nil)
		_ = d.Reset(nil)
		return out, err
	}
	return dst, errUnknownCodec
}

type gzipReader struct {
	gzip.Reader
	src bytes.Reader
}

type lz4Reader struct {
	*lz4.Reader
	src bytes.Reader
}

type zstdDecoder struct {
	*zstd.Decoder
	src bytes.Reader
}

var (
	gzipReaders = sync.Pool{New: func() any { return new(gzipReader) }}
	lz4Readers  = sync.Pool{New: func() any { return &lz4Reader{Reader: lz4.NewReader(nil)} }}
	// Concurrency 1 makes the stream decoder synchronous (no goroutines per decoder); the
	// window cap keeps a hostile frame header from reserving an enormous window.
	zstdDecoders = sync.Pool{New: func() any {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			panic(err) // only on invalid options, which are constants here
		}
		return &zstdDecoder{Decoder: d}
	}}
)

// readLimited reads r to EOF into dst, growing it geometrically but never past limit+1 bytes of
// new output: the (limit+1)th byte proves the bomb without decompressing any further.
func readLimited(dst []byte, r io.Reader, limit int) ([]byte, error) {
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			grow := cap(dst) - start
			if grow < 4096 {
				grow = 4096
			}
			if room := limit + 1 - (len(dst) - start); grow > room {
				grow = room
			}
			dst = append(dst, make([]byte, grow)...)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst)-start > limit {
			return dst[:start+limit], ErrDecompressLimit
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// xerialMagic opens a snappy-java framed stream; a 4-byte version and a 4-byte minimum
// compatible version follow.
var xerialMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

const xerialHeaderSize = 16

// xerialBlockSize is snappy-java's default uncompressed chunk size (32 KiB).
const xerialBlockSize = 32 << 10

var errSnappyFrame = errors.New("malformed xerial snappy framing")

// decodeSnappy decodes either framing. Each block's decoded length is read from its header
// before anything is allocated, so the limit is enforced before the work.
func decodeSnappy(dst, src []byte, limit int) ([]byte, error) {
	start := len(dst)
	block := func(b []byte) error {
		n, err := snappy.DecodedLen(b)
		if err != nil {
			return err
		}
		if n > limit-(len(dst)-start) {
			return ErrDecompressLimit
		}
		dst = growLen(dst, n)
		out, err := snappy.Decode(dst[len(dst)-n:], b)
		if err != nil {
			return err
		}
		if len(out) != n {
			return errSnappyFrame
		}
		return nil
	}
	if !bytes.HasPrefix(src, xerialMagic) {
		return dst, block(src)
	}
	if len(src) < xerialHeaderSize {
		return dst, errSnappyFrame
	}
	p := src[xerialHeaderSize:]
	for len(p) > 0 {
		if len(p) < 4 {
			return dst, errSnappyFrame
		}
		l := binary.BigEndian.Uint32(p)
		p = p[4:]
		if uint64(l) > uint64(len(p)) {
			return dst, errSnappyFrame
		}
		if err := block(p[:l]); err != nil {
			return dst, err
		}
		p = p[l:]
	}
	return dst, nil
}

// growLen extends b by n bytes (contents of the new bytes unspecified).
func growLen(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*len(b)+n)
	copy(nb, b)
	return nb
}

// Compress appends src compressed with codec c to dst. level follows Apache's per-codec level
// configs (GzipLevel*, LZ4Level*, ZstdLevel*); snappy has no level.
func Compress(dst []byte, c, level int, src []byte) ([]byte, error) {
	switch c {
	case CompressionNone:
		return append(dst, src...), nil
	case CompressionGzip:
		p := gzipWriterPool(level)
		w := p.Get().(*gzipWriter)
		defer p.Put(w)
		return compressStream(w.Writer, &w.out, dst, src)
	case CompressionSnappy:
		// xerial framing, as the Java producer writes it: Java consumers of old versions read
		// only this form.
		dst = append(dst, xerialMagic...)
		dst = binary.BigEndian.AppendUint32(dst, 1) // version
		dst = binary.BigEndian.AppendUint32(dst, 1) // minimum compatible version
		for len(src) > 0 {
			chunk := src
			if len(chunk) > xerialBlockSize {
				chunk = chunk[:xerialBlockSize]
			}
			src = src[len(chunk):]
			at := len(dst)
			dst = growLen(dst, 4+snappy.MaxEncodedLen(len(chunk)))
			enc := snappy.Encode(dst[at+4:], chunk)
			binary.BigEndian.PutUint32(dst[at:], uint32(len(enc)))
			dst = dst[:at+4+len(enc)]
		}
		return dst, nil
	case CompressionLZ4:
		p := lz4WriterPool(level)
		w := p.Get().(*lz4Writer)
		defer p.Put(w)
		return compressStream(w.Writer, &w.out, dst, src)
	case CompressionZstd:
		return zstdEncoder(level).EncodeAll(src, dst), nil
	}
	return dst, errUnknownCodec
}

// streamWriter is what gzip.Writer and lz4.Writer have in common: a reusable stream encoder.
type streamWriter interface {
	Reset(io.Writer)
	Write([]byte) (int, error)
	Close() error
}

// compressStream appends src encoded by the pooled w to dst, writing through out (which holds dst
// only for the call, so the pooled writer keeps no reference to the caller's slice).
func compressStream(w streamWriter, out *sliceWriter, dst, src []byte) ([]byte, error) {
	out.B = dst
	w.Reset(out)
	_, err := w.Write(src)
	if err == nil {
		err = w.Close()
	}
	res := out.B
	out.B = nil
	if err != nil {
		return dst, err // dst as given: a partial frame is not handed back
	}
	return res, nil
}

// sliceWriter appends to B (an io.Writer over a caller's slice).
type sliceWriter struct{ B []byte }

func (s *sliceWriter) Write(p []byte) (int, error) { s.B = append(s.B, p...); return len(p), nil }

type gzipWriter struct {
	*gzip.Writer
	out sliceWriter
}

type lz4Writer struct {
	*lz4.Writer
	out sliceWriter
}

// Writer pools per level. Gzip levels are -1 and 1..9 (11 pools); lz4 levels map onto
// pierrec's 10 levels; zstd levels onto klauspost's 4 encoder speeds.
var (
	gzipPools [GzipLevelMax + 2]sync.Pool // index level+1; 0 = default
	lz4Pools  [10]sync.Pool               // index 0 = Fast, n = LevelN
	zstdEncs  [5]struct {
		once sync.Once
		enc  *zstd.Encoder
	}
)

func gzipWriterPool(level int) *sync.Pool {
	if level < GzipLevelMin || level > GzipLevelMax {
		level = GzipLevelDefault
	}
	return &gzipPools[level+1]
}

// lz4 levels: Apache's lz4-java levels 1..17 (1 = fast, 9 = its default HC level, 17 = max);
// pierrec has Fast and HC depths 1..9. Apache's 1 is the fast compressor; 2..17 are HC depths,
// clamped to pierrec's deepest.
func lz4WriterPool(level int) *sync.Pool {
	i := 0
	switch {
	case level < LZ4LevelMin || level > LZ4LevelMax:
		i = LZ4LevelDefault
	case level >= 2:
		i = min(level, 9)
	}
	return &lz4Pools[i]
}

func init() {
	for i := range gzipPools {
		level := i - 1
		if level == 0 {
			continue // not a valid Apache level; gzipWriterPool never picks it
		}
		gzipPools[i].New = func() any {
			w, err := gzip.NewWriterLevel(nil, level)
			if err != nil {
				panic(err) // levels are -1 and 1..9
			}
			return &gzipWriter{Writer: w}
		}
	}
	for i := range lz4Pools {
		lvl := lz4.Fast
		if i > 0 {
			lvl = lz4.CompressionLevel(1 << (8 + i))
		}
		lz4Pools[i].New = func() any {
			w := lz4.NewWriter(nil)
			if err := w.Apply(lz4.CompressionLevelOption(lvl), lz4.ConcurrencyOption(1)); err != nil {
				panic(err) // the level is one of pierrec's constants
			}
			return &lz4Writer{Writer: w}
		}
	}
}

// zstdEncoder returns the shared encoder for a zstd level. EncodeAll is safe for concurrent use
// (one block encoder per GOMAXPROCS, built on demand). zstd's numeric levels
// map onto klauspost's speeds (EncoderLevelFromZstd); negative levels are the fastest.
func zstdEncoder(level int) *zstd.Encoder {
	if level == 0 || level < ZstdLevelMin || level > ZstdLevelMax {
		level = ZstdLevelDefault // zstd's level 0 means its default level
	}
	l := zstd.SpeedFastest
	if level > 0 {
		l = zstd.EncoderLevelFromZstd(level)
	}
	e := &zstdEncs[l]
	e.once.Do(func() {
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(l), zstd.WithWindowSize(1<<20),
			zstd.WithZeroFrames(true))
		if err != nil {
			panic(err) // constant options
		}
		e.enc = enc
	})
	return e.enc
}
