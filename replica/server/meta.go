package server

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/catena-streams/catena/internal/durable"
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
	return durable.WriteFile(dir, metaFile, b, 0o644)
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
