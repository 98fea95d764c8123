package framelog

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// File is what an Appender writes through (an *os.File with fdatasync, or a test double).
type File interface {
	WriteAt(b []byte, off int64) (int, error)
	// Datasync makes written data durable without the metadata a read does not need
	// (fdatasync(2) on Linux). Only used for writes that end inside the pre-zeroed, fsync'd
	// region, so neither the size nor the block map has to be committed by it.
	Datasync() error
	// Sync is a full fsync (size and allocation included).
	Sync() error
	Truncate(size int64) error
}

// ErrFrameTooLarge: a payload is larger than the format's reader accepts (Format.MaxLen). It is
// refused before anything is written: acknowledging it would lose it on the next start.
var ErrFrameTooLarge = errors.New("frame larger than the log's reader accepts")

// Appender writes frames at the end of a log, one write and one sync per call, and repairs the
// file after a failed write or sync. It is not safe for concurrent use (a log has one writer).
//
//	   Write ok (off += n)
//	  ┌────┐
//	  ▼    │      Write or its sync fails
//	┌────────┐ ─────────────────────────────────► ┌────────┐ ──┐ Repair fails: every
//	│ clean  │                                    │ broken │   │ Write fails, nothing
//	└────────┘ ◄───────────────────────────────── └────────┘ ◄─┘ is written
//	             Repair ok (zeros / cut + fsync)
//
// Repair: after a failed fsync Linux may have marked the dirty pages clean without writing them
// (fsyncgate), so the region the failed write may have reached, [off, broken), is not trusted:
// it is zeroed again where it lies in the pre-zeroed region, cut off where the write grew the
// file, and the result is fsync'd. Only then is anything appended again, so nothing is ever
// written after a possibly partial frame (the scanner would have to call the later, acknowledged
// frames damage).
type Appender struct {
	f      File
	format *Format
	// off is the end of the durable data: the next write goes here.
	off int64
	// zeroEnd: [off, zeroEnd) holds zeros that were fsync'd ahead of time, so a write ending
	// below it is made durable with Datasync.
	zeroEnd int64
	// broken > 0: a write or sync failed and [off, broken) may hold part of it.
	broken int64
	buf    []byte

	// Observe, if set, is told the duration of every write and of its sync, and whether the
	// sync was a full fsync (the write ended past the pre-zeroed region).
	Observe func(write, sync time.Duration, full bool)
}

// NewAppender appends to f at off; [off, zeroEnd) is pre-zeroed and fsync'd (zeroEnd <= off if
// nothing is). format frames the payloads given to Append.
func NewAppender(f File, format *Format, off, zeroEnd int64) *Appender {
	return &Appender{f: f, format: format, off: off, zeroEnd: zeroEnd}
}

// Offset is the end of the durable data.
func (a *Appender) Offset() int64 { return a.off }

// Fits reports whether n more bytes stay inside the pre-zeroed region.
func (a *Appender) Fits(n int) bool { return a.off+int64(n) <= a.zeroEnd }

// Broken reports whether a failed write still waits for its repair.
func (a *Appender) Broken() bool { return a.broken != 0 }

// Append frames every payload and writes them with one write and one sync. A payload the
// reader would refuse fails with ErrFrameTooLarge before anything is written.
func (a *Appender) Append(payloads ...[]byte) error {
	b := a.buf[:0]
	for _, p := range payloads {
		if !a.format.Fits(len(p)) {
			return fmt.Errorf("cannot append a %d-byte frame (limit %d): %w", len(p), a.format.MaxLen, ErrFrameTooLarge)
		}
		b = a.format.Append(b, p)
	}
	err := a.Write(b)
	if cap(b) <= 1<<20 {
		a.buf = b[:0]
	}
	return err
}

// Write writes b (whole frames) at the end with one write and makes it durable with one
// fdatasync, or fsync where it reaches past the pre-zeroed region. A pending repair runs first;
// if it fails nothing is written. If the write or sync fails, the region is marked possibly
// partial and repaired at once (and again before the next write while that fails); the error
// says whether the repair failed too.
func (a *Appender) Write(b []byte) error {
	if err := a.Repair(); err != nil {
		return err
	}
	start := time.Now()
	_, err := a.f.WriteAt(b, a.off)
	wrote := time.Now()
	full := !a.Fits(len(b))
	if err == nil {
		if full {
			err = a.f.Sync()
		} else {
			err = a.f.Datasync()
		}
	}
	if a.Observe != nil {
		a.Observe(wrote.Sub(start), time.Since(wrote), full)
	}
	if err != nil {
		a.broken = a.off + int64(len(b))
		if rerr := a.Repair(); rerr != nil {
			return fmt.Errorf("%w (%v; nothing is appended until a repair succeeds)", err, rerr)
		}
		return err
	}
	a.off += int64(len(b))
	return nil
}

// Repair puts the file back to ending cleanly at Offset after a failed write (see Appender). A
// no-op when nothing failed.
func (a *Appender) Repair() error {
	if a.broken == 0 {
		return nil
	}
	err := func() error {
		if a.broken > a.zeroEnd {
			if err := a.f.Truncate(max(a.off, a.zeroEnd)); err != nil {
				return err
			}
		}
		if err := WriteZeros(a.f, a.off, min(a.broken, a.zeroEnd)); err != nil {
			return err
		}
		return a.f.Sync()
	}()
	if err != nil {
		return fmt.Errorf("cannot repair the log after a failed write: %w", err)
	}
	a.broken = 0
	return nil
}

// zeroChunk is shared read-only by every writer of zeros.
var zeroChunk = make([]byte, 256<<10)

// WriteZeros writes zeros over [from, to) of w (nothing if to <= from).
func WriteZeros(w io.WriterAt, from, to int64) error {
	for off := from; off < to; {
		n := min(int64(len(zeroChunk)), to-off)
		if _, err := w.WriteAt(zeroChunk[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}
