package codec

import (
	"fmt"
	"sort"
	"sync"
)

// The supported-version registry. Each handler file registers the range it implements in its
// init(); the ApiVersions response is generated from this table and is never hand-maintained, so
// the broker can only advertise what a handler actually serves.

// VersionRange is the inclusive range of versions served for one API key.
type VersionRange struct {
	Key      int16
	Min, Max int16
}

var (
	registryMu sync.RWMutex
	registry   = map[int16]VersionRange{}
	sortedOnce []VersionRange
)

// Register declares that key is served for versions [min, max]. It panics on an invalid range or
// a double registration: both are programming errors caught at start-up.
func Register(key, min, max int16) {
	if min < 0 || max < min {
		panic(fmt.Sprintf("BUG: invalid version range for key %d: %d-%d", key, min, max))
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, ok := registry[key]; ok {
		panic(fmt.Sprintf("BUG: key %d registered twice", key))
	}
	registry[key] = VersionRange{Key: key, Min: min, Max: max}
	sortedOnce = nil
}

// Lookup returns the registered range for key.
func Lookup(key int16) (VersionRange, bool) {
	registryMu.RLock()
	r, ok := registry[key]
	registryMu.RUnlock()
	return r, ok
}

// Supported reports whether (key, version) is served.
func Supported(key, version int16) bool {
	r, ok := Lookup(key)
	return ok && version >= r.Min && version <= r.Max
}

// Registered returns every registered range sorted by key.
func Registered() []VersionRange {
	registryMu.Lock()
	defer registryMu.Unlock()
	if sortedOnce == nil {
		out := make([]VersionRange, 0, len(registry))
		for _, r := range registry {
			out = append(out, r)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
		sortedOnce = out
	}
	return sortedOnce
}
