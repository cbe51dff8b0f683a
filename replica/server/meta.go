package server

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/catena-streams/catena/rpc/catenapb"
	"google.golang.org/protobuf/encoding/protojson"
)

// metaFile is the per-partition file that records the chain configuration
// last installed on this replica. It is written (temp file, fsync, rename,
// fsync dir) before a configuration is confirmed, so a replica that restarts
// never forgets an epoch it accepted and so never accepts an older one.
const metaFile = "chain.json"

type chainMeta struct {
	Stream    string          `json:"stream"`
	Partition uint32          `json:"partition"`
	Epoch     uint64          `json:"epoch"`
	Members   []memberMeta    `json:"members"`
	Config    json.RawMessage `json:"config"`
	config    *catenapb.StreamConfig
}

type memberMeta struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

func metaFromRequest(req *catenapb.ConfigureRequest) (*chainMeta, error) {
	cfg, err := protojson.Marshal(req.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("failed to encode stream config: %w", err)
	}
	m := &chainMeta{Stream: req.GetStream(), Partition: req.GetPartition(), Epoch: req.GetEpoch(), Config: cfg, config: req.GetConfig()}
	for _, mem := range req.GetMembers() {
		m.Members = append(m.Members, memberMeta{ID: mem.GetId(), Addr: mem.GetAddr()})
	}
	return m, nil
}

func (m *chainMeta) memberIDs() []string {
	ids := make([]string, len(m.Members))
	for i, mem := range m.Members {
		ids[i] = mem.ID
	}
	return ids
}

func (m *chainMeta) addrOf(id string) string {
	for _, mem := range m.Members {
		if mem.ID == id {
			return mem.Addr
		}
	}
	return ""
}

func (m *chainMeta) pbMembers() []*catenapb.Member {
	out := make([]*catenapb.Member, len(m.Members))
	for i, mem := range m.Members {
		out[i] = &catenapb.Member{Id: mem.ID, Addr: mem.Addr}
	}
	return out
}

func (m *chainMeta) sameMembers(o *chainMeta) bool {
	if len(m.Members) != len(o.Members) {
		return false
	}
	for i := range m.Members {
		if m.Members[i] != o.Members[i] {
			return false
		}
	}
	return true
}

func writeMeta(dir string, m *chainMeta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("failed to encode chain meta: %w", err)
	}
	return writeFileDurably(dir, metaFile, b)
}

// writeFileDurably replaces dir/name with b atomically and durably: a
// temporary file, fsync, rename over name, fsync of dir. A crash leaves
// the old file or the new one, never a torn one.
func writeFileDurably(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("failed to create %s: %w", tmp, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("failed to write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("failed to fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("failed to close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("failed to install %s: %w", name, err)
	}
	return syncDir(dir)
}

func readMeta(dir string) (*chainMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	m := &chainMeta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("failed to decode %s: %w", filepath.Join(dir, metaFile), err)
	}
	m.config = &catenapb.StreamConfig{}
	if err := protojson.Unmarshal(m.Config, m.config); err != nil {
		return nil, fmt.Errorf("failed to decode stream config in %s: %w", filepath.Join(dir, metaFile), err)
	}
	return m, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("failed to open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("failed to fsync dir %s: %w", dir, err)
	}
	return nil
}
