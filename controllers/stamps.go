package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// stamps is a time per object, safe for concurrent reconciles: when a
// reconciler last did something to it. It is memory only, evidence of
// this process's own actions, lost with it.
type stamps struct {
	mu sync.Mutex
	at map[types.NamespacedName]time.Time
}

// get is key's time, zero when none.
func (s *stamps) get(key types.NamespacedName) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at[key]
}

func (s *stamps) set(key types.NamespacedName, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = map[types.NamespacedName]time.Time{}
	}
	s.at[key] = at
}

func (s *stamps) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.at, key)
}
