package framelog

import "errors"

// Torn-tail classification. A log is only ever appended to, one write + one sync at a time, and
// a write is acknowledged only after its sync returned. So after a crash:
//
//	 valid frames ............ | stop | ......................................
//	 (acknowledged, or the     | the first byte that is not a valid frame, or the end of
//	  unit being written)      | the data; what follows it decides what the stop is:
//
//	 clean end   the data ends, or the bytes at the stop are filler (Prezeroed zeros, a
//	             recycled file's earlier life) and no valid frame follows
//	 torn end    the stop is inside the last write: an incomplete unit, a frame cut short or
//	             with a bad checksum, or only frames of that same unfinished write follow
//	             (its pages can reach the disk in any order before the sync that never
//	             returned). Discard everything from End: it was never acknowledged.
//	 damaged     a frame that was acknowledged follows the stop: the damage is inside
//	             acknowledged data. No crash produces that; the caller refuses to start
//	             rather than lose or invent state.
//
// Which later frames may belong to the unfinished write is the log's own knowledge (a batch
// number, a round number), hence the Follow callback.

// Follow is what a valid frame found after the stop means.
type Follow int

const (
	// Stray: a frame of the unfinished write. The tail is torn, not damaged.
	Stray Follow = iota
	// Acked: a frame that was (or may have been) acknowledged: damage inside acknowledged data.
	Acked
	// Skip: not a frame of this log after all; keep looking.
	Skip
)

// ErrBadFrame, returned (possibly wrapped) by a Scanner's Frame callback, makes the scanner treat
// that frame like one whose checksum failed: the valid data stops there, and what follows
// classifies the stop. Any other error ends the scan with that error.
var ErrBadFrame = errors.New("bad frame")

// Scanner reads a log's frames and classifies where they stop.
type Scanner struct {
	Format *Format
	// Frame is called for every valid frame in file order; pos is its offset in the data. commit
	// reports whether the frame completes a unit (the batch one Append wrote): End advances only
	// at commits, so frames of a unit that never got its last frame are a torn tail. A log whose
	// every frame is a unit returns true.
	Frame func(pos int, payload []byte) (commit bool, err error)
	// Follow classifies the valid frames found after the stop, in order, until one is Acked.
	// nil: every one is Acked (a log that writes one frame per sync).
	Follow func(pos int, payload []byte) Follow
}

// Result is where a scan stopped and why.
type Result struct {
	// End is the offset just past the last committed frame (the scan's start if none): the
	// length of the valid data.
	End int64
	// Stop is where reading frames stopped (>= End).
	Stop int64
	// Torn: the bytes from End on must be discarded (never acknowledged). TornAt = Stop, Why
	// says what was found there.
	Torn   bool
	TornAt int64
	Why    string
	// Damaged: an acknowledged frame follows the stop, at DamagedAt.
	Damaged   bool
	DamagedAt int64
}

// Scan reads the frames of data from offset from on.
func (s *Scanner) Scan(data []byte, from int) (Result, error) {
	f := s.Format
	res := Result{End: int64(from)}
	pos, open, why := from, false, ""
	for pos < len(data) {
		payload, size, ok := f.Parse(data[pos:])
		if !ok {
			if !f.isFiller(data[pos:]) {
				why = "torn or corrupt frame (length or checksum)"
				if len(data)-pos < f.HeaderLen {
					why = "short frame header"
				}
			}
			break
		}
		commit, err := s.Frame(pos, payload)
		if err != nil {
			if errors.Is(err, ErrBadFrame) {
				why = err.Error()
				break
			}
			return res, err
		}
		pos += size
		open = !commit
		if commit {
			res.End = int64(min(pos, len(data)))
		}
	}
	stop := min(pos, len(data))
	res.Stop = int64(stop)
	if why == "" && open {
		why = "incomplete unit (its last frame is missing)"
	}
	if why != "" {
		res.Torn, res.TornAt, res.Why = true, int64(stop), why
	}
	for p := f.Find(data, stop+1); p >= 0; {
		payload, size, _ := f.Parse(data[p:])
		k := Acked
		if s.Follow != nil {
			k = s.Follow(p, payload)
		}
		switch k {
		case Acked:
			res.Damaged, res.DamagedAt = true, int64(p)
			return res, nil
		case Stray:
			if !res.Torn {
				res.Torn, res.TornAt, res.Why = true, int64(stop), "stray frames of an unfinished write"
			}
			p = f.Find(data, p+size)
		default:
			p = f.Find(data, p+1)
		}
	}
	return res, nil
}
