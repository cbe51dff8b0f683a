package groups

import (
	"context"
	"hash/fnv"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Several ingestion nodes share the groups of one deployment (on
// Kubernetes, the pods of a Stream's ingestion Deployment). Each group has
// one coordinator among them, chosen by rendezvous hashing of the group's
// name over the nodes that are up: every node computes the same owner
// from the same list, and a node joining or leaving moves only the groups
// it gains or loses. The list is what the deployment publishes (the
// ready addresses of a headless Service), so every node reads the same
// one, a few seconds apart at most; docs/kafka.md says what a client sees
// while two nodes' lists differ.

// Peer is one ingestion node that coordinates groups. Every node of a
// deployment serves on the same ports, so its host names it.
type Peer struct {
	// Host is the node's address (an IP on Kubernetes: the pod's).
	Host string
	// ID is its Kafka node id: PeerID(Host).
	ID int32
}

// PeerID is the Kafka node id of the node at host: a hash of the address,
// non-negative as Kafka's node ids are, the same on every node.
func PeerID(host string) int32 {
	h := fnv.New32a()
	h.Write([]byte(host))
	return int32(h.Sum32() & 0x7fffffff)
}

// Membership is the list of nodes that share the groups and which of
// them this node is. The zero list is this node alone.
type Membership struct {
	self Peer

	mu    sync.Mutex
	peers []Peer
	// version counts the changes of peers: a coordinator that loaded at an
	// older one catches up before it serves again.
	version uint64
}

// NewMembership returns the membership of the node at self, alone until
// Set.
func NewMembership(self string) *Membership {
	p := Peer{Host: self, ID: PeerID(self)}
	return &Membership{self: p, peers: []Peer{p}}
}

// Self is this node.
func (m *Membership) Self() Peer { return m.self }

// Set replaces the list by the nodes at hosts. An empty list is this node
// alone: with no node published (the deployment's list is being rebuilt)
// a node still coordinates rather than refusing every group. A list
// without this node makes it coordinate none (it is not published as up,
// so the others do not count it).
func (m *Membership) Set(hosts []string) {
	if len(hosts) == 0 {
		hosts = []string{m.self.Host}
	}
	hosts = slices.Clone(hosts)
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	peers := make([]Peer, len(hosts))
	for i, h := range hosts {
		peers[i] = Peer{Host: h, ID: PeerID(h)}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if slices.Equal(peers, m.peers) {
		return
	}
	m.peers = peers
	m.version++
}

// Peers is the list, by host.
func (m *Membership) Peers() []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.peers)
}

// Version counts the list's changes.
func (m *Membership) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

// Owner is the node that coordinates group, and whether it is this one.
func (m *Membership) Owner(group string) (Peer, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return owner(m.peers, group), m.ownsLocked(group)
}

func (m *Membership) ownsLocked(group string) bool {
	return owner(m.peers, group) == m.self
}

// owner is the peer of the highest weight for group (rendezvous hashing).
func owner(peers []Peer, group string) Peer {
	var best Peer
	var bestWeight uint64
	for i, p := range peers {
		h := fnv.New64a()
		h.Write([]byte(p.Host))
		h.Write([]byte{0})
		h.Write([]byte(group))
		if w := mix(h.Sum64()); i == 0 || w > bestWeight {
			best, bestWeight = p, w
		}
	}
	return best
}

// mix spreads FNV's output over all 64 bits (FNV's high bits vary little
// with the last bytes), so weights compare fairly.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb33fe1a85ec9
	x ^= x >> 33
	return x
}

// Discover keeps m's list the addresses names resolve to (a headless
// Service's name resolves to its ready pods' IPs; an IP stands for
// itself), resolving again every interval until ctx ends. A lookup that
// fails leaves the list as it was.
func Discover(ctx context.Context, m *Membership, names []string, interval time.Duration, logger logr.Logger) {
	resolve := func() {
		var hosts []string
		for _, n := range names {
			if net.ParseIP(n) != nil {
				hosts = append(hosts, n)
				continue
			}
			lctx, cancel := context.WithTimeout(ctx, interval)
			addrs, err := net.DefaultResolver.LookupHost(lctx, n)
			cancel()
			if err != nil {
				// No ready endpoint at all answers NXDOMAIN too; the
				// list stays as it was rather than dropping every peer.
				logger.V(1).Info("Could not resolve the group coordinators' peers", "name", n, "err", err.Error())
				return
			}
			hosts = append(hosts, addrs...)
		}
		before := m.Version()
		m.Set(hosts)
		if m.Version() != before {
			logger.Info("Group coordinators changed", "peers", hosts)
		}
	}
	resolve()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			resolve()
		}
	}
}
