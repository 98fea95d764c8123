package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kaas-go/kaas/codec"
)

// Record-level access to v2 batches for the cleaner (cleaner.go): walking records (compressed
// batches through cleaner_codec.go), and rebuilding a batch from a subset of them in the
// batch's own codec.

// attrDeleteHorizon is the v2 attribute bit of KIP-534: the batch's baseTimestamp holds the
// delete horizon (the time after which its tombstones and its marker may be removed), and the
// records' timestamp deltas are relative to it.
const attrDeleteHorizon = 0x40

var errBadRecord = errors.New("record does not parse")

var castagnoliTable = crc32.MakeTable(crc32.Castagnoli)

// rawRecord is one record of a batch: its bytes (length prefix excluded) and parsed fields.
type rawRecord struct {
	body      []byte // attributes .. headers (what the length prefix covers)
	tsDelta   int64
	offDelta  int64
	key       []byte
	hasKey    bool
	tombstone bool
	rest      []byte // body from the offset delta on (re-encoding changes only the timestamp delta)
}

// walkRecords calls fn for each record of a batch, in order, decompressing it if need be. The
// record's slices are valid until walkRecords returns.
func walkRecords(b codec.Batch, fn func(r *rawRecord) error) error {
	p := b.Records()
	if c := b.Compression(); c != 0 {
		var err error
		if p, err = decompressRecords(c, p); err != nil {
			return fmt.Errorf("cannot decompress batch at offset %d: %w", b.BaseOffset(), err)
		}
	}
	var r rawRecord
	for i := int32(0); i < b.NumRecords(); i++ {
		l, k := binary.Varint(p)
		if k <= 0 || l < 1 || int64(len(p)-k) < l {
			return errBadRecord
		}
		body := p[k : k+int(l)]
		p = p[k+int(l):]
		q := body[1:] // attributes (unused in v2)
		td, k1 := binary.Varint(q)
		if k1 <= 0 {
			return errBadRecord
		}
		rest := q[k1:]
		od, k2 := binary.Varint(rest)
		if k2 <= 0 {
			return errBadRecord
		}
		q = rest[k2:]
		kl, k3 := binary.Varint(q)
		if k3 <= 0 || (kl >= 0 && int64(len(q)-k3) < kl) {
			return errBadRecord
		}
		q = q[k3:]
		r = rawRecord{body: body, tsDelta: td, offDelta: od, rest: rest}
		if kl >= 0 {
			r.key, r.hasKey = q[:kl], true
			q = q[kl:]
		}
		vl, k4 := binary.Varint(q)
		if k4 <= 0 {
			return errBadRecord
		}
		r.tombstone = vl < 0
		if err := fn(&r); err != nil {
			return err
		}
	}
	return nil
}

// batchBuilder rebuilds a batch from kept records: same base offset, lastOffsetDelta, producer
// id/epoch/sequence and max timestamp (so sequences, offsets and the time index stay as they
// were), possibly a new delete horizon.
type batchBuilder struct {
	buf []byte
	n   int32
	// horizon >= 0: stamp it (KIP-534) and re-encode timestamp deltas relative to it.
	horizon int64
	oldBase int64
}

func (bb *batchBuilder) start(b codec.Batch, horizon int64) {
	bb.buf = append(bb.buf[:0], b[:codec.BatchHeaderSize]...)
	bb.n = 0
	bb.horizon = horizon
	bb.oldBase = b.BaseTimestamp()
}

func (bb *batchBuilder) add(r *rawRecord) {
	bb.n++
	if bb.horizon < 0 {
		bb.buf = binary.AppendVarint(bb.buf, int64(len(r.body)))
		bb.buf = append(bb.buf, r.body...)
		return
	}
	td := bb.oldBase + r.tsDelta - bb.horizon
	var tmp [binary.MaxVarintLen64]byte
	tl := binary.PutVarint(tmp[:], td)
	bb.buf = binary.AppendVarint(bb.buf, int64(1+tl+len(r.rest)))
	bb.buf = append(bb.buf, 0)
	bb.buf = append(bb.buf, tmp[:tl]...)
	bb.buf = append(bb.buf, r.rest...)
}

// finish fixes the header (length, attributes, base timestamp, count, CRC) and returns the
// batch, compressed again with the original batch's codec (an empty batch is left uncompressed:
// it has nothing to compress).
func (bb *batchBuilder) finish() (codec.Batch, error) {
	b := bb.buf
	if c := codec.Batch(b).Compression(); c != 0 {
		if bb.n == 0 {
			attrs := binary.BigEndian.Uint16(b[21:]) &^ codec.AttrCompressionMask
			binary.BigEndian.PutUint16(b[21:], attrs)
		} else {
			z, err := compressRecords(c, b[codec.BatchHeaderSize:])
			if err != nil {
				return nil, err
			}
			b = append(b[:codec.BatchHeaderSize], z...)
			bb.buf = b
		}
	}
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-codec.LogOverhead))
	if bb.horizon >= 0 {
		attrs := binary.BigEndian.Uint16(b[21:]) | attrDeleteHorizon
		binary.BigEndian.PutUint16(b[21:], attrs)
		binary.BigEndian.PutUint64(b[27:], uint64(bb.horizon))
	}
	binary.BigEndian.PutUint32(b[57:], uint32(bb.n))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoliTable))
	return codec.Batch(b), nil
}

// deleteHorizon returns the batch's KIP-534 delete horizon, if it carries one.
func deleteHorizon(b codec.Batch) (int64, bool) {
	if b.Attributes()&attrDeleteHorizon == 0 {
		return 0, false
	}
	return b.BaseTimestamp(), true
}
