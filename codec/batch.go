package codec

import (
	"encoding/binary"
	"hash/crc32"
)

// Batch is a zero-copy view of one v2 record batch (KIP-98 format) as it sits on the wire and on
// disk. Layout (byte offsets):
//
//	 0 baseOffset int64        27 baseTimestamp int64
//	 8 batchLength int32       35 maxTimestamp int64
//	12 partitionLeaderEpoch    43 producerId int64
//	16 magic int8              51 producerEpoch int16
//	17 crc uint32 (CRC32C of   53 baseSequence int32
//	   bytes 21..end)          57 recordCount int32
//	21 attributes int16        61 records...
//	23 lastOffsetDelta int32
//
// baseOffset and partitionLeaderEpoch lie outside the CRC, so the broker assigns offsets by
// rewriting them in place without touching the CRC.
type Batch []byte

// BatchHeaderSize is the size of the fixed v2 header; LogOverhead is baseOffset+batchLength.
const (
	BatchHeaderSize = 61
	LogOverhead     = 12
)

// Attribute bits.
const (
	AttrCompressionMask = 0x07
	AttrLogAppendTime   = 0x08
	AttrTransactional   = 0x10
	AttrControl         = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (b Batch) BaseOffset() int64           { return int64(binary.BigEndian.Uint64(b)) }
func (b Batch) SetBaseOffset(o int64)       { binary.BigEndian.PutUint64(b, uint64(o)) }
func (b Batch) BatchLength() int32          { return int32(binary.BigEndian.Uint32(b[8:])) }
func (b Batch) PartitionLeaderEpoch() int32 { return int32(binary.BigEndian.Uint32(b[12:])) }
func (b Batch) SetPartitionLeaderEpoch(e int32) {
	binary.BigEndian.PutUint32(b[12:], uint32(e))
}
func (b Batch) Magic() int8            { return int8(b[16]) }
func (b Batch) CRC() uint32            { return binary.BigEndian.Uint32(b[17:]) }
func (b Batch) Attributes() int16      { return int16(binary.BigEndian.Uint16(b[21:])) }
func (b Batch) LastOffsetDelta() int32 { return int32(binary.BigEndian.Uint32(b[23:])) }
func (b Batch) LastOffset() int64      { return b.BaseOffset() + int64(b.LastOffsetDelta()) }
func (b Batch) BaseTimestamp() int64   { return int64(binary.BigEndian.Uint64(b[27:])) }
func (b Batch) MaxTimestamp() int64    { return int64(binary.BigEndian.Uint64(b[35:])) }
func (b Batch) ProducerID() int64      { return int64(binary.BigEndian.Uint64(b[43:])) }
func (b Batch) ProducerEpoch() int16   { return int16(binary.BigEndian.Uint16(b[51:])) }
func (b Batch) BaseSequence() int32    { return int32(binary.BigEndian.Uint32(b[53:])) }
func (b Batch) NumRecords() int32      { return int32(binary.BigEndian.Uint32(b[57:])) }
func (b Batch) Compression() int       { return int(b.Attributes() & AttrCompressionMask) }
func (b Batch) IsTransactional() bool  { return b.Attributes()&AttrTransactional != 0 }
func (b Batch) IsControl() bool        { return b.Attributes()&AttrControl != 0 }
func (b Batch) IsLogAppendTime() bool  { return b.Attributes()&AttrLogAppendTime != 0 }
func (b Batch) ComputeCRC() uint32     { return crc32.Checksum(b[21:], castagnoli) }
func (b Batch) CRCValid() bool         { return b.ComputeCRC() == b.CRC() }
func (b Batch) updateCRC()             { binary.BigEndian.PutUint32(b[17:], b.ComputeCRC()) }
func (b Batch) Records() []byte        { return b[BatchHeaderSize:] }
func (b Batch) HasProducer() bool      { return b.ProducerID() >= 0 }
func (b Batch) Size() int              { return len(b) }

// LastSequence is the sequence number of the last record. Sequences wrap from MaxInt32 to 0, as
// the Java producer does (DefaultRecordBatch.incrementSequence).
func (b Batch) LastSequence() int32 { return IncrementSequence(b.BaseSequence(), b.LastOffsetDelta()) }

// IncrementSequence adds delta to seq with Kafka's wrap-around to 0 past MaxInt32.
func IncrementSequence(seq, delta int32) int32 {
	if seq > int32(^uint32(0)>>1)-delta {
		return delta - (int32(^uint32(0)>>1) - seq) - 1
	}
	return seq + delta
}

// SetLogAppendTime stamps the batch with the broker's time (topic message.timestamp.type =
// LogAppendTime): the timestamp-type bit is set and maxTimestamp carries the append time, which
// consumers report for every record. Both fields are under the CRC, so it is recomputed.
func (b Batch) SetLogAppendTime(ts int64) {
	binary.BigEndian.PutUint16(b[21:], uint16(b.Attributes()|AttrLogAppendTime))
	binary.BigEndian.PutUint64(b[35:], uint64(ts))
	b.updateCRC()
}

// FrameBatch reads the batch at the start of buf using only its length field. It returns the
// batch and ok=true if buf holds the whole batch and the length is plausible; ok=false means buf
// is short (or the header is impossible, when bad is set). It does not check the CRC.
func FrameBatch(buf []byte) (b Batch, ok, bad bool) {
	if len(buf) < LogOverhead {
		return nil, false, false
	}
	l := int64(int32(binary.BigEndian.Uint32(buf[8:])))
	if l < BatchHeaderSize-LogOverhead {
		return nil, false, true
	}
	total := l + LogOverhead
	if int64(len(buf)) < total {
		return nil, false, false
	}
	return Batch(buf[:total]), true, false
}
