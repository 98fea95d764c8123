package codec

import "encoding/binary"

// Control record types (org.apache.kafka.common.record.ControlRecordType).
const (
	ControlAbort  int16 = 0
	ControlCommit int16 = 1
)

// AppendControlBatch appends a transaction marker batch (KIP-98): one control record whose key is
// (int16 version 0, int16 type) and whose value is (int16 version 0, int32 coordinatorEpoch). The
// batch is transactional and control, carries the producer's id and epoch, sequence -1, and the
// broker's timestamp. baseOffset is left 0 for the log to assign.
func AppendControlBatch(dst []byte, producerID int64, epoch int16, commit bool, coordinatorEpoch int32, nowMs int64) []byte {
	typ := ControlAbort
	if commit {
		typ = ControlCommit
	}
	start := len(dst)
	var hdr [BatchHeaderSize]byte
	dst = append(dst, hdr[:]...)
	b := dst[start:]
	binary.BigEndian.PutUint32(b[12:], 0xffffffff) // partitionLeaderEpoch -1
	b[16] = 2
	binary.BigEndian.PutUint16(b[21:], uint16(AttrTransactional|AttrControl))
	binary.BigEndian.PutUint32(b[23:], 0)
	binary.BigEndian.PutUint64(b[27:], uint64(nowMs))
	binary.BigEndian.PutUint64(b[35:], uint64(nowMs))
	binary.BigEndian.PutUint64(b[43:], uint64(producerID))
	binary.BigEndian.PutUint16(b[51:], uint16(epoch))
	binary.BigEndian.PutUint32(b[53:], 0xffffffff)
	binary.BigEndian.PutUint32(b[57:], 1)

	var rec [32]byte
	body := rec[:0]
	body = append(body, 0)              // attributes
	body = binary.AppendVarint(body, 0) // timestamp delta
	body = binary.AppendVarint(body, 0) // offset delta
	body = binary.AppendVarint(body, 4) // key length
	body = binary.BigEndian.AppendUint16(body, 0)
	body = binary.BigEndian.AppendUint16(body, uint16(typ))
	body = binary.AppendVarint(body, 6) // value length
	body = binary.BigEndian.AppendUint16(body, 0)
	body = binary.BigEndian.AppendUint32(body, uint32(coordinatorEpoch))
	body = binary.AppendVarint(body, 0) // headers
	dst = binary.AppendVarint(dst, int64(len(body)))
	dst = append(dst, body...)

	b = dst[start:]
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-LogOverhead))
	Batch(b).updateCRC()
	return dst
}

// ControlType returns the marker type of a control batch (its first record's key), or -1 if the
// batch is not a well-formed control batch.
func ControlType(b Batch) int16 {
	if len(b) < BatchHeaderSize+1 || !b.IsControl() {
		return -1
	}
	p := b.Records()
	l, k := binary.Varint(p)
	if k <= 0 || l <= 0 || int64(len(p)-k) < l {
		return -1
	}
	rec := p[k : k+int(l)]
	rec = rec[1:]
	for i := 0; i < 2; i++ { // timestamp delta, offset delta
		_, k = binary.Varint(rec)
		if k <= 0 {
			return -1
		}
		rec = rec[k:]
	}
	kl, k := binary.Varint(rec)
	if k <= 0 || kl < 4 || int64(len(rec)-k) < kl {
		return -1
	}
	key := rec[k:]
	return int16(binary.BigEndian.Uint16(key[2:]))
}
