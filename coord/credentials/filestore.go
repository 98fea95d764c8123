package credentials

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kaas-go/kaas/storage"
)

// FileName is the credential file in data.dir/__cluster.
const FileName = "scram-credentials.json"

const lockName = "scram-credentials.lock"

// FileStore keeps credentials in one JSON file, replaced atomically (storage.WriteFileAtomic) on
// every change. Two processes may write it: the broker (AlterUserScramCredentials) and
// `kaas credentials add`, which works without a running broker. Both take an exclusive flock on
// a lock file next to it for the read-modify-write, so neither loses the other's change, and a
// running broker picks up a change made by the command: Lookup stats the file (at most once per
// statInterval) and re-reads it when it was replaced.
//
// Lock order: the flock is taken before mu; mu is held only to swap the in-memory map.
type FileStore struct {
	dir string

	mu      sync.Mutex
	users   map[string]map[Mechanism]Credential
	stamp   fileStamp // of the file the map was read from
	checked time.Time // last stat
}

// statInterval bounds how often Lookup stats the file.
var statInterval = 250 * time.Millisecond

type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	s := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// fileCred is the on-disk form (byte fields base64 through encoding/json).
type fileCred struct {
	Mechanism  string `json:"mechanism"`
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	StoredKey  []byte `json:"stored_key"`
	ServerKey  []byte `json:"server_key"`
}

// credential validates a stored record of user: a known mechanism, an iteration count Apache
// accepts and all three keys present.
func (c fileCred) credential(user string) (Credential, error) {
	m, ok := ParseMechanism(c.Mechanism)
	if !ok || c.Iterations < MinIterations || len(c.Salt) == 0 || len(c.StoredKey) == 0 || len(c.ServerKey) == 0 {
		return Credential{}, fmt.Errorf("bad %s credential of user %q", c.Mechanism, user)
	}
	return Credential{Mechanism: m, Salt: c.Salt, Iterations: c.Iterations, StoredKey: c.StoredKey, ServerKey: c.ServerKey}, nil
}

func toFileCred(c Credential) fileCred {
	return fileCred{Mechanism: c.Mechanism.String(), Salt: c.Salt, Iterations: c.Iterations, StoredKey: c.StoredKey, ServerKey: c.ServerKey}
}

// applyChanges applies AlterUserScramCredentials changes to users in place, stopping at the first
// one that fails (callers apply to a copy, so a failure applies nothing).
func applyChanges(users map[string]map[Mechanism]Credential, changes []Change) error {
	for _, ch := range changes {
		if ch.Delete {
			if _, ok := users[ch.User][ch.Mechanism]; !ok {
				return fmt.Errorf("cannot delete %v credential of %q: %w", ch.Mechanism, ch.User, ErrNotFound)
			}
			delete(users[ch.User], ch.Mechanism)
			if len(users[ch.User]) == 0 {
				delete(users, ch.User)
			}
			continue
		}
		if err := CheckIterations(ch.Cred.Iterations, MinIterations); err != nil {
			return fmt.Errorf("cannot store %v credential of %q: %w", ch.Mechanism, ch.User, err)
		}
		if users[ch.User] == nil {
			users[ch.User] = map[Mechanism]Credential{}
		}
		c := ch.Cred
		c.Mechanism = ch.Mechanism
		users[ch.User][ch.Mechanism] = c
	}
	return nil
}

type fileFormat struct {
	Version int                   `json:"version"`
	Users   map[string][]fileCred `json:"users"`
}

// OpenFileStore opens (creating dir if needed) the store in dir, normally data.dir/__cluster. A
// file that cannot be parsed refuses to open: guessing would lock every user out or let one in.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create credential dir %s: %w", dir, err)
	}
	s := &FileStore{dir: dir}
	users, stamp, err := s.read()
	if err != nil {
		return nil, err
	}
	s.users, s.stamp, s.checked = users, stamp, time.Now()
	return s, nil
}

func (s *FileStore) path() string { return filepath.Join(s.dir, FileName) }

// read parses the file; a missing file is an empty store.
func (s *FileStore) read() (map[string]map[Mechanism]Credential, fileStamp, error) {
	users := map[string]map[Mechanism]Credential{}
	f, err := os.Open(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return users, fileStamp{}, nil
	}
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("cannot open credentials (%s): %w", s.path(), err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("cannot stat credentials (%s): %w", s.path(), err)
	}
	var ff fileFormat
	if err := json.NewDecoder(f).Decode(&ff); err != nil {
		return nil, fileStamp{}, fmt.Errorf("cannot parse credentials (%s): %w", s.path(), err)
	}
	for u, cs := range ff.Users {
		for _, c := range cs {
			cred, err := c.credential(u)
			if err != nil {
				return nil, fileStamp{}, fmt.Errorf("cannot parse credentials (%s): %w", s.path(), err)
			}
			if users[u] == nil {
				users[u] = map[Mechanism]Credential{}
			}
			users[u][cred.Mechanism] = cred
		}
	}
	return users, stampOf(fi), nil
}

// refresh re-reads the file if another process replaced it. A file that became unreadable keeps
// the last good credentials (and the error is returned to the caller, who counts it).
func (s *FileStore) refresh() error {
	s.mu.Lock()
	if time.Since(s.checked) < statInterval {
		s.mu.Unlock()
		return nil
	}
	s.checked = time.Now()
	old := s.stamp
	s.mu.Unlock()
	fi, err := os.Stat(s.path())
	var now fileStamp
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("cannot stat credentials (%s): %w", s.path(), err)
	default:
		now = stampOf(fi)
	}
	if now == old {
		return nil
	}
	users, stamp, err := s.read()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.users, s.stamp = users, stamp
	s.mu.Unlock()
	return nil
}

// Lookup implements Store.
func (s *FileStore) Lookup(user string, m Mechanism) (Credential, bool, error) {
	err := s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.users[user][m]
	return c, ok, err
}

// Users implements Store.
func (s *FileStore) Users() (map[string][]Credential, error) {
	err := s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]Credential, len(s.users))
	for u, ms := range s.users {
		for _, c := range ms {
			out[u] = append(out[u], c)
		}
		sort.Slice(out[u], func(i, j int) bool { return out[u][i].Mechanism < out[u][j].Mechanism })
	}
	return out, err
}

// Apply implements Store: under the flock it re-reads the file (another process may have changed
// it), applies changes to the copy and replaces the file.
func (s *FileStore) Apply(changes []Change) error {
	lf, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("cannot lock credentials (%s): %w", s.dir, err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("cannot lock credentials (%s): %w", s.dir, err)
	}
	defer unix.Flock(int(lf.Fd()), unix.LOCK_UN) //nolint:errcheck

	users, _, err := s.read()
	if err != nil {
		return err
	}
	if err := applyChanges(users, changes); err != nil {
		return err
	}
	ff := fileFormat{Version: 1, Users: map[string][]fileCred{}}
	for u, ms := range users {
		for _, m := range Mechanisms {
			if c, ok := ms[m]; ok {
				ff.Users[u] = append(ff.Users[u], toFileCred(c))
			}
		}
	}
	data, err := json.MarshalIndent(ff, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode credentials: %w", err)
	}
	if err := storage.WriteFileAtomic(s.dir, FileName, data); err != nil {
		return fmt.Errorf("cannot write credentials (%s): %w", s.path(), err)
	}
	// Derived keys, not passwords, but still nobody else's business.
	_ = os.Chmod(s.path(), 0o600)
	users, stamp, err := s.read()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.users, s.stamp, s.checked = users, stamp, time.Now()
	s.mu.Unlock()
	return nil
}
