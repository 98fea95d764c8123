package acl

import (
	"github.com/kaas-go/kaas/storage"
)

// FileStore keeps the whole binding set in dir/acls.json, replaced atomically on every change:
// ACL changes are rare admin operations, and a crash leaves either the old or the new set, never
// a mix (storage.DocFile). It serves one broker process; cluster mode keeps the set in etcd
// (coord/cluster.Doc) instead, because two brokers rewriting one file would lose each other's
// changes. Update reports revision 0 (a file has none).
type FileStore struct{ storage.SharedDocFile[Binding] }

// NewFileStore stores them in dir/acls.json (dir is created if missing).
func NewFileStore(dir string) *FileStore {
	return &FileStore{storage.SharedDocFile[Binding]{Doc: storage.DocFile[Binding]{Dir: dir, Name: "acls.json", Key: "bindings", What: "ACL"}}}
}
