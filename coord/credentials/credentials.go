// Package credentials holds SASL/SCRAM credentials (RFC 5802 / RFC 7677) the way Apache Kafka
// stores them: per user and mechanism, only the salt, the iteration count and the two derived
// keys (StoredKey, ServerKey). A password is never stored, and nothing here logs one.
//
// The Store interface is what the broker asks; FileStore keeps the credentials of a single
// broker in data.dir/__cluster. Cluster mode puts another Store (etcd) behind the same interface.
package credentials

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"hash"

	"github.com/xdg-go/scram"
)

// Mechanism is Kafka's ScramMechanism as it travels in DescribeUserScramCredentials /
// AlterUserScramCredentials: 1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512 (0 is UNKNOWN).
type Mechanism int8

const (
	SHA256 Mechanism = 1
	SHA512 Mechanism = 2
)

// Mechanisms lists the mechanisms in Kafka's order.
var Mechanisms = []Mechanism{SHA256, SHA512}

// MaxIterations is Apache's upper bound on a SCRAM iteration count.
const MaxIterations = 16384

// MinIterations is Apache's lower bound (RFC 7677 recommends at least 4096).
const MinIterations = 4096

// String is the SASL mechanism name.
func (m Mechanism) String() string {
	switch m {
	case SHA256:
		return "SCRAM-SHA-256"
	case SHA512:
		return "SCRAM-SHA-512"
	}
	return fmt.Sprintf("UNKNOWN(%d)", int8(m))
}

// Valid reports whether m is a mechanism kaas stores.
func (m Mechanism) Valid() bool { return m == SHA256 || m == SHA512 }

// ParseMechanism parses SCRAM-SHA-256 / SCRAM-SHA-512.
func ParseMechanism(s string) (Mechanism, bool) {
	for _, m := range Mechanisms {
		if m.String() == s {
			return m, true
		}
	}
	return 0, false
}

// HashGen is the xdg-go/scram hash of the mechanism.
func (m Mechanism) HashGen() scram.HashGeneratorFcn {
	if m == SHA512 {
		return scram.SHA512
	}
	return scram.SHA256
}

func (m Mechanism) newHash() func() hash.Hash {
	if m == SHA512 {
		return sha512.New
	}
	return sha256.New
}

// Credential is one user's SCRAM credential for one mechanism.
type Credential struct {
	Mechanism  Mechanism
	Salt       []byte
	Iterations int
	StoredKey  []byte // H(HMAC(SaltedPassword, "Client Key"))
	ServerKey  []byte // HMAC(SaltedPassword, "Server Key")
}

// ErrUnacceptable is a credential Apache would refuse (UNACCEPTABLE_CREDENTIAL).
var ErrUnacceptable = errors.New("unacceptable credential")

// CheckIterations enforces [minIter, MaxIterations] (Apache refuses a credential outside
// [4096, 16384] with UNACCEPTABLE_CREDENTIAL).
func CheckIterations(iterations, minIter int) error {
	if minIter < MinIterations {
		minIter = MinIterations
	}
	if iterations < minIter || iterations > MaxIterations {
		return fmt.Errorf("%w: iterations %d outside [%d, %d]", ErrUnacceptable, iterations, minIter, MaxIterations)
	}
	return nil
}

// FromPassword derives a credential from a password with a fresh random salt (what
// `kaas credentials add` and `kafka-storage format --add-scram` do). The password is SASLprep'd
// by xdg-go/scram, as the clients do.
func FromPassword(m Mechanism, password string, iterations int) (Credential, error) {
	if !m.Valid() {
		return Credential{}, fmt.Errorf("cannot derive credential: unknown mechanism %v", m)
	}
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return Credential{}, fmt.Errorf("cannot derive credential: %w", err)
	}
	return derive(m, password, salt, iterations)
}

func derive(m Mechanism, password string, salt []byte, iterations int) (Credential, error) {
	cl, err := m.HashGen().NewClient("", password, "")
	if err != nil {
		return Credential{}, fmt.Errorf("cannot derive credential: %w", err)
	}
	sc, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iterations})
	if err != nil {
		return Credential{}, fmt.Errorf("cannot derive credential: %w", err)
	}
	return Credential{Mechanism: m, Salt: salt, Iterations: iterations, StoredKey: sc.StoredKey, ServerKey: sc.ServerKey}, nil
}

// FromSaltedPassword builds a credential from what AlterUserScramCredentials carries: the client
// salts and iterates the password itself (SaltedPassword = Hi(password, salt, i), RFC 5802 §3)
// and sends only that, so the broker derives the two keys from it.
func FromSaltedPassword(m Mechanism, salt, salted []byte, iterations int) Credential {
	mac := func(key []byte, s string) []byte {
		h := hmac.New(m.newHash(), key)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	h := m.newHash()()
	h.Write(clientKey)
	return Credential{
		Mechanism:  m,
		Salt:       append([]byte(nil), salt...),
		Iterations: iterations,
		StoredKey:  h.Sum(nil),
		ServerKey:  mac(salted, "Server Key"),
	}
}

// VerifyPassword reports whether password matches c (SASL/PLAIN against the stored SCRAM
// credential): it derives the StoredKey from the password with c's salt and iterations and
// compares in constant time.
func (c Credential) VerifyPassword(password string) bool {
	d, err := derive(c.Mechanism, password, c.Salt, c.Iterations)
	if err != nil {
		return false
	}
	return hmac.Equal(d.StoredKey, c.StoredKey)
}

// Stored is the xdg-go/scram view of c, for a server conversation.
func (c Credential) Stored() scram.StoredCredentials {
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(c.Salt), Iters: c.Iterations},
		StoredKey:  c.StoredKey,
		ServerKey:  c.ServerKey,
	}
}

// Change is one upsertion or deletion of AlterUserScramCredentials.
type Change struct {
	User      string
	Mechanism Mechanism
	Delete    bool
	Cred      Credential // for an upsertion
}

// ErrNotFound is a deletion of a credential that does not exist (RESOURCE_NOT_FOUND).
var ErrNotFound = errors.New("credential not found")

// Store holds the credentials of a cluster. Implementations are safe for concurrent use; a
// change applied by Apply is seen by every later Lookup (new connections authenticate against it
// without a restart).
type Store interface {
	// Lookup returns user's credential for m.
	Lookup(user string, m Mechanism) (Credential, bool, error)
	// Users returns every user's credentials, sorted by mechanism.
	Users() (map[string][]Credential, error)
	// Apply applies changes all or nothing. A deletion of a missing credential fails with
	// ErrNotFound and applies nothing.
	Apply(changes []Change) error
}
