package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kaas-go/kaas/storage"
)

// KIP-584 feature finalization. ApiVersions carries FinalizedFeaturesEpoch so a client can tell a
// newer finalized set from an older one (Apache bumps it with every metadata change that touches
// features, and clients such as the Java producer ignore a feature update whose epoch is not
// higher than what they have seen). A constant epoch would hide a change of transaction.version
// across a restart: a client reconnecting would keep its cached level. So the finalized levels are
// persisted with their epoch, and the epoch grows exactly when a level changes.
//
// File: <data.dir>/__cluster/features.json, {"epoch":N,"levels":{"transaction.version":L}}, written
// tmp + fsync + rename (storage.WriteFileAtomic). A missing file starts at epoch 1.

const featuresFile = "features.json"

type finalizedFeatures struct {
	Epoch  int64            `json:"epoch"`
	Levels map[string]int16 `json:"levels"`
}

// loadFinalizedFeatures returns the finalizing epoch for levels, bumping and persisting it when
// levels differ from the last finalized set (or when none was recorded).
func loadFinalizedFeatures(clusterDir string, levels map[string]int16) (int64, error) {
	path := filepath.Join(clusterDir, featuresFile)
	var cur finalizedFeatures
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &cur); err != nil || cur.Epoch < 1 {
			return 0, fmt.Errorf("cannot parse %s (fix or remove it): %v", path, err)
		}
		if sameLevels(cur.Levels, levels) {
			return cur.Epoch, nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("cannot read %s: %w", path, err)
	}
	next := finalizedFeatures{Epoch: cur.Epoch + 1, Levels: levels}
	data, _ = json.Marshal(next)
	if err := os.MkdirAll(clusterDir, 0o755); err != nil {
		return 0, fmt.Errorf("cannot create %s: %w", clusterDir, err)
	}
	if err := storage.WriteFileAtomic(clusterDir, featuresFile, data); err != nil {
		return 0, fmt.Errorf("cannot persist finalized features to %s: %w", path, err)
	}
	return next.Epoch, nil
}

func sameLevels(a, b map[string]int16) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// finalizedLevels is what this configuration finalizes (features() clamps to what is served).
func finalizedLevels(txnVersion int16) map[string]int16 {
	if transactionVersionServed == 0 {
		return map[string]int16{}
	}
	return map[string]int16{"transaction.version": min(txnVersion, transactionVersionServed)}
}
