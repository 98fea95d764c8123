package quota

import (
	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps every quota entity in dir/client_quotas.json, replaced atomically on each change
// (quota changes are rare admin operations; storage.DocFile). It serves one broker process;
// cluster mode keeps the entries in etcd (coord/cluster.Doc), so two brokers never rewrite one
// file. Update reports revision 0 (a file has none).
type FileStore struct{ storage.SharedDocFile[Entry] }

// NewFileStore stores them in dir/client_quotas.json (dir is created if missing).
func NewFileStore(dir string) *FileStore {
	return &FileStore{storage.SharedDocFile[Entry]{Doc: storage.DocFile[Entry]{Dir: dir, Name: "client_quotas.json", Key: "entries", What: "client quota"}}}
}
