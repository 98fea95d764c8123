package framelog

import (
	"bytes"
	"testing"
)

// FuzzScan: on arbitrary bytes the scanner never panics, its result is consistent (End ≤ Stop ≤
// len, a clean end has no uncommitted frames, damage is a valid frame past the stop), and cutting
// the data at End — what recovery does with a torn tail — leaves a log that scans clean with
// exactly the same committed frames. Run for both framings: unit batches without a magic in a
// pre-zeroed file (the journal) and one-frame units with a magic (the offset log).
func FuzzScan(f *testing.F) {
	jf := Format{HeaderLen: 8, LenAt: 0, CRCAt: 4, MinLen: 2, MaxLen: 1 << 12, Prezeroed: true}
	of := Format{Magic: 0x4B474F46, HeaderLen: 12, LenAt: 4, CRCAt: 8, MaxLen: 1 << 12}
	j := func(s string) []byte { return jf.Append(nil, []byte(s)) }
	o := func(s string) []byte { return of.Append(nil, []byte(s)) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	log := cat(j("P1a"), j("L1b"), j("L2c"))
	zeros := make([]byte, 32)
	f.Add(log)
	f.Add(cat(log, zeros))
	f.Add(log[:len(log)-3])
	f.Add(cat(j("P1a"), j("L1b"), j("P2x"), zeros, j("L2y")))
	f.Add(cat(j("L1a"), zeros, j("L3z")))
	torn := bytes.Clone(log)
	torn[12] ^= 0xff
	f.Add(torn)
	f.Add(cat(o("L1"), o("L2"), []byte("garbage")))
	f.Add(cat(o("L1"), zeros, o("L2")))
	f.Add([]byte{})

	check := func(t *testing.T, fm *Format, data []byte, unit bool) {
		type frame struct {
			pos int
			p   string
		}
		scan := func(data []byte) (Result, []frame) {
			var frames []frame
			last := byte('0')
			s := &Scanner{Format: fm,
				Frame: func(pos int, p []byte) (bool, error) {
					if again, _, ok := fm.Parse(data[pos:]); !ok || !bytes.Equal(again, p) {
						t.Fatalf("frame at %d does not parse", pos)
					}
					if len(p) > 0 && p[0] == 'B' {
						return false, ErrBadFrame
					}
					frames = append(frames, frame{pos, string(p)})
					if !unit {
						return true, nil
					}
					if p[0] == 'L' { // unit frames are at least MinLen = 2 bytes
						last = p[1]
						return true, nil
					}
					return false, nil
				},
				Follow: func(_ int, p []byte) Follow {
					if unit && len(p) > 1 && p[1] == last+1 {
						return Stray
					}
					return Acked
				},
			}
			res, err := s.Scan(data, 0)
			if err != nil {
				t.Fatal(err)
			}
			return res, frames
		}
		res, frames := scan(data)
		if res.End < 0 || res.End > res.Stop || res.Stop > int64(len(data)) {
			t.Fatalf("end %d stop %d of %d bytes", res.End, res.Stop, len(data))
		}
		if !res.Torn && res.End != res.Stop {
			t.Fatalf("clean end %d but frames were read up to %d", res.End, res.Stop)
		}
		if res.Torn && res.TornAt != res.Stop {
			t.Fatalf("torn at %d, stop %d", res.TornAt, res.Stop)
		}
		if res.Damaged {
			if res.DamagedAt <= res.Stop {
				t.Fatalf("damage at %d, not after the stop %d", res.DamagedAt, res.Stop)
			}
			if _, _, ok := fm.Parse(data[res.DamagedAt:]); !ok {
				t.Fatalf("damage reported at %d, where no valid frame is", res.DamagedAt)
			}
			return
		}
		var committed []frame
		for _, fr := range frames {
			if int64(fr.pos) < res.End {
				committed = append(committed, fr)
			}
		}
		cut := data[:res.End]
		again, frames2 := scan(cut)
		if again.Torn || again.Damaged || again.End != res.End {
			t.Fatalf("after cutting at %d: %+v", res.End, again)
		}
		if len(frames2) != len(committed) {
			t.Fatalf("cut log has %d frames, %d were committed", len(frames2), len(committed))
		}
		for i := range frames2 {
			if frames2[i] != committed[i] {
				t.Fatalf("frame %d: %+v, want %+v", i, frames2[i], committed[i])
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check(t, &jf, data, true)
		check(t, &of, data, false)
	})
}
